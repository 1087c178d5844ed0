"""A tie made with nn.map_variables loses the writes through the target."""
import jax.numpy as jnp
import flax.linen as nn


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    count.value = 2 * count.value + 1
    return x


class Model(nn.Module):

  @nn.compact
  def __call__(self, x):
    a, root = Counter(name='a'), self.scope.root
    b = nn.map_variables(Counter, 'state', mutable=True, trans_out_fn=lambda _: {},
        trans_in_fn=lambda _: {'state': root.variables()['state']['a']})(name='b')
    return b(a(x))  # b is meant to be a second use of a: count 1 -> 3 -> 7


_, out = Model().apply({'state': {'a': {'count': jnp.array(1.0)}}}, 0.0, mutable='state')
count = out['state']['a']['count']
print('works' if count == 7 else f'fails: count {count:g}, not 7: the write through b is lost')
