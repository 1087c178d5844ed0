"""Alternative (b) inside nn.scan / nn.vmap: a map_variables tie cannot reach its source.

Each layer borrows the model's `shared` weights with nn.map_variables, through
self.scope.root, as it works without a transform. Inside nn.scan (or nn.vmap
with --vmap) the layer's scope is a root of its own: `shared` is not there.
Writing back (alternative b) changes nothing here: the read fails first.
"""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn


class Layer(nn.Module):

  @nn.compact
  def __call__(self, x):
    root = self.scope.root
    Shared = nn.map_variables(nn.Dense, 'params', trans_out_fn=lambda _: {}, init=True,
                              trans_in_fn=lambda _: {'params': root.variables()['params']['shared']})
    return x + nn.Dense(4, name='own')(x) + Shared(4, name='shared')(x), None


class Model(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(4, name='shared')(x)  # the source, used first
    kw = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    if '--vmap' in sys.argv:
      return nn.vmap(Layer, in_axes=None, axis_size=3, **kw)(name='layers')(x)[0]
    return nn.scan(Layer, length=3, **kw)(name='layers')(x)[0]


try:
  params = Model().init(jax.random.key(0), jnp.ones((2, 4)))['params']
  print('works' if list(params['layers']) == ['own'] else f"fails: {jax.tree.map(jnp.shape, params)}")
except Exception as e:
  print(f'fails: {type(e).__name__} {e}')
