"""A module created outside nn.vmap and called inside it is not shared."""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

KW = {'broadcast_outer': True} if '--broadcast-outer' in sys.argv else {}  # prototype (a)


class Member(nn.Module):
  shared: nn.Module  # created outside the vmap

  @nn.compact
  def __call__(self, x):
    return nn.Dense(4, name='own')(x) + self.shared(x)


class Ensemble(nn.Module):

  @nn.compact
  def __call__(self, x):
    Members = nn.vmap(Member, variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=None, axis_size=3, **KW)
    return Members(nn.Dense(4, name='shared'), name='members')(x)


try:
  shape = Ensemble().init(jax.random.key(0), jnp.ones((2, 4)))['params']['shared']['kernel'].shape
  print('works' if shape == (4, 4) else f'fails: one shared kernel per member, {shape}')
except Exception as e:
  print(f'fails: {type(e).__name__}')
