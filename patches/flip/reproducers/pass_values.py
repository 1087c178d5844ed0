"""Workaround (d): the owner computes the shared value and passes it to every layer.

Usage: pass_values.py scan|vmap|remat. Works under each transform; every module
between the owner and the users takes the value as an argument, and cannot write it.
"""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

CASE = sys.argv[1]


class Layer(nn.Module):

  @nn.compact
  def __call__(self, x, shared):  # the value, not the module
    return x + nn.Dense(4, name='own')(x) + shared, None


class Model(nn.Module):

  @nn.compact
  def __call__(self, x):
    shared = nn.Dense(4, name='shared')(x)
    kw = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    if CASE == 'scan':
      return nn.scan(Layer, in_axes=nn.broadcast, length=3, **kw)(name='layers')(x, shared)[0]
    if CASE == 'vmap':
      return nn.vmap(Layer, in_axes=None, axis_size=3, **kw)(name='layers')(x, shared)[0]
    for i in range(3):
      x = nn.remat(Layer)(name=f'layer_{i}')(x, shared)[0]
    return x


x = jnp.ones((2, 4))
params = Model().init(jax.random.key(0), x)['params']
grads = jax.grad(lambda p: Model().apply({'params': p}, x).sum())(params)
ok = params['shared']['kernel'].shape == (4, 4) and jnp.abs(grads['shared']['kernel']).sum() > 0
print('works' if ok else f"fails: {jax.tree.map(jnp.shape, params)}")
