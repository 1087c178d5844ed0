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

This module is written as a part of ``flax/core/lift.py``: every public
function here is transplanted verbatim into that file by
``tools/make_patches.py`` (the upstream-ready diffs in ``patches/``), so
function bodies use only names that ``flax/core/lift.py`` itself defines or
imports. The import block below is the only part that differs.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax

from flax.core.frozen_dict import freeze
from flax.core.lift import _dedup_scopes
from flax.core.lift import _dup_scopes
from flax.core.lift import _transpose
from flax.core.lift import pack
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.core.scope import Filter
from flax.core.scope import group_collections
from flax.core.scope import in_filter
from flax.core.scope import intersect_filters
from flax.core.scope import Scope
from flax.core.scope import union_filters
from flax_tieext import static_args
from flax_tieext.core import tie_checks
from flax_tieext.core import tie_spec
from flax_tieext.core import ties as ties_lib
# pylint: enable=g-importing-member,unused-import

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
      value-dependent Python control flow (default ``False``). Support for such
      control flow is optional, and disabled by default, because in some
      edge-case compositions with :func:`jax.jit` it can lead to some extra
      computation.
    prevent_cse: Optional, boolean indicating whether to prevent common
      subexpression elimination (CSE) optimizations in the HLO generated from
      differentiation. This CSE prevention has costs because it can foil other
      optimizations, and because it can incur high overheads on some backends,
      especially GPU. The default is True because otherwise, under a ``jit`` or
      ``pmap``, CSE can defeat the purpose of this decorator. But in some
      settings, like when used inside a ``scan``, this CSE prevention mechanism
      is unnecessary, in which case ``prevent_cse`` can be set to False.
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
  statics = static_args.StaticArgs(
    fn, static_argnums, static_argnames, transform='lift.checkpoint'
  )
  return _checkpoint(fn, statics, variables, rngs, concrete, prevent_cse, policy)


def _checkpoint(
  fn: Callable[..., Any],
  statics: static_args.StaticArgs,
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

    @functools.partial(
      jax.remat,
      static_argnums=(2,),
      prevent_cse=prevent_cse,
      policy=policy,
    )
    @functools.wraps(fn)
    def rematted(variable_groups, rng_groups, static, args, kwargs):
      args, kwargs = statics.merge(static, args, kwargs)
      scope = scope_fn(variable_groups, rng_groups)
      y = fn(scope, *args, **kwargs)
      return y, repack_fn(scope)

    return statics.apply(
      functools.partial(rematted, variable_groups, rng_groups), args, kwargs
    )

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



def _partial_pack(
    scope_tree: Scope,
    in_variable_filters: Sequence[CollectionFilter],
    out_variable_filters: Sequence[CollectionFilter],
    rng_filters: Sequence[PRNGSequenceFilter],
    name=None,
) -> tuple[Callable[..., Any], Callable[..., Any], Any, Any, Callable[..., Any]]:
  """Pack variables and rngs for functional transformations.

  The _partial_pack function is the building block for all other lifted
  transformations.

  Tied variables (see :func:`tie`) take part in the packing: when a lifted
  scope contains a tied target whose source lies outside every lifted scope,
  the source's scope is lifted as well, like a Module passed in as an
  attribute (a transform that maps over an axis lifts only its rngs; see
  ``ties.lifted_sources``). Inside, the target resolves to the inner source, so
  reads, writes and gradients reach the one stored variable. The extra scopes
  are not visible to ``fn``: ``scope_fn`` returns, and ``repack_fn`` takes, the
  scope tree of ``scope_tree``'s shape.

  Args:
    scope_tree: The scope(s) to pack.
    in_variable_filters: Input variable filters.
    out_variable_filters: Output variable filters.
    rng_filters: RNG filters.
    name: The name of the packed scope.
  Returns:
    `(scope_fn, repack_fn, variable_groups, rng_groups, publish_results_fn)`
  """
  # pylint: disable=protected-access
  user_scopes, treedef = jax.tree_util.tree_flatten(scope_tree)
  tie_sources = ties_lib.lifted_sources(user_scopes, name)
  scopes, paths = _dedup_scopes(
      list(user_scopes) + [scope for scope, _ in tie_sources])
  rngs_only = [any(s is scope and only for s, only in tie_sources)
               for scope in scopes]
  with_variables = [s for s, only in zip(scopes, rngs_only) if not only]

  variable_groups_xs = []

  for scope, only in zip(scopes, rngs_only):
    scope._validate_trace_level()
    scope._populate_collections()
    variable_groups_xs.append(group_collections(
        {} if only else ties_lib.lifted_variables(scope, with_variables),
        in_variable_filters))
  variable_groups_xs_t = _transpose(variable_groups_xs)

  # Make sure that in-only variable collections are frozen
  for variable_group_xs in variable_groups_xs_t:
    for variable_group in variable_group_xs:
      for col_name, collection in variable_group.items():
        col_in_out = any(
            in_filter(col_filter, col_name)
            for col_filter in out_variable_filters
        )
        if not col_in_out:
          variable_group[col_name] = freeze(collection)
  rng_groups_xs = []
  inner_rng_counters = []
  for scope in scopes:
    rng_counters = scope.rng_counters
    rng_groups = group_collections(scope.rngs, rng_filters)
    rng_groups_xs.append(rng_groups)
    inner_rng_counters.append(rng_counters)
  rng_groups_xs_t = _transpose(rng_groups_xs)

  def scope_fn(
      variable_groups_xs_t,
      rng_groups_xs_t,
      mutable_filter: CollectionFilter = True,
  ):
    inner_scopes = []
    mutable: Filter = False
    for out_filter in out_variable_filters:
      mutable = union_filters(mutable, out_filter)
    # could be () in the edge case where no rngs or variable_groups are lifted
    # in this case fallback to ((),) * len(scopes) to make sure the zip has
    # something to iterate over for each scope.
    variable_groups_xs = _transpose(variable_groups_xs_t) or ((),) * len(
        scopes
    )
    rng_groups_xs = _transpose(rng_groups_xs_t) or ((),) * len(scopes)
    assert len(variable_groups_xs) == len(scopes)
    assert len(rng_groups_xs) == len(scopes)
    for variable_groups, rng_groups, scope, rng_counters in zip(
        variable_groups_xs, rng_groups_xs, scopes, inner_rng_counters
    ):
      variables = {}
      rngs = {}
      for variable_group in variable_groups:
        variables.update(variable_group)
      for rng_group in rng_groups:
        rngs.update(rng_group)
      # make sure variable dicts are cloned and can't be manipulated by ref
      # sharing.
      variables = jax.tree_util.tree_map(lambda x: x, variables)
      scope_mutable = intersect_filters(
          intersect_filters(scope.mutable, mutable), mutable_filter
      )
      new_debug_path = scope.debug_path
      if name:
        if new_debug_path:
          new_debug_path = new_debug_path[:-1] + (
              f'{name}({new_debug_path[-1]})',
          )
        else:
          new_debug_path = (f'{name}()',)
      inner_scope = Scope(
          variables,
          name=scope.name,
          rngs=rngs,
          mutable=scope_mutable,
          parent=None,
          path=scope.path,
          debug_path=new_debug_path,
          flags=scope.flags,
      )
      inner_scope.rng_counters = rng_counters
      inner_scopes.append(inner_scope)
    ties_lib.link_inner_scopes(scopes, inner_scopes, name, rngs_only)
    inner_scopes = _dup_scopes(scopes, inner_scopes, paths)
    return treedef.unflatten(inner_scopes[: len(user_scopes)])

  def repack_fn(inner_scope_tree):
    inner_scopes = treedef.flatten_up_to(inner_scope_tree)
    if tie_sources:
      inner_scopes = list(inner_scopes) + _dup_scopes(
          scopes, ties_lib.inner_scopes_of(inner_scopes), paths
      )[len(user_scopes):]
    inner_scopes, inner_paths = _dedup_scopes(inner_scopes)
    inner_scopes = list(inner_scopes)
    assert [p for _, p in paths] == [p for _, p in inner_paths]
    out_variable_groups_xs = []
    for inner_scope in inner_scopes:
      inner_scope.invalidate()
      inner_scope._validate_trace_level()
      mutable_variables = {
          key: val
          for key, val in inner_scope._variables.items()
          if in_filter(inner_scope.mutable, key)
      }
      out_variable_groups = group_collections(
          mutable_variables, tuple(out_variable_filters) + (True,)
      )
      remainder = tuple(out_variable_groups[-1].keys())
      if remainder:
        raise ValueError(f'unmapped output variables: {remainder}')
      out_variable_groups_xs.append(out_variable_groups[:-1])

    return _transpose(out_variable_groups_xs)

  def publish_results_fn(out_variable_groups_xs_t):
    out_variable_groups_xs = _transpose(out_variable_groups_xs_t)
    for scope, out_variable_groups, rng_counters in zip(
        scopes, out_variable_groups_xs, inner_rng_counters
    ):
      for out_variable_group in out_variable_groups:
        for col_name, collection in out_variable_group.items():
          if not scope.is_mutable_collection(col_name):
            # Some lifted transforms like scan return redundant variables.
            continue
          for var_name, value in collection.items():
            scope.put_variable(col_name, var_name, value)

  return (
      scope_fn,
      repack_fn,
      variable_groups_xs_t,
      rng_groups_xs_t,
      publish_results_fn,
  )


def tie(
    fn: Callable[..., Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
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

  Unlike a tie made by hand with ``map_variables``, the tie takes part in the
  lifted transforms' scope rewriting: when ``checkpoint``/``remat``, ``jit``,
  ``map_variables``, ``cond``, ``switch`` or ``while_loop`` lift a scope that
  contains a tied target, the source's scope is lifted with it. Inside ``vmap``
  and ``scan`` (and ``vjp``/``jvp``/``custom_vjp``), a source outside the
  transform is a broadcast, read-only value. Each call site is traced once.

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

  Returns:
    ``fn`` with the ties in force.

  Raises:
    TieError: at declaration for a self-tie, a cycle, a tie between a module
      and its ancestor, values given for a target at ``apply``, or a tied
      collection that is absent; at use for a write that cannot land or
      through a view; at the end of ``init`` for a target or source that does
      not exist (naming the nearest existing names).
  """

  def wrapper(scope_tree, *args, **kwargs):
    scopes, treedef = jax.tree_util.tree_flatten(
        scope_tree, is_leaf=lambda x: isinstance(x, Scope))
    declaring = scopes[-1]
    resolved = tie_spec.normalize(ties, collections, declaring.path)
    tie_checks.check_apply(declaring, resolved)
    scopes[-1] = ties_lib.declare(declaring, resolved)
    y = fn(treedef.unflatten(scopes), *args, **kwargs)
    tie_checks.check_init(scopes[-1], resolved)
    return y

  return wrapper
