"""Regression tests for the edges of ``tie`` listed in issue 8.

Each test protects one behaviour that failed away from the paths the other
``test_tie_*`` files walk: mistakes that passed silently once a transform was
involved, errors that were bare or gave false advice, rng streams and init
order, stacks, transforms that are not on a list, and conversion.

Reference semantics are Flax's own: a tie behaves as ONE module instance
called at two places. References are built the way a user shares by hand (one
module instance passed into both places as an attribute, or one variable
passed as an argument) and compared on outputs, stored variables and
gradients; never against numbers from a previous run.

Most cases run with no transform and under ``nn.remat``,
``nn.partitioning.remat`` and ``nn.jit`` applied to the blocks / the target
module (``WRAPS``); a comment says where a wrapper cannot apply.

The conversion tests use only ``flax_tieext.tie_variables`` /
``untie_variables`` on variables of plain Flax models, so they run without the
patch; every test that builds a tied model needs the Scope hooks the patch
installs and is marked ``needs_patch`` (it uses ``flax_tieext.linen.tie``, the
same transform as ``nn.tie``).
"""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_wraps

import flax_tieext
from flax_tieext import TieError

tie = flax_tieext.linen.tie
needs_patch = pytest.mark.needs_patch

D = 4
N = 3

WRAPS = tie_wraps.WRAPS
ALL_WRAPS = sorted(WRAPS)

X = jax.random.normal(jax.random.key(1), (2, D))

assert_close = functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                 atol=1e-6)


def assert_trees_equal(actual, expected):
  assert (jax.tree_util.tree_structure(actual)
          == jax.tree_util.tree_structure(expected))
  jax.tree_util.tree_map(np.testing.assert_array_equal, actual, expected)


def assert_trees_close(actual, expected):
  assert (jax.tree_util.tree_structure(actual)
          == jax.tree_util.tree_structure(expected))
  jax.tree_util.tree_map(assert_close, actual, expected)


def assert_message_names(message, *fragments):
  for fragment in fragments:
    assert fragment in message, f'{fragment!r} missing from: {message}'


def assert_says_how_to_fix(message):
  assert re.search(r'\bfix\b|did you mean|option|instead', message,
                   re.IGNORECASE), f'no advice in: {message}'


# Advice that is false when the tie is declared at the root, outside every
# transform.
FALSE_ADVICE = ('declare the tie at the common ancestor', 'declared inside')


def assert_no_false_advice(message, *phrases):
  for phrase in phrases:
    assert phrase not in message.lower(), (
        f'false advice {phrase!r} in: {message}')


def outputs_and_grads(model, variables, *args, rngs=None):
  """The outputs, and the gradient of a loss on them w.r.t. ``params``."""

  def loss(params):
    y = model.apply({**variables, 'params': params}, *args, rngs=rngs)
    return jnp.sum(jnp.sin(y)), y

  (_, y), grads = jax.value_and_grad(loss, has_aux=True)(variables['params'])
  return y, grads


# ---------------------------------------------------------------------------
# Models shared by several tests.
# ---------------------------------------------------------------------------


class SelfAttention(nn.Module):

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='q')(x))


class Block(nn.Module):
  """A block; ``shared`` is the hand-made reference's one attention module."""

  shared: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    attn = self.shared if self.shared is not None else SelfAttention(
        name='SelfAttention')
    return x + nn.Dense(D, name='ff')(attn(x))


def encoder(block_cls, order=(0, 1), shared=False):
  """Two blocks called in ``order``; ``shared`` passes one module to both."""

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      attn = SelfAttention(name='SelfAttention') if shared else None
      blocks = [block_cls(shared=attn, name=f'block_{i}') for i in range(2)]
      for i in order:
        x = blocks[i](x)
      return x

  return Encoder


def to_shared_layout(params):
  """The tied encoder's params in the shared-module encoder's layout."""
  out = {name: {'ff': p['ff']} for name, p in params.items()}
  out['SelfAttention'] = params['block_0']['SelfAttention']
  return out


# ---------------------------------------------------------------------------
# Silent where it must raise.
# ---------------------------------------------------------------------------


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
# Bare or wrong errors.
# ---------------------------------------------------------------------------


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


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = count.value + 1
    return x + count.value


class CounterLayer(nn.Module):

  @nn.compact
  def __call__(self, c, x):
    return c, Counter(name='counter')(x)


def stack_writing_to_outside_source(kind, wrap):

  class Model(nn.Module):

    @nn.compact
    def __call__(self, xs):
      Counter(name='src')(xs)
      common = dict(variable_axes={'params': 0, 'state': 0},
                    split_rngs={'params': True})
      if kind == 'scan':
        stack = nn.scan(CounterLayer, length=N, **common)
      else:
        stack = nn.vmap(CounterLayer, in_axes=(None, 0), out_axes=(None, 0),
                        **common)
      _, ys = WRAPS[wrap](stack)(name='stack')(None, xs)
      return ys

  return tie(Model, {'stack/counter': 'src'}, collections='state')


@needs_patch
@pytest.mark.parametrize('kind', ['scan', 'vmap'])
@pytest.mark.parametrize('wrap', ALL_WRAPS)  # applied to the whole stack
def test_write_in_stack_to_outside_source_does_not_give_false_advice(
    wrap, kind):
  """The write rightly raises; the tie is already at the common ancestor."""
  model = stack_writing_to_outside_source(kind, wrap)()
  xs = jnp.ones((N, D))
  variables = model.init(jax.random.key(0), xs)
  assert list(variables['state']) == ['src']
  with pytest.raises(TieError) as info:
    model.apply(variables, xs, mutable=['state'])
  message = str(info.value)
  assert_message_names(message, '/stack/counter', '/src', "'state'", kind)
  assert_no_false_advice(message, *FALSE_ADVICE)
  assert_says_how_to_fix(message)


# ---------------------------------------------------------------------------
# Rng streams: a params tie into scan / vmap with split dropout rngs.
# ---------------------------------------------------------------------------


class Drop(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dropout(0.5, deterministic=False)(nn.Dense(D, name='proj')(x))


class DropLayer(nn.Module):
  """One step of the stack; ``shared`` is the reference's one Drop module."""

  shared: nn.Module | None = None

  @nn.compact
  def __call__(self, c, x):
    drop = self.shared if self.shared is not None else Drop(name='drop')
    return c, drop(x)


def dropout_stack(kind, wrap, shared):
  # Upstream accepts the reference (the shared module passed into the stack)
  # with its params broadcast over the stack: scan with
  # variable_broadcast='params', vmap with variable_axes={'params': None}.
  # Both split the 'params' and 'dropout' streams per iteration.
  split = {'params': True, 'dropout': True}
  layer = WRAPS[wrap](DropLayer)
  if kind == 'scan':
    stack = nn.scan(layer, variable_broadcast='params', split_rngs=split,
                    length=N)
  else:
    stack = nn.vmap(layer, in_axes=(None, 0), out_axes=(None, 0),
                    variable_axes={'params': None}, split_rngs=split)

  class Model(nn.Module):

    @nn.compact
    def __call__(self, xs):
      src = Drop(name='src')
      src(xs[0])
      _, ys = stack(shared=src if shared else None, name='stack')(None, xs)
      return ys

  if shared:
    return Model
  return tie(Model, {'stack/drop': 'src'})


@needs_patch
@pytest.mark.parametrize('kind', ['scan', 'vmap'])
@pytest.mark.parametrize('wrap', ALL_WRAPS)  # applied to the stacked layer
def test_params_tie_into_stack_draws_dropout_per_iteration_like_shared_module(
    wrap, kind):
  """Every iteration used to get the same dropout key."""
  xs = jnp.broadcast_to(X, (N, *X.shape))  # the same input every iteration
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  tied = dropout_stack(kind, wrap, shared=False)()
  ref = dropout_stack(kind, wrap, shared=True)()
  variables = tied.init(rngs, xs)
  ref_variables = ref.init(rngs, xs)
  assert set(variables['params']) == {'src'}
  assert_trees_equal(variables, ref_variables)

  # Outputs show the masks. (Gradients through a stack into a source outside
  # it: tests/test_tie_transforms.py::test_source_outside_stack_is_broadcast_*.)
  drop_rngs = {'dropout': jax.random.key(2)}
  ys = tied.apply(variables, xs, rngs=drop_rngs)
  ref_ys = ref.apply(variables, xs, rngs=drop_rngs)
  # The reference draws a mask per iteration (not one for all) ...
  assert not all(np.array_equal(ref_ys[0], y) for y in ref_ys[1:])
  # ... and the tie draws the same ones.
  assert_close(ys, ref_ys)


# ---------------------------------------------------------------------------
# Init order: every tie initializes as its source does when it runs first.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Stacks: one scanned stack tied to another.
# ---------------------------------------------------------------------------


class ScanLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return jnp.tanh(nn.Dense(D, name='d')(x)), None


class TwoStacks(nn.Module):
  wrap: str
  shared: bool = False  # the reference: one scanned instance called twice

  @nn.compact
  def __call__(self, x):
    stack_cls = WRAPS[self.wrap](nn.scan(
        ScanLayer, variable_axes={'params': 0}, split_rngs={'params': True},
        length=N))
    a = stack_cls(name='A')
    b = a if self.shared else stack_cls(name='B')
    x, _ = a(x, None)
    x, _ = b(x, None)
    return x


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)  # applied to both stacks
def test_scanned_stack_tied_to_another_equals_one_stack_called_twice(wrap):
  """It failed in init with a bare ScopeParamShapeError."""
  tied = tie(TwoStacks, {'B': 'A'})(wrap)
  ref = TwoStacks(wrap, shared=True)
  # Under jax.jit, as a training script runs them (and faster to compile).
  variables = jax.jit(tied.init)(jax.random.key(0), X)
  ref_variables = jax.jit(ref.init)(jax.random.key(0), X)
  assert set(variables['params']) == {'A'}
  assert variables['params']['A']['d']['kernel'].shape == (N, D, D)
  assert_trees_equal(variables, ref_variables)
  y, g = jax.jit(functools.partial(outputs_and_grads, tied))(variables, X)
  ry, rg = jax.jit(functools.partial(outputs_and_grads, ref))(variables, X)
  assert_close(y, ry)
  assert_trees_close(g, rg)


# ---------------------------------------------------------------------------
# Transforms not on a list: nn.fold_rngs (a Linen class transform in this
# Flax, lifted through lift.pack like nn.remat).
# ---------------------------------------------------------------------------


@needs_patch
@pytest.mark.skipif(not hasattr(nn, 'fold_rngs'),
                    reason='this Flax has no nn.fold_rngs')
@pytest.mark.parametrize('wrap', ALL_WRAPS)  # applied around nn.fold_rngs
def test_target_in_fold_rngs_running_before_its_source_works_like_remat(wrap):
  """It raised TieError; the same model under nn.remat worked."""
  block_cls = WRAPS[wrap](nn.fold_rngs(Block))
  ties = {'block_1/SelfAttention': 'block_0/SelfAttention'}
  tied = tie(encoder(block_cls, order=(1, 0)), ties)()
  ref = encoder(block_cls, order=(1, 0), shared=True)()
  variables = tied.init(jax.random.key(0), X)
  params = variables['params']
  assert set(params['block_1']) == {'ff'}, 'the target was stored'
  assert set(params['block_0']) == {'ff', 'SelfAttention'}
  # nn.fold_rngs folds the rng path into the key at its boundary, as nn.jit
  # does, so init values are compared in the shared layout's structure only.
  ref_params = ref.init(jax.random.key(0), X)['params']
  assert (jax.tree_util.tree_structure(to_shared_layout(params))
          == jax.tree_util.tree_structure(ref_params))
  y, g = outputs_and_grads(tied, variables, X)
  ry, rg = outputs_and_grads(ref, {'params': to_shared_layout(params)}, X)
  assert_close(y, ry)
  assert_trees_close(to_shared_layout(g), rg)


# ---------------------------------------------------------------------------
# Conversion: tie_variables / untie_variables (no patch needed). They act on
# variable dicts, not on a running model: no transform applies.
# ---------------------------------------------------------------------------


class WithBatchNorm(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name='b')(nn.Dense(D, name='a')(x))
    return nn.BatchNorm(use_running_average=False, name='bn')(x)


@pytest.mark.parametrize('collections', [['params', 'batch_stats'], True],
                         ids=['params+batch_stats', 'all'])
def test_conversion_skips_collections_holding_neither_path(collections):
  """batch_stats holds neither a nor b: it used to fail "source is missing"."""
  untied = WithBatchNorm().init(jax.random.key(0), X)
  # The untied model with b made equal to a, as a user ties it by hand ...
  untied['params']['b'] = untied['params']['a']
  # ... and the layout the tied model stores: without b.
  tied = {col: dict(tree) for col, tree in untied.items()}
  del tied['params']['b']
  ties = {'b': 'a'}
  assert_trees_equal(
      flax_tieext.tie_variables(untied, ties, collections=collections), tied)
  assert_trees_equal(
      flax_tieext.untie_variables(tied, ties, collections=collections),
      untied)
  assert_trees_equal(
      flax_tieext.tie_variables(
          flax_tieext.untie_variables(tied, ties, collections=collections),
          ties, collections=collections),
      tied)


VOCAB = 5


class PartitionedLM(nn.Module):
  """An untied LM whose weights carry partitioning names, as a user writes it.

  The head's kernel is (D, VOCAB): its names are the embedding's, swapped.
  """

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D, name='embed', embedding_init=nn.with_partitioning(
        nn.initializers.normal(1.0), ('vocab', 'embed')))(tokens)
    x = nn.Dense(D, name='mid', kernel_init=nn.with_partitioning(
        nn.initializers.lecun_normal(), ('embed', 'mlp')))(x)
    return nn.Dense(VOCAB, use_bias=False, name='head',
                    kernel_init=nn.with_partitioning(
                        nn.initializers.lecun_normal(),
                        ('embed', 'vocab')))(x)


HEAD_TIE = {'head/kernel': ('embed/embedding', jnp.transpose)}


def partitioned_variables():
  """The untied variables, head = embedding transposed, and the tied ones."""
  untied = PartitionedLM().init(jax.random.key(0), jnp.array([[1]]))
  untied = jax.tree_util.tree_map(
      lambda a: a, untied, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  params = untied['params']
  # The user makes the head hold the transposed embedding, keeping the head's
  # own names ('embed', 'vocab').
  params['head']['kernel'] = params['head']['kernel'].replace_boxed(
      params['embed']['embedding'].unbox().T)
  tied = {'params': {k: v for k, v in params.items() if k != 'head'}}
  return untied, tied


def assert_partitioned_like(actual, expected):
  """Same values, and the same partitioning names on every boxed value."""
  assert_trees_equal(nn.unbox(actual), nn.unbox(expected))
  assert nn.get_partition_spec(actual) == nn.get_partition_spec(expected)


def assert_refusal_says_why(error):
  assert_message_names(str(error), '/head/kernel', '/embed/embedding',
                       "'params'")
  assert re.search(r'partition|names', str(error), re.IGNORECASE), str(error)


def test_untie_variables_through_a_view_swaps_partitioning_names():
  """The view transposes the value: the names must follow, or untie refuses."""
  untied, tied = partitioned_variables()
  try:
    result = flax_tieext.untie_variables(tied, HEAD_TIE)
  except TieError as e:  # refusing is right, if it says why
    assert_refusal_says_why(e)
    return
  assert_partitioned_like(result, untied)


def test_tie_variables_through_a_view_accepts_correctly_named_target():
  """The untied head carries its own, correct names; tying checks values."""
  untied, tied = partitioned_variables()
  try:
    result = flax_tieext.tie_variables(untied, HEAD_TIE)
  except TieError as e:
    assert_refusal_says_why(e)
    return
  assert_partitioned_like(result, tied)


def test_untie_variables_never_boxes_names_that_do_not_fit_the_value():
  """A view that drops an axis: the names cannot follow, so none may be wrong.

  Either each boxed value carries one name per axis, or untie refuses.
  """
  _, tied = partitioned_variables()
  ties = {'head/kernel': ('embed/embedding', jnp.ravel)}
  try:
    result = flax_tieext.untie_variables(tied, ties)
  except TieError as e:
    assert_refusal_says_why(e)
    return
  np.testing.assert_array_equal(
      nn.unbox(result)['params']['head']['kernel'],
      jnp.ravel(nn.unbox(tied)['params']['embed']['embedding']))
  is_box = lambda x: isinstance(x, nn.Partitioned)
  for box in jax.tree_util.tree_leaves(result, is_leaf=is_box):
    if is_box(box):
      assert len(box.names) == box.value.ndim, box
