# Copyright 2026 The flax-tieext Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""``flax_tieext.nnx.tie``: one Variable at two places in NNX tree mode.

Every result is checked against a reference a user would write: the same
model in graph mode with a shared reference (``self.b.kernel =
self.a.kernel``), or the computation by hand with the shared array passed
explicitly. None of this relies on the patch (``flax_tieext.nnx.remat`` is
the plugin's own), so the suite's opted-out copy runs it too.
"""

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import flax_tieext
from flax_tieext import _compat

try:
  from flax import nnx  # pylint: disable=g-import-not-at-top
except ImportError as e:  # Flax 0.10.7 on its pinned jax 0.8.1
  pytest.skip(f'flax.nnx does not import on Flax {_compat.FLAX_VERSION} / jax'
              f' {_compat.JAX_VERSION}: {e}', allow_module_level=True)
import flax_tieext.nnx  # pylint: disable=g-import-not-at-top,g-bad-import-order

if not flax_tieext.nnx._TREE_MODE:  # pylint: disable=protected-access
  pytest.skip(f'Flax {_compat.FLAX_VERSION} has no NNX tree mode (graph=False on'
              ' nnx.split and the transforms), which these ties are for',
              allow_module_level=True)

tie = flax_tieext.nnx.tie
TieError = flax_tieext.TieError


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------
class Mask(nnx.Variable):
  """Not a parameter: nnx.Param filters leave it out."""


class Count(nnx.Variable):
  """A float counter: tree-mode nnx.grad differentiates every Variable."""


class SharedMLP(nnx.Module):
  """ALBERT-style: ``up`` reuses ``down``'s kernel (``share``: by reference)."""

  def __init__(self, features, *, share=False, rngs):
    self.up = nnx.Linear(features, features, rngs=rngs)
    self.down = nnx.Linear(features, features, rngs=rngs)
    if share:  # the graph-mode reference: one Variable at two places
      self.up.kernel = self.down.kernel
    self.calls = Count(jnp.zeros(()))

  def __call__(self, x):
    self.calls[...] += 1
    return self.down(jax.nn.tanh(self.up(x)))


# Graph mode stores a shared Variable at its first path in sorted order,
# a tie at its source: here the two are one path, so the states compare.
TiedMLP = tie(SharedMLP, {'up.kernel': 'down.kernel'})


class LM(nnx.Module):
  """A language model whose head is the transposed embedding."""

  def __init__(self, vocab, features, *, rngs):
    self.embed = nnx.Embed(vocab, features, rngs=rngs)
    self.mix = nnx.Linear(features, features, rngs=rngs)
    self.head = nnx.Linear(features, vocab, use_bias=False, rngs=rngs)

  def __call__(self, tokens):
    return self.head(jax.nn.gelu(self.mix(self.embed(tokens))))


TiedLM = tie(LM, {'head.kernel': ('embed.embedding', jnp.transpose)})


def lm_by_hand(embedding, mix_kernel, mix_bias, tokens):
  return jax.nn.gelu(embedding[tokens] @ mix_kernel + mix_bias) @ embedding.T


def local_mask(length):
  pos = jnp.arange(length)
  return (jnp.abs(pos[:, None] - pos[None, :]) <= 1).astype(jnp.float32)


class Block(nnx.Module):

  def __init__(self, features, length, *, mask=None, rngs):
    self.mask = mask if mask is not None else Mask(local_mask(length))
    self.qkv = nnx.Linear(features, 3 * features, rngs=rngs)

  def __call__(self, x, deterministic=False):
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    scores = jnp.where(self.mask[...] > 0, q @ k.swapaxes(-1, -2), -1e9)
    y = jax.nn.softmax(scores) @ v
    if not deterministic:  # a Python branch: `deterministic` must be static
      y = 0.5 * y
    return x + y


def block_by_hand(mask, kernel, bias, x, deterministic):
  q, k, v = jnp.split(x @ kernel + bias, 3, axis=-1)
  scores = jnp.where(mask > 0, q @ k.swapaxes(-1, -2), -1e9)
  y = jax.nn.softmax(scores) @ v
  return x + (y if deterministic else 0.5 * y)


class Encoder(nnx.Module):
  """Rematted blocks reading one mask (``share``: by reference)."""

  def __init__(self, layers, features, length, *, share=False, graph=False,
               rngs):
    self.attention_mask = Mask(local_mask(length))  # sorts before `blocks`
    self.graph = graph
    self.blocks = nnx.List([
        Block(features, length, mask=self.attention_mask if share else None,
              rngs=rngs)
        for _ in range(layers)])

  def __call__(self, x, deterministic=False):
    forward = flax_tieext.nnx.remat(
        lambda block, x, deterministic: block(x, deterministic),
        static_argnames='deterministic', graph=self.graph)
    for block in self.blocks:
      x = forward(block, x, deterministic)
    return x


TiedEncoder = tie(Encoder, {'blocks.0.mask': 'attention_mask',
                             'blocks.1.mask': 'attention_mask'})


class StackedEncoder(nnx.Module):
  """Blocks made by nnx.vmap (one stack); every slice reads one mask."""

  def __init__(self, layers, features, length, *, rngs):
    self.mask = Mask(local_mask(length))

    @nnx.vmap(graph=False)
    def make(key):
      return Block(features, length, rngs=nnx.Rngs(key))

    self.blocks = make(jax.random.split(rngs.params(), layers))

  def axes(self):
    """The mask broadcast (None), the stack scanned or mapped (0)."""
    return nnx.prefix(self, {Mask: None, ...: 0}, graph=False)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, self.axes()), out_axes=nnx.Carry, graph=False)
    def step(x, encoder):
      return encoder.blocks(x, deterministic=True)

    return step(x, self)


TiedStackedEncoder = tie(StackedEncoder, {'blocks.mask': 'mask'})


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def pure(tree, graph=False, only=...):
  """Nested dict of the arrays of a module, a grads tree or a State."""
  if not isinstance(tree, nnx.State):
    tree = nnx.state(tree, only, graph=graph)
  return nnx.to_pure_dict(tree)


def params(grads, graph=False):
  """The parameters' part: tree-mode nnx.grad differentiates every Variable."""
  return pure(grads, graph, nnx.Param)


# Tree mode and graph mode run the same XLA program and agree to 1e-6; a
# computation written by hand orders its float operations its own way, so
# comparisons with one allow a few ulps more (rtol=1e-5).
def assert_trees_close(actual, expected, rtol=1e-6, atol=1e-6):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=rtol, atol=atol),
               actual, expected)


def train(model, x, steps, graph):
  """``steps`` jitted Adam steps; the losses, last grads and trace count."""
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param, graph=graph)
  traces = []

  def loss_fn(model, x):
    traces.append(1)
    return jnp.mean(model(x) ** 2)

  @nnx.jit(graph=graph)
  def step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(loss_fn, graph=graph)(model, x)
    optimizer.update(model, grads)
    return loss, grads

  losses, grads = [], None
  for _ in range(steps):
    loss, grads = step(model, optimizer, x)
    losses.append(float(loss))
  return losses, grads, optimizer, len(traces)


X = jax.random.normal(jax.random.key(1), (2, 4, 8))


# --------------------------------------------------------------------------
# split / merge / state / update
# --------------------------------------------------------------------------
def test_tree_state_holds_a_tied_variable_once():
  model = TiedMLP(8, rngs=nnx.Rngs(0))
  assert model.down.kernel is model.up.kernel
  params = pure(nnx.state(model, nnx.Param, graph=False))
  assert set(params['up']) == {'bias'}
  assert set(params['down']) == {'kernel', 'bias'}
  leaves = jax.tree.leaves(model)
  assert len(leaves) == len(jax.tree.leaves(SharedMLP(8, rngs=nnx.Rngs(0)))) - 1


def test_tree_state_is_the_graph_state_of_the_shared_reference():
  tied = pure(TiedMLP(8, rngs=nnx.Rngs(0)))
  shared = pure(SharedMLP(8, share=True, rngs=nnx.Rngs(0)), graph=True)
  assert_trees_close(tied, shared, rtol=0, atol=0)


def test_merge_puts_the_source_back_at_the_target():
  graphdef, state = nnx.split(TiedMLP(8, rngs=nnx.Rngs(0)), graph=False)
  model = nnx.merge(graphdef, state)
  assert type(model) is TiedMLP
  assert model.down.kernel is model.up.kernel
  assert model.up.kernel is state['down']['kernel']


def test_update_writes_the_source_which_the_target_reads():
  model = TiedMLP(8, rngs=nnx.Rngs(0))
  state = nnx.state(model, graph=False)
  new = jax.tree.map(lambda v: v + 1.0, nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, new)
  nnx.update(model, state)
  np.testing.assert_array_equal(model.up.kernel[...], new['down']['kernel'])
  assert model.down.kernel is model.up.kernel


def test_graph_mode_is_unchanged():
  tied = TiedMLP(8, rngs=nnx.Rngs(0))
  shared = SharedMLP(8, share=True, rngs=nnx.Rngs(0))
  (tied_def, tied_state), (shared_def, shared_state) = nnx.split(tied), nnx.split(shared)
  assert_trees_close(nnx.to_pure_dict(tied_state), nnx.to_pure_dict(shared_state),
                     rtol=0, atol=0)
  merged = nnx.merge(tied_def, tied_state)
  assert merged.down.kernel is merged.up.kernel
  grads = nnx.grad(lambda m: m(X).sum())(tied)
  assert_trees_close(params(grads, graph=True),
                     params(nnx.grad(lambda m: m(X).sum())(shared), graph=True))


def test_an_undeclared_alias_still_gets_flax_error_in_tree_mode():
  with pytest.raises(ValueError, match='Duplicate') as refused:
    nnx.split(SharedMLP(8, share=True, rngs=nnx.Rngs(0)), graph=False)
  assert not isinstance(refused.value, TieError)


# --------------------------------------------------------------------------
# jit, grad, Optimizer: against the graph-mode shared reference
# --------------------------------------------------------------------------
def test_tied_model_trains_in_tree_mode_as_the_shared_reference_in_graph_mode():
  tied = TiedMLP(8, rngs=nnx.Rngs(0))
  shared = SharedMLP(8, share=True, rngs=nnx.Rngs(0))
  tied_losses, tied_grads, tied_opt, tied_traces = train(tied, X, 3, graph=False)
  ref_losses, ref_grads, ref_opt, _ = train(shared, X, 3, graph=True)
  np.testing.assert_allclose(tied_losses, ref_losses, rtol=1e-6)
  assert_trees_close(params(tied_grads), params(ref_grads, graph=True))
  # One Adam moment per tied Variable, as for the shared reference.
  tied_opt_state, ref_opt_state = pure(tied_opt), pure(ref_opt, graph=True)
  assert 'kernel' not in tied_opt_state['opt_state'][0]['mu']['up']
  assert_trees_close(tied_opt_state, ref_opt_state)
  assert_trees_close(pure(tied), pure(shared, graph=True))
  assert tied.down.kernel is tied.up.kernel
  assert tied_traces == 1  # one trace for three steps


def _errors_quoted_by_the_dropout_section():
  """docs/nnx.md's "Dropout and checkpoints": ``{error name: its quoted text}``."""
  page = (pathlib.Path(__file__).parents[1] / 'docs' / 'nnx.md').read_text()
  prose = page.split('## Dropout and checkpoints in tree mode')[1].split('```')[0]
  return {name: ' '.join(text.split())
          for name, text in re.findall(r'`(\w+Error): (.*?)`', prose, re.S)}


def test_docs_quote_the_errors_of_a_dropout_step_that_takes_the_rng_state_along():
  class DropoutLM(LM):

    def __init__(self, vocab, features, *, rngs):
      super().__init__(vocab, features, rngs=rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, tokens):
      return self.head(self.dropout(jax.nn.gelu(self.mix(self.embed(tokens)))))

  model = tie(DropoutLM, {'head.kernel': ('embed.embedding', jnp.transpose)})(
      8, 4, rngs=nnx.Rngs(0))
  tokens = jnp.zeros((2, 3), jnp.int32)
  loss = lambda model: model(tokens).mean()
  # The whole state differentiated: the RNG count is a uint32.
  with pytest.raises(TypeError) as whole:
    nnx.grad(loss, graph=False)(model)
  # The parameters differentiated, the rest closed over.
  graphdef, params_, rest = nnx.split(model, nnx.Param, ..., graph=False)
  with pytest.raises(Exception) as closed:  # pylint: disable=broad-except
    nnx.grad(lambda p: loss(nnx.merge(graphdef, p, rest)), graph=False)(params_)
  got = {type(e.value).__name__: str(e.value) for e in (whole, closed)}
  quoted = _errors_quoted_by_the_dropout_section()
  assert set(quoted) == set(got) == {'TypeError', 'TraceContextError'}, got
  for name, text in quoted.items():
    assert got[name].startswith(text), (text, got[name])
  # The fix the page shows: the rest as a second argument.
  nnx.grad(lambda p, r: loss(nnx.merge(graphdef, p, r)), graph=False)(params_, rest)


def test_gradient_of_a_tied_variable_sums_both_uses():
  model = TiedMLP(8, rngs=nnx.Rngs(0))
  grads = nnx.grad(lambda m: m(X).sum(), graph=False)(model)

  def by_hand(kernel, up_bias, down_bias):
    return (jax.nn.tanh(X @ kernel + up_bias) @ kernel + down_bias).sum()

  expected = jax.grad(by_hand)(model.down.kernel[...], model.up.bias[...],
                               model.down.bias[...])
  np.testing.assert_allclose(grads.down.kernel[...], expected, rtol=1e-5, atol=1e-6)
  assert 'kernel' not in params(grads)['up']


def test_writes_through_the_target_land_once_under_jit():
  model = TiedMLP(8, rngs=nnx.Rngs(0))

  class TwoCounters(nnx.Module):
    def __init__(self):
      self.a = Count(jnp.zeros((), jnp.int32))
      self.b = Count(jnp.zeros((), jnp.int32))

  TiedCounters = tie(TwoCounters, {'b': 'a'})
  c = TiedCounters()

  @nnx.jit(graph=False)
  def bump(c, model):
    c.b[...] += 1  # through the target
    c.a[...] += 10  # through the source
    return model(X)

  bump(c, model)
  bump(c, model)
  assert int(c.a[...]) == 22 and c.b is c.a
  assert int(model.calls[...]) == 2


@pytest.mark.end_to_end  # a whole model: left to --end-to-end and CI
def test_tied_head_matches_the_embedding_passed_by_hand():
  model = TiedLM(16, 8, rngs=nnx.Rngs(0))
  assert 'head' not in pure(model, only=nnx.Param)
  tokens = jnp.array([[1, 5, 7], [2, 3, 15]])
  embedding = model.embed.embedding[...]
  args = (embedding, model.mix.kernel[...], model.mix.bias[...])
  # Both jitted: one compiler on both sides, so the comparison is of the
  # programs, not of jit's rounding against eager's.
  np.testing.assert_allclose(nnx.jit(lambda m, t: m(t), graph=False)(model, tokens),
                             jax.jit(lm_by_hand)(*args, tokens), rtol=1e-6)
  grads = nnx.grad(lambda m: m(tokens).sum(), graph=False)(model)
  expected = jax.grad(lambda *a: lm_by_hand(*a, tokens).sum(), argnums=(0, 1, 2))(*args)
  assert_trees_close(
      (grads.embed.embedding[...], grads.mix.kernel[...], grads.mix.bias[...]),
      expected)


@pytest.mark.end_to_end  # a whole model: left to --end-to-end and CI
def test_tied_head_trains_as_optax_on_the_parameters_by_hand():
  model = TiedLM(16, 8, rngs=nnx.Rngs(0))
  tokens = jnp.array([[1, 5, 7], [2, 3, 15]])
  params = (model.embed.embedding[...], model.mix.kernel[...], model.mix.bias[...])
  tx = optax.adam(1e-2)
  opt_state = tx.init(params)
  losses, _, optimizer, traces = train(model, tokens, 3, graph=False)
  by_hand = []
  for _ in range(3):
    loss, grads = jax.value_and_grad(
        lambda p: jnp.mean(lm_by_hand(*p, tokens) ** 2))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    by_hand.append(float(loss))
  np.testing.assert_allclose(losses, by_hand, rtol=1e-6)
  assert_trees_close((model.embed.embedding[...], model.mix.kernel[...],
                      model.mix.bias[...]), params)
  mu = pure(optimizer)['opt_state'][0]['mu']
  np.testing.assert_allclose(mu['embed']['embedding'], opt_state[0].mu[0],
                             rtol=1e-5, atol=1e-9)
  assert 'head' not in mu
  assert traces == 1


# --------------------------------------------------------------------------
# remat with static_argnames
# --------------------------------------------------------------------------
@pytest.mark.end_to_end  # a whole model: left to --end-to-end and CI
@pytest.mark.parametrize('deterministic', [True, False])
def test_shared_mask_under_remat_matches_the_graph_mode_shared_reference(deterministic):
  tied = TiedEncoder(2, 8, 4, rngs=nnx.Rngs(0))
  shared = Encoder(2, 8, 4, share=True, graph=True, rngs=nnx.Rngs(0))
  assert len(jax.tree.leaves(nnx.state(tied, Mask, graph=False))) == 1
  loss = lambda m: jnp.mean(m(X, deterministic) ** 2)
  tied_loss, tied_grads = nnx.jit(nnx.value_and_grad(loss, graph=False),
                                  graph=False)(tied)
  ref_loss, ref_grads = nnx.jit(nnx.value_and_grad(loss))(shared)
  np.testing.assert_allclose(tied_loss, ref_loss, rtol=1e-6)
  assert_trees_close(params(tied_grads), params(ref_grads, graph=True))

  def by_hand(mask, blocks):
    x = X
    for kernel, bias in blocks:
      x = block_by_hand(mask, kernel, bias, x, deterministic)
    return jnp.mean(x ** 2)

  blocks = [(b.qkv.kernel[...], b.qkv.bias[...]) for b in tied.blocks]
  np.testing.assert_allclose(tied_loss, by_hand(tied.attention_mask[...], blocks),
                             rtol=1e-6)


@pytest.mark.end_to_end  # a whole model trained: left to --end-to-end and CI
def test_shared_mask_trains_under_remat_as_the_graph_mode_shared_reference():
  tied = TiedEncoder(2, 8, 4, rngs=nnx.Rngs(0))
  shared = Encoder(2, 8, 4, share=True, graph=True, rngs=nnx.Rngs(0))
  tied_losses, tied_grads, tied_opt, traces = train(tied, X, 3, graph=False)
  ref_losses, ref_grads, ref_opt, _ = train(shared, X, 3, graph=True)
  np.testing.assert_allclose(tied_losses, ref_losses, rtol=1e-6)
  assert_trees_close(params(tied_grads), params(ref_grads, graph=True))
  assert_trees_close(pure(tied_opt), pure(ref_opt, graph=True))
  assert traces == 1


# --------------------------------------------------------------------------
# scan and vmap: a tied source broadcast into a stack
# --------------------------------------------------------------------------
def _stack_by_hand(model):
  return (model.mask[...], model.blocks.qkv.kernel[...], model.blocks.qkv.bias[...])


def _scan_by_hand(mask, kernels, biases, x):
  body = lambda x, kb: (block_by_hand(mask, *kb, x, True), None)
  return jax.lax.scan(body, x, (kernels, biases))[0]


@pytest.mark.end_to_end  # a whole model: left to --end-to-end and CI
def test_scan_broadcasts_the_tied_source_into_every_slice():
  model = TiedStackedEncoder(3, 8, 4, rngs=nnx.Rngs(0))
  assert model.blocks.mask is model.mask
  assert model.blocks.qkv.kernel.shape == (3, 8, 24)
  assert len(jax.tree.leaves(nnx.state(model, Mask, graph=False))) == 1
  np.testing.assert_allclose(model(X), _scan_by_hand(*_stack_by_hand(model), X),
                             rtol=1e-6)
  grads = nnx.grad(lambda m: m(X).sum(), graph=False)(model)
  expected = jax.grad(lambda *a: _scan_by_hand(*a, X).sum(), argnums=(0, 1, 2))(
      *_stack_by_hand(model))
  assert_trees_close((grads.mask[...], grads.blocks.qkv.kernel[...],
                      grads.blocks.qkv.bias[...]), expected, rtol=1e-5, atol=1e-6)


def test_vmap_broadcasts_the_tied_source_into_every_slice():
  model = TiedStackedEncoder(3, 8, 4, rngs=nnx.Rngs(0))
  each = nnx.vmap(lambda encoder, x: encoder.blocks(x, deterministic=True),
                  in_axes=(model.axes(), None), graph=False)(model, X)
  mask, kernels, biases = _stack_by_hand(model)
  expected = jax.vmap(lambda k, b: block_by_hand(mask, k, b, X, True))(kernels, biases)
  np.testing.assert_allclose(each, expected, rtol=1e-6)


def test_a_broadcast_source_sliced_by_a_transform_is_refused():
  model = TiedStackedEncoder(4, 8, 4, rngs=nnx.Rngs(0))  # 4 layers, a 4x4 mask

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, graph=False)
  def step(x, encoder):  # the mask scanned with the stack: lengths agree
    return encoder.blocks(x, deterministic=True)

  with pytest.raises(TieError, match=r"'mask' lies outside the stack 'blocks'.*"
                     r'rank 2 -> 1.*\{Mask: None, \.\.\.: 0\}'):
    step(X, model)


@pytest.mark.needs_patch
@pytest.mark.parametrize('scanned', ['decorator', 'call', 'bare'])
def test_a_broadcast_source_sliced_against_a_stack_of_another_length_is_refused(
    scanned):
  # 3 layers, a 4x4 mask: jax.lax.scan refuses before the body runs ("scan
  # got values with different leading axis sizes: 3, 3, 4", no path); the
  # patched nnx.scan names the tie instead, from JAX's error.
  model = TiedStackedEncoder(3, 8, 4, rngs=nnx.Rngs(0))

  def body(x, encoder):
    return encoder.blocks(x, deterministic=True)

  step = {
      'decorator': lambda: nnx.scan(in_axes=(nnx.Carry, 0),
                                    out_axes=nnx.Carry, graph=False)(body),
      'call': lambda: nnx.scan(body, in_axes=(nnx.Carry, 0),
                               out_axes=nnx.Carry, graph=False),
      # Flax's default in_axes, (Carry, 0), slices the whole model too.
      'bare': lambda: nnx.scan(body, out_axes=nnx.Carry, graph=False),
  }[scanned]()
  with pytest.raises(TieError, match=r"'mask' lies outside the stack 'blocks'"
                     r'.*nnx.scan, in_axes 0.*\{Mask: None, \.\.\.: 0\}') as info:
    step(X, model)
  assert 'different leading axis sizes: 3, 3, 4' in str(info.value.__cause__)


@pytest.mark.needs_patch
def test_a_scan_error_that_is_not_a_tied_source_passes_unchanged():
  # The mask broadcast as it should be, an input of the wrong length: the
  # patched nnx.scan raises JAX's error as Flax's own nnx.scan does.
  model = TiedStackedEncoder(3, 8, 4, rngs=nnx.Rngs(0))
  xs = jnp.ones((4, 2, 4, 8))

  def body(x, encoder, extra):
    return encoder.blocks(x + extra, deterministic=True)

  errors = []
  for scan in (nnx.scan, nnx.scan.__wrapped__):  # patched, Flax's
    with pytest.raises(ValueError, match='different leading axis') as info:
      scan(body, in_axes=(nnx.Carry, model.axes(), 0), out_axes=nnx.Carry,
           graph=False)(X, model, xs)
    errors.append(info.value)
  assert [type(e) for e in errors] == [ValueError, ValueError]
  assert str(errors[0]) == str(errors[1]) and errors[0].__cause__ is None


@pytest.mark.end_to_end  # a whole model: left to --end-to-end and CI
def test_a_stack_of_tied_modules_maps_whole():
  @nnx.vmap(graph=False)
  def make(key):
    return TiedStackedEncoder(3, 8, 4, rngs=nnx.Rngs(key))

  models = make(jax.random.split(jax.random.key(0), 2))
  assert models.mask.shape == (2, 4, 4)
  each = nnx.vmap(lambda m, x: m(x), in_axes=(0, None), graph=False)(models, X)
  for i in range(2):
    mask, kernels, biases = (models.mask[i], models.blocks.qkv.kernel[i],
                             models.blocks.qkv.bias[i])
    np.testing.assert_allclose(each[i], _scan_by_hand(mask, kernels, biases, X),
                               rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# cond / switch / fori_loop / while_loop
# --------------------------------------------------------------------------
def test_cond_and_switch_see_one_variable():
  # The reference is the graph-mode shared Variable under the same transform,
  # so that both sides are compiled alike (eager and compiled float32 differ
  # in the last bits, which depend on the host's CPU).
  model = TiedMLP(8, rngs=nnx.Rngs(0))
  reference = SharedMLP(8, share=True, rngs=nnx.Rngs(0))

  def twice(m, x):
    assert m.down.kernel is m.up.kernel
    return 2 * m(x)

  once = lambda m, x: m(x)
  y = nnx.cond(jnp.array(True), once, twice, model, X, graph=False)
  np.testing.assert_allclose(
      y, nnx.cond(jnp.array(True), once, twice, reference, X), rtol=1e-6)
  y = nnx.switch(jnp.array(1), [once, twice], model, X, graph=False)
  np.testing.assert_allclose(
      y, nnx.switch(jnp.array(1), [once, twice], reference, X), rtol=1e-6)
  assert int(model.calls[...]) == 2 and model.down.kernel is model.up.kernel
  assert int(reference.calls[...]) == 2


def test_fori_loop_and_while_loop_carry_one_variable():
  # The reference: the graph-mode shared Variable under the same loops.
  model = TiedMLP(8, rngs=nnx.Rngs(0))
  reference = SharedMLP(8, share=True, rngs=nnx.Rngs(0))

  def body(_, carry):
    m, x = carry
    m.up.kernel[...] = m.up.kernel[...] * 1.0  # a write through the target
    return m, m(x)

  _, y = nnx.fori_loop(0, 3, body, (model, X), graph=False)
  _, expected = nnx.fori_loop(0, 3, body, (reference, X))
  np.testing.assert_allclose(y, expected, rtol=1e-5)
  step = lambda c: (c[0], c[0](c[1]), c[2] + 1)
  _, y, _ = nnx.while_loop(lambda c: c[2] < 3, step, (model, X, 0),
                           graph=False)
  _, expected, _ = nnx.while_loop(lambda c: c[2] < 3, step,
                                  (reference, X, 0))
  np.testing.assert_allclose(y, expected, rtol=1e-5)
  assert int(model.calls[...]) == 6 and model.down.kernel is model.up.kernel
  assert int(reference.calls[...]) == 6


# --------------------------------------------------------------------------
# Orbax, and converting between the tied and the untied layout
# --------------------------------------------------------------------------
@pytest.mark.end_to_end  # an Orbax checkpoint written and read: left to --end-to-end and CI
def test_orbax_checkpoint_of_the_tree_state_stores_the_tied_variable_once(tmp_path):
  ocp = pytest.importorskip('orbax.checkpoint')  # a dependency of flax
  model = TiedLM(16, 8, rngs=nnx.Rngs(0))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / 'lm', nnx.state(model, graph=False))
  checkpointer.wait_until_finished()
  fresh = TiedLM(16, 8, rngs=nnx.Rngs(1))
  restored = checkpointer.restore(tmp_path / 'lm', nnx.state(fresh, graph=False))
  assert 'head' not in nnx.to_pure_dict(restored)
  nnx.update(fresh, restored)
  assert_trees_close(pure(fresh), pure(model), rtol=0, atol=0)
  tokens = jnp.array([[1, 2, 3]])
  np.testing.assert_array_equal(fresh(tokens), model(tokens))


def test_untie_state_is_the_state_of_the_untied_model():
  tied = TiedLM(16, 8, rngs=nnx.Rngs(0))
  untied = LM(16, 8, rngs=nnx.Rngs(1))
  state = flax_tieext.nnx.untie_state(nnx.state(tied, graph=False), TiedLM)
  nnx.update(untied, state)
  tokens = jnp.array([[1, 2, 3]])
  np.testing.assert_allclose(untied(tokens), tied(tokens), rtol=1e-6)
  assert jax.tree.structure(nnx.to_pure_dict(state)) == jax.tree.structure(
      pure(untied))


def test_untie_state_of_a_state_untied_already_keeps_or_refuses_as_linen():
  tied = TiedLM(16, 8, rngs=nnx.Rngs(0))
  state = flax_tieext.nnx.untie_state(nnx.state(tied, graph=False), TiedLM)
  again = flax_tieext.nnx.untie_state(state, TiedLM)  # nothing to drop
  jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(again),
               nnx.to_pure_dict(state))
  state['head']['kernel'].set_value(state['head']['kernel'].get_value() + 1)
  with pytest.raises(TieError, match=r"(?s)target 'head\.kernel' is already"
                     r' in the state.*other values.*would drop them'):
    flax_tieext.nnx.untie_state(state, TiedLM)


def test_tie_state_loads_an_untied_checkpoint_whose_copies_agree():
  untied = SharedMLP(8, rngs=nnx.Rngs(0))
  untied.up.kernel[...] = untied.down.kernel[...]
  state = flax_tieext.nnx.tie_state(nnx.state(untied, graph=False), TiedMLP)
  tied = TiedMLP(8, rngs=nnx.Rngs(5))
  nnx.update(tied, state)
  np.testing.assert_allclose(tied(X), untied(X), rtol=1e-6)
  assert tied.down.kernel is tied.up.kernel


def test_tie_state_refuses_copies_that_differ():
  untied = SharedMLP(8, rngs=nnx.Rngs(0))
  with pytest.raises(TieError, match=r"'up\.kernel' -> 'down\.kernel'.*differs"):
    flax_tieext.nnx.tie_state(nnx.state(untied, graph=False), TiedMLP)


# --------------------------------------------------------------------------
# Errors in the user's terms
# --------------------------------------------------------------------------
def test_a_target_that_does_not_exist_names_the_nearest():
  with pytest.raises(TieError, match=r"target 'dwn\.kernel' does not exist\. "
                     r"Nearest existing names under the module: down"):
    tie(SharedMLP, {'dwn.kernel': 'up.kernel'})(8, rngs=nnx.Rngs(0))


def test_a_source_that_does_not_exist_names_the_nearest():
  with pytest.raises(TieError, match=r"source 'up\.kernal' does not exist\. "
                     r"Nearest existing names under 'up': kernel"):
    tie(SharedMLP, {'down.kernel': 'up.kernal'})(8, rngs=nnx.Rngs(0))


def test_shapes_that_differ_are_refused_with_both_paths():
  with pytest.raises(TieError, match=r"(?s)'embed\.embedding' has \(16, 8\):float32,"
                     r" but 'head\.kernel' has \(8, 16\).*jnp\.transpose"):
    tie(LM, {'head.kernel': 'embed.embedding'})(16, 8, rngs=nnx.Rngs(0))


def test_dtypes_that_differ_are_refused():
  class Mixed(nnx.Module):
    def __init__(self):
      self.a = nnx.Param(jnp.zeros((3,), jnp.float32))
      self.b = nnx.Param(jnp.zeros((3,), jnp.bfloat16))

  with pytest.raises(TieError, match=r"'a' has \(3,\):float32, but 'b' has \(3,\):bfloat16"):
    tie(Mixed, {'b': 'a'})()


def test_variable_types_that_differ_are_refused():
  class Kinds(nnx.Module):
    def __init__(self):
      self.a = nnx.Param(jnp.zeros((3,)))
      self.b = nnx.BatchStat(jnp.zeros((3,)))

  with pytest.raises(TieError, match='target is a BatchStat, the source a Param'):
    tie(Kinds, {'b': 'a'})()


def test_a_source_inside_a_stack_whose_target_is_not_is_refused():
  class Outside(StackedEncoder):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      self.head_mask = Mask(local_mask(4))

  with pytest.raises(TieError, match=r'inside a stack of 3'):
    tie(Outside, {'head_mask': 'blocks.mask'})(3, 8, 4, rngs=nnx.Rngs(0))


def test_ties_to_itself_or_inside_itself_are_refused():
  with pytest.raises(TieError, match='itself'):
    tie(SharedMLP, {'up.kernel': 'up.kernel'})
  with pytest.raises(TieError, match=r"'up\.kernel' lies inside 'up'"):
    tie(SharedMLP, {'up': 'up.kernel'})


def test_a_reassigned_target_is_refused_rather_than_dropped():
  model = TiedMLP(8, rngs=nnx.Rngs(0))
  model.up.kernel = nnx.Param(jnp.zeros((8, 8)))
  with pytest.raises(TieError, match=r"'up\.kernel'.*no longer holds its source"):
    nnx.split(model, graph=False)


def test_a_view_is_read_only():
  model = TiedLM(16, 8, rngs=nnx.Rngs(0))
  with pytest.raises(TieError, match='read-only view'):
    model.head.kernel[...] = jnp.zeros((8, 16))


def test_a_view_shows_in_repr_without_being_read():
  text = repr(TiedLM(16, 8, rngs=nnx.Rngs(0)))
  assert 'ParamView' in text and 'read-only view of its tie source' in text


def test_a_deep_copy_of_a_view_reads_the_copy_of_its_source():
  import copy  # pylint: disable=g-import-not-at-top
  model = TiedLM(16, 8, rngs=nnx.Rngs(0))
  copied = copy.deepcopy(model)
  copied.embed.embedding[...] = 2 * copied.embed.embedding[...]
  np.testing.assert_array_equal(copied.head.kernel[...], 2 * model.head.kernel[...])
  np.testing.assert_array_equal(model.head.kernel[...], model.embed.embedding[...].T)


def test_a_view_read_by_a_graph_mode_transform_says_to_use_tree_mode():
  model = TiedLM(16, 8, rngs=nnx.Rngs(0))
  with pytest.raises(TieError, match='graph=False'):
    nnx.jit(lambda m: m(jnp.array([1])), graph=True)(model)


# --------------------------------------------------------------------------
# Cost: what graph-mode sharing costs (benchmarks/test_nnx_tree_tie.py)
# --------------------------------------------------------------------------
@pytest.mark.end_to_end  # compiles two train steps per case: left to --end-to-end and CI
@pytest.mark.parametrize('name', ['lm', 'encoder'])
def test_tied_train_step_compiles_to_the_cost_of_graph_mode_sharing(name):
  from flax_tieext.examples import nnx_tree  # pylint: disable=g-import-not-at-top
  config = nnx_tree.Config(vocab_size=64, features=16, num_layers=2, length=8,
                           batch_size=2)
  if name == 'lm':
    shared = nnx_tree.SharedLM(config, rngs=nnx.Rngs(0))
    tied = nnx_tree.TiedLM(config, rngs=nnx.Rngs(0))
  else:
    shared = nnx_tree.Encoder(config, share=True, graph=True, rngs=nnx.Rngs(0))
    tied = nnx_tree.tied_encoder(config, rngs=nnx.Rngs(0))
  tokens = nnx_tree.batch(config)
  base, base_traces, base_losses = nnx_tree.train_step_stats(shared, tokens, graph=True)
  cost, traces, losses = nnx_tree.train_step_stats(tied, tokens, graph=False)
  # XLA's cost and memory analysis are deterministic; the target is 1.01.
  assert cost.flops / base.flops <= 1.01
  assert cost.temp_bytes / base.temp_bytes <= 1.01
  assert cost.argument_bytes / base.argument_bytes <= 1.01
  assert traces == base_traces == 1  # one trace for three steps
  np.testing.assert_allclose(losses, base_losses, rtol=1e-6)
