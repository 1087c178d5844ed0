"""Checks the prototype of alternative (a) beyond the reproducers' shapes.

With `broadcast_outer=True`, one module created outside `nn.scan` / `nn.vmap`
must behave as one instance called at every iteration / batch index: the
output and the gradients of an `nn.scan` / `nn.vmap` model equal those of the
same model unrolled in Python (plain Flax shares an instance there), with the
shared module used inside only and also before the transform, under `jax.jit`.
Prints `works`, or `fails: <what>` (on Flax without the patch: TypeError).
"""
import jax
import jax.numpy as jnp
import flax.linen as nn

N = 3


class Layer(nn.Module):
  shared: nn.Module

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(x + nn.Dense(4, name='own')(x) + self.shared(x)), None


class Model(nn.Module):
  how: str  # 'scan', 'vmap' or 'unrolled'
  use_before: bool

  @nn.compact
  def __call__(self, x):
    shared = nn.Dense(4, name='shared')
    x = shared(x) if self.use_before else x
    if self.how == 'scan':
      return nn.scan(Layer, variable_axes={'params': 0}, split_rngs={'params': True},
                     length=N, broadcast_outer=True)(shared, name='layers')(x)[0]
    if self.how == 'vmap':
      return nn.vmap(Layer, variable_axes={'params': 0}, split_rngs={'params': True},
                     in_axes=None, axis_size=N, broadcast_outer=True)(shared, name='layers')(x)[0]
    ys = []
    for i in range(N):
      y = Layer(shared, name=f'layer_{i}')(x if not ys or self.how == 'vmap_ref' else ys[-1])[0]
      ys.append(y)
    return jnp.stack(ys) if self.how == 'vmap_ref' else ys[-1]


def unstack(params):  # the stacked 'layers' of scan / vmap as layer_0 ... layer_{N-1}
  own = params['layers']['own']
  return {'shared': params['shared'],
          **{f'layer_{i}': {'own': jax.tree.map(lambda a: a[i], own)} for i in range(N)}}


def check(how, use_before):
  x = jax.random.normal(jax.random.key(1), (2, 4))
  model, ref = Model(how, use_before), Model('unrolled' if how == 'scan' else 'vmap_ref', use_before)
  params = model.init(jax.random.key(0), x)['params']
  assert sorted(params) == ['layers', 'shared'] and params['shared']['kernel'].shape == (4, 4)
  assert list(params['layers']) == ['own'] and params['layers']['own']['kernel'].shape == (N, 4, 4)
  loss = lambda m: jax.jit(jax.value_and_grad(lambda p: jnp.sum(m.apply({'params': p}, x) ** 2)))
  (value, grads), (ref_value, ref_grads) = loss(model)(params), loss(ref)(unstack(params))
  assert jnp.allclose(value, ref_value), (how, use_before, value, ref_value)
  assert jax.tree.all(jax.tree.map(jnp.allclose, unstack(grads), ref_grads)), (how, use_before)
  assert jnp.abs(grads['shared']['kernel']).sum() > 0


try:
  for how in ('scan', 'vmap'):
    for use_before in (False, True):
      check(how, use_before)
  print('works')
except Exception as e:
  print(f'fails: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ""}')
