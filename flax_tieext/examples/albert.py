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

"""An ALBERT-style encoder: one attention module shared by all blocks.

Two ways to write the sharing, with identical variables and computation:

* ``sharing='module'``, the upstream idiom: the encoder creates one
  ``SelfAttention`` and passes it into every (rematted) block as an attribute.
  Flax lifts the shared module into each ``nn.remat`` with the block. Works on
  Flax without ``flax_tieext``.
* ``sharing='tie'``: every block creates its own ``attn`` submodule, as if
  untied, and ``nn.tie`` ties ``block_i/attn`` to ``block_0/attn``. The blocks
  need not know that they share anything.

``sharing='none'`` is the untied model (one attention module per block).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.linen as nn
import jax

from flax_tieext.examples import task
from flax_tieext.examples.attention import SelfAttention
from flax_tieext.examples.attention import with_axes

Sharing = Literal['module', 'tie', 'none']


@dataclasses.dataclass(frozen=True)
class AlbertConfig:
  """Sizes of the encoder.

  Attributes:
    vocab_size: number of token ids.
    num_layers: number of encoder blocks.
    d_model: width of the residual stream.
    num_heads: attention heads.
    d_ff: width of each block's feed-forward layer.
    length: sequence length.
  """

  vocab_size: int = 64
  num_layers: int = 12
  d_model: int = 64
  num_heads: int = 4
  d_ff: int = 128
  length: int = 32


class Block(nn.Module):
  """A pre-norm block; its attention is ``attention`` if given, else its own.

  Attributes:
    config: the sizes.
    attention: a shared attention module created by the caller (the upstream
      idiom), or ``None`` for a submodule ``attn`` of the block's own.
    logical_axes: annotate every kernel with logical axis names
      (``nn.with_logical_partitioning``), see :data:`LOGICAL_AXIS_RULES`.
  """

  config: AlbertConfig
  attention: nn.Module | None = None
  logical_axes: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    cfg = self.config
    attention = self.attention
    if attention is None:
      attention = SelfAttention(cfg.num_heads, logical_axes=self.logical_axes,
                                name='attn')
    x = x + attention(nn.LayerNorm(name='attn_norm')(x),
                      deterministic=deterministic)
    y = nn.LayerNorm(name='mlp_norm')(x)
    kernel_init = nn.linear.default_kernel_init
    y = nn.gelu(nn.Dense(
        cfg.d_ff, name='wi',
        kernel_init=with_axes(kernel_init, ('embed', 'mlp'), self.logical_axes),
    )(y))
    return x + nn.Dense(
        cfg.d_model, name='wo',
        kernel_init=with_axes(kernel_init, ('mlp', 'embed'), self.logical_axes),
    )(y)


class Encoder(nn.Module):
  """Embeddings, ``num_layers`` blocks, logits.

  Every block is wrapped in ``nn.remat(Block, static_argnums=(2,))`` (Flax's
  own numbering, ``self`` is 0) when the attention is shared the upstream way
  (``share_module``), so that the encoder runs on Flax without
  ``flax_tieext``; otherwise in ``nn.remat(Block,
  static_argnames=('deterministic',))``.

  Attributes:
    config: the sizes.
    share_module: create one ``SelfAttention`` here and pass it into every
      block (the upstream idiom); otherwise each block has its own.
    remat: wrap every block in ``nn.remat``.
    logical_axes: annotate every parameter with logical axis names, for
      sharded training (see :data:`LOGICAL_AXIS_RULES`).
  """

  config: AlbertConfig
  share_module: bool = False
  remat: bool = True
  logical_axes: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, deterministic: bool = True
               ) -> jax.Array:
    cfg = self.config
    block = Block
    if self.remat and self.share_module:
      block = nn.remat(Block, static_argnums=(2,))
    elif self.remat:
      block = nn.remat(Block, static_argnames=('deterministic',))
    shared = None
    if self.share_module:
      shared = SelfAttention(cfg.num_heads, logical_axes=self.logical_axes,
                             name='attn')
    axes = self.logical_axes
    embed_init = with_axes(nn.linear.default_embed_init, ('vocab', 'embed'),
                           axes)
    x = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=embed_init,
                 name='embed')(tokens)
    x = x + self.param(
        'position_embedding',
        with_axes(nn.initializers.normal(0.02), ('length', 'embed'), axes),
        (cfg.length, cfg.d_model))[:tokens.shape[-1]]
    for i in range(cfg.num_layers):
      x = block(cfg, attention=shared, logical_axes=self.logical_axes,
                name=f'block_{i}')(x, deterministic)
    x = nn.LayerNorm(name='final_norm')(x)
    logits_init = with_axes(nn.linear.default_kernel_init, ('embed', 'vocab'),
                            axes)
    return nn.Dense(cfg.vocab_size, use_bias=False, kernel_init=logits_init,
                    name='logits')(x)


# How the logical axes of ``logical_axes=True`` map onto a ``('data', 'model')``
# mesh (``nn.logical_to_mesh_sharding``): attention heads, the feed-forward
# width and the vocabulary are split over ``'model'``, the batch over
# ``'data'``; everything else is replicated.
LOGICAL_AXIS_RULES = (
    ('batch', 'data'),
    ('heads', 'model'),
    ('mlp', 'model'),
    ('vocab', 'model'),
    ('embed', None),
    ('length', None),
    ('qkv', None),
    ('kv', None),
)


def attention_ties(num_layers: int) -> dict[str, str]:
  """Every block's attention is block 0's."""
  return {f'block_{i}/attn': 'block_0/attn' for i in range(1, num_layers)}


def make_encoder(config: AlbertConfig, *, sharing: Sharing = 'tie',
                 remat: bool = True, logical_axes: bool = False) -> nn.Module:
  """The encoder with its attention shared as ``sharing`` says.

  Args:
    config: the sizes.
    sharing: ``'module'`` (one module passed into every block), ``'tie'``
      (``nn.tie``), or ``'none'`` (untied).
    remat: remat every block.
    logical_axes: annotate the parameters with logical axis names
      (:data:`LOGICAL_AXIS_RULES`).

  Returns:
    The encoder module.
  """
  if sharing == 'module':
    return Encoder(config, share_module=True, remat=remat,
                   logical_axes=logical_axes)
  if sharing == 'none':
    return Encoder(config, remat=remat, logical_axes=logical_axes)
  if sharing == 'tie':
    tied = nn.tie(Encoder, attention_ties(config.num_layers))
    return tied(config, remat=remat, logical_axes=logical_axes)
  raise ValueError(f"sharing must be 'module', 'tie' or 'none', got {sharing!r}")


def loss_fn(model: nn.Module, params: Any, tokens: jax.Array,
            targets: jax.Array) -> jax.Array:
  """Mean cross-entropy of ``model`` on ``(tokens, targets)``."""
  return task.cross_entropy(model.apply({'params': params}, tokens), targets)
