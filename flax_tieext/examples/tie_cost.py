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

"""What ties cost in Python: calls of ``init`` and of a grad trace, counted.

``N`` rematted blocks, every block tied to ``block_0`` with ``nn.tie``, against
the same model written by hand: one ``block_0`` module called ``N`` times (one
shared instance). Python calls are counted with ``sys.setprofile`` (``'call'``
events), which is deterministic, while each function is traced abstractly
(``jax.eval_shape``), so the ratio tied / hand-shared can be asserted where a
time could not. Used by ``benchmarks/test_tie_cost.py`` and
``tests/test_tie_cost.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

Kind = Literal['tied', 'shared']
FEATURES = 8
INPUT = jax.ShapeDtypeStruct((2, FEATURES), jnp.float32)


class Block(nn.Module):
  """A small residual block: dense, layer norm, tanh."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(FEATURES, name='dense')(x)
    return x + jnp.tanh(nn.LayerNorm(name='norm')(h))


RematBlock = nn.remat(Block)  # pylint: disable=invalid-name


class Blocks(nn.Module):
  """``blocks`` rematted blocks; ``shared``: one instance called each time."""

  blocks: int
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    one = RematBlock(name='block_0') if self.shared else None
    for i in range(self.blocks):
      x = (one or RematBlock(name=f'block_{i}'))(x)
    return x


class Attention(nn.Module):
  """Reads the attention mask from collection ``graph`` (the user's report)."""

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask',
                         lambda: jnp.tril(jnp.ones((FEATURES, FEATURES))))
    return x @ (0.5 * mask.value)


class InnerBlock(nn.Module):
  """The original pattern: block ``idx > 0`` ties its attention to block 0's.

  The tie is declared inside the block, so inside its ``nn.remat``, and its
  source ``/block_0/attn`` lies outside it; with ``attn`` given, the block
  calls that one shared instance instead (the hand-shared model).
  """

  idx: int = 0
  attn: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    attn = self.attn
    if attn is None:
      cls = Attention if self.idx == 0 else nn.tie(
          Attention, {'.': '/block_0/attn'}, collections='graph')
      attn = cls(name='attn')
    return x + jnp.tanh(nn.Dense(FEATURES, name='dense')(attn(x)))


class InnerBlocks(nn.Module):
  """``blocks`` blocks, ``nn.remat`` (or ``nn.jit``) applied in the loop as the README does."""

  blocks: int
  shared: bool = False
  jit: bool = False

  @nn.compact
  def __call__(self, x):
    attn = Attention(name='attn') if self.shared else None
    wrap = nn.jit if self.jit else nn.remat
    for i in range(self.blocks):
      x = wrap(InnerBlock)(i, attn, name=f'block_{i}')(x)
    return x


def model(blocks: int, kind: Kind, inner: bool = False,
          jit: bool = False) -> nn.Module:
  """Every block tied to ``block_0`` (``tied``), or one shared block.

  With ``inner``, the original pattern: each block ties its attention mask
  to block 0's (a tie declared inside the rematted block, or the jitted one
  with ``jit``), against one attention instance passed into every block.
  """
  if inner:
    return InnerBlocks(blocks, shared=kind == 'shared', jit=jit)
  if kind == 'shared':
    return Blocks(blocks, shared=True)
  tied = nn.tie(Blocks, {f'block_{i}': 'block_0' for i in range(1, blocks)})
  return tied(blocks)


def python_calls(fn: Callable[[], Any]) -> int:
  """The number of Python function calls made while ``fn()`` runs."""
  count = 0

  def profile(frame, event, arg):
    del frame, arg
    nonlocal count
    if event == 'call':
      count += 1

  previous = sys.getprofile()
  sys.setprofile(profile)
  try:
    fn()
  finally:
    sys.setprofile(previous)
  return count


def init_calls(blocks: int, kind: Kind, inner: bool = False) -> int:
  """Python calls of ``init``, traced abstractly."""
  m = model(blocks, kind, inner)
  return python_calls(lambda: jax.eval_shape(m.init, jax.random.key(0), INPUT))


def grad_calls(blocks: int, kind: Kind, inner: bool = False) -> int:
  """Python calls of tracing the gradient of the output's sum."""
  m = model(blocks, kind, inner)
  variables = jax.eval_shape(m.init, jax.random.key(0), INPUT)
  loss = lambda v, x: m.apply(v, x).sum()
  return python_calls(lambda: jax.eval_shape(jax.grad(loss), variables, INPUT))


def ratios(blocks: int, grad: bool = True,
           inner: bool = False) -> dict[str, float]:
  """``init`` (and grad-trace) calls, tied / hand-shared, at ``blocks``."""
  init_calls(2, 'tied', inner), init_calls(2, 'shared', inner)  # warm caches
  row = {'blocks': blocks, 'init_tied': init_calls(blocks, 'tied', inner),
         'init_shared': init_calls(blocks, 'shared', inner)}
  row['init_ratio'] = row['init_tied'] / row['init_shared']
  if grad:
    row['grad_tied'] = grad_calls(blocks, 'tied', inner)
    row['grad_shared'] = grad_calls(blocks, 'shared', inner)
    row['grad_ratio'] = row['grad_tied'] / row['grad_shared']
  return row
