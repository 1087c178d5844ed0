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

Written as a part of ``flax/linen/partitioning.py`` (see
``tools/make_patches.py``). Upstream counts ``static_argnums`` here
*without* ``self`` (HF transformers relies on that); that numbering is kept.

Upstream implemented static arguments here by closure (``core_remat_static``)
to work around a ``scan(remat(...))`` abstraction bug. ``lift.checkpoint``
now does the same for every entry point, so ``core_remat_static`` delegates
to it; it keeps its name because ``lift_transform`` names the transformed
Module class after it (``Core_remat_staticMLP``), and with it the
auto-generated submodule names of existing checkpoints.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable

import flax
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
# In upstream partitioning.py, `nn` is `flax.linen`; `nn.transforms` is then
# flax.linen.transforms and `nn.transforms.lift` is flax.core.lift. Here they
# are flax_tieext's own twins of those modules.
from flax_tieext import linen as nn
# pylint: enable=g-importing-member,unused-import


# Remat with static arguments
# ------------------------------------------------------------------------------
# Static arguments used to be implemented here by closure, to work around a
# scan(remat(...)) abstraction bug; lift.checkpoint now does the same for every
# entry point, and resolves them through the wrapped method's signature.
# core_remat_static keeps its name: lift_transform names the transformed Module
# class after it (Core_remat_staticMLP), and with it the auto-generated names
# of submodules in existing checkpoints.


def core_remat_static(
    fn,
    variables=True,
    rngs=True,
    concrete=False,
    prevent_cse=True,
    static_argnums=(),
    policy=None,
    static_argnames=(),
):
  """Flax functional core remat version with static_argnums.

  Same as ``lift.checkpoint``, which implements static arguments by closure;
  ``static_argnums`` counts from the first argument after the scope.
  """
  return nn.transforms.lift.checkpoint(
      fn,
      variables=variables,
      rngs=rngs,
      concrete=concrete,
      prevent_cse=prevent_cse,
      static_argnums=static_argnums,
      policy=policy,
      static_argnames=static_argnames,
  )


def remat(
    target=None,
    variables: CollectionFilter = True,
    rngs: PRNGSequenceFilter = True,
    concrete: bool = False,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    policy: Callable[..., bool] | None = None,
    methods=None,
    static_argnames: str | Iterable[str] = (),
):
  """Flax lifted remat that supports static_argnums and static_argnames.

  The same as ``nn.remat`` except for the numbering of ``static_argnums``,
  which here does **not** count ``self``: index 0 is the first argument after
  ``self``. ``static_argnames`` needs no numbering at all, and a named
  argument is static however it is passed (positionally, by keyword, or left
  to its default). Keyword arguments reach the wrapped method.

  Example::

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    ...
    >>> class Layer(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x, mask=None, deterministic=True):
    ...     x = nn.Dense(4)(x)
    ...     return nn.Dropout(0.5, deterministic=deterministic)(x)
    ...
    >>> # Counting without self, as HF transformers does: deterministic is 2.
    >>> RematLayer = nn.partitioning.remat(Layer, static_argnums=(2,))
    >>> # The same by name, which also covers keyword and omitted calls.
    >>> RematLayer = nn.partitioning.remat(Layer, static_argnames='deterministic')
    >>> x = jnp.ones((2, 3))
    >>> variables = RematLayer().init(jax.random.key(0), x)
    >>> y = RematLayer().apply(variables, x, deterministic=True)

  Args:
    target: a ``Module`` or a function taking a ``Module`` as its first
      argument. If ``None``, returns a decorator that takes the target.
    variables: The variable collections that are lifted. By default all
      collections are lifted.
    rngs: The PRNG sequences that are lifted. By default all PRNG sequences
      are lifted.
    concrete: Deprecated and unsupported by JAX; ``True`` raises
      ``NotImplementedError`` when called. Use ``static_argnames``.
    prevent_cse: Optional, boolean indicating whether to prevent common
      subexpression elimination (CSE), see ``nn.checkpoint``.
    static_argnums: Optional, int or sequence of ints: positions of static
      arguments, **not** counting ``self`` (the first argument after ``self``
      is 0). Negative indices count from the last positional parameter.
    policy: Experimental checkpoint policy, see ``jax.checkpoint``.
    methods: An optional list of method names that will be lifted (default:
      ``__call__``), or a dict mapping each method name to its own
      ``core_remat_static`` arguments.
    static_argnames: Optional, str or sequence of str: names of static
      arguments.

  Returns:
    A wrapped version of ``target``, rematerialized on the backward pass.

  Raises:
    ValueError: as ``nn.checkpoint``, in this numbering.
    TypeError: as ``nn.checkpoint``.
  """
  if target is None:
    return functools.partial(
        remat,
        variables=variables,
        rngs=rngs,
        concrete=concrete,
        prevent_cse=prevent_cse,
        static_argnums=static_argnums,
        policy=policy,
        methods=methods,
        static_argnames=static_argnames,
    )
  return nn.transforms._checkpoint_lift_transform(  # pylint: disable=protected-access
      'core_remat_static',
      target,
      transform_name='nn.partitioning.remat',
      counts_self=False,
      methods=methods,
      variables=variables,
      rngs=rngs,
      concrete=concrete,
      prevent_cse=prevent_cse,
      static_argnums=static_argnums,
      policy=policy,
      static_argnames=static_argnames,
  )
