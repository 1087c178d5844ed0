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

"""A T5-style encoder whose blocks share one attention mask, tied with ``nn.tie``.

Every block reads a local-attention mask from the ``graph`` collection (a
non-trainable variable, like ``batch_stats``). Untied, each of the ``N`` blocks
stores its own copy of the same mask. Tied, block 0 stores it and the other
blocks' ``graph`` variables *are* block 0's::

  model = make_encoder(T5Config(num_layers=12), tied=True, remat=True)
  variables = model.init(jax.random.key(0), tokens, deterministic=True)
  list(variables['graph'])  # ['block_0']

The blocks are rematted with
``nn.checkpoint(Block, static_argnames=('deterministic',))``: ``deterministic``
switches dropout on and off in Python, so it must be static, however the block
is called.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import flax_tieext  # pylint: disable=unused-import  (installs nn.tie, static_argnames)
from flax_tieext.examples import task
from flax_tieext.examples.attention import SelfAttention


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Sizes of the encoder; the defaults train in seconds on a laptop CPU.

  Attributes:
    vocab_size: number of token ids.
    num_layers: number of encoder blocks.
    d_model: width of the residual stream.
    num_heads: attention heads per block.
    d_ff: width of the feed-forward layer.
    length: sequence length (the mask is ``length x length``).
    window: each token attends to the tokens at most ``window`` away.
    dropout_rate: dropout after attention and in the feed-forward layer.
  """

  vocab_size: int = 64
  num_layers: int = 12
  d_model: int = 64
  num_heads: int = 4
  d_ff: int = 128
  length: int = 32
  window: int = 4
  dropout_rate: float = 0.1


def local_attention_mask(length: int, window: int) -> jax.Array:
  """A ``(length, length)`` float32 mask: 1 where ``|i - j| <= window``."""
  pos = jnp.arange(length)
  return (jnp.abs(pos[:, None] - pos[None, :]) <= window).astype(jnp.float32)


class Block(nn.Module):
  """A pre-norm T5 encoder block: masked self-attention, then a ReLU MLP.

  The mask is the block's ``graph`` variable ``mask``, created on first use.
  """

  config: T5Config

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = False) -> jax.Array:
    cfg = self.config
    mask = self.variable(
        'graph', 'mask', local_attention_mask, x.shape[-2], cfg.window)
    y = nn.RMSNorm(name='attn_norm')(x)
    y = SelfAttention(cfg.num_heads, name='attn')(y, mask.value)
    x = x + nn.Dropout(cfg.dropout_rate, deterministic=deterministic)(y)
    y = nn.RMSNorm(name='mlp_norm')(x)
    y = nn.relu(nn.Dense(cfg.d_ff, use_bias=False, name='wi')(y))
    y = nn.Dropout(cfg.dropout_rate, deterministic=deterministic)(y)
    y = nn.Dense(cfg.d_model, use_bias=False, name='wo')(y)
    return x + nn.Dropout(cfg.dropout_rate, deterministic=deterministic)(y)


class Encoder(nn.Module):
  """Token and position embeddings, ``num_layers`` blocks, norm, logits.

  Attributes:
    config: the sizes.
    remat: wrap every block in
      ``nn.checkpoint(Block, static_argnames=('deterministic',))``.
    static_argnums: instead, write the remat the way upstream Flax needs it:
      ``nn.checkpoint(Block, static_argnums=(2,))`` with ``deterministic``
      passed positionally (the benchmarks compare the two).
  """

  config: T5Config
  remat: bool = True
  static_argnums: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, deterministic: bool = False
               ) -> jax.Array:
    cfg = self.config
    block = Block
    if self.remat and self.static_argnums:
      block = nn.checkpoint(Block, static_argnums=(2,))
    elif self.remat:
      block = nn.checkpoint(Block, static_argnames=('deterministic',))
    x = nn.Embed(cfg.vocab_size, cfg.d_model, name='embed')(tokens)
    x = x + self.param('position_embedding', nn.initializers.normal(0.02),
                       (cfg.length, cfg.d_model))[:tokens.shape[-1]]
    for i in range(cfg.num_layers):
      if self.static_argnums:
        x = block(cfg, name=f'block_{i}')(x, deterministic)
      else:
        x = block(cfg, name=f'block_{i}')(x, deterministic=deterministic)
    x = nn.RMSNorm(name='final_norm')(x)
    return nn.Dense(cfg.vocab_size, use_bias=False, name='logits')(x)


def mask_ties(num_layers: int) -> dict[str, str]:
  """The ties of the ``graph`` collection: every block shares block 0's."""
  return {f'block_{i}': 'block_0' for i in range(1, num_layers)}


def make_encoder(config: T5Config, *, tied: bool = True, remat: bool = True,
                 static_argnums: bool = False) -> nn.Module:
  """The encoder, with its ``graph`` collection tied across blocks or not.

  Args:
    config: the sizes.
    tied: store the mask once (``nn.tie``); otherwise once per block.
    remat: remat every block.
    static_argnums: remat with upstream's positional ``static_argnums``
      instead of ``static_argnames`` (see ``Encoder``).

  Returns:
    An ``Encoder`` (a tied subclass of it when ``tied``).
  """
  if not tied:
    return Encoder(config, remat=remat, static_argnums=static_argnums)
  tied_encoder = nn.tie(Encoder, mask_ties(config.num_layers),
                        collections='graph')
  return tied_encoder(config, remat=remat, static_argnums=static_argnums)


def loss_fn(
    model: nn.Module,
    params: Any,
    other_variables: dict[str, Any],
    tokens: jax.Array,
    targets: jax.Array,
    dropout_key: jax.Array | None = None,
) -> jax.Array:
  """Mean cross-entropy; dropout is on iff ``dropout_key`` is given."""
  deterministic = dropout_key is None
  rngs = {} if deterministic else {'dropout': dropout_key}
  logits = model.apply({'params': params, **other_variables}, tokens,
                       deterministic=deterministic, rngs=rngs)
  return task.cross_entropy(logits, targets)
