"""``in_scan``: how a tie source outside an ``nn.scan`` enters the loop.

``'broadcast'`` reads the source as a loop invariant, as Flax's
``variable_broadcast`` does; ``'scanned'`` broadcasts it to the stack's
length before the loop and scans over it, as the stack's own variables are
(``variable_axes``), the form that was never slower than the untied stack on
an accelerator (docs/scaling.md). The default (``None``) takes ``'scanned'``
where the call cannot write the source and the scan is recorded, else
``'broadcast'``. Reference semantics, for each: the untied stack given the
source's values in every layer, written as a user writes it by hand
(``broadcast_by_hand``): the same outputs and gradients (the broadcast's
transpose sums them), and for ``'scanned'`` the same loop: the source is one
of the scan's scanned inputs, never a closed-over constant.
"""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tie_models import (assert_message_names, assert_says_how_to_fix,
                        assert_trees_close, assert_trees_equal)

import flax_tieext
from flax_tieext import TieError

needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch

N, D = 3, 4
X = jnp.linspace(-1.0, 1.0, 2 * D).reshape(2, D)


class Layer(nn.Module):
  """A scan body: its ``attn`` is the tie's target."""

  @nn.compact
  def __call__(self, x, _):
    h = jnp.tanh(nn.Dense(D, name='attn')(x))
    return x + nn.Dense(D, name='ff')(h), None


def stacked(layer=Layer, axis=0, length=N, **scan_kwargs):
  """An encoder: ``attn`` (the source) then ``nn.scan(nn.remat(layer))``."""

  class Encoder(nn.Module):
    untied: bool = False

    @nn.compact
    def __call__(self, x, xs=None):
      if not self.untied and self.is_initializing():
        nn.Dense(D, name='attn')(x)
      stack = nn.scan(nn.remat(layer), variable_axes={'params': axis},
                      split_rngs={'params': True}, length=length,
                      **scan_kwargs)
      x, _ = stack(name='layers')(x, xs)
      return x

  return Encoder


def tied(encoder, in_scan):
  return nn.tie(encoder, {'layers/attn': 'attn'}, in_scan=in_scan)()


def broadcast_by_hand(encoder, axis=0):
  """The untied stack, given ``attn`` in every layer by the user's step."""
  untied = encoder(untied=True)

  def apply(variables, x, xs=None):
    params = dict(variables['params'])
    attn = params.pop('attn')
    params['layers'] = {**params['layers'], 'attn': jax.tree_util.tree_map(
        lambda w: jnp.repeat(jnp.expand_dims(w, axis), N, axis), attn)}
    return untied.apply({**variables, 'params': params}, x, xs)

  return apply


def loss_and_grads(apply, variables, *args):
  return jax.value_and_grad(lambda v: jnp.sum(apply(v, *args) ** 2))(variables)


def scan_inputs(apply, variables, *args):
  """The shapes of every input of the gradient's loops (forward and transpose).

  Only shapes: which inputs a loop closes over and which it scans is spelled
  differently by each JAX release (``num_consts``, then ``ft_in``). A source
  read as a loop invariant enters some loop with its own shape; one scanned
  over enters with the stack's length in front.
  """
  grad = jax.grad(lambda v: jnp.sum(apply(v, *args) ** 2))
  shapes = []

  def walk(jaxpr):  # into jit and the like, whose jaxprs are parameters
    for e in jaxpr.eqns:
      if e.primitive.name == 'scan':
        shapes.extend(tuple(v.aval.shape) for v in e.invars)
      for param in e.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          sub = getattr(sub, 'jaxpr', sub)
          if hasattr(sub, 'eqns'):
            walk(sub)

  walk(jax.make_jaxpr(grad)(variables).jaxpr)
  return sorted(shapes)


@pytest.mark.end_to_end  # whole stacks against the computation by hand: left to --end-to-end and CI
@needs_patch
@pytest.mark.parametrize('axis', [0, 1])
@pytest.mark.parametrize('in_scan', ['broadcast', 'scanned'])
def test_each_way_in_computes_the_untied_stack_given_the_source_by_hand(
    in_scan, axis):
  encoder = stacked(axis=axis)
  model = tied(encoder, in_scan)
  variables = model.init(jax.random.key(0), X)
  assert sorted(variables['params']) == ['attn', 'layers']
  assert 'attn' not in variables['params']['layers']  # stored once
  loss, grads = loss_and_grads(model.apply, variables, X)
  ref_loss, ref_grads = loss_and_grads(broadcast_by_hand(encoder, axis),
                                       variables, X)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  assert_trees_close(grads, ref_grads)


@needs_patch
def test_init_stores_the_same_variables_either_way():
  encoder = stacked()
  by_default = tied(encoder, 'broadcast').init(jax.random.key(0), X)
  scanned = tied(encoder, 'scanned').init(jax.random.key(0), X)
  assert_trees_equal(scanned, by_default)


@needs_patch
def test_scanned_source_is_a_scanned_input_of_the_loop_as_by_hand():
  """The fast form: sliced per layer, never a loop-invariant constant."""
  encoder = stacked()
  variables = tied(encoder, 'broadcast').init(jax.random.key(0), X)
  kernel, bias = (D, D), (D,)

  scanned = scan_inputs(tied(encoder, 'scanned').apply, variables, X)
  assert scanned == scan_inputs(broadcast_by_hand(encoder), variables, X)
  assert kernel not in scanned and bias not in scanned
  assert (N, *kernel) in scanned and (N, *bias) in scanned

  invariant = scan_inputs(tied(encoder, 'broadcast').apply, variables, X)
  assert kernel in invariant and bias in invariant


class LayerOverInputs(nn.Module):

  @nn.compact
  def __call__(self, x, x_i):
    h = jnp.tanh(nn.Dense(D, name='attn')(x + x_i))
    return x + nn.Dense(D, name='ff')(h), None


@needs_patch
def test_the_length_is_the_scanned_inputs_when_the_scan_is_not_given_one():
  encoder = stacked(LayerOverInputs, length=None)
  xs = jnp.stack([X * (i + 1) for i in range(N)])
  model = tied(encoder, 'scanned')
  variables = model.init(jax.random.key(0), X, xs)
  scanned = scan_inputs(model.apply, variables, X, xs)
  assert (N, D, D) in scanned and (D, D) not in scanned
  assert_trees_close(loss_and_grads(model.apply, variables, X, xs),
                     loss_and_grads(broadcast_by_hand(encoder), variables, X,
                                    xs))


@needs_patch
def test_partitioned_source_gets_the_stack_axis_name_and_back():
  """A boxed source is broadcast with its metadata, as the stack's own are."""

  class Partitioned(nn.Module):

    @nn.compact
    def __call__(self, x, _):
      dense = lambda name: nn.Dense(D, name=name, kernel_init=(
          nn.with_partitioning(nn.initializers.lecun_normal(), ('a', 'b'))))
      return x + dense('ff')(jnp.tanh(dense('attn')(x))), None

  class Encoder(nn.Module):
    untied: bool = False

    @nn.compact
    def __call__(self, x, xs=None):
      if not self.untied and self.is_initializing():
        nn.Dense(D, name='attn', kernel_init=nn.with_partitioning(
            nn.initializers.lecun_normal(), ('a', 'b')))(x)
      stack = nn.scan(nn.remat(Partitioned), variable_axes={'params': 0},
                      split_rngs={'params': True}, length=N,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
      return stack(name='layers')(x, xs)[0]

  variables = tied(Encoder, 'scanned').init(jax.random.key(0), X)
  box = variables['params']['attn']['kernel']
  assert isinstance(box, nn.Partitioned) and box.names == ('a', 'b')
  assert variables['params']['layers']['ff']['kernel'].names == (
      'layers', 'a', 'b')
  out = tied(Encoder, 'scanned').apply(variables, X)
  ref = tied(Encoder, 'broadcast').apply(variables, X)
  np.testing.assert_allclose(out, ref, rtol=1e-6)


@needs_patch
def test_a_collection_the_scan_does_not_scan_is_read_as_a_loop_invariant():
  """``in_scan='scanned'`` applies where the scan scans the collection."""

  class Broadcast(nn.Module):  # every layer of the stack shares its params

    @nn.compact
    def __call__(self, x):
      nn.Dense(D, name='attn')(x)
      stack = nn.scan(nn.remat(Layer), variable_broadcast='params',
                      split_rngs={'params': False}, length=N)
      return stack(name='layers')(x, None)[0]

  model = tied(Broadcast, 'scanned')
  variables = model.init(jax.random.key(0), X)
  assert (D, D) in scan_inputs(model.apply, variables, X)
  np.testing.assert_allclose(model.apply(variables, X),
                             tied(Broadcast, 'broadcast').apply(variables, X),
                             rtol=1e-6)


@needs_patch
@pytest.mark.parametrize('api', ['nn.tie', 'lift.tie'])
@pytest.mark.parametrize('value', ['stacked', 'auto', True])
def test_an_unknown_in_scan_is_refused_at_the_declaration(api, value):
  with pytest.raises(TieError) as info:
    if api == 'nn.tie':
      nn.tie(stacked(), {'layers/attn': 'attn'}, in_scan=value)
    else:
      flax.core.lift.tie(lambda scope: None, {'b': 'a'}, in_scan=value)
  message = str(info.value)
  assert_message_names(message, f'{api}(', f'in_scan={value!r}',
                       "'broadcast'", "'scanned'")


@needs_patch
@pytest.mark.parametrize('first, second, named', [
    ('scanned', 'broadcast', "in_scan='broadcast'"),
    ('scanned', None, 'in_scan=None (the default)')])
def test_one_tie_declared_with_two_in_scans_is_refused(first, second, named):
  once = nn.tie(stacked(), {'layers/attn': 'attn'}, in_scan=first)
  twice = nn.tie(once, {'layers/attn': 'attn'}, in_scan=second)
  with pytest.raises(TieError) as info:
    twice().init(jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, '/layers/attn', '/attn',
                       "in_scan='scanned'", named)
  assert_says_how_to_fix(message)


# ---------------------------------------------------------------------------
# The default: 'scanned' where it computes what 'broadcast' does
# ---------------------------------------------------------------------------


@needs_patch
def test_the_default_scans_a_read_only_source_as_scanned_does():
  encoder = stacked()
  default = nn.tie(encoder, {'layers/attn': 'attn'})()
  variables = default.init(jax.random.key(0), X)
  inputs = scan_inputs(default.apply, variables, X)
  assert inputs == scan_inputs(tied(encoder, 'scanned').apply, variables, X)
  assert inputs == scan_inputs(broadcast_by_hand(encoder), variables, X)
  loss, grads = loss_and_grads(default.apply, variables, X)
  ref_loss, ref_grads = loss_and_grads(broadcast_by_hand(encoder), variables, X)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  assert_trees_close(grads, ref_grads)


@installs_patch
def test_the_default_reads_the_source_of_an_unrecorded_scan_as_a_loop_invariant():
  """A scan made before the patch cannot stack: the default closes over,
  where ``in_scan='scanned'`` raises (test above)."""
  Encoder = encoder_over_a_scan_made_before_the_patch()  # pylint: disable=invalid-name
  default = nn.tie(Encoder, {'layers/attn': 'attn'})()
  variables = default.init(jax.random.key(0), X)
  assert (D, D) in scan_inputs(default.apply, variables, X)
  assert_trees_close(loss_and_grads(default.apply, variables, X),
                     loss_and_grads(tied(Encoder, 'broadcast').apply, variables, X))


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if self.is_mutable_collection('state') and not self.is_initializing():
      count.value = count.value + 1
    return x + count.value


class CounterLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return Counter(name='counter')(x), None


class CountingStack(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = Counter(name='src')(x)
    stack = nn.scan(CounterLayer, variable_axes={'state': 0, 'params': 0},
                    split_rngs={'params': True}, length=N)
    return stack(name='stack')(x, None)[0]


@needs_patch
@pytest.mark.parametrize('in_scan', ['scanned', None, 'broadcast'])
def test_a_write_to_a_source_outside_the_scan_is_refused_naming_the_scan(in_scan):
  def model(in_scan):
    return nn.tie(CountingStack, {'stack/counter': 'src'},
                  collections='state', in_scan=in_scan)()

  variables = model(in_scan).init(jax.random.key(0), X)
  assert list(variables['state']) == ['src']
  variables = {'state': {'src': {'count': jnp.array(2.0)}}}
  np.testing.assert_allclose(model(in_scan).apply(variables, X),
                             model('broadcast').apply(variables, X))
  np.testing.assert_allclose(model(in_scan).apply(variables, X), X + 8.0,
                             rtol=1e-6)
  with pytest.raises(TieError) as info:
    model(in_scan).apply(variables, X, mutable=['state'])
  assert_message_names(str(info.value), '/stack/counter', '/src', "'state'",
                       'scan')
  assert_says_how_to_fix(str(info.value))


class MaskedAttn(nn.Module):
  """A ``graph`` mask (a collection the scan below does not scan) and a Dense."""

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.linspace(0.5, 1.0, D))
    return jnp.tanh(nn.Dense(D, name='dense')(x * mask.value))


class MaskedLayer(nn.Module):

  @nn.compact
  def __call__(self, x):
    return MaskedAttn(name='attn')(x)


class MaskedScanLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return MaskedLayer(name='layer')(x), None


class MaskedStack(nn.Module):
  remat: bool

  @nn.compact
  def __call__(self, x):
    layer = nn.remat(MaskedScanLayer) if self.remat else MaskedScanLayer
    stack = nn.scan(layer, variable_axes={'params': 0},
                    split_rngs={'params': True}, length=N)
    return stack(name='scan')(x, None)[0]


class MaskedOuter(nn.Module):
  """The source, run first, then the stack whose every layer is tied to it."""
  remat: bool
  shared: bool = False  # the reference: one MaskedAttn called N + 1 times

  @nn.compact
  def __call__(self, x):
    src = MaskedAttn(name='src')
    x = src(x)
    if self.shared:
      for _ in range(N):
        x = src(x)
      return x
    return MaskedStack(self.remat, name='stack')(x)


@needs_patch
@pytest.mark.parametrize('in_scan', [None, 'scanned', 'broadcast'])
@pytest.mark.parametrize('remat', [False, True], ids=['scan', 'scan_of_remat'])
def test_a_tie_of_a_collection_the_scan_does_not_scan_works_each_way_in(
    remat, in_scan):
  """``graph`` and ``params`` tied into the layers, the source run first.

  The default and ``'scanned'`` raised "Initializing /stack/scan/layer/attn in
  collection 'graph' cannot land ... Run the source /src before the scan":
  the source scanned over held ``params`` alone, and the layers found no
  ``graph`` there. A collection the scan does not stack is read as a loop
  invariant, as ``'broadcast'`` reads it, while ``params`` is scanned over
  where the way in scans it; every way in gives one shared module's
  variables, outputs and gradients.
  """
  model = nn.tie(MaskedOuter, {'stack/scan/layer/attn': 'src'},
                 collections=['params', 'graph'], in_scan=in_scan)(remat)
  variables = model.init(jax.random.key(0), X)
  shared = MaskedOuter(remat, shared=True)
  assert_trees_equal(variables, shared.init(jax.random.key(0), X))
  assert_trees_close(loss_and_grads(model.apply, variables, X),
                     loss_and_grads(shared.apply, variables, X))
  # params still enter the loop as each way in says: scanned, or invariant.
  assert ((N, D, D) in scan_inputs(model.apply, variables, X)) == (
      in_scan != 'broadcast')


def encoder_over_a_scan_made_before_the_patch():
  """An encoder whose ``nn.scan`` took Flax's own ``lift.scan`` (no record)."""
  flax_tieext.uninstall()
  try:
    layers = nn.scan(nn.remat(Layer), variable_axes={'params': 0},
                     split_rngs={'params': True}, length=N)
  finally:
    flax_tieext.install()

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      nn.Dense(D, name='attn')(x)
      return layers(name='layers')(x, None)[0]

  return Encoder


@installs_patch
def test_a_scan_made_before_the_patch_cannot_stack_and_says_so():
  Encoder = encoder_over_a_scan_made_before_the_patch()  # pylint: disable=invalid-name
  variables = tied(Encoder, 'broadcast').init(jax.random.key(0), X)
  with pytest.raises(TieError) as info:
    tied(Encoder, 'scanned').apply(variables, X)
  message = str(info.value)
  assert_message_names(message, '/layers/attn', "in_scan='scanned'",
                       'import flax_tieext', "in_scan='broadcast'")
  assert_says_how_to_fix(message)


@needs_patch
def test_lift_tie_takes_in_scan_as_nn_tie_does():
  """The core API: ``lift.tie(..., in_scan='scanned')`` around ``lift.scan``."""
  from flax.core import apply, init, lift  # pylint: disable=g-import-not-at-top
  from flax.core import nn as core_nn  # pylint: disable=g-import-not-at-top

  def body(scope, c, _):
    return c + scope.child(core_nn.dense, 'attn')(c, D), None

  def model(scope, x):
    scope.child(core_nn.dense, 'attn')(x, D)
    stack = lift.scan(body, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=N)
    return stack(scope.push('layers'), x, None)[0]

  outs = {}
  for in_scan in ('broadcast', 'scanned'):
    tied = lift.tie(model, {'layers/attn': 'attn'}, in_scan=in_scan)
    y, variables = init(tied)(jax.random.key(0), X)
    assert 'attn' not in variables['params'].get('layers', {})
    loss = lambda v, tied=tied: jnp.sum(apply(tied)(v, X) ** 2)
    outs[in_scan] = (y, *jax.value_and_grad(loss)(variables),
                     scan_inputs(lambda v, x, tied=tied: apply(tied)(v, x),
                                 variables, X))
  assert_trees_close(outs['scanned'][:3], outs['broadcast'][:3])
  assert (N, D, D) in outs['scanned'][3] and (D, D) not in outs['scanned'][3]
  assert (D, D) in outs['broadcast'][3]


@needs_patch
def test_a_jitted_stack_traces_each_way_in_once_and_apart():
  """``nn.jit`` keys its traces on the ties inside, ``in_scan`` included."""

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      nn.Dense(D, name='attn')(x)
      stack = nn.jit(nn.scan(nn.remat(Layer), variable_axes={'params': 0},
                             split_rngs={'params': True}, length=N))
      return stack(name='layers')(x, None)[0]

  variables = tied(Encoder, 'broadcast').init(jax.random.key(0), X)
  for in_scan, invariant in (('broadcast', True), ('scanned', False)):
    model = tied(Encoder, in_scan)
    shapes = scan_inputs(model.apply, variables, X)
    assert ((D, D) in shapes) is invariant, (in_scan, shapes)
    np.testing.assert_allclose(model.apply(variables, X),
                               tied(Encoder, 'broadcast').apply(variables, X),
                               rtol=1e-6)


@needs_patch
def test_a_scan_without_a_length_raises_flax_s_own_error():
  encoder = stacked(length=None)  # and nothing scanned over: Flax refuses it
  variables = tied(stacked(), 'broadcast').init(jax.random.key(0), X)
  errors = []
  for in_scan in ('broadcast', 'scanned'):
    with pytest.raises(ValueError) as info:
      tied(encoder, in_scan).apply(variables, X)
    errors.append(str(info.value))
  assert errors[0] == errors[1] and 'length' in errors[0]


@installs_patch
def test_a_scan_inside_a_recorded_one_never_reads_the_outer_call():
  """The record of a scan call is its own: kept per call, for its scope tree.

  An inner scan made by Flax's own ``lift.scan`` (before the patch), called
  inside a scan the patch records, has no record of its own: the outer
  call's length and axes must not stand in for it.
  """
  flax_tieext.uninstall()
  try:
    inner = nn.scan(Layer, variable_axes={'params': 0},
                    split_rngs={'params': True}, length=2)
  finally:
    flax_tieext.install()

  class Outer(nn.Module):

    @nn.compact
    def __call__(self, x, _):
      return inner(name='inner')(x, None)[0], None

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      nn.Dense(D, name='attn')(x)
      stack = nn.scan(Outer, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=N)
      return stack(name='outer')(x, None)[0]

  ties = {'outer/inner/attn': 'attn'}
  variables = nn.tie(Encoder, ties)().init(jax.random.key(0), X)
  with pytest.raises(TieError) as info:
    nn.tie(Encoder, ties, in_scan='scanned')().apply(variables, X)
  assert_message_names(str(info.value), '/outer/inner/attn',
                       "in_scan='scanned'", 'import flax_tieext')


class TwoStacks(nn.Module):
  """Two scanned stacks; ``shared`` calls one stack instance twice."""

  shared: bool = False

  @nn.compact
  def __call__(self, x):
    stack = nn.scan(Layer, variable_axes={'params': 0},
                    split_rngs={'params': True}, length=N)
    first = stack(name='s1')
    x, _ = first(x, None)
    x, _ = (first if self.shared else stack(name='s2'))(x, None)
    return x


@needs_patch
@pytest.mark.parametrize('in_scan', [None, *(pytest.param(s, marks=pytest.mark.end_to_end)
                                             for s in ('broadcast', 'scanned'))])
def test_a_stack_tied_whole_to_a_stack_is_one_shared_stack(in_scan):
  # The tied stack holds its source's stacked variables: never stacked again.
  tied = flax_tieext.linen.tie(TwoStacks, {'s2': 's1'}, in_scan=in_scan)()
  y, variables = tied.init_with_output(jax.random.key(0), X)
  shared = TwoStacks(shared=True)
  ref_y, ref_variables = shared.init_with_output(jax.random.key(0), X)
  assert_trees_equal(variables, ref_variables)
  assert_trees_close(y, ref_y)
  loss = lambda model: lambda v: jnp.sum(model.apply(v, X) ** 2)
  assert_trees_close(tied.apply(variables, X), shared.apply(variables, X))
  assert_trees_close(jax.grad(loss(tied))(variables),
                     jax.grad(loss(shared))(variables))


class ScalarLayer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return x * self.param('s', nn.initializers.ones, ()), None


def layer_then_stack(layer):
  """One unstacked ``single`` layer, then a stack of ``N`` such layers."""

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x, _ = layer(name='single')(x, None)
      stack = nn.scan(layer, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=N)
      return stack(name='layers')(x, None)[0]

  return Model


@needs_patch
@pytest.mark.parametrize('layer, source', [
    (Layer, "/single/attn/kernel has shape (4, 4)"),
    (ScalarLayer, '/single/s has shape ()'),
])
def test_a_stack_tied_whole_to_one_layer_says_the_stored_shape(layer, source):
  # The scan would slice the layer (a bare IndexError for a scalar).
  with pytest.raises(TieError) as info:
    flax_tieext.linen.tie(layer_then_stack(layer), {'layers': 'single'})(
    ).init(jax.random.key(0), X)
  assert_message_names(str(info.value), source, 'axis 0', f'{N} layers',
                       "{'/layers/")


class StackThenSource(nn.Module):

  @nn.compact
  def __call__(self, x):
    stack = nn.scan(Layer, variable_axes={'params': 0},
                    split_rngs={'params': True}, length=N)
    x, _ = stack(name='layers')(x, None)
    return nn.Dense(D, name='attn')(x)


@needs_patch
def test_a_stack_before_its_source_at_init_offers_no_wrong_path_fix():
  with pytest.raises(TieError) as info:
    flax_tieext.linen.tie(StackThenSource, {'layers/attn': 'attn'})().init(
        jax.random.key(0), X)
  message = str(info.value)
  assert_message_names(message, 'Run the source /attn before the scan')
  assert 'Fix the source path' not in message and 'none' not in message, (
      message)
  assert 'To fix it: Fix' not in message
