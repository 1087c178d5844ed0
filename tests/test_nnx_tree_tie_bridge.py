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

"""Ties across ``nnx.bridge`` in NNX tree mode, both ways.

* Linen -> NNX: the T5-style encoder with ``nn.tie`` (one mask for every
  rematted block) in ``nnx.bridge.ToNNX``, trained with tree-mode ``nnx.jit``,
  ``nnx.value_and_grad``, ``flax_tieext.nnx.remat`` and ``nnx.Optimizer``.
  Reference: the Linen model trained with optax from the same variables.
* NNX -> Linen: a module tied with ``flax_tieext.nnx.tie`` (head = the
  transposed embedding) inside a Linen model under ``nn.remat``, through
  ``nnx.bridge.to_linen`` in tree mode. Reference: the computation by hand
  with the embedding passed explicitly.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_tieext import _compat
from flax_tieext.examples import t5
from flax_tieext.examples import task

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


def assert_close(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
               a, b)


@pytest.mark.end_to_end  # trains a whole model: left to --end-to-end and CI
@pytest.mark.needs_patch  # the Linen encoder declares its ties with nn.tie
def test_tied_linen_model_trains_in_nnx_tree_mode_as_in_linen():
  config = t5.T5Config(vocab_size=16, num_layers=2, d_model=16, num_heads=2,
                       d_ff=32, length=8)
  linen_model = t5.make_encoder(config, tied=True, remat=True)
  tokens, targets = task.synthetic_batch(jax.random.key(1), 2, config.length,
                                         config.vocab_size)
  variables = jax.tree.map(jnp.asarray, dict(
      linen_model.init(jax.random.key(0), tokens, deterministic=True)))

  model = nnx.bridge.ToNNX(linen_model, rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(model, tokens, deterministic=True)
  for collection, tree in variables.items():
    state = nnx.state(model, nnx.variable_type_from_name(collection), graph=False)
    nnx.replace_by_pure_dict(state, tree)
    nnx.update(model, state)
  # One mask, block 0's: the Linen layout, in tree mode too.
  graph = nnx.state(model, nnx.variable_type_from_name('graph'), graph=False)
  assert list(nnx.to_pure_dict(graph)) == ['block_0']

  tx = optax.adam(1e-2)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param, graph=False)
  forward = flax_tieext.nnx.remat(
      lambda model, tokens, deterministic: model(tokens, deterministic=deterministic),
      static_argnames='deterministic', graph=False)

  @nnx.jit(graph=False)
  def nnx_step(model, optimizer, tokens, targets):
    # Tree-mode nnx.grad differentiates every Variable of its argument (the
    # bridge's RNG counters too): split out the parameters.
    graphdef, params, rest = nnx.split(model, nnx.Param, ..., graph=False)

    def loss_fn(params, rest):
      logits = forward(nnx.merge(graphdef, params, rest), tokens, True)
      return task.cross_entropy(logits, targets)

    loss, grads = nnx.value_and_grad(loss_fn, graph=False)(params, rest)
    optimizer.update(model, grads)
    return loss, grads

  params = variables['params']
  others = {col: tree for col, tree in variables.items() if col != 'params'}
  opt_state = tx.init(params)

  @jax.jit
  def linen_step(params, opt_state, tokens, targets):
    def loss_fn(params):
      logits = linen_model.apply({'params': params, **others}, tokens,
                                 deterministic=True)
      return task.cross_entropy(logits, targets)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  for _ in range(3):
    loss, grads = nnx_step(model, optimizer, tokens, targets)
    params, opt_state, linen_loss, linen_grads = linen_step(
        params, opt_state, tokens, targets)
    assert_close(loss, linen_loss)
    assert_close(nnx.to_pure_dict(grads), linen_grads)
  trained = nnx.state(model, nnx.Param, graph=False)
  assert_close(nnx.to_pure_dict(trained), params)


class LM(nnx.Module):

  def __init__(self, vocab, features, *, rngs):
    self.embed = nnx.Embed(vocab, features, rngs=rngs)
    self.head = nnx.Linear(features, vocab, use_bias=False, rngs=rngs)

  def __call__(self, tokens):
    return self.head(jax.nn.gelu(self.embed(tokens)))


TiedLM = flax_tieext.nnx.tie(LM, {'head.kernel': ('embed.embedding', jnp.transpose)})


class LinenBlock(nn.Module):

  @nn.compact
  def __call__(self, tokens):
    return nnx.bridge.to_linen(TiedLM, 16, 8, name='lm')(tokens)


class LinenModel(nn.Module):

  @nn.compact
  def __call__(self, tokens):
    return nn.remat(LinenBlock)(name='block')(tokens)


@pytest.mark.end_to_end  # a whole model through nnx.bridge: left to --end-to-end and CI
def test_tree_mode_tied_module_in_a_rematted_linen_model():
  tokens = jnp.array([[1, 5, 7], [2, 3, 15]])
  with nnx.set_graph_mode(False):  # the bridge's split, state and update
    params = LinenModel().init(jax.random.key(0), tokens)['params']
    # The embedding is stored once; the tied head is not a Linen variable.
    assert jax.tree.map(jnp.shape, params) == {
        'block': {'lm': {'embed': {'embedding': (16, 8)}}}}
    loss_fn = lambda p: (LinenModel().apply({'params': p}, tokens) ** 2).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)

  def by_hand(embedding):
    return ((jax.nn.gelu(embedding[tokens]) @ embedding.T) ** 2).mean()

  embedding = params['block']['lm']['embed']['embedding']
  expected_loss, expected_grad = jax.value_and_grad(by_hand)(embedding)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  np.testing.assert_allclose(grads['block']['lm']['embed']['embedding'],
                             expected_grad, rtol=1e-5, atol=1e-7)
