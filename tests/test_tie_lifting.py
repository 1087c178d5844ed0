"""Ties through Flax's lifted transforms, against Flax's own sharing.

Reference semantics: a tie behaves as one module instance called at two
places. The reference model is written the way a Flax user shares a module by
hand: one ``Attn`` instance created in the encoder and passed into every block
as an attribute. The tied model gives every block its own ``attn`` path and
ties ``block_i/attn`` to ``block_0/attn``. With the same parameter values, both
must compute the same outputs and gradients, under every transform and in
both nesting orders; the same holds for ``cond``, ``switch``, ``while_loop``,
``vjp``, ``nn.fold_rngs`` (a transform on no list) and one scanned stack tied
to another.

Each transform declares what a source outside it is: lifted with the target
(``remat``, ``jit``, ``map_variables``, the branches), broadcast read-only
into a stack (``scan``, ``vmap``: never stacked, its rngs split per iteration
as a shared module's, a write into it refused without false advice), or
nothing (refused by name). A tie declared inside a transform reads its source
outside as a closed-over value (``tests/test_tie_inside_transform.py``): a
write there, and any such tie under ``nn.jit`` (a stale copy), is refused, and
the fix the message gives (declare it at the common ancestor) works.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_wraps
from tie_blocks import D, X, Attn, Block, encoder, to_shared_layout
from tie_models import (ONES, assert_close, assert_message_names,
                        assert_says_how_to_fix, assert_trees,
                        assert_trees_close, assert_trees_equal,
                        outputs_and_grads)

import flax_tieext
from flax_tieext import TieError

tie = flax_tieext.linen.tie
needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch
# end_to_end: every transform and nesting order; the README's test run leaves it
# to --end-to-end (tests/upstream/linen_tie_test.py covers each transform).
pytestmark = pytest.mark.end_to_end

N = 3

WRAPS = {
    **tie_wraps.WRAPS,
    **tie_wraps.MAP_VARIABLES,
    'remat(jit)': lambda cls: nn.remat(nn.jit(cls)),
    'jit(remat)': lambda cls: nn.jit(nn.remat(cls)),
    'remat(remat)': lambda cls: nn.remat(nn.remat(cls)),
}
# No transform, nn.remat, nn.partitioning.remat and nn.jit.
ALL_WRAPS = sorted(tie_wraps.WRAPS)


# ---------------------------------------------------------------------------
# Params ties under each transform, against one shared module.
# ---------------------------------------------------------------------------


class AttnBlock(nn.Module):
  shared: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    attn = self.shared if self.shared is not None else Attn(name='attn')
    x = attn(x)
    return x + nn.Dense(D, name='ff')(x)


def make_encoder(wrap, shared, order=None):
  block_cls = WRAPS[wrap](AttnBlock)
  order = order or list(range(N))

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      attn = Attn(name='attn') if shared else None
      blocks = [block_cls(shared=attn, name=f'block_{i}') for i in range(N)]
      for i in order:
        x = blocks[i](x)
      return x

  return Encoder


TIES = {f'block_{i}/attn': 'block_0/attn' for i in range(1, N)}


def tied_encoder(wrap, order=None):
  return nn.tie(make_encoder(wrap, shared=False, order=order), TIES)


def to_reference_params(params):
  """The tied model's parameters in the shared-module model's layout."""
  ref = {f'block_{i}': {'ff': params[f'block_{i}']['ff']} for i in range(N)}
  ref['attn'] = params['block_0']['attn']
  return ref


def from_reference_params(ref):
  params = {f'block_{i}': {'ff': ref[f'block_{i}']['ff']} for i in range(N)}
  params['block_0']['attn'] = ref['attn']
  return params


def check_against_reference(tied_cls, ref_cls, x):
  variables = tied_cls().init(jax.random.key(0), x)
  params = variables['params']
  expected_keys = {f'block_{i}' for i in range(N)}
  assert set(params) == expected_keys
  assert 'attn' in params['block_0']
  for i in range(1, N):
    assert set(params[f'block_{i}']) == {'ff'}, 'a tied target was stored'

  def loss(cls, p):
    return jnp.sum(cls().apply({'params': p}, x) ** 2)

  ref_params = to_reference_params(params)
  y, grads = jax.value_and_grad(functools.partial(loss, tied_cls))(params)
  ref_y, ref_grads = jax.value_and_grad(functools.partial(loss, ref_cls))(
      ref_params)
  assert_close(y, ref_y)
  jax.tree_util.tree_map(assert_close, to_reference_params(grads), ref_grads)


@needs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_tie_declared_outside_transform_matches_shared_module(wrap):
  x = jax.random.normal(jax.random.key(1), (2, D))
  check_against_reference(tied_encoder(wrap),
                          make_encoder(wrap, shared=True), x)


@needs_patch
@pytest.mark.parametrize('outer', ['remat', 'jit', 'partitioning.remat'])
def test_transform_outside_tie_matches_shared_module(outer):
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied_cls = WRAPS[outer](tied_encoder('none'))
  ref_cls = WRAPS[outer](make_encoder('none', shared=True))
  check_against_reference(tied_cls, ref_cls, x)


@needs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_init_does_not_depend_on_which_use_runs_first(wrap):
  x = jax.random.normal(jax.random.key(1), (2, D))
  forward = tied_encoder(wrap)().init(jax.random.key(0), x)['params']
  backward = tied_encoder(wrap, order=[2, 1, 0])().init(
      jax.random.key(0), x)['params']
  jax.tree_util.tree_map(np.testing.assert_array_equal, forward, backward)


class PairBlock(nn.Module):
  """Calls two attention paths; the reference calls one module twice."""

  shared: bool = False

  @nn.compact
  def __call__(self, x):
    a = Attn(name='a')
    b = a if self.shared else Attn(name='b')
    return b(a(x))


@needs_patch
@pytest.mark.parametrize('wrap', ['remat', 'jit', 'partitioning.remat'])
def test_tie_declared_inside_transform(wrap):
  """The tie is part of the rematted module: both paths live inside."""
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied_cls = WRAPS[wrap](nn.tie(PairBlock, {'b': 'a'}))
  ref_cls = WRAPS[wrap](functools.partial(PairBlock, shared=True))
  params = tied_cls().init(jax.random.key(0), x)['params']
  assert set(params) == {'a'}
  loss = lambda cls, p: jnp.sum(cls().apply({'params': p}, x) ** 2)
  y, g = jax.value_and_grad(functools.partial(loss, tied_cls))(params)
  ry, rg = jax.value_and_grad(functools.partial(loss, ref_cls))(params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


@needs_patch
def test_tie_within_rematted_target_and_jit_train_step():
  """A jitted SGD step on the tied model equals the one on the reference."""
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied_cls = tied_encoder('remat')
  ref_cls = make_encoder('remat', shared=True)
  params = tied_cls().init(jax.random.key(0), x)['params']

  def step(cls, p):
    g = jax.grad(lambda p: jnp.sum(cls().apply({'params': p}, x) ** 2))(p)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)

  new = jax.jit(functools.partial(step, tied_cls))(params)
  ref_new = jax.jit(functools.partial(step, ref_cls))(
      to_reference_params(params))
  jax.tree_util.tree_map(assert_close, new, from_reference_params(ref_new))


# ---------------------------------------------------------------------------
# scan / vmap: a source outside the stack is broadcast, never stacked.
# ---------------------------------------------------------------------------


class StackLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    x = Attn(name='attn')(x)
    return x + nn.Dense(D, name='ff')(x), None


class StackModel(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x):
    x = Attn(name='src')(x)
    common = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    if self.kind == 'scan':
      stack = nn.scan(StackLayer, length=N, **common)
    elif self.kind == 'remat(scan)':
      stack = nn.remat(nn.scan(StackLayer, length=N, **common))
    elif self.kind == 'scan(remat)':
      stack = nn.scan(nn.remat(StackLayer), length=N, **common)
    else:
      stack = nn.vmap(StackLayer, in_axes=(0, None), **common)
    x, _ = stack(name='stack')(x, None)
    return x


def stack_reference(params, x, kind):
  """The stack written out by hand: one ``src`` applied at every step."""
  attn = lambda p, h: Attn().apply({'params': p}, h)
  dense = lambda p, h: nn.Dense(D).apply({'params': p}, h)
  x = attn(params['src'], x)
  ff = params['stack']['ff']
  if kind == 'vmap':
    outs = []
    for i in range(N):
      h = attn(params['src'], x[i])
      outs.append(h + dense(jax.tree_util.tree_map(lambda a: a[i], ff), h))
    return jnp.stack(outs)
  for i in range(N):
    x = attn(params['src'], x)
    x = x + dense(jax.tree_util.tree_map(lambda a: a[i], ff), x)
  return x


@needs_patch
@pytest.mark.parametrize('kind', ['scan', 'vmap', 'remat(scan)',
                                  'scan(remat)'])
def test_source_outside_stack_is_broadcast_not_stacked(kind):
  model = nn.tie(StackModel, {'stack/attn': 'src'})(kind)
  x = jax.random.normal(jax.random.key(1), (N, D))
  params = model.init(jax.random.key(0), x)['params']
  assert 'attn' not in params['stack']
  assert params['src']['proj']['kernel'].shape == (D, D)  # not stacked
  assert params['stack']['ff']['kernel'].shape == (N, D, D)  # stacked

  loss = lambda p: jnp.sum(model.apply({'params': p}, x) ** 2)
  ref_loss = lambda p: jnp.sum(stack_reference(p, x, kind) ** 2)
  y, g = jax.value_and_grad(loss)(params)
  ry, rg = jax.value_and_grad(ref_loss)(params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


class MaskedDense(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return jnp.tanh(nn.Dense(D, name='dense')(x * mask.value))


class MaskedLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return nn.remat(MaskedDense)(name='m')(x), None


def masked_stack(broadcast_graph):
  scan_kwargs = dict(variable_axes={'params': 0}, split_rngs={'params': True},
                     length=N)
  if broadcast_graph:
    scan_kwargs['variable_broadcast'] = 'graph'

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x, _ = MaskedLayer(name='src')(x, None)
      x, _ = nn.scan(MaskedLayer, **scan_kwargs)(name='stack')(x, None)
      return x

  return Model


@needs_patch
def test_scanned_target_with_nested_remat_reads_broadcast_source():
  tied = nn.tie(masked_stack(False), {'stack': 'src'}, collections='graph')()
  ref = masked_stack(True)()  # the mask copied in, broadcast over the scan
  x = jax.random.normal(jax.random.key(1), (2, D))
  variables = tied.init(jax.random.key(0), x)
  assert list(variables['graph']) == ['src']
  params = variables['params']
  mask = jnp.linspace(0.5, 1.5, D)

  def tied_loss(m):
    return jnp.sum(tied.apply(
        {'params': params, 'graph': {'src': {'m': {'mask': m}}}}, x) ** 2)

  def ref_loss(m_src, m_stack):
    graph = {'src': {'m': {'mask': m_src}}, 'stack': {'m': {'mask': m_stack}}}
    return jnp.sum(ref.apply({'params': params, 'graph': graph}, x) ** 2)

  y, g = jax.value_and_grad(tied_loss)(mask)
  ry, (g_src, g_stack) = jax.value_and_grad(ref_loss, argnums=(0, 1))(
      mask, mask)
  assert_close(y, ry)
  assert_close(g, g_src + g_stack)


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
  # it: test_source_outside_stack_is_broadcast_*.)
  drop_rngs = {'dropout': jax.random.key(2)}
  ys = tied.apply(variables, xs, rngs=drop_rngs)
  ref_ys = ref.apply(variables, xs, rngs=drop_rngs)
  # The reference draws a mask per iteration (not one for all) ...
  assert not all(np.array_equal(ref_ys[0], y) for y in ref_ys[1:])
  # ... and the tie draws the same ones.
  assert_close(ys, ref_ys)


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


# Advice that is false when the tie is declared at the root, outside every
# transform.
FALSE_ADVICE = ('declare the tie at the common ancestor', 'declared inside')


def assert_no_false_advice(message, *phrases):
  for phrase in phrases:
    assert phrase not in message.lower(), (
        f'false advice {phrase!r} in: {message}')


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
# cond, switch, while_loop (lift the source), vjp (reads it as a closure).
# ---------------------------------------------------------------------------


class CondModel(nn.Module):
  shared: bool = False

  @nn.compact
  def __call__(self, x, pred):
    a = Attn(name='a')
    b = a if self.shared else Attn(name='b')
    a(x)  # created outside the cond
    return nn.cond(pred, lambda mdl, h: mdl(h), lambda mdl, h: -mdl(h), b, x)


@needs_patch
@pytest.mark.parametrize('pred', [True, False])
def test_tied_target_inside_cond(pred):
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied = nn.tie(CondModel, {'b': 'a'})()
  params = tied.init(jax.random.key(0), x, True)['params']
  assert set(params) == {'a'}
  loss = lambda m, p: jnp.sum(m.apply({'params': p}, x, pred) ** 2)
  y, g = jax.value_and_grad(functools.partial(loss, tied))(params)
  ry, rg = jax.value_and_grad(functools.partial(loss, CondModel(True)))(
      params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


class ControlFlowModel(nn.Module):
  kind: str
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    a = Attn(name='a')
    b = a if self.shared else Attn(name='b')
    x = a(x)
    if self.kind == 'switch':
      branches = [lambda m, h: m(h), lambda m, h: -m(h), lambda m, h: 2 * m(h)]
      return nn.switch(2, branches, b, x)
    if self.kind == 'while_loop':
      body = lambda m, c: (c[0] + 1, m(c[1]))
      return nn.while_loop(lambda m, c: c[0] < 3, body, b, (0, x))[1]
    y, backward = nn.vjp(lambda m, h: m(h), b, x)
    _, x_grad = backward(jnp.ones_like(y))
    return y + x_grad


@needs_patch
@pytest.mark.parametrize('kind', ['switch', 'while_loop', 'vjp'])
def test_tied_target_inside_control_flow_and_vjp(kind):
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied = nn.tie(ControlFlowModel, {'b': 'a'})(kind)
  ref = ControlFlowModel(kind, shared=True)
  params = tied.init(jax.random.key(0), x)['params']
  assert set(params) == {'a'}
  assert_close(tied.apply({'params': params}, x),
               ref.apply({'params': params}, x))
  if kind == 'while_loop':
    return  # JAX cannot reverse-differentiate a while_loop
  loss = lambda m, p: jnp.sum(m.apply({'params': p}, x) ** 2)
  g = jax.grad(functools.partial(loss, tied))(params)
  rg = jax.grad(functools.partial(loss, ref))(params)
  jax.tree_util.tree_map(assert_close, g, rg)


class DoublingCounter(nn.Module):
  """A Dense whose output is scaled by an order-sensitive call counter."""

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = count.value * 2 + 1
    return nn.Dense(D, name='dense')(x) * count.value


class Branches(nn.Module):
  kind: str
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    a = DoublingCounter(name='a')
    b = a if self.shared else DoublingCounter(name='b')
    x = a(x)
    body = lambda m, h: m(jnp.tanh(m(h)))  # the target twice
    if self.kind == 'cond':
      return nn.cond(True, body, body, b, x)
    if self.kind == 'switch':
      return nn.switch(1, [body, body, body], b, x)
    return nn.while_loop(lambda m, c: c[0] < 2,
                         lambda m, c: (c[0] + 1, body(m, c[1])), b, (0, x),
                         carry_variables='state')[1]


@installs_patch
@pytest.mark.parametrize('kind', ['cond', 'switch', 'while_loop'])
def test_branch_body_using_a_target_twice_is_the_shared_module(kind):
  """init crashed: "Cannot reach the source ... from /switch(b)"."""
  tied = nn.tie(Branches, {'b': 'a'}, collections=['params', 'state'])(kind)
  ref = Branches(kind, shared=True)
  variables = tied.init(jax.random.key(0), X)
  assert_trees(np.testing.assert_array_equal, variables,
               ref.init(jax.random.key(0), X))
  y, updates = tied.apply(variables, X, mutable=['state'])
  ry, ref_updates = ref.apply(variables, X, mutable=['state'])
  assert_close(y, ry)
  assert_trees(assert_close, updates, ref_updates)


# ---------------------------------------------------------------------------
# Transforms not on a list: nn.fold_rngs (a Linen class transform in this
# Flax, lifted through lift.pack like nn.remat), and one that declares
# nothing.
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


@installs_patch
def test_a_transform_that_declares_nothing_is_refused_by_name():
  """A pack name that is on no list used to be lifted like an attribute."""
  from flax.core import lift  # pylint: disable=g-import-not-at-top

  def undeclared(fn):
    def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
      scope = scope_fn(variable_groups, rng_groups)
      return fn(scope, *args), repack_fn(scope)
    return lift.pack(inner, (True,), (True,), (True,), name='my_transform')

  class Custom(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = nn.Dense(D, name='a')(x)
      b = nn.Dense(D, name='b')
      return undeclared(lambda scope, h: b.clone(parent=scope)(h))(
          b.scope if b.scope is not None else self.scope.push('b'), x)

  with pytest.raises(TieError, match="'my_transform'"):
    nn.tie(Custom, {'b': 'a'})().init(jax.random.key(0), X)


# ---------------------------------------------------------------------------
# A tie declared inside a transform, with its source outside it.
# ---------------------------------------------------------------------------


class InnerBlock(nn.Module):
  source: str | None = None

  @nn.compact
  def __call__(self, x):
    cls = Counter if self.source is None else nn.tie(
        Counter, {'.': self.source}, collections='state')
    return cls(name='c')(x)


def inner_tie_model(transform):
  block_cls = transform(InnerBlock)  # one class: nn.jit keeps its traces

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = block_cls(name='block_0')(x)
      return block_cls(source='/block_0/c', name='block_1')(x)

  return Model


@needs_patch
@pytest.mark.parametrize('transform, name', [
    (nn.remat, 'remat'), (nn.partitioning.remat, 'remat'), (nn.jit, 'jit')],
                         ids=['nn.remat', 'nn.partitioning.remat', 'nn.jit'])
def test_inner_tie_reads_its_outer_source_and_refuses_writes(transform, name):
  # A tie declared inside a lifted transform reads its source outside as a
  # closed-over value: init stores the source only; a write cannot land there
  # (the transform did not lift it) and is refused, naming the write; under
  # nn.jit, whose init met the tie, so that apply lifts the source as a value.
  model = inner_tie_model(transform)()
  variables = model.init(jax.random.key(0), ONES)
  assert list(variables['state']) == ['block_0']
  with pytest.raises(TieError) as info:
    model.apply(variables, ONES, mutable=['state'])
  message = str(info.value)
  assert 'A write to /block_1/c' in message and '/block_0/c' in message
  assert name in message


@needs_patch
def test_inner_tie_is_read_also_when_another_tie_is_in_force():
  # The same rule when the transform packed with a tie in force (and
  # recorded its outer scopes): one rule, whatever else is tied.

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = Counter(name='b')(Counter(name='a')(x))
      block_cls = nn.remat(InnerBlock)
      x = block_cls(name='block_0')(x)
      return block_cls(source='/block_0/c', name='block_1')(x)

  model = nn.tie(Model, {'b': 'a'}, collections='state')()
  variables = model.init(jax.random.key(0), ONES)
  assert sorted(variables['state']) == ['a', 'block_0']
  with pytest.raises(TieError) as info:
    model.apply(variables, ONES, mutable=['state'])
  assert 'A write to /block_1/c' in str(info.value)


@needs_patch
def test_inner_tie_declared_at_the_common_ancestor_works():
  # The fix the message gives.

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      block_cls = nn.remat(InnerBlock)
      x = block_cls(name='block_0')(x)
      return block_cls(name='block_1')(x)

  tied = nn.tie(Model, {'block_1/c': 'block_0/c'}, collections='state')()
  variables = tied.init(jax.random.key(0), ONES)
  assert list(variables['state']) == ['block_0']
  _, updated = tied.apply(variables, ONES, mutable=['state'])
  assert list(updated['state']) == ['block_0']


class WrapPQ(nn.Module):
  """A module whose class may tie its Dense ``d`` elsewhere."""

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='d')(x))


class OwnTieInTheMiddle(nn.Module):
  """``b``'s own class ties ``d`` to ``a``'s; the root ties ``b`` to ``c``."""

  wrap: str = 'none'

  @nn.compact
  def __call__(self, x):
    x = WrapPQ(name='a')(x)
    b = tie_wraps.WRAPS[self.wrap](nn.tie(WrapPQ, {'d': '../a/d'}))
    return WrapPQ(name='c')(b(name='b')(x))


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_a_targets_own_class_tie_under_a_transform(wrap):
  """init stored a and c, then apply refused its output ("Values were given
  for /b/d") under nn.remat and nn.jit: the lifted b carries c's variables,
  which were taken for values given for its own target b/d."""
  tied = nn.tie(OwnTieInTheMiddle, {'b': 'c'})
  variables = tied(wrap).init(jax.random.key(0), X)
  assert set(variables['params']) == {'a', 'c'}
  loss = lambda w, v: jnp.sum(tied(w).apply(v, X) ** 2)
  y, g = jax.value_and_grad(functools.partial(loss, wrap))(variables)
  ry, rg = jax.value_and_grad(functools.partial(loss, 'none'))(variables)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


class ChainRoot(nn.Module):
  """``c``'s class ties its ``d`` to ``b``'s, and the root ties ``b`` to ``a``."""

  wrap: str = 'none'

  @nn.compact
  def __call__(self, x):
    x = WrapPQ(name='b')(WrapPQ(name='a')(x))
    c = tie_wraps.WRAPS[self.wrap](nn.tie(WrapPQ, {'d': '../b/d'}))
    return c(name='c')(x)


class ChainShared(nn.Module):
  """The reference: one module called three times."""

  @nn.compact
  def __call__(self, x):
    a = WrapPQ(name='a')
    return a(a(a(x)))


@needs_patch
@pytest.mark.parametrize('wrap', ALL_WRAPS)
def test_a_chain_through_a_module_tie_across_declaring_modules(wrap):
  """c/d -> b/d -> a/d collapses to a/d: apply takes init's own output."""
  tied = nn.tie(ChainRoot, {'b': 'a'})
  variables = tied(wrap).init(jax.random.key(0), X)
  assert jax.tree_util.tree_structure(variables) == jax.tree_util.tree_structure(
      ChainShared().init(jax.random.key(0), X))
  loss = lambda model, v: jnp.sum(model.apply(v, X) ** 2)
  y, g = jax.value_and_grad(functools.partial(loss, tied(wrap)))(variables)
  ry, rg = jax.value_and_grad(functools.partial(loss, ChainShared()))(variables)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)
