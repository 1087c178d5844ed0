"""A module created outside nn.scan and called inside it is not shared."""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

KW = {'broadcast_outer': True} if '--broadcast-outer' in sys.argv else {}  # prototype (a)


class Layer(nn.Module):
  shared: nn.Module  # created outside the scan

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(4, name='own')(x) + self.shared(x), None


class Model(nn.Module):
  use_before: bool  # also call `shared` before the scan

  @nn.compact
  def __call__(self, x):
    shared = nn.Dense(4, name='shared')
    x = shared(x) if self.use_before else x
    Stack = nn.scan(Layer, variable_axes={'params': 0}, split_rngs={'params': True}, length=3, **KW)
    return Stack(shared, name='layers')(x)[0]


def shared_kernel(use_before):
  try:
    return Model(use_before).init(jax.random.key(0), jnp.ones((2, 4)))['params']['shared']['kernel'].shape
  except Exception as e:
    return type(e).__name__


inside, before = shared_kernel(False), shared_kernel(True)
print('works' if inside == before == (4, 4) else f'fails: used inside only: {inside}; also before: {before}')
