"""What ``init`` stores: each source once, as its own init gives it, checked.

A tie behaves as one module instance called at two places, so ``init`` stores
only the source, with the values the source's own init gives whichever use runs
first (a target that runs first initializes a copy from its source's rng
streams, checked and dropped when the declaring call returns), and
``init_with_output`` returns what ``apply`` of those variables returns. Every
use is checked against the source at init: a target of another shape or dtype
(directly, through a view, under every transform and in both orders), a tied
collection the tied modules lack, a method that never runs the source, a source
outside a stack that only the stack would create. Each refusal is a
``TieError`` naming both paths.

Most cases run with no transform and under ``nn.remat``,
``nn.partitioning.remat`` and ``nn.jit`` (``tie_wraps.WRAPS``), against the
model that shares by hand (one module instance at both places) or the untied
model where the source runs first.
"""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_blocks
import tie_models
import tie_wraps
from tie_blocks import D, X, Block, Pair, TwoWays, encoder
from tie_models import (Chain, Leaf, Linear, assert_close, assert_message_names,
                        assert_says_how_to_fix, assert_trees,
                        assert_trees_close, assert_trees_equal, error, init,
                        outputs_and_grads)

import flax_tieext
from flax_tieext import TieError

tie = flax_tieext.linen.tie
needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch

WRAPS = tie_wraps.WRAPS
ALL_WRAPS = sorted(WRAPS)


# ---------------------------------------------------------------------------
# Init order: every tie initializes as its source does when it runs first.
# ---------------------------------------------------------------------------


class OwnParamChild(nn.Module):
  """Uses a parameter ``w``; the reference passes the parent's ``w`` in."""

  @nn.compact
  def __call__(self, x, w=None):
    if w is None:
      w = self.param('w', nn.initializers.lecun_normal(), (D, D))
    return jnp.tanh(x @ w)


class OwnParamModel(nn.Module):
  wrap: str
  child_first: bool
  by_hand: bool = False  # the reference: the parent's w passed to the child

  @nn.compact
  def __call__(self, x):
    child = WRAPS[self.wrap](OwnParamChild)(name='child')
    make_w = lambda: self.param('w', nn.initializers.lecun_normal(), (D, D))
    if self.by_hand:  # w is created first, then passed to the child
      w = make_w()
      use_child = lambda h: child(h, w)
    else:
      w, use_child = None, child
    if self.child_first:
      x = use_child(x)
    w = make_w() if w is None else w
    x = jnp.tanh(x @ w)
    if not self.child_first:
      x = use_child(x)
    return x


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_variable_tie_to_a_param_of_the_declaring_module_target_first(wrap):
  """{'child/w': 'w'} with the child running first.

  It raised "a write ... cannot land ... declare the tie at the common
  ancestor" (under nn.jit: "declared inside the jit"): both false, the tie is
  declared at the root. It works, whichever use runs first, as the reference
  does.
  """
  tied = tie(OwnParamModel, {'child/w': 'w'})
  source_first = tied(wrap, child_first=False).init(jax.random.key(0), X)
  variables = tied(wrap, child_first=True).init(jax.random.key(0), X)
  assert set(variables['params']) == {'w'}, 'the target was stored'
  ref = OwnParamModel(wrap, child_first=True, by_hand=True)
  ref_variables = ref.init(jax.random.key(0), X)
  assert set(ref_variables['params']) == {'w'}
  # The source initializes w as it does when it runs first.
  assert_trees_equal(variables, source_first)
  assert_trees_equal(variables, ref_variables)
  y, g = outputs_and_grads(tied(wrap, child_first=True), variables, X)
  ry, rg = outputs_and_grads(ref, variables, X)
  assert_close(y, ry)
  assert_trees_close(g, rg)


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_variable_level_params_tie_init_does_not_depend_on_call_order(wrap):
  """b1 running before b0 used to store another kernel."""
  ties = {'block_1/SelfAttention/q/kernel': 'block_0/SelfAttention/q/kernel'}
  block_cls = WRAPS[wrap](Block)
  untied = encoder(block_cls)().init(jax.random.key(0), X)['params']
  # What the tied model must store: the untied model's, where the source ran
  # first, without the target.
  expected = jax.tree_util.tree_map(lambda a: a, untied)
  del expected['block_1']['SelfAttention']['q']['kernel']
  for order in [(0, 1), (1, 0)]:
    params = tie(encoder(block_cls, order), ties)().init(
        jax.random.key(0), X)['params']
    assert_trees_equal(params, expected)


class RandomMask(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable(
        'graph', 'mask',
        lambda: jax.random.uniform(self.make_rng('params'), x.shape[-1:]))
    return nn.Dense(D, name='d')(x * mask.value)


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_graph_tie_initialized_from_rngs_does_not_depend_on_call_order(wrap):
  """A graph variable drawn from make_rng('params') depended on call order."""
  block_cls = WRAPS[wrap](RandomMask)

  def model(order):

    class Model(nn.Module):

      @nn.compact
      def __call__(self, x):
        blocks = [block_cls(name=f'block_{i}') for i in range(2)]
        for i in order:
          x = blocks[i](x)
        return x

    return Model

  # The source's value is the one the source module draws when it runs first,
  # as in the untied model.
  untied = model((0, 1))().init(jax.random.key(0), X)
  forward = tie(model((0, 1)), {'block_1': 'block_0'}, collections='graph')(
  ).init(jax.random.key(0), X)
  backward = tie(model((1, 0)), {'block_1': 'block_0'}, collections='graph')(
  ).init(jax.random.key(0), X)
  assert_trees_equal(forward['graph'], {'block_0': untied['graph']['block_0']})
  assert_trees_equal(forward['params']['block_0'],
                     untied['params']['block_0'])
  assert_trees_equal(backward, forward)


@installs_patch
@pytest.mark.parametrize('target_first', [False, True],
                         ids=['source_first', 'target_first'])
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_init_with_output_equals_apply(wrap, target_first):
  """init's output used the target's throw-away parameters."""
  tied = nn.tie(TwoWays, {'b': 'a'})(target_first, wrap)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  assert list(variables['params']) == ['a']
  assert_close(y, tied.apply(variables, X))
  # The stored values are the untied model's source values.
  untied = TwoWays(target_first, wrap).init(jax.random.key(0), X)
  assert_trees(np.testing.assert_array_equal, variables['params']['a'],
               untied['params']['a'])


class DrawnMasked(nn.Module):
  """A Dense behind a mask of another collection, drawn from 'params'."""

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jax.random.uniform(
        self.make_rng('params'), (D,)))
    return nn.Dense(D, name='dense')(x * mask.value)


class BranchFirst(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x):
    a, b = DrawnMasked(name='a'), DrawnMasked(name='b')
    body = lambda m, h: m(jnp.tanh(m(h)))
    if self.kind == 'cond':
      x = nn.cond(False, body, body, b, x)
    else:
      x = nn.switch(2, [body, body, body], b, x)
    return a(x)


@installs_patch
@pytest.mark.parametrize('kind', ['cond', 'switch'])
def test_target_in_a_branch_before_its_source_draws_the_source_values(kind):
  """Every branch but the first drew its copy from an advanced counter."""
  tied = nn.tie(BranchFirst, {'b': 'a'}, collections=['params', 'graph'])(kind)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  assert_close(y, tied.apply(variables, X))


# The target's own draws are not the source's where the source restarts its
# streams (nn.jit, nn.fold_rngs), for a single tied variable (no counterpart
# draw) and for a tie of another collection than params (no shared streams).
FIRST_WRAPS = {**WRAPS}
if hasattr(nn, 'fold_rngs'):  # Flax >= 0.10
  FIRST_WRAPS['fold_rngs'] = nn.fold_rngs
FIRST_TIES = {
    'module': ({'b': 'a'}, ('params', 'graph')),
    'variable': ({'b/dense/kernel': 'a/dense/kernel'}, 'params'),
    'graph': ({'b': 'a'}, 'graph'),
}


class TargetFirst(nn.Module):
  """``b`` runs before ``a``, each in the transform drawn for it."""
  source_wrap: str
  target_wrap: str

  @nn.compact
  def __call__(self, x):
    b = FIRST_WRAPS[self.target_wrap](DrawnMasked)(name='b')
    a = FIRST_WRAPS[self.source_wrap](DrawnMasked)(name='a')
    y = b(x)
    return a(x) + y


@installs_patch
@pytest.mark.end_to_end  # 46 pairs of transforms: left to --end-to-end and CI
@pytest.mark.parametrize('kind', sorted(FIRST_TIES))
@pytest.mark.parametrize('target_wrap', ['none', 'remat', 'jit'])
@pytest.mark.parametrize('source_wrap', sorted(FIRST_WRAPS))
def test_a_target_that_runs_first_gives_init_the_output_of_apply(
    source_wrap, target_wrap, kind):
  """init's output used the target's own draws, not what init stores."""
  ties, collections = FIRST_TIES[kind]
  tied = nn.tie(TargetFirst, ties, collections=collections)(
      source_wrap, target_wrap)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  assert_close(y, tied.apply(variables, X))
  # What init stores is the source's own init, as before.
  untied = TargetFirst(source_wrap, target_wrap).init(jax.random.key(0), X)
  for col in variables:
    assert_trees(np.testing.assert_array_equal, variables[col]['a'],
                 untied[col]['a'])


@installs_patch
@pytest.mark.parametrize('source_wrap', ['jit', 'none'])
def test_a_target_that_runs_first_under_jax_jit_gives_the_output_of_apply(
    source_wrap):
  """Traced values cannot be compared: the order of first writes decides."""
  tied = nn.tie(TargetFirst, {'b': 'a'}, collections=['params', 'graph'])(
      source_wrap, 'remat')
  for _ in range(2):  # the second init replays nn.jit's cached trace
    y, variables = jax.jit(tied.init_with_output)(jax.random.key(0), X)
    assert_close(y, tied.apply(variables, X))


@installs_patch
@pytest.mark.parametrize('target_first', [False, True],
                         ids=['source_first', 'target_first'])
def test_init_runs_again_only_where_a_target_ran_first_with_other_values(
    target_first):
  """A target after its source, or one that draws alike, costs no second run."""
  calls = []

  class Counted(nn.Module):
    """DrawnMasked that counts its calls in Python (a trace runs it once)."""

    @nn.compact
    def __call__(self, x):
      calls.append(self.name)
      return DrawnMasked(name='inner')(x)

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      a, b = Counted(name='a'), Counted(name='b')
      return a(b(x)) if target_first else b(a(x))

  tied = nn.tie(Model, {'b': 'a'}, collections='graph')()
  y, variables = tied.init_with_output(jax.random.key(0), X)
  # A graph tie shares no rng streams: a target that ran first drew another
  # mask, and init ran once more, as apply runs.
  assert calls == (['b', 'a'] * 2 if target_first else ['a', 'b'])
  assert_close(y, tied.apply(variables, X))


class Counter(nn.Module):
  """Counts its calls in ``stats`` while initializing too (order-sensitive)."""

  @nn.compact
  def __call__(self, x):
    count = self.variable('stats', 'count', jnp.zeros, (), jnp.int32)
    count.value = count.value * 2 + 1
    return nn.Dense(D, name='dense')(x) * count.value


class TwoUses(nn.Module):
  """``leaf`` at ``a`` and ``b``, in call order; or one module called twice."""
  leaf: type[nn.Module]
  wrap: str
  target_first: bool | None  # None: one module called twice

  @nn.compact
  def __call__(self, x):
    a = WRAPS[self.wrap](self.leaf)(name='a')
    if self.target_first is None:
      return a(x), a(x)
    b = WRAPS[self.wrap](self.leaf)(name='b')
    return (b(x), a(x)) if self.target_first else (a(x), b(x))


@installs_patch
@pytest.mark.parametrize('ties', [{'b': 'a'}, {'b/count': 'a/count'}],
                         ids=['module', 'variable'])
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_an_init_time_write_lands_in_the_source_or_raises(wrap, ties):
  """A write before the source exists went to the dropped copy, silently."""
  tied = nn.tie(TwoUses, ties, collections=['params', 'stats'])
  variables = tied(Counter, wrap, False).init(jax.random.key(0), X)
  want = TwoUses(Counter, wrap, None).init(jax.random.key(0), X)
  assert_trees_equal(variables['stats']['a'], want['stats']['a'])  # 3
  assert 'count' not in variables['stats'].get('b', {})
  with pytest.raises(TieError) as info:
    tied(Counter, wrap, True).init(jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, '/b/count', '/a/count', "'stats'",
                       'before its source', 'is_initializing')
  assert_says_how_to_fix(message)


class Sower(nn.Module):
  """Sows its output into ``intermediates``, summed or (Flax's default) kept."""
  summed: bool = False

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(D, name='dense')(x)
    if self.summed:
      self.sow('intermediates', 'h', y, reduce_fn=lambda a, b: a + b,
               init_fn=lambda: 0)
    else:
      self.sow('intermediates', 'h', y)
    return y


SOWN = {  # (ties, init's keyword arguments, the first variable the target sows)
    'sow': ({'b': 'a'}, {'mutable': True}, '/b/h'),
    'sow_summed': ({'b': 'a'}, {'mutable': True}, '/b/h'),
    'sow_variable': ({'b/h': 'a/h', 'b/dense': 'a/dense'}, {'mutable': True},
                     '/b/h'),
    'capture_intermediates': ({'b': 'a'}, {'capture_intermediates': True},
                              '/b/dense/__call__'),
}


def _sower(case):
  return functools.partial(Sower, summed=case == 'sow_summed')


@installs_patch
@pytest.mark.parametrize('case', sorted(SOWN))
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_a_sow_before_the_source_exists_is_refused_as_a_write(wrap, case):
  """It raised "Shape or dtype mismatch ... (2, 4):float32 but (2, 4):float32,
  (2, 4):float32 ... Use a view_fn" (equal shapes): init ran again with the
  source's values seeded at the target, which the target's sow appended to;
  where both uses sowed equal values there was no second run, and init kept
  one value where one shared module keeps two, silently (summed: half the
  total). A sow writes the call's values, which the copy of a target that
  runs before its source cannot keep: refused, as any such write.
  """
  ties, kwargs, target = SOWN[case]
  tied = nn.tie(TwoUses, ties, collections=['params', 'intermediates'])
  with pytest.raises(TieError) as info:
    tied(_sower(case), wrap, True).init(jax.random.key(0), X, **kwargs)
  message = str(info.value)
  assert_message_names(message, target, target.replace('/b/', '/a/'),
                       "'intermediates'", 'before its source')
  assert 'mismatch' not in message and 'view_fn' not in message
  assert_says_how_to_fix(message)


# A transform writes back the tied name of a variable tie inside it as the
# target's own, checked against the source before the source's own write-back.
_WRITTEN_BACK = pytest.mark.xfail(strict=True, raises=TieError, reason=(
    "a variable tie's write-back from a transform (left open in issue 61)"))


@installs_patch
@pytest.mark.parametrize('wrap,case', [
    pytest.param(wrap, case, marks=[_WRITTEN_BACK] * (
        case == 'sow_variable' and wrap != 'none'))
    for wrap in sorted(WRAPS) for case in sorted(SOWN)])
def test_a_sow_after_the_source_lands_in_it_as_one_shared_modules(wrap, case):
  """The source first: both uses' values are kept in the source, in call
  order, as one module called twice keeps them (a sow through a variable tie
  raised "Shape or dtype mismatch": its appended tuple was checked as a
  value of the stored one's shape)."""
  ties, kwargs, _ = SOWN[case]
  tied = nn.tie(TwoUses, ties, collections=['params', 'intermediates'])
  y, variables = tied(_sower(case), wrap, False).init_with_output(
      jax.random.key(0), X, **kwargs)
  want, shared = TwoUses(_sower(case), wrap, None).init_with_output(
      jax.random.key(0), X, **kwargs)
  assert_trees_close(variables['intermediates']['a'],
                     shared['intermediates']['a'])
  assert_trees_close(y, want)


class RandomlyMasked(nn.Module):
  """``x`` times a ``graph`` mask drawn from ``make_rng('params')``."""

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jax.random.uniform(
        self.make_rng('params'), (D,)))
    return x * mask.value


class Totalled(nn.Module):
  """Two uses, then a ``stats`` total of both outputs, written after them."""
  wrap: str
  target_first: bool | None  # None: one module called twice, a's place first

  @nn.compact
  def __call__(self, x):
    cls = WRAPS[self.wrap](RandomlyMasked)
    a = cls(name='a')
    b = a if self.target_first is None else cls(name='b')
    if self.target_first is False:
      ya, yb = a(x), b(x)
    else:
      yb = b(x)
      ya = a(x)
    total = self.variable('stats', 'total', jnp.zeros, ())
    total.value += ya.sum() + yb.sum()
    return ya + yb


@installs_patch
@pytest.mark.parametrize('target_first', [False, True],
                         ids=['source_first', 'target_first'])
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_state_that_init_computes_from_a_tied_use_is_one_shared_modules(
    wrap, target_first):
  """Target first, the stats total came from the target's throw-away mask."""
  tied = nn.tie(Totalled, {'b': 'a'}, collections='graph')(wrap, target_first)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  want, shared = Totalled(wrap, None).init_with_output(jax.random.key(0), X)
  assert_trees_equal(variables['graph'], shared['graph'])
  assert_trees_close(variables['stats'], shared['stats'])
  assert_close(y, want)
  assert_close(y, tied.apply(variables, X, mutable='stats')[0])


class DropoutAtInit(nn.Module):
  """Dropout active while initializing (``deterministic=False`` at init)."""

  @nn.compact
  def __call__(self, x):
    return nn.Dropout(0.5, deterministic=False)(nn.Dense(D, name='dense')(x))


@pytest.mark.end_to_end  # every transform, both orders: left to --end-to-end and CI
@installs_patch
@pytest.mark.parametrize('target_first', [False, True],
                         ids=['source_first', 'target_first'])
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_dropout_while_initializing_draws_as_one_module_called_twice(
    wrap, target_first):
  """The target's counters started afresh for every stream: its mask at init
  repeated its source's first one (under nn.jit, target first, the trace's
  inner scope lost its source's counters)."""
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  tied = nn.tie(TwoUses, {'b': 'a'})(DropoutAtInit, wrap, target_first)
  y, variables = tied.init_with_output(rngs, X)
  want, shared = TwoUses(DropoutAtInit, wrap, None).init_with_output(rngs, X)
  assert_trees_equal(variables['params']['a'], shared['params']['a'])
  for first_or_second, expected in zip(y, want):  # in call order
    assert_close(first_or_second, expected)


@needs_patch
@pytest.mark.parametrize('target_first', [False, pytest.param(True, marks=pytest.mark.xfail(
    not tie_blocks.LIFTS_RNGS_WITHOUT_PATH, strict=True,
    reason='Flax 0.8: a target run first inside nn.jit still draws other masks'
           ' than one shared instance (issue 61, defect 2, open there)'))],
                         ids=['source_first', 'target_first'])
@pytest.mark.parametrize('wrap', tie_blocks.RNG_LIFTING_WRAPS)
def test_a_target_in_a_jitted_or_folded_block_draws_at_init_as_at_apply(
    wrap, target_first):
  """Target first, the source not stored yet was not lifted: the target drew
  its source's streams as they are outside the block, where apply, the
  source lifted, draws them as nn.jit and nn.fold_rngs lift a module passed
  in (without their path): init_with_output's output was not apply's. Under
  nn.jit a second init (another seed) replayed the first one's trace, which
  held the first seed's streams as constants."""
  block = getattr(nn, wrap)(tie_blocks.DropBlock)  # one class for both inits

  class Model(nn.Module):
    shared: bool

    @nn.compact
    def __call__(self, x):
      src = tie_blocks.Dropped(name='src')
      use = block(src if self.shared else None, name='block')
      if target_first:
        return use(x), src(x)
      return src(x), use(x)

  tied, reference = nn.tie(Model, {'block/use': 'src'})(False), Model(True)
  for seed in range(2):
    rngs = {'params': jax.random.key(seed), 'dropout': jax.random.key(seed + 7)}
    y, variables = tied.init_with_output(rngs, X)
    want, expected = reference.init_with_output(rngs, X)
    assert_trees_close(reference.apply(expected, X, rngs=rngs), want)
    assert_trees_close(tied.apply(variables, X, rngs=rngs), y)
    # What one shared instance computes from the stored values, which are
    # the source's own, whichever use runs first.
    assert_trees_close(y, reference.apply(variables, X, rngs=rngs))


# ---------------------------------------------------------------------------
# Shape and dtype: a use that does not fit its source is refused.
# ---------------------------------------------------------------------------


@needs_patch
def test_shape_mismatch_names_both_paths():
  class Unequal(nn.Module):

    @nn.compact
    def __call__(self, x):
      return Linear(4, name='wide')(x), Linear(5, name='wider')(x)

  with pytest.raises(TieError) as info:
    init(nn.tie(Unequal, {'wider': 'wide'}))
  message = str(info.value)
  assert '/wider' in message and '/wide' in message
  assert 'shape' in message.lower()


class Unequal(nn.Module):
  wrap: str
  target_first: bool

  @nn.compact
  def __call__(self, x):
    cls = WRAPS[self.wrap](nn.Dense)
    wide, wider = cls(4, name='wide'), cls(5, name='wider')
    if self.target_first:
      return wider(x), wide(x)
    return wide(x), wider(x)


@pytest.mark.end_to_end  # every transform, both orders: left to --end-to-end and CI
@needs_patch
@pytest.mark.parametrize('target_first', [False, True],
                         ids=['source_first', 'target_first'])
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_shape_mismatch_is_a_tie_error_under_every_transform_and_order(
    wrap, target_first):
  """Under remat, or target first, it was a bare ScopeParamShapeError."""
  model = tie(Unequal, {'wider': 'wide'})(wrap, target_first)
  with pytest.raises(TieError, match='shape') as info:
    model.init(jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, '/wider', '/wide', "'params'")
  # The two shapes of one tied variable: the kernels or the biases.
  assert (f'({D}, 4)' in message and f'({D}, 5)' in message
          or '(4,)' in message and '(5,)' in message), message


@needs_patch
@pytest.mark.parametrize('remat', [False, True], ids=['plain', 'remat'])
def test_a_target_of_another_dtype_is_refused(remat):
  leaf = nn.remat(Leaf) if remat else Leaf
  classes = (('c', lambda name: leaf(param_dtype=jnp.bfloat16, name=name)),)
  if remat:
    classes += (('a', nn.remat(Leaf)),)
  message = error(nn.tie(Chain, {'c': 'a'})(classes=classes))
  assert 'Shape or dtype mismatch in the tie /c/d/kernel -> /a/d/kernel' in message
  assert '(3, 3):float32, but /c/d/kernel has (3, 3):bfloat16' in message


@needs_patch
def test_a_view_that_changes_the_dtype_is_refused():
  to_bf16 = lambda k: k.astype(jnp.bfloat16)
  message = error(nn.tie(Chain, {'c/d/kernel': ('a/d/kernel', to_bf16)})())
  assert 'Shape or dtype mismatch' in message
  assert 'the source /a/d/kernel has (3, 3):bfloat16' in message
  assert '/c/d/kernel has (3, 3):float32' in message


@needs_patch
def test_a_model_cast_for_inference_still_applies():
  # At apply, as in Flax, dtypes are the caller's.
  model = nn.tie(Chain, {'b': 'a', 'c': 'a'})()
  variables = model.init(jax.random.key(0), tie_models.X)
  cast = jax.tree_util.tree_map(lambda v: v.astype(jnp.bfloat16), variables)
  untied = {'params': {n: cast['params']['a'] for n in 'abc'}}
  np.testing.assert_allclose(model.apply(cast, tie_models.X),
                             Chain().apply(untied, tie_models.X))


# ---------------------------------------------------------------------------
# Collections: a tie of a collection the tied modules lack.
# ---------------------------------------------------------------------------


class Masked(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return nn.Dense(D, name='d')(x * mask.value)


class Plain(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name='d')(x)


def two_blocks(block_cls, other_cls=None):

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      if other_cls is not None:
        x = other_cls(name='other')(x)
      return block_cls(name='block_1')(block_cls(name='block_0')(x))

  return Model


# (collection tied, block, module elsewhere, a name the message must offer)
MISSING_COLLECTIONS = {
    # A typo: the model has 'graph'.
    'typo': ('grpah', Masked, None, "'graph'"),
    # No module of the model has the collection.
    'absent': ('batch_stats', Plain, None, None),
    # The model has 'graph' elsewhere, but neither tied module holds any: the
    # tie ties nothing at all, which is as silent a mistake as a typo.
    'not_in_tied_modules': ('graph', Plain, Masked, None),
}


@needs_patch
@pytest.mark.parametrize('case', sorted(MISSING_COLLECTIONS))
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_tie_of_a_collection_the_tied_modules_lack_raises_at_init(wrap, case):
  """It used to store the target untied; only a later apply raised."""
  col, block, other, nearest = MISSING_COLLECTIONS[case]
  model = tie(two_blocks(WRAPS[wrap](block), other),
              {'block_1': 'block_0'}, collections=col)
  with pytest.raises(TieError, match=re.escape(repr(col))) as info:
    model().init(jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, '/block_1', '/block_0')
  if nearest:
    assert_message_names(message, nearest)
  assert_says_how_to_fix(message)


# ---------------------------------------------------------------------------
# A source that init would never create.
# ---------------------------------------------------------------------------


@installs_patch
def test_init_whose_method_never_runs_the_source_says_so():
  tied = nn.tie(Pair, {'b': 'a'})()
  with pytest.raises(TieError) as info:
    tied.init(jax.random.key(0), X, method=lambda m, x: m.b(x))
  message = str(info.value)
  assert '/a' in message and 'also runs the source' in message
  assert '(a misspelt path, or a source that this init does not call)' in message


class Codec(nn.Module):
  """An encoder and a decoder; ``shared`` makes them one instance."""
  shared: bool = False

  def setup(self):
    self.enc = nn.Dense(D)
    self.dec = self.enc if self.shared else nn.Dense(D)

  def encode(self, x):
    return jnp.tanh(self.enc(x))

  def decode(self, x):
    return self.dec(x)


def _round_trip(module, x):
  return module.decode(module.encode(x))


class _Caller:
  """A bound method that is no Module's: Flax calls it with the module."""

  def round_trip(self, module, x):
    return _round_trip(module, x)


@installs_patch
@pytest.mark.parametrize('method', [
    lambda m, x: m.decode(m.encode(x)), _round_trip, _Caller().round_trip],
                         ids=['lambda', 'function', 'bound_method'])
def test_init_method_running_both_ends_is_checked_when_it_returns(method):
  """A callable ``method=`` running the target after the source: the check
  ran when ``encode`` returned, before ``decode`` ran the target, and raised
  "the target ... does not exist" (a named method doing the same worked)."""
  y, variables = nn.tie(Codec, {'dec': 'enc'})().init_with_output(
      jax.random.key(0), X, method=method)
  want, shared = Codec(shared=True).init_with_output(
      jax.random.key(0), X, method=method)
  assert_trees_equal(variables, shared)
  assert_close(y, want)


class ScanLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return Linear(name='leaf')(x), None


@needs_patch
def test_target_in_scan_cannot_initialize_a_source_outside_it():
  """Broadcast is read-only: the source must exist before the stack runs."""

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      stack = nn.scan(ScanLayer, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=2)
      x, _ = stack(name='stack')(x, None)
      return Linear(name='src')(x)  # the source runs after the stack

  with pytest.raises(TieError) as info:
    init(nn.tie(Model, {'stack/leaf': 'src'}))
  message = str(info.value)
  assert 'cannot land' in message and 'scan' in message
  assert '/stack/leaf' in message and '/src' in message
  assert 'read-only (broadcast)' in message


class _ReadsMask(nn.Module):

  @nn.compact
  def __call__(self, x):
    return x @ self.variable('graph', 'mask', lambda: jnp.eye(x.shape[-1])).value


class _JittedReaders(nn.Module):

  @nn.compact
  def __call__(self, x):
    for i in range(3):
      x = nn.jit(_ReadsMask)(name=f'a{i}')(x)
    return x


@installs_patch
@pytest.mark.parametrize('ties', [{'a1': 'a0', 'a2': 'a0'},
                                  {'a1/mask': 'a0/mask'}, {'a2': 'a1'}],
                         ids=['modules', 'variable', 'middle'])
def test_a_second_init_replaying_nn_jit_traces_stores_what_the_first_did(ties):
  """``graph`` targets inside ``nn.jit`` that only read: the trace is replayed.

  The second ``init`` in the process reuses the jitted traces of the first
  (no Python runs inside them); the end-of-init checks still find every tie
  used, and store what the first stored, as one shared module would.
  """
  tied = nn.tie(_JittedReaders, ties, collections='graph')()
  first = tied.init(jax.random.key(0), X)
  second = tied.init(jax.random.key(1), X)
  jax.tree_util.tree_map(np.testing.assert_array_equal, first, second)
  def source(name):  # the module whose mask ``name`` reads
    return ties.get(name) or ties.get(f'{name}/mask', name).split('/')[0]

  assert set(first['graph']) == {n for n in ('a0', 'a1', 'a2')
                                 if source(n) == n}
  by_hand = {n: first['graph'][source(n)] for n in ('a0', 'a1', 'a2')}
  assert_close(tied.apply(second, X),
               _JittedReaders().apply({'graph': by_hand}, X))
