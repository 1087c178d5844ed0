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

"""Tied NNX models in tree mode and their graph-mode shared references.

Two models, each in two spellings that compute the same function of the
same stored variables:

* a language model whose head is the transposed embedding:
  ``TiedLM`` (``flax_tieext.nnx.tie`` with a ``jnp.transpose`` view, tree
  mode) and ``SharedLM`` (graph mode: the head reads the one embedding
  module, ``nnx.Embed.attend``);
* an encoder of rematted blocks reading one mask: ``TiedEncoder`` (tree
  mode) and ``Encoder(share=True)`` (graph mode: the blocks hold one ``Mask``
  object).

:func:`train_step_stats` compiles one Adam train step of a model, jitted as
a function of its split state, and reports XLA's cost and memory analysis
and how often the step was traced. ``benchmarks/test_nnx_tree_tie.py``
and ``tests/test_nnx_tree_tie.py`` compare the two spellings with it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import flax_tieext.nnx
from flax_tieext.examples import measure


class Mask(nnx.Variable):
  """Not a parameter: the optimizer leaves it alone."""


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int = 512
  features: int = 128
  num_layers: int = 4
  length: int = 64
  batch_size: int = 8


class LM(nnx.Module):
  """Embedding, a residual MLP per layer, and an untied head."""

  def __init__(self, config: Config, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(config.vocab_size, config.features, rngs=rngs)
    self.layers = nnx.List([nnx.Linear(config.features, config.features, rngs=rngs)
                            for _ in range(config.num_layers)])
    self.head = nnx.Linear(config.features, config.vocab_size, use_bias=False,
                           rngs=rngs)

  def hidden(self, tokens):
    x = self.embed(tokens)
    for layer in self.layers:
      x = x + jax.nn.gelu(layer(x))
    return x

  def __call__(self, tokens):
    return self.head(self.hidden(tokens))


TiedLM = flax_tieext.nnx.tie(LM, {'head.kernel': ('embed.embedding', jnp.transpose)})


class SharedLM(LM):
  """The graph-mode reference: the head is the embedding module itself."""

  def __init__(self, config: Config, *, rngs: nnx.Rngs):
    super().__init__(config, rngs=rngs)
    del self.head

  def __call__(self, tokens):
    return self.embed.attend(self.hidden(tokens))


def local_attention_mask(length, window=4):
  pos = jnp.arange(length)
  return (jnp.abs(pos[:, None] - pos[None, :]) <= window).astype(jnp.float32)


class Block(nnx.Module):

  def __init__(self, config: Config, mask: Mask | None, *, rngs: nnx.Rngs):
    self.mask = mask if mask is not None else Mask(local_attention_mask(config.length))
    self.qkv = nnx.Linear(config.features, 3 * config.features, rngs=rngs)
    self.mlp = nnx.Linear(config.features, config.features, rngs=rngs)

  def __call__(self, x):
    q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
    scores = q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(self.mask[...] > 0, scores, -1e9)
    x = x + jax.nn.softmax(scores) @ v
    return x + jax.nn.relu(self.mlp(x))


class Encoder(nnx.Module):
  """Rematted blocks; ``share``: one Mask object (the graph-mode reference)."""

  def __init__(self, config: Config, *, share: bool = False, graph: bool = False,
               rngs: nnx.Rngs):
    self.embed = nnx.Embed(config.vocab_size, config.features, rngs=rngs)
    self.attention_mask = Mask(local_attention_mask(config.length))
    self.graph = graph
    self.blocks = nnx.List([
        Block(config, self.attention_mask if share else None, rngs=rngs)
        for _ in range(config.num_layers)])

  def __call__(self, tokens):
    forward = flax_tieext.nnx.remat(lambda block, x: block(x), graph=self.graph)
    x = self.embed(tokens)
    for block in self.blocks:
      x = forward(block, x)
    return self.embed.attend(x)


def tied_encoder(config: Config, *, rngs: nnx.Rngs) -> Encoder:
  ties = {f'blocks.{i}.mask': 'attention_mask' for i in range(config.num_layers)}
  return _tied_encoder_class(tuple(ties.items()))(config, rngs=rngs)


_TIED_ENCODERS: dict = {}


def _tied_encoder_class(ties):
  if ties not in _TIED_ENCODERS:
    _TIED_ENCODERS[ties] = flax_tieext.nnx.tie(Encoder, dict(ties))
  return _TIED_ENCODERS[ties]


def batch(config: Config, seed: int = 1):
  """Token sequences one longer than the model's length: inputs and targets."""
  return jax.random.randint(jax.random.key(seed),
                            (config.batch_size, config.length + 1), 0,
                            config.vocab_size)


def loss_fn(model, tokens):
  logits = model(tokens[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, tokens[:, 1:]).mean()


def train_step(model, graph: bool, traces: list | None = None):
  """``(step, state)``: one Adam step as a jitted function of the split state."""
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param, graph=graph)
  graphdef, state = nnx.split((model, optimizer), graph=graph)

  @jax.jit
  def step(state, tokens):
    if traces is not None:
      traces.append(1)
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn, graph=graph)(model, tokens)
    optimizer.update(model, grads)
    return loss, nnx.state((model, optimizer), graph=graph)

  return step, state


def train_step_stats(model, tokens, graph: bool, steps: int = 3):
  """XLA's stats of ``model``'s train step, its trace count and its losses."""
  traces: list = []
  step, state = train_step(model, graph, traces)
  _, stats = measure.compile_stats(step, state, tokens)
  losses = []
  for _ in range(steps):
    loss, state = step(state, tokens)
    losses.append(float(loss))
  return stats, len(traces), losses
