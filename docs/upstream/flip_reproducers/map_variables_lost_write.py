"""A tie made with `nn.map_variables` loses the writes through the target.

A counter in the mutable `state` collection is used at three places: `a`,
then `b` and `c`, which should be `a` again. One module instance called three
times applies `count <- 2 * count + 1` three times: 1 -> 3 -> 7 -> 15. The
hand-made tie gives `b` and `c` a copy of `a`'s collection on the way in and
drops it on the way out, so their writes go to the copy.

Plain Flax 0.12.12: the count ends at 3, not 15 (an `AssertionError` here).
With `nn.tie` (the flax-tieext plugin, or Flax with this FLIP): 15, and the
output of the shared instance.
"""

import jax
import jax.numpy as jnp
import flax.linen as nn

try:
  import flax_tieext  # noqa: F401  installs nn.tie into Flax
except ImportError:
  pass


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = count.value * 2 + 1
    return x * 3 + count.value


def borrow_a(root):
  return lambda variables: {'state': root.variables()['state']['a']}


class Model(nn.Module):
  how: str  # 'instance': one module called three times; 'map_variables'; 'tie'

  @nn.compact
  def __call__(self, x):
    a = Counter(name='a')
    if self.how == 'instance':
      return a(a(a(x)))
    if self.how == 'map_variables':
      b, c = (nn.map_variables(Counter, 'state', trans_in_fn=borrow_a(self.scope.root),
                               trans_out_fn=lambda variables: {}, mutable=True)(name=n)
              for n in 'bc')
    else:  # the targets of nn.tie: modules of their own
      b, c = Counter(name='b'), Counter(name='c')
    return c(b(a(x)))


x, start = jnp.ones(()), {'state': {'a': {'count': jnp.array(1.0)}}}
if hasattr(nn, 'tie'):
  model = nn.tie(Model, {'b': 'a', 'c': 'a'}, collections='state')(how='tie')
else:
  model = Model(how='map_variables')
assert list(model.init(jax.random.key(0), x)['state']) == ['a'], 'stored once'
y, updates = model.apply(start, x, mutable='state')
ref_y, ref_updates = Model(how='instance').apply(start, x, mutable='state')
count = updates['state']['a']['count']
assert count == ref_updates['state']['a']['count'] == 15, f'writes lost: count {count}'
assert y == ref_y
