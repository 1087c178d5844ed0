"""Each call site is traced once at init and once per apply, however deep.

A tree of depth d has 2**d leaf call sites; every level ties its second child
to its first. A hand-made tie on ``nn.map_variables`` runs the wrapped body
twice per level at init (4**d leaf traces); ``nn.tie`` must run each call
site exactly once.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import flax_tieext  # noqa: F401

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
pytestmark = pytest.mark.needs_patch

CALLS = []


class Leaf(nn.Module):

  @nn.compact
  def __call__(self, x):
    CALLS.append(self.scope.path)
    return jnp.tanh(nn.Dense(2, name='dense')(x))


def nested(depth, remat):
  cls = Leaf
  for level in range(depth):
    child = nn.remat(cls) if remat else cls

    class Level(nn.Module):
      child_cls: type = child

      @nn.compact
      def __call__(self, x):
        return self.child_cls(name='b')(self.child_cls(name='a')(x))

    Level.__name__ = f'Level{level}'
    cls = nn.tie(Level, {'b': 'a'})
  return cls


@pytest.mark.parametrize('remat', [False, True], ids=['plain', 'remat'])
@pytest.mark.parametrize('depth', [1, 2, 3, 4, 5])
def test_each_call_site_traced_once(depth, remat):
  model = nested(depth, remat)()
  x = jnp.ones((1, 2))
  CALLS.clear()
  variables = model.init(jax.random.key(0), x)
  assert len(CALLS) == 2 ** depth
  assert len(set(CALLS)) == 2 ** depth  # every call site, once each

  # Only the leftmost path is stored: one Dense for the whole tree.
  leaves = jax.tree_util.tree_leaves(variables)
  assert len(leaves) == 2

  CALLS.clear()
  jax.grad(lambda v: model.apply(v, x).sum())(variables)
  assert len(CALLS) == 2 ** depth
