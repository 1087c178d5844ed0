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

"""Module-level lifted transforms added or extended by flax_tieext.

Written as a part of ``flax/linen/transforms.py``: each public function is
transplanted verbatim into that file by ``tools/make_patches.py``. Like
upstream's transforms these are thin: they map Module methods to the
functional-core transforms in ``flax_tieext.core.lift`` via
``lift_transform``.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax

from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.linen.transforms import lift_transform
from flax.linen.transforms import Target
from flax_tieext.core import lift
# pylint: enable=g-importing-member,unused-import

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

# TODO(static_argnames): replaced by the static_argnames implementation.
from flax.linen.transforms import checkpoint  # pylint: disable=g-import-not-at-top
remat = checkpoint

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------

def tie(
    target: Target,
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
    *,
    methods=None,
) -> Target:
  """Ties variables of one path to those of another: one variable, two paths.

  A tree of variables duplicates what a graph would share: the blocks of an
  encoder each get their own copy of an attention mask, an ALBERT-style model
  its own copy of every shared layer, a language model a head separate from
  its embedding. ``nn.tie`` declares that the variables of a *target* path (a
  submodule with all its variables in the tied ``collections``, or a single
  variable) *are* the variables of a *source* path. The result behaves exactly
  as one module instance called at two places: only the source is stored (in
  ``init``, in ``apply(mutable=...)`` results and so in checkpoints), every
  read sees the current value, writes land in the one variable in program
  order, and gradients with respect to the source sum over all uses.

  The tie survives Flax's lifted transforms: a target inside ``nn.remat``,
  ``nn.checkpoint``, ``nn.partitioning.remat``, ``nn.jit``, ``nn.scan``,
  ``nn.vmap``, ``nn.map_variables``, ``nn.cond``/``nn.switch``/
  ``nn.while_loop`` still reaches its source, and each call site is traced
  once. Inside ``nn.scan``/``nn.vmap`` a source outside the stack is broadcast
  (read-only), never stacked.

  Example: one attention mask shared by every block, with rematted blocks::

    >>> import jax, jax.numpy as jnp
    >>> import flax.linen as nn
    >>> import flax_tieext
    ...
    >>> class Block(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    ...     return nn.Dense(x.shape[-1])(x * mask.value)
    ...
    >>> class Encoder(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     for i in range(3):
    ...       x = nn.remat(Block)(name=f'block_{i}')(x)
    ...     return x
    ...
    >>> TiedEncoder = nn.tie(
    ...     Encoder, {'block_1': 'block_0', 'block_2': 'block_0'},
    ...     collections='graph')
    >>> variables = TiedEncoder().init(jax.random.key(0), jnp.ones((1, 4)))
    >>> list(variables['graph'])  # stored once
    ['block_0']
    >>> grads = jax.grad(lambda v: TiedEncoder().apply(
    ...     v, jnp.ones((1, 4))).sum())(variables)
    >>> grads['graph']['block_0']['mask'].shape  # summed over the 3 blocks
    (4,)

  Example: a language-model head tied to the embedding, transposed::

    >>> class LM(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, tokens):
    ...     x = nn.Embed(10, 4, name='embed')(tokens)
    ...     return nn.Dense(10, use_bias=False, name='head')(x)
    ...
    >>> TiedLM = nn.tie(LM, {'head/kernel': ('embed/embedding', jnp.transpose)})
    >>> params = TiedLM().init(jax.random.key(0), jnp.zeros((1, 2), int))
    >>> sorted(params['params'])
    ['embed']

  Args:
    target: a ``Module`` class, or a method of one (used as a decorator).
    ties: maps a target path to a source path, or to ``(source_path,
      view_fn)``, where ``view_fn`` derives the target's read-only value from
      the source's. Paths are ``/``-separated names relative to the wrapped
      module; ``"."`` is the wrapped module itself and a leading ``/`` starts
      at the root module. A path names a module or one variable
      (``"head/kernel"``).
    collections: the tied collections: a collection filter such as
      ``"params"``, ``"graph"`` or ``["batch_stats", "cache"]``.
    methods: for a ``Module`` class target, the methods to wrap (default
      ``__call__``), as a list, or a dict of per-method arguments.

  Returns:
    The wrapped ``Module`` class or method.

  Raises:
    flax_tieext.TieError: for a tie that cannot resolve, a write that cannot
      land, or values given for a tied target; the message names the paths,
      the collection and the declaring module, lists the nearest existing
      names and says how to fix it.
  """
  return lift_transform(
      lift.tie, target, ties, collections=collections, methods=methods
  )
