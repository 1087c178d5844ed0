"""Every TieError: raised, never a warning, and saying where and how to fix.

Each message must name the path(s), the collection and the scope where the tie
was declared, and (for a path that does not exist) the nearest existing names.
Mistakes that once passed silently (a typo in a source path under a transform
stored a new variable) raise under every transform; errors that were bare or
gave false advice name what they should. The checks ``init`` makes of each use
are tests/test_tie_init.py; those of transforms, tests/test_tie_lifting.py.
"""

from flax import errors as flax_errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_models
import tie_wraps
from tie_blocks import (D, HEAD_TIE, LM, VOCAB, X, Block, Pair, SeesKernel,
                        encoder)
from tie_models import (ONES, Blocks, Chain, assert_close, assert_message_names,
                        assert_says_how_to_fix, error, init)

import flax_tieext
from flax_tieext import TieError

tie = flax_tieext.linen.tie
needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch

WRAPS = tie_wraps.WRAPS
ALL_WRAPS = sorted(WRAPS)


# ---------------------------------------------------------------------------
# Paths that do not exist.
# ---------------------------------------------------------------------------


@needs_patch
def test_missing_target_names_nearest_existing_name():
  message = error(nn.tie(Blocks, {'blok_1': 'block_0'})(), ONES)
  assert_message_names(message, 'target /blok_1',
                       'Nearest existing names under /: block_1', "'params'",
                       'declared at /')


@needs_patch
def test_missing_source_names_nearest_existing_name():
  message = error(nn.tie(Blocks, {'block_1': 'blok_0'})(), ONES)
  assert_message_names(message, 'source /blok_0', 'block_0')


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    return Blocks(name='encoder')(x)


@needs_patch
def test_missing_source_at_apply_is_a_tie_error_not_a_missing_parameter():
  tied = nn.tie(Encoder, {'encoder/block_1': 'encoder/block_0'})
  variables = init(tied)
  bad = nn.tie(Encoder, {'encoder/block_1': 'encoder/blok_0'})
  with pytest.raises(TieError) as info:
    bad().apply(variables, ONES)
  message = str(info.value)
  assert 'source /encoder/blok_0' in message
  assert 'Nearest existing names under /encoder: block_0' in message
  assert "collection 'params'" in message


@needs_patch
def test_paths_are_relative_to_the_declaring_module():
  tied = nn.tie(Encoder, {'block_1': 'block_0'})  # missing 'encoder/'
  assert_message_names(error(tied(), ONES), '/block_1', 'encoder',
                       'relative to the module that declares the tie')


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_typo_in_source_module_path_raises_under_every_transform(wrap):
  """Without a transform this was a TieError; under remat it stored blok_0."""
  model = tie(encoder(WRAPS[wrap](Block)),
              {'block_1/SelfAttention': 'blok_0/SelfAttention'})
  with pytest.raises(TieError, match='blok_0') as info:
    model().init(jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, '/block_1/SelfAttention',
                       '/blok_0/SelfAttention', "'params'", 'block_0')
  assert 'a misspelt path' in message
  assert_says_how_to_fix(message)


class TwoDense(nn.Module):
  wrap: str = 'none'

  @nn.compact
  def __call__(self, x):
    dense_cls = WRAPS[self.wrap](nn.Dense)
    return dense_cls(D, name='b')(dense_cls(D, name='a')(x))


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_typo_in_source_variable_name_raises_not_stores_it(wrap):
  """{'b/kernel': 'a/kernal'} used to store a new a/kernal beside a/kernel."""
  model = tie(TwoDense, {'b/kernel': 'a/kernal'})(wrap)
  with pytest.raises(TieError, match='kernal') as info:
    model.init(jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, '/b/kernel', '/a/kernal', "'params'")
  # The nearest existing name, a/kernel, offered beyond the two paths.
  assert 'kernel' in message.replace('/b/kernel', '').replace('kernal', ''), (
      f'nearest name kernel missing from: {message}')
  assert_says_how_to_fix(message)


@installs_patch
def test_typo_in_a_source_seen_from_inside_a_stack_names_the_nearest():

  class Layer(nn.Module):

    @nn.compact
    def __call__(self, x, _):
      return nn.Dense(D, name='leaf')(x), None

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = nn.Dense(D, name='src')(x)
      stack = nn.scan(Layer, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=2)
      return stack(name='stack')(x, None)[0]

  assert_message_names(error(nn.tie(Model, {'stack/leaf': 'sr'})(), X),
                       'Nearest existing names under /: src',
                       'Fix the source path')


class Masked(nn.Module):
  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return nn.Dense(D, name='dense')(x * mask.value)


class TwoMasked(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Masked(name='b')(Masked(name='a')(x))


@installs_patch
def test_variable_tie_in_the_wrong_collection_names_the_right_one():
  assert_message_names(error(nn.tie(TwoMasked, {'b/mask': 'a/mask'})(), X),
                       "stored in collection 'graph'", "collections='graph'")


@installs_patch
def test_dotted_path_suggests_slashes():
  assert "for 'b.dense' write 'b/dense'" in error(
      nn.tie(TwoMasked, {'b.dense': 'a/dense'})(), X)


# ---------------------------------------------------------------------------
# Ties that cannot hold.
# ---------------------------------------------------------------------------


@needs_patch
def test_self_tie_is_refused():
  assert_message_names(error(nn.tie(Blocks, {'block_0': './block_0'})(), ONES),
                       'to itself', '/block_0')


@needs_patch
def test_tie_to_own_ancestor_is_refused():
  assert_message_names(
      error(nn.tie(Blocks, {'block_0/dense': 'block_0'})(), ONES),
      'inside', 'ancestor')


@needs_patch
def test_source_path_must_be_a_string():
  assert 'must be a str' in error(nn.tie(Blocks, {'block_1': 0})(), ONES)


BAD_TIES = {  # what was given -> what the message must say to pass
    'a list of pairs': ([('block_1', 'block_0')], 'dict(pairs)'),
    'a set': ({'block_1'}, 'map each target to its source'),
    'None': (None, '{} ties nothing'),
    'a view that is not callable': ({'block_1': ('block_0', 3)},
                                    'view_fn, int 3, is not callable'),
}


@installs_patch
@pytest.mark.parametrize('given', list(BAD_TIES))
def test_nn_tie_refuses_ties_it_cannot_read_at_the_call(given):
  """A list of pairs was an AttributeError from the tied-class cache."""
  ties, fix = BAD_TIES[given]
  with pytest.raises(TieError) as info:
    nn.tie(Blocks, ties)
  assert_message_names(str(info.value), 'nn.tie(..., ties)', fix)


@installs_patch
@pytest.mark.parametrize('given', list(BAD_TIES))
def test_lift_tie_refuses_ties_it_cannot_read_at_the_call(given):
  from flax.core import lift  # pylint: disable=g-import-not-at-top
  ties, fix = BAD_TIES[given]
  with pytest.raises(TieError) as info:
    lift.tie(lambda scope, x: x, ties)  # before any scope is given
  assert_message_names(str(info.value), 'lift.tie(..., ties)', fix)


@pytest.mark.end_to_end  # every transform: left to --end-to-end and CI
@installs_patch
def test_a_view_that_cannot_be_hashed_works_under_every_transform():
  """A dataclass view (eq=True: no hash) failed where a tie is hashed.

  nn.jit keys its traces on the ties in force; such a view keys them as the
  one object it is, so it is compared with the same hashable view.
  """
  import dataclasses  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass
  class Transposed:
    scale: float = 1.0

    def __call__(self, x):
      return self.scale * jnp.transpose(x)

  view = Transposed()
  tokens = jnp.arange(5) % VOCAB
  reference = nn.tie(LM, HEAD_TIE)()
  variables = reference.init(jax.random.key(0), tokens)
  for name in ALL_WRAPS:

    class Root(nn.Module):
      tie_view: object = None

      @nn.compact
      def __call__(self, x, wrap=WRAPS[name]):
        ties = {'head/kernel': ('embed/embedding', self.tie_view)}
        return wrap(nn.tie(LM, ties))(name='lm')(x)

    model = Root(view)
    nested = {'params': {'lm': variables['params']}}
    got = model.init(jax.random.key(0), tokens)  # stored once
    assert (jax.tree_util.tree_map(jnp.shape, got)
            == jax.tree_util.tree_map(jnp.shape, nested))
    for _ in range(2):  # again: the same tied class, the same trace
      np.testing.assert_allclose(model.apply(nested, tokens),
                                 reference.apply(variables, tokens), rtol=1e-6)


@installs_patch
def test_a_module_tied_to_a_variable_is_a_tie_error():
  """It was a bare ValueError (the truth value of an array)."""
  with pytest.raises(TieError, match='"b/kernel": "a/kernel"'):
    nn.tie(SeesKernel, {'b': 'a/kernel'})().init(jax.random.key(0), X)


@installs_patch
def test_nn_tie_takes_a_module_class_and_no_methods():
  with pytest.raises(TypeError, match='Module class'):
    nn.tie(lambda self, x: x, {'b': 'a'})
  with pytest.raises(TypeError, match='methods'):
    nn.tie(Pair, {'b': 'a'}, methods=['__call__'])  # pylint: disable=unexpected-keyword-arg


def _a_function(x):
  return x


@installs_patch
@pytest.mark.parametrize('given, got', [
    (_a_function, r'got function <function _a_function'),
    (Pair(), r'got an instance of Pair: pass its class, Pair'),
    (3, r'got int 3'),
], ids=['function', 'instance', 'int'])
def test_a_tie_of_what_is_not_tieable_is_a_tie_error_naming_the_argument(
    given, got):
  """It was a bare TypeError (nn.tie), or an error at the first call (lift)."""
  with pytest.raises(TieError, match=r'nn\.tie\(target, ties\): target must be'
                     r' a Module class.*' + got + r'.*nn\.tie\(Encoder') as info:
    nn.tie(given, {'b': 'a'})
  assert isinstance(info.value, TypeError)  # `except TypeError` still works
  for fn in (3, Pair, None):
    with pytest.raises(TieError, match=r'lift\.tie\(fn, ties\): fn must be a scope'
                       r' function.*for a Linen Module class: nn\.tie') as info:
      flax_tieext.core.lift.tie(fn, {'b': 'a'})
    assert isinstance(info.value, TypeError)


# ---------------------------------------------------------------------------
# The tied collections at apply.
# ---------------------------------------------------------------------------


class Mask(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return x * mask.value


@needs_patch
def test_tied_collection_absent_at_apply():
  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      return Mask(name='m1')(Mask(name='m0')(x))

  tied = nn.tie(Model, {'m1': 'm0'}, collections='graph')
  with pytest.raises(TieError) as info:
    tied().apply({}, ONES)
  message = str(info.value)
  assert "collection 'graph'" in message
  assert 'declared at /' in message


@needs_patch
@pytest.mark.parametrize('col, said', [
    ('parms', "Did you mean 'params'?"),
    # Like no given name: it was Flax's bare ScopeParamNotFoundError.
    ('grpah', 'Fix the collection name in collections='),
])
def test_a_misspelled_tied_collection_at_apply_is_the_ties_error(col, said):
  model = nn.tie(Chain, {'b': 'a', 'c': 'a'}, collections=col)()
  variables = nn.tie(Chain, {'b': 'a', 'c': 'a'})().init(
      jax.random.key(0), tie_models.X)
  with pytest.raises(TieError) as info:
    model.apply(variables, tie_models.X)
  message = str(info.value)
  assert f"ties collection {col!r}" in message
  assert "collections given: 'params'" in message
  assert said in message
  assert 'To fix it: Fix' not in message  # (one option reads as one)


@needs_patch
def test_a_tied_collection_only_some_calls_use_stays_optional():
  # 'cache' exists only while decoding: a plain apply with a missing
  # parameter is Flax's own error, not a tie's.
  model = nn.tie(Chain, {'b': 'a'}, collections=['params', 'cache'])()
  variables = model.init(jax.random.key(0), tie_models.X)
  np.testing.assert_allclose(model.apply(variables, tie_models.X),
                             model.apply(variables, tie_models.X))
  del variables['params']['c']
  with pytest.raises(flax_errors.ScopeParamNotFoundError):
    model.apply(variables, tie_models.X)


class SometimesCached(nn.Module):
  @nn.compact
  def __call__(self, x, decode=False):
    a, b = nn.Dense(D, name='a'), nn.Dense(D, name='b')
    if decode:
      cache = self.variable('cache', 'step', jnp.zeros, ())
      x = x + cache.value
    return b(a(x))


@installs_patch
def test_a_tied_collection_is_checked_when_it_is_used():
  """A plain apply that never touches 'cache' raised for the missing one."""
  tied = nn.tie(SometimesCached, {'b': 'a'}, collections=['params', 'cache'])()
  variables = tied.init(jax.random.key(0), X)
  assert set(variables) == {'params'}
  untied = {'params': {'a': variables['params']['a'],
                       'b': variables['params']['a']}}
  assert_close(tied.apply(variables, X), SometimesCached().apply(untied, X))
  with pytest.raises(TieError, match="'cache'"):
    tied.apply(variables, X, decode=True)


# ---------------------------------------------------------------------------
# Values given for a tied target.
# ---------------------------------------------------------------------------


@needs_patch
def test_values_given_for_a_tied_target_are_refused():
  untied = init(Blocks)
  tied = nn.tie(Blocks, {'block_1': 'block_0'})
  with pytest.raises(TieError) as info:
    tied().apply(untied, ONES)
  message = str(info.value)
  assert '/block_1' in message and 'tie_variables' in message


@installs_patch
def test_values_given_for_a_tied_variable_are_refused():
  """They were silently ignored (the source's kernel was used)."""
  untied = SeesKernel().init(jax.random.key(0), X)
  with pytest.raises(TieError, match='Values were given for /b/kernel'):
    nn.tie(SeesKernel, {'b/kernel': 'a/kernel'})().apply(untied, X)


# ---------------------------------------------------------------------------
# Writes that cannot land.
# ---------------------------------------------------------------------------


@needs_patch
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


class WritesHead(nn.Module):

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D, name='embed')(tokens)
    head = HeadWriter(name='head')
    return head(x)


class HeadWriter(nn.Module):

  @nn.compact
  def __call__(self, x):
    kernel = self.param('kernel', nn.initializers.zeros, (D, VOCAB))
    self.put_variable('params', 'kernel', kernel + 1)
    return x @ kernel


@needs_patch
def test_write_through_a_view_is_refused():
  tokens = jnp.array([[1, 2]])
  model = nn.tie(WritesHead, HEAD_TIE)()
  variables = nn.tie(LM, HEAD_TIE)().init(jax.random.key(0), tokens)
  params = {'embed': variables['params']['embed']}
  with pytest.raises(TieError) as info:
    model.apply({'params': params}, tokens, mutable=['params'])
  message = str(info.value)
  assert '/head/kernel' in message and '/embed/embedding' in message
  assert 'read-only view' in message
  assert "'params'" in message


# ---------------------------------------------------------------------------
# The patch, and the documentation.
# ---------------------------------------------------------------------------


@needs_patch
def test_tie_without_the_scope_machinery_says_how_to_install():
  flax_tieext.uninstall()
  try:
    with pytest.raises(TieError) as info:
      init(flax_tieext.linen.tie(Blocks, {'block_1': 'block_0'}))
    assert 'flax_tieext.install()' in str(info.value)
  finally:
    flax_tieext.install()


@installs_patch
def test_tied_class_used_after_uninstall_names_install():
  tied = nn.tie(Pair, {'b': 'a'})()
  variables = tied.init(jax.random.key(0), X)
  flax_tieext.uninstall()
  try:
    with pytest.raises(TieError, match=r'flax_tieext\.install\(\)'):
      tied.apply(variables, X)
  finally:
    flax_tieext.install()
  assert_close(tied.apply(variables, X), Pair(shared=True).apply(variables, X))


@installs_patch
def test_tie_error_points_at_its_own_documentation():
  with pytest.raises(TieError) as info:
    nn.tie(Pair, {'b': 'aa'})().init(jax.random.key(0), X)
  message = str(info.value)
  assert 'help(flax_tieext.TieError)' in message
  assert 'flax.readthedocs.io' not in message
  assert 'Scope machinery' in flax_tieext.TieError.__doc__ or (
      'source' in flax_tieext.TieError.__doc__)


# ---------------------------------------------------------------------------
# Bad input: a TieError naming the argument, at the call (issue 52).
# ---------------------------------------------------------------------------

_TIED_TREE = {'params': {'a': {'w': jnp.ones(2)}}}
_UNTIED_TREE = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.ones(2)}}}


@pytest.mark.parametrize('call, argument', [
    (lambda: flax_tieext.untie_variables(_TIED_TREE, {'b': 'aa'}), '/aa'),
    (lambda: flax_tieext.tie_variables(_TIED_TREE, {'c': 'aa'}), '/aa'),
    (lambda: flax_tieext.tie_variables([1, 2], {'b': 'a'}), 'variables=[1, 2]'),
    (lambda: flax_tieext.tie_variables(None, {'b': 'a'}), 'variables=None'),
    (lambda: flax_tieext.untie_variables(None, {'b': 'a'}), 'variables=None'),
    (lambda: flax_tieext.untie_variables({'params': 1}, {'b': 'a'}),
     'variables='),
    (lambda: flax_tieext.tie_variables(_UNTIED_TREE, None), 'ties'),
    (lambda: flax_tieext.tie_variables(_UNTIED_TREE, {'b': 'a'},
                                       stacks=['b']), "stacks=['b']"),
    (lambda: flax_tieext.untie_variables(_TIED_TREE, {'b': 'a'},
                                         stacks=['b']), "stacks=['b']"),
    (lambda: flax_tieext.untie_variables(_TIED_TREE, {'b': 'a'},
                                         stacks={'b': 0}), "stacks={'b': 0}"),
    (lambda: flax_tieext.tie_variables(_UNTIED_TREE, {'b': 'a'},
                                       collections=123), 'collections=123'),
    (lambda: flax_tieext.untie_variables(_TIED_TREE, {'b': 'a'},
                                         collections=[['params']]),
     "collections=[['params']]"),
    (lambda: flax_tieext.tie_variables(_UNTIED_TREE, {'b': 'a'}, merge='avg'),
     "merge='avg'"),
    (lambda: tie(Pair, {'b': 'a'}, collections=[['params']]),
     "nn.tie(..., collections=[['params']])"),
    (lambda: tie(Pair, {'b': 'a'}, collections=123),
     'nn.tie(..., collections=123)'),
    (lambda: flax_tieext.core.lift.tie(lambda s: s, {'b': 'a'},
                                       collections=123),
     'lift.tie(..., collections=123)'),
])
@needs_patch  # (nn.tie refuses to declare anything without the patch)
def test_bad_input_is_a_tie_error_naming_the_argument(call, argument):
  with pytest.raises(TieError) as e:
    call()
  assert argument in str(e.value), str(e.value)


@needs_patch
@pytest.mark.parametrize('ties, meant', [
    ({'bb': 'a'}, '/b'),
    ({'b/kernl': 'a/kernel'}, '/b/kernel'),
    ({'bb/kernel': 'a/kernel'}, '/b/kernel'),
])
def test_misspelled_target_at_apply_names_the_tie_and_the_nearest(ties, meant):
  variables = Pair().init(jax.random.key(0), X)
  variables = {'params': {'a': variables['params']['a']}}  # b as tied
  with pytest.raises(TieError) as e:
    tie(Pair, ties)().apply(variables, X)
  assert_message_names(str(e.value), f'Did you mean the target {meant}?',
                       'the tie /' + next(iter(ties)))
  assert_says_how_to_fix(str(e.value))


@needs_patch
def test_a_missing_parameter_beside_a_used_target_is_flax_s_own_error():
  # b_1 ran (its name is taken): b_2's missing kernel is no misspelling.
  class Three(nn.Module):
    @nn.compact
    def __call__(self, x):
      for name in ('b_0', 'b_1', 'b_2'):
        x = nn.Dense(D, name=name)(x)
      return x

  variables = Three().init(jax.random.key(0), X)
  del variables['params']['b_1'], variables['params']['b_2']
  with pytest.raises(flax_errors.ScopeParamNotFoundError):
    tie(Three, {'b_1': 'b_0'})().apply(variables, X)
