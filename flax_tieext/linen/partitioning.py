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

"""``nn.partitioning.remat`` with ``static_argnames``.

Written in the layout of ``flax/linen/partitioning.py``. Flax counts
``static_argnums`` here *without* ``self`` (HF transformers relies on that);
that numbering is kept.

``core_remat_static`` closed over static arguments to work around a
``scan(remat(...))`` bug of ``jax.remat``'s ``static_argnums`` (its TODO asked
to move the fix into ``lift.checkpoint``). ``lift.checkpoint`` now closes over
them itself, so ``core_remat_static`` is ``lift.checkpoint`` under its old
name, which ``remat`` keeps for the classes it makes (``Core_remat_staticMLP``)
and with them the names of existing checkpoints.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable

import flax
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
# flax_tieext's twin of flax.linen.transforms (whose `lift` is flax.core.lift's
# twin), where upstream partitioning.py reaches it as `nn.transforms`.
from flax_tieext.linen import transforms
# pylint: enable=g-importing-member,unused-import


def core_remat_static(fn, variables=True, rngs=True, concrete=False,
                      prevent_cse=True, static_argnums=(), policy=None):
  """Flax functional core remat version with static_argnums.

  ``lift.checkpoint``, which closes over static arguments as this function
  did to work around a ``scan(remat(...))`` bug of ``jax.remat``.
  """
  return transforms.lift.checkpoint(
      fn, variables, rngs, concrete, prevent_cse, static_argnums, policy
  )


def remat(
    target=None,
    variables=True,
    rngs=True,
    concrete=False,
    prevent_cse=True,
    static_argnums=(),
    policy=None,
    methods=None,
    static_argnames=(),
):
  """Flax lifted remat that supports static_argnums and static_argnames.

  The same as ``nn.remat``, except that ``static_argnums`` does not count
  ``self`` here: 0 is the first argument after it. A name in
  ``static_argnames`` needs no counting, and is static however the argument
  is passed: positionally, by keyword, or left to its default. Keyword
  arguments reach the method.

  Example::

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    >>> import flax.linen.partitioning  # for nn.partitioning
    ...
    >>> class Layer(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x, mask=None, deterministic=True):
    ...     x = nn.Dense(4)(x)
    ...     return nn.Dropout(0.5, deterministic=deterministic)(x)
    ...
    >>> RematLayer = nn.partitioning.remat(Layer, static_argnums=(2,))  # no self
    >>> RematLayer = nn.partitioning.remat(Layer, static_argnames='deterministic')
    >>> variables = RematLayer().init(jax.random.key(0), jnp.ones((2, 3)))
    >>> y = RematLayer().apply(variables, jnp.ones((2, 3)), deterministic=True)
  """
  return transforms._checkpoint_lift_transform(  # pylint: disable=protected-access
      core_remat_static, 'nn.partitioning.remat', 0, target, variables, rngs,
      concrete, prevent_cse, static_argnums, policy, methods, static_argnames,
      closes_over=True,
  )
