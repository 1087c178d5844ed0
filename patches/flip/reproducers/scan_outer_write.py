"""A module created outside nn.scan that writes its state inside it (a counter, batch stats)."""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

KW = {'broadcast_outer': True} if '--broadcast-outer' in sys.argv else {}  # prototype (a)


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = 2 * count.value + 1
    return x


class Layer(nn.Module):
  shared: nn.Module  # created outside the scan

  @nn.compact
  def __call__(self, x):
    return self.shared(x), None


class Model(nn.Module):

  @nn.compact
  def __call__(self, x):
    Stack = nn.scan(Layer, variable_axes={'state': 0}, length=3, **KW)
    return Stack(Counter(name='counter'), name='layers')(x)[0]


try:
  variables = Model().init(jax.random.key(0), 0.0)
  _, out = Model().apply(variables, 0.0, mutable='state')
  count = out['state']['counter']['count']  # one counter called 3 times: 0 -> 1 -> 3 -> 7
  print('works' if count.shape == () and count == 7 else f'fails: count {count}, not 7')
except Exception as e:
  print(f'fails: {type(e).__name__}: {str(e)[:70]}')
