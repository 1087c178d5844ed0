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

"""Lifted transforms added or extended by flax_tieext.

Written in the layout and style of ``flax/core/lift.py``, beside whose
transforms the patch installs these. What is sent to Flax is smaller
(``patches/flax/``).
"""

# pylint: disable=g-importing-member
import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax

from flax.core.lift import pack
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.core.scope import Scope
from flax_tieext.core import _static_args
from flax_tieext.core import tie_errors
from flax_tieext.core import tie_spec
from flax_tieext.core import ties as ties_lib
# pylint: enable=g-importing-member

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

def checkpoint(
  fn: Callable[..., Any] | None = None,
  variables: CollectionFilter = True,
  rngs: PRNGSequenceFilter = True,
  concrete: bool = False,
  prevent_cse: bool = True,
  static_argnums: int | tuple[int, ...] = (),
  policy: Callable[..., bool] | None = None,
  static_argnames: str | Iterable[str] = (),
) -> Callable[..., Any]:
  """Lifted version of ``jax.checkpoint``.

  This function is aliased to ``lift.remat`` just like ``jax.remat``.

  ``static_argnums`` and ``static_argnames`` are resolved through the
  signature of ``fn``: a static argument is static however it is passed,
  positionally, by keyword, or left to its default.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from flax.core import init, lift
    ...
    >>> def dense(scope, x, activation='relu'):
    ...   w = scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))
    ...   y = x @ w
    ...   return jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)
    ...
    >>> remat_dense = lift.checkpoint(dense, static_argnames='activation')
    >>> y, variables = init(remat_dense)(jax.random.key(0), jnp.ones((1, 3)))
    >>> y
    Array([[3., 3.]], dtype=float32)

  Args:
    fn: scope function for which intermediate computations should be re-computed
      when computing gradients. If ``None``, returns a decorator.
    variables: The variable collections that are lifted. By default all
      collections are lifted.
    rngs: The PRNG sequences that are lifted. By default all PRNG sequences are
      lifted.
    concrete: Optional, boolean indicating whether ``fun`` may involve
      value-dependent Python control flow (default ``False``), as in
      ``flax.linen.checkpoint``.
    prevent_cse: Optional, boolean indicating whether to prevent common
      subexpression elimination (CSE) optimizations in the HLO generated from
      differentiation (default ``True``); ``flax.linen.checkpoint`` says when
      it can be set to False.
    static_argnums: Optional, int or sequence of ints, indicates which argument
      values on which to specialize for tracing and caching purposes. Specifying
      arguments as static can avoid ConcretizationTypeErrors when tracing, but
      at the cost of more retracing overheads. The first argument after the
      scope is 0.
    policy: Experimental checkpoint policy, see ``jax.checkpoint``.
    static_argnames: Optional, str or sequence of str, the names of static
      arguments.

  Returns:
    A wrapped version of ``fn``. When computing gradients intermediate
    computations will be re-computed when computing gradients.
  """
  if fn is None:
    return lambda fn: checkpoint(
      fn, variables, rngs, concrete, prevent_cse, static_argnums, policy,
      static_argnames,
    )
  statics = _static_args.StaticArgs(
    fn, static_argnums, static_argnames, transform='lift.checkpoint'
  )
  return _checkpoint(fn, statics, variables, rngs, concrete, prevent_cse, policy)


def _checkpoint(
  fn: Callable[..., Any],
  statics: _static_args.StaticArgs,
  variables: CollectionFilter = True,
  rngs: PRNGSequenceFilter = True,
  concrete: bool = False,
  prevent_cse: bool = True,
  policy: Callable[..., bool] | None = None,
) -> Callable[..., Any]:
  """``checkpoint`` with the static arguments of ``fn`` resolved."""

  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
    # After JAX v0.3.16, concrete=False is a no-op and concrete=True raises
    # NotImplementedError. Starting in JAX v0.8.2, the concrete argument is
    # deprecated and will be removed in the future.
    if concrete:
      raise NotImplementedError(
          "The concrete argument is deprecated. Use static_argnums instead."
          " for more information, see"
          " https://docs.jax.dev/en/latest/jep/11830-new-remat-checkpoint.html"
      )

    # Static values are closed over, not passed as jax.remat's static_argnums:
    # nothing of a call outlives it (JAX would keep them in a cache), any
    # value works, and scan(remat(...)) traces as it did with
    # nn.partitioning's core_remat_static. Indices the resolver leaves to
    # Flax's meaning (negative ones, say) go to jax.remat as Flax sends them.
    static_argnums = ()
    if statics.as_flax and not statics.closes_over:
      static_argnums = jax.tree_util.tree_map(lambda x: x + 2, statics.plain)

    def remat_call(static, args, kwargs):
      @functools.partial(
        jax.remat, prevent_cse=prevent_cse, policy=policy,
        static_argnums=static_argnums,
      )
      @functools.wraps(fn)
      def rematted(variable_groups, rng_groups, *args, **kwargs):
        args, kwargs = statics.merge(static, args, kwargs)
        scope = scope_fn(variable_groups, rng_groups)
        y = fn(scope, *args, **kwargs)
        return y, repack_fn(scope)

      return rematted(variable_groups, rng_groups, *args, **kwargs)

    return statics.apply(remat_call, args, kwargs)

  return pack(
    inner,
    (variables,),
    (variables,),
    (rngs,),
    name='remat',
    enable_kwargs=True,
  )


remat = checkpoint

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------


def tie(
    fn: Callable[..., Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
    in_scan: str | None = None,
) -> Callable[..., Any]:
  """Ties variables of one path to those of another: one variable, two paths.

  A tree of variables duplicates what a graph would share. ``tie`` declares
  that the variables of a *target* path (a module and all its variables in the
  tied collections, recursively, or a single variable) *are* those of a
  *source* path. The target has no storage of its own: only the source is
  stored, in ``init`` and in ``apply(mutable=...)`` results. Every read of the
  target sees the source's current value, every write lands in the source in
  program order, and gradients with respect to the source sum over all uses:
  the two paths behave exactly as one module instance called at two places.

  The tie is state of the scope ``fn`` receives, so it is in force in every
  scope derived from it, the inner scopes of lifted transforms included (each
  transform declares what a tie source outside it is: ``pack``'s
  ``tie_sources``). Each call site is traced once.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from flax.core import init, apply, nn as core_nn
    >>> from flax.core import lift
    ...
    >>> def two_layers(scope, x):
    ...   x = scope.child(core_nn.dense, 'a')(x, 3)
    ...   return scope.child(core_nn.dense, 'b')(x, 3)
    ...
    >>> tied = lift.tie(two_layers, {'b': 'a'})
    >>> y, variables = init(tied)(jax.random.key(0), jnp.ones((1, 3)))
    >>> sorted(variables['params'])  # 'b' is not stored: it is 'a'
    ['a']
    >>> bool((apply(tied)(variables, jnp.ones((1, 3))) == y).all())
    True

  Args:
    fn: the scope function whose variables are tied. When ``fn`` receives
      several scopes (a Module with Modules passed in as attributes, as Flax's
      Module lifting does), the last one is the Module's own scope; the tie is
      declared there and the others pass through.
    ties: maps a target path to a source path, or to ``(source_path, view_fn)``
      where ``view_fn`` derives the target's read-only value from the source's
      (e.g. ``jnp.transpose`` for a language-model head tied to the
      embedding). Paths are ``/``-separated names relative to the scope of
      ``fn``; ``"."`` is that scope itself, and a leading ``/`` starts at the
      root. A path names a module or one variable (``"head/kernel"``). Chains
      (``a -> b``, ``b -> c``) resolve to the end of the chain.
    collections: the tied collections, a collection filter (``"params"``,
      ``"graph"``, ``["batch_stats", "cache"]``, ``True`` for all).
    in_scan: how a source outside a ``scan`` whose body holds the target
      enters the loop: ``"scanned"``, broadcast to the stack's length before
      the loop and scanned over, where the scan scans the tied collection
      (``variable_axes``), as the stack's own variables are;
      ``"broadcast"``, a loop invariant read by every iteration, as
      ``variable_broadcast`` collections are. ``None`` (the default) takes
      ``"scanned"`` wherever it can: a scan made by ``lift.scan`` while the
      plugin is installed (one made before cannot tell its length), for a
      target inside the scanned body (a scanned scope tied whole to another
      is scanned like its source already); elsewhere a loop invariant. The same values and gradients either
      way (the broadcast's transpose sums them); the compiled loop differs:
      ``"scanned"`` runs as the untied stack does, and holds its temporaries
      (a stacked gradient of the source); ``"broadcast"`` holds fewer, and
      ran up to 6% slower than the untied stack for some attention layouts
      (``docs/scaling.md`` has the measurements).

  Returns:
    ``fn`` with the ties in force.

  Raises:
    TieError: at declaration for a self-tie, a cycle, a tie between a module
      and its ancestor, or two sources for one target; at use for values
      given for a target, a source that is not stored, a write that cannot
      land or goes through a view; when the call of an ``init`` returns, for a
      target or source that does not exist (naming the nearest existing
      names) or a target that does not match its source.
  """
  if not callable(fn) or isinstance(fn, type):
    raise tie_errors.not_tieable(
        'lift.tie', 'fn', fn, 'a scope function, fn(scope, *args) (for a'
        ' Linen Module class: nn.tie)', "lift.tie(two_layers, {'b': 'a'})")
  ties = dict(tie_spec.given(ties, 'lift.tie'))  # checked before any use
  in_scan = tie_spec.in_scan_given(in_scan, 'lift.tie')
  tie_spec.collections_given(collections, 'lift.tie')
  # lift.tie of a lift.tie declares both at once, as their union.
  fn, stacked = getattr(fn, '_tie_declarations', (fn, ()))

  def wrapper(scope_tree, *args, **kwargs):
    declaring = jax.tree_util.tree_leaves(
        scope_tree, is_leaf=lambda x: isinstance(x, Scope))[-1]
    declared = ties_lib.declare(declaring, ties, collections, stacked,
                                in_scan)
    y = fn(scope_tree, *args, **kwargs)
    ties_lib.check_init(declaring, declared)
    return y

  wrapper._tie_declarations = (fn, (*stacked, (ties, collections, in_scan)))
  return wrapper
