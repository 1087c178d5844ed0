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

"""Multi-head self-attention with an optional mask, and a trace counter.

Shared by the T5-style and the ALBERT-style encoders. The counter lets the
benchmarks count how many times the module's ``__call__`` body runs (how many
times it is traced) while a model is initialized::

  with count_calls() as calls:
    model.init(key, tokens)
  print(calls.count)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass
class CallCount:
  """How many times :class:`SelfAttention` ran since the count started."""

  count: int = 0


_active_counts: list[CallCount] = []


@contextlib.contextmanager
def count_calls() -> Iterator[CallCount]:
  """Counts the runs of ``SelfAttention.__call__`` inside the ``with`` block."""
  counter = CallCount()
  _active_counts.append(counter)
  try:
    yield counter
  finally:
    _active_counts.remove(counter)


class SelfAttention(nn.Module):
  """Multi-head dot-product self-attention (no biases, as in T5).

  Attributes:
    num_heads: number of attention heads; must divide the feature size.
    dropout_rate: dropout on the attention weights.
    logical_axes: annotate the kernels with logical axis names
      (``nn.with_logical_partitioning``): ``('embed', 'qkv', 'heads', 'kv')``
      for the fused query/key/value projection and ``('heads', 'kv',
      'embed')`` for the output projection.
  """

  num_heads: int
  dropout_rate: float = 0.0
  logical_axes: bool = False

  @nn.compact
  def __call__(
      self,
      x: jax.Array,
      mask: jax.Array | None = None,
      deterministic: bool = True,
  ) -> jax.Array:
    """Attends over the second-to-last axis of ``x``.

    Args:
      x: inputs of shape ``(..., length, features)``.
      mask: optional ``(length, length)`` array; query ``i`` attends to key
        ``j`` where ``mask[i, j] > 0``.
      deterministic: if ``False``, applies dropout (needs a ``'dropout'`` rng).

    Returns:
      An array shaped like ``x``.
    """
    for counter in _active_counts:
      counter.count += 1
    features = x.shape[-1]
    head_dim = features // self.num_heads
    qkv = nn.DenseGeneral(
        (3, self.num_heads, head_dim), use_bias=False,
        kernel_init=with_axes(nn.linear.default_kernel_init,
                              ('embed', 'qkv', 'heads', 'kv'),
                              self.logical_axes),
        name='qkv')(x)
    q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
    logits = jnp.einsum('...qhd,...khd->...hqk', q, k) / jnp.sqrt(head_dim)
    if mask is not None:
      logits = jnp.where(mask > 0, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits, axis=-1)
    weights = nn.Dropout(self.dropout_rate, deterministic=deterministic)(
        weights)
    y = jnp.einsum('...hqk,...khd->...qhd', weights, v)
    return nn.DenseGeneral(
        features, axis=(-2, -1), use_bias=False,
        kernel_init=with_axes(nn.linear.default_kernel_init,
                              ('heads', 'kv', 'embed'), self.logical_axes),
        name='out')(y)


def with_axes(init: Callable[..., jax.Array], names: tuple[str, ...],
              enabled: bool = True) -> Callable[..., Any]:
  """``init``, annotated with logical axis ``names`` if ``enabled``."""
  return nn.with_logical_partitioning(init, names) if enabled else init
