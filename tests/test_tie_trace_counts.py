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
@pytest.mark.parametrize('depth', [1, 2, 3, *(pytest.param(d, marks=pytest.mark.end_to_end)
                                              for d in (4, 5))])
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


class Pair(nn.Module):
  """Two Dense layers; ``mode`` (static) chooses their order."""

  @nn.compact
  def __call__(self, x, mode='ab'):
    CALLS.append(mode)
    a, b = nn.Dense(2, name='a'), nn.Dense(2, name='b')
    return b(a(x)) if mode == 'ab' else a(b(x))


@pytest.mark.parametrize('static', ['static_argnames', 'static_argnums',
                                    'none'])
def test_jit_of_a_tied_module_traces_as_the_untied_one(static):
  """Every apply of nn.jit(nn.tie(...)) retraced (the key held per-call state)."""
  kwargs = {'static_argnames': {'static_argnames': 'mode'},
            'static_argnums': {'static_argnums': 2}, 'none': {}}[static]
  modes = ['ab', 'ba', 'ab', 'ba'] if static != 'none' else ['ab'] * 4
  x = jnp.ones((1, 2))
  counts = []
  for cls in (Pair, nn.tie(Pair, {'b': 'a'})):
    jitted = nn.jit(cls, **kwargs)
    variables = jitted().init(jax.random.key(0), x)
    CALLS.clear()
    for mode in modes:
      if static == 'static_argnums':
        jitted().apply(variables, x, mode)
      elif static == 'static_argnames':
        jitted().apply(variables, x, mode=mode)
      else:
        jitted().apply(variables, x)
    counts.append(len(CALLS))
  assert counts[1] == counts[0] == len(set(modes))


class Head(nn.Module):

  @nn.compact
  def __call__(self, x):
    CALLS.append(self.scope.path)
    return nn.Dense(2, use_bias=False, name='d')(x)


JittedHead = nn.jit(Head)  # one class: its call sites may share a trace


def heads(wrapped, views):
  class Heads(nn.Module):

    @nn.compact
    def __call__(self, x):
      y = nn.Dense(2, use_bias=False, name='src')(x)
      return wrapped(name='b')(x) + 2 * wrapped(name='c')(x) + y

  return nn.tie(Heads, {'b/d/kernel': ('src/kernel', views[0]),
                        'c/d/kernel': ('src/kernel', views[1])})


@pytest.mark.parametrize('same_view', [False, True])
def test_jit_call_sites_whose_views_differ_trace_apart(same_view):
  """Two nn.jit call sites whose ties differ only in the view shared a trace."""
  views = ((jnp.transpose, jnp.transpose) if same_view
           else (jnp.transpose, lambda k: 2 * k))
  x = jnp.arange(4.0).reshape(2, 2)
  variables = heads(Head, views)().init(jax.random.key(0), x)
  expected = heads(Head, views)().apply(variables, x)
  CALLS.clear()
  got = heads(JittedHead, views)().apply(variables, x)
  assert jnp.allclose(got, expected)
  assert len(CALLS) == (1 if same_view else 2)  # one trace per distinct trace


class Mask(nn.Module):

  @nn.compact
  def __call__(self, x):
    return x @ self.variable('graph', 'mask', jnp.eye, 2).value


class InnerTieBlock(nn.Module):
  """Block 0 holds the mask; every other block ties its own to block 0's."""
  idx: int

  @nn.compact
  def __call__(self, x):
    CALLS.append(self.name)
    mask = Mask if self.idx == 0 else nn.tie(
        Mask, {'.': '/block_0/mask'}, collections='graph')
    return nn.Dense(2, name='d')(mask(name='mask')(x))


def inner_tie_encoder():
  """Three call sites of one ``nn.jit`` class (one trace cache), as hoisted."""
  jitted = nn.jit(InnerTieBlock)

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      for i in range(3):
        x = jitted(i, name=f'block_{i}')(x)
      return x

  return Encoder()


@pytest.mark.parametrize('init_first', [
    pytest.param(True, id='after_init'),
    pytest.param(False, id='apply_only', marks=pytest.mark.end_to_end),  # with CI
])
def test_jit_traces_every_call_site_of_a_class_that_met_an_inner_tie_twice(
    init_first):
  """docs/design.md said only the call sites holding such a tie traced twice.

  With no init of the class in the process, the first apply meets the inner
  tie; the count of ties met keys every later trace of the class, so the
  second apply traces every call site once more, block_0 (no tie) included.
  """
  x = jnp.ones((1, 2))
  variables = inner_tie_encoder().init(jax.random.key(0), x)
  model = inner_tie_encoder()
  if init_first:
    model.init(jax.random.key(0), x)
  traced = []
  for _ in range(3):
    CALLS.clear()
    model.apply(variables, x)
    traced.append(sorted(CALLS))
  every_site = ['block_0', 'block_1', 'block_2']
  if init_first:
    assert traced == [every_site, [], []]
  else:
    assert traced == [every_site, every_site, []]
