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

"""The synthetic task the example encoders train on.

Random tokens; the target at each position is the previous token (0 at the
first position). Learning it needs attention to a neighbour and position
information, nothing else, so a small encoder learns it in a few hundred steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def synthetic_batch(key: jax.Array, batch_size: int, length: int,
                    vocab_size: int) -> tuple[jax.Array, jax.Array]:
  """``(tokens, targets)``, both ``int32[batch_size, length]``."""
  tokens = jax.random.randint(key, (batch_size, length), 1, vocab_size)
  targets = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  return tokens, targets


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of integer ``targets``."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, targets).mean()
