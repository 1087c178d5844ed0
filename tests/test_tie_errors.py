"""Every TieError: raised, never a warning, and saying where and how to fix.

Each message must name the path(s), the collection and the scope where the tie
was declared, and (for a path that does not exist) the nearest existing names.
"""

import flax.linen as nn
import flax.linen.partitioning  # pylint: disable=unused-import
import jax
import jax.numpy as jnp
import pytest

import flax_tieext

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
pytestmark = pytest.mark.needs_patch
from flax_tieext import TieError

D = 3


class Leaf(nn.Module):
  features: int = D

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features, name='dense')(x)


class Masked(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return x * mask.value


class Blocks(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = Leaf(name='block_0')(x)
    return Leaf(name='block_1')(x)


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    return Blocks(name='encoder')(x)


X = jnp.ones((1, D))


def init(cls, **kwargs):
  return cls(**kwargs).init(jax.random.key(0), X)


def test_missing_target_names_nearest_existing_name():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'blok_1': 'block_0'}))
  message = str(info.value)
  assert 'target /blok_1' in message
  assert 'Nearest existing names under /: block_1' in message
  assert "'params'" in message and 'declared at /' in message


def test_missing_source_names_nearest_existing_name():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'block_1': 'blok_0'}))
  message = str(info.value)
  assert 'source /blok_0' in message
  assert 'block_0' in message


def test_missing_source_at_apply_is_a_tie_error_not_a_missing_parameter():
  tied = nn.tie(Encoder, {'encoder/block_1': 'encoder/block_0'})
  variables = init(tied)
  bad = nn.tie(Encoder, {'encoder/block_1': 'encoder/blok_0'})
  with pytest.raises(TieError) as info:
    bad().apply(variables, X)
  message = str(info.value)
  assert 'source /encoder/blok_0' in message
  assert 'Nearest existing names under /encoder: block_0' in message
  assert "collection 'params'" in message


def test_paths_are_relative_to_the_declaring_module():
  tied = nn.tie(Encoder, {'block_1': 'block_0'})  # missing 'encoder/'
  with pytest.raises(TieError) as info:
    init(tied)
  message = str(info.value)
  assert '/block_1' in message and 'encoder' in message
  assert 'relative to the module that declares the tie' in message


def test_cycle_is_refused_at_declaration():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'block_0': 'block_1', 'block_1': 'block_0'}))
  message = str(info.value)
  assert 'cycle' in message
  assert '/block_0 -> /block_1 -> /block_0' in message


def test_collections_may_be_any_flax_filter():
  deny = nn.DenyList(['graph', 'cache'])  # a filter holding a list
  variables = init(nn.tie(Blocks, {'block_1': 'block_0'}, collections=deny))
  assert set(variables['params']) == {'block_0'}


def test_chain_resolves_to_its_end():
  class Three(nn.Module):

    @nn.compact
    def __call__(self, x):
      for name in 'abc':
        x = Leaf(name=name)(x)
      return x

  variables = init(nn.tie(Three, {'a': 'b', 'b': 'c'}))
  assert set(variables['params']) == {'c'}


def test_self_tie_is_refused():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'block_0': './block_0'}))
  assert 'to itself' in str(info.value)
  assert '/block_0' in str(info.value)


def test_tie_to_own_ancestor_is_refused():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'block_0/dense': 'block_0'}))
  message = str(info.value)
  assert 'inside' in message and 'ancestor' in message


def test_shape_mismatch_names_both_paths():
  class Unequal(nn.Module):

    @nn.compact
    def __call__(self, x):
      return Leaf(4, name='wide')(x), Leaf(5, name='wider')(x)

  with pytest.raises(TieError) as info:
    init(nn.tie(Unequal, {'wider': 'wide'}))
  message = str(info.value)
  assert '/wider' in message and '/wide' in message
  assert 'shape' in message.lower()


def test_write_of_another_shape_through_a_variable_tie_names_both_paths():
  class Writes(nn.Module):

    @nn.compact
    def __call__(self, x):
      a = self.variable('state', 'a', jnp.zeros, (2,))
      Writer(name='w')(x)
      return a.value

  with pytest.raises(TieError) as info:
    init(nn.tie(Writes, {'w/b': 'a'}, collections='state'))
  message = str(info.value)
  assert '/w/b' in message and '/a' in message and '(2,)' in message


class Writer(nn.Module):

  @nn.compact
  def __call__(self, x):
    b = self.variable('state', 'b', jnp.zeros, (3,))
    b.value = jnp.zeros(3)


def test_dtype_mismatch_in_tie_variables_names_both_paths():
  variables = {'params': {'a': {'w': jnp.ones(2)},
                          'b': {'w': jnp.ones(2, jnp.int32)}}}
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(variables, {'b': 'a'})
  message = str(info.value)
  assert '/b' in message and '/a' in message and 'int32' in message


def test_tie_variables_refuses_a_target_that_differs():
  variables = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.zeros(2)}}}
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(variables, {'b': 'a'})
  assert 'differs from its source' in str(info.value)


def test_tied_collection_absent_at_apply():
  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      return Masked(name='m1')(Masked(name='m0')(x))

  tied = nn.tie(Model, {'m1': 'm0'}, collections='graph')
  with pytest.raises(TieError) as info:
    tied().apply({}, X)
  message = str(info.value)
  assert "collection 'graph'" in message
  assert 'declared at /' in message


def test_values_given_for_a_tied_target_are_refused():
  untied = init(Blocks)
  tied = nn.tie(Blocks, {'block_1': 'block_0'})
  with pytest.raises(TieError) as info:
    tied().apply(untied, X)
  message = str(info.value)
  assert '/block_1' in message and 'tie_variables' in message


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value += 1
    return x + count.value


class InnerBlock(nn.Module):
  source: str | None = None

  @nn.compact
  def __call__(self, x):
    cls = Counter if self.source is None else nn.tie(
        Counter, {'.': self.source}, collections='state')
    return cls(name='c')(x)


def inner_tie_model(transform):

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      block_cls = transform(InnerBlock)
      x = block_cls(name='block_0')(x)
      return block_cls(source='/block_0/c', name='block_1')(x)

  return Model


@pytest.mark.parametrize('transform', [nn.remat, nn.partitioning.remat],
                         ids=['nn.remat', 'nn.partitioning.remat'])
def test_inner_tie_under_remat_says_declare_at_ancestor(transform):
  # A tie declared inside a lifted transform reaches only the paths inside
  # it: its source outside was not lifted (nothing was tied when the
  # transform packed its scopes), under every transform as under nn.jit.
  model = inner_tie_model(transform)()
  with pytest.raises(TieError) as info:
    model.init(jax.random.key(0), X)
  message = str(info.value)
  assert 'declared inside' in message and '/block_0/c' in message
  assert 'common ancestor' in message and 'remat' in message


def test_inner_tie_is_refused_also_when_another_tie_is_in_force():
  # The same rule when the transform packed with a tie in force (and so
  # could reach outside): one rule, whatever else is tied.

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = Counter(name='b')(Counter(name='a')(x))
      block_cls = nn.remat(InnerBlock)
      x = block_cls(name='block_0')(x)
      return block_cls(source='/block_0/c', name='block_1')(x)

  model = nn.tie(Model, {'b': 'a'}, collections='state')()
  with pytest.raises(TieError) as info:
    model.init(jax.random.key(0), X)
  message = str(info.value)
  assert 'declared inside' in message and '/block_0/c' in message


def test_inner_tie_declared_at_the_common_ancestor_works():
  # The fix the message gives.

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      block_cls = nn.remat(InnerBlock)
      x = block_cls(name='block_0')(x)
      return block_cls(name='block_1')(x)

  tied = nn.tie(Model, {'block_1/c': 'block_0/c'}, collections='state')()
  variables = tied.init(jax.random.key(0), X)
  assert list(variables['state']) == ['block_0']
  _, updated = tied.apply(variables, X, mutable=['state'])
  assert list(updated['state']) == ['block_0']


def test_inner_tie_under_jit_is_refused_not_stale():
  model = inner_tie_model(nn.jit)()
  with pytest.raises(TieError) as info:
    model.init(jax.random.key(0), X)
  message = str(info.value)
  assert 'jit' in message and 'stale' in message


def test_source_path_must_be_a_string():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'block_1': 0}))
  assert 'must be a str' in str(info.value)


def test_tie_without_the_scope_machinery_says_how_to_install():
  flax_tieext.uninstall()
  try:
    with pytest.raises(TieError) as info:
      init(flax_tieext.linen.tie(Blocks, {'block_1': 'block_0'}))
    assert 'flax_tieext.install()' in str(info.value)
  finally:
    flax_tieext.install()


class ScanLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return Leaf(name='leaf')(x), None


def test_target_in_scan_cannot_initialize_a_source_outside_it():
  """Broadcast is read-only: the source must exist before the stack runs."""

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      stack = nn.scan(ScanLayer, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=2)
      x, _ = stack(name='stack')(x, None)
      return Leaf(name='src')(x)  # the source runs after the stack

  with pytest.raises(TieError) as info:
    init(nn.tie(Model, {'stack/leaf': 'src'}))
  message = str(info.value)
  assert 'cannot land' in message and 'scan' in message
  assert '/stack/leaf' in message and '/src' in message
  assert 'read-only (broadcast)' in message
