"""Alternative (c): share into nn.scan / nn.vmap by broadcasting a collection.

params:      nn.scan(variable_broadcast='params'): the layers' own weights are shared too.
custom:      the shared module keeps its weight in a collection of its own,
             'shared', and nn.scan broadcasts that collection: stored once.
vmap-custom: the same with nn.vmap, variable_axes={'params': 0, 'shared': None}.
custom-rng:  as custom, but the weight is drawn from the 'params' rng, which the
             scan splits per layer: the broadcast weight depends on the loop.
"""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

CASE = sys.argv[1]
COL = 'params' if CASE == 'params' else 'shared'


class SharedBias(nn.Module):  # written for it: nn.Dense keeps its weights in 'params'

  @nn.compact
  def __call__(self, x):
    init = lambda: jax.random.normal(self.make_rng('params'), (4,)) if CASE == 'custom-rng' else jnp.zeros(4)
    return x + self.variable(COL, 'b', init).value


class Layer(nn.Module):
  shared: nn.Module  # created outside the transform

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(4, name='own')(x) + self.shared(x), None


class Model(nn.Module):

  @nn.compact
  def __call__(self, x):
    shared, split = SharedBias(name='shared'), {'params': CASE != 'params'}
    if CASE == 'params':
      return nn.scan(Layer, variable_broadcast='params', split_rngs=split, length=3)(shared, name='layers')(x)[0]
    if CASE in ('custom', 'custom-rng'):
      return nn.scan(Layer, variable_axes={'params': 0}, variable_broadcast='shared',
                     split_rngs=split, length=3)(shared, name='layers')(x)[0]
    return nn.vmap(Layer, variable_axes={'params': 0, 'shared': None}, split_rngs=split,
                   in_axes=None, axis_size=3)(shared, name='layers')(x)[0]


try:
  shapes = jax.tree.map(jnp.shape, Model().init(jax.random.key(0), jnp.ones((2, 4))))
except ValueError as e:
  print(f'fails: ValueError: {e}')
  sys.exit()
shapes = jax.tree.map(jnp.shape, Model().init(jax.random.key(0), jnp.ones((2, 4))))
b, own = shapes[COL]['shared']['b'], shapes['params']['layers']['own']['kernel']
print('works' if b == (4,) and own == (3, 4, 4) else f'fails: shared b {b}, own kernel {own} (one for all layers)')
