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

"""Tied variables: one stored variable reachable under two paths.

A tie is state of the scope that declares it: :func:`declare` records its
:class:`~flax.core.tie_spec.Tie` records in that scope's ``flags``, which Flax
hands to every scope derived from it (``push``, ``rewound``, and the inner
scopes of every lifted transform), so a tie is in force wherever its target is
used. This module is the mechanism inside one scope tree; lifted transforms
take part through ``flax.core.tie_lift``, single tied variables through
``flax.core.tie_vars``. The rules, each stated once:

* **Reach** (:func:`reach`). A path is found up the parents, then among the
  inner roots of the same lifted transform, then outside it, where it is a
  closed-over, read-only value.
* **Storage** (:func:`_resolve`). A target scope's collection *is* its
  source's dict, kept where Flax keeps a scope's collections; a scope below a
  target reaches it through its parent, as in Flax.
* **Rngs** (:func:`_share_rngs`). A module-level ``params`` target draws from
  its source's rng streams: with the source's counters (one module called
  twice), or, while initializing, with fresh ones, so that a copy it
  initializes equals what the source draws.
* **Init** (:func:`check_init`). A ``params`` target works on a copy that
  starts as its source's variables; other collections use the source once it
  exists. When the declaring call returns, each copy is checked against its
  source and dropped: the stored values are the source's, whichever use runs
  first.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, MutableMapping

import jax

from flax import errors as flax_errors
from flax.core.frozen_dict import FrozenDict
from flax.core.frozen_dict import freeze
from flax_tieext.core.tie_spec import (
    Path,
    Tie,
    apply_view,
    check_like,
    did_you_mean,
    flatten,
    is_box,
    is_within,
    named_collections,
    nearest,
    text,
    tie_error,
    walk,
)

TIES_FLAG = '__ties__'
# On an inner root of a lifted transform (and the scopes below it): what that
# root stands for, recorded by ``tie_lift``. Flags, so that rewound() keeps it:
# ``outer`` (the scope it was lifted from), ``siblings`` (the inner roots of
# the same pack), ``name``, ``maps`` and ``caches_trace`` (what the transform
# declares), ``rngs_only`` (a source lifted for its rngs only) and ``closure``
# (the record of the transform whose closed-over values it holds, or None).
LIFT_FLAG = '__tie_lift__'


def ties_in_force(scope) -> tuple[Tie, ...]:
  return scope.flags.get(TIES_FLAG, ())


def declare(scope, ties: tuple[Tie, ...]):
  """Puts ``ties`` in force at ``scope`` and at every scope derived from it.

  ``scope`` is changed in place, as its constructor would have set it: a tie
  is state of the scope that declares it. A tie equal to one already in force
  is kept as it is, so declaring again (an inner clone of a lifted module) is
  a no-op; one for the same target and collections replaces it.

  Returns:
    The ties in force that ``ties`` declared (those already in force kept).
  """
  present = ties_in_force(scope)
  new = {(t.target, t.collections) for t in ties}
  kept = tuple(t for t in present
               if t in ties or (t.target, t.collections) not in new)
  added = tuple(t for t in ties if t not in kept)
  if added or len(kept) != len(present):
    scope.flags = freeze({**scope.flags, TIES_FLAG: kept + added})
    _share_rngs(scope)
  return tuple(t for t in kept + added if t in ties)


# ---------------------------------------------------------------------------
# Where a path is stored
# ---------------------------------------------------------------------------


def _lift(scope):
  """What the root of ``scope`` stands for, if it is an inner root of a pack."""
  return scope.root.flags.get(LIFT_FLAG)


def _tie_for(scope, path: Path, col: str) -> Tie | None:
  """The tie in force at ``scope`` whose target is ``path``, in ``col``."""
  found = None
  for t in ties_in_force(scope):
    if t.target == path and t.applies_to(col):
      found = t  # the last one declared wins
  return found


def _base(scope, path: Path, rngs: bool = False):
  """``(scope at or above path, records of the transforms crossed)``.

  Walks up the parents, then over the inner roots of the same lifted
  transform (a root lifted for its rngs only counts for ``rngs``), then out of
  the transform. Beyond a crossed transform, variables are closed over.
  """
  crossed = ()
  while scope is not None:
    s = scope
    while s is not None:
      if is_within(path, s.path):
        return s, crossed
      s = s.parent
    lift = _lift(scope)
    if lift is None:
      break
    for sib in lift.siblings:
      info = _lift(sib)
      if (sib is not scope.root and is_within(path, sib.path)
          and (rngs or not info.rngs_only)):
        return sib, crossed + ((info.closure,) if info.closure else ())
    crossed += (lift,)
    scope = lift.outer
  return None, crossed


def _push_to(scope, path: Path):
  """A scope at ``path`` below ``scope``, built as Flax builds one."""
  for name in path[len(scope.path):]:
    scope = scope.rewound().push(name, reuse=True)
  return scope


def reach(scope, path: Path, rngs: bool = False):
  """``(scope at path, transforms crossed)``; ties on the way are followed."""
  base, crossed = _base(scope, path, rngs)
  return (None if base is None else _push_to(base, path)), crossed


def stored(scope, path: Path, col: str):
  """What is stored at ``path`` itself in ``col`` (no tie followed), or None."""
  base, _ = _base(scope, path)
  if base is None:
    return None
  root = base.root
  return walk(root._variables.get(col), path[len(root.path):])  # pylint: disable=protected-access


def _names(crossed) -> str:
  return ' and '.join(f'nn.{lift.name}' for lift in crossed)


def _maps(crossed) -> bool:
  """Whether a crossed transform maps over an axis (its sources broadcast)."""
  return any(lift.maps for lift in crossed)


# ---------------------------------------------------------------------------
# Scope hooks (installed on flax.core.scope.Scope)
# ---------------------------------------------------------------------------


def _resolve(scope, tie: Tie, col: str, write: bool, original):
  """The collection ``col`` of ``scope``, the target of ``tie``."""
  initializing = (scope.get_flag('initializing', False)
                  and scope.is_mutable_collection(col))
  if not initializing:
    given = stored(scope, scope.path, col)
    if given:
      raise tie_error(
          f'Values were given for {text(tie.target)} in collection {col!r},'
          f' but it is the target of the {tie.describe()}: only the source'
          f' {text(tie.source)} is stored, so they would be ignored.',
          'Convert variables saved from an untied model with'
          ' tie_variables(variables, ties), which checks that each target'
          ' equals its source and removes it.')
  source, crossed = reach(scope, tie.source)
  if source is None:
    raise tie_error(f'Cannot reach the source of the {tie.describe(col)} from'
                    f' {scope.path_text}.',
                    'Declare the tie at a module that contains both paths.')
  if initializing and not _maps(crossed):
    node = source._collection(col)  # pylint: disable=protected-access
    if col == 'params' or crossed or not node:
      if node:
        refuse_stale(scope, tie, col, crossed)
      if col != 'params' and not write:
        return original(scope, col)  # nothing of its own yet
      own = _own(scope, col)  # a copy, checked and dropped by check_init
      _fill(own, node, tie)
      return own
  tie.used.add(col)
  if crossed:  # a closed-over value: read-only, never cached
    refuse_stale(scope, tie, col, crossed)
    if write:
      raise _cannot_land(scope, tie, col, crossed, 'A write to')
    node = source._collection(col)  # pylint: disable=protected-access
    if not node:
      raise _cannot_land(scope, tie, col, crossed, 'Initializing')
    return freeze(_viewed(tie, node))
  if write and tie.view is None:
    node = source._mutable_collection(col)  # pylint: disable=protected-access
  else:
    node = source._collection(col)  # pylint: disable=protected-access
    if not node and not isinstance(node, dict):
      return _missing(scope, tie, col)
  if tie.view is not None:
    if write:
      raise _read_only(tie, col, scope)
    return _viewed(tie, node)
  scope._variables[col] = node  # pylint: disable=protected-access
  return node


def _viewed(tie: Tie, node):
  if tie.view is None:
    return node
  return jax.tree_util.tree_map(lambda x: apply_view(tie, x), node,
                                is_leaf=is_box)


def _own(scope, col: str):
  """The scope's own dict of ``col``, created where Flax creates it."""
  if scope.parent is None:
    return scope._variables.setdefault(col, {})  # pylint: disable=protected-access
  own = scope.parent._mutable_collection(col).setdefault(scope.name, {})  # pylint: disable=protected-access
  scope._variables[col] = own  # pylint: disable=protected-access
  return own


def _fill(own, source, tie: Tie):
  """Adds to ``own`` what ``source`` holds and ``own`` lacks (leaves shared)."""
  if not isinstance(source, Mapping):
    return
  for name, value in source.items():
    if isinstance(value, Mapping):
      _fill(own.setdefault(name, {}), value, tie)
    elif name not in own:
      own[name] = apply_view(tie, value)


def _missing(scope, tie: Tie, col: str):
  if scope.is_mutable_collection(col):
    return FrozenDict()
  raise tie_error(
      f'The source {text(tie.source)} of the {tie.describe(col)} is not'
      f' stored (looked up from {scope.path_text}).'
      + nearest(stored(scope, (), col) or {}, tie.source[len(scope.root.path):],
                scope.root.path),
      'Fix the source path (paths are relative to the module that declares'
      ' the tie; a leading "/" starts at the root module).',
      "Pass the source's variables to apply (init them with a method that"
      ' runs the source).')


def refuse_stale(scope, tie: Tie, col: str, crossed):
  """A closed-over source inside a transform that caches its trace is stale."""
  where = next((lift.name for lift in crossed if lift.caches_trace), None)
  if where is not None:
    raise tie_error(
        f'The {tie.describe(col)} is used inside nn.{where} at'
        f' {scope.path_text}, but its source lies outside that {where} and was'
        f' not lifted into it (the tie is declared inside the {where}): the'
        ' compiled function would keep a stale copy of the source.',
        f'Declare the tie at a module that contains both paths, outside the'
        f' {where}.')


def _cannot_land(scope, tie: Tie, col: str, crossed, what: str):
  inside = is_within(tie.declared_at, scope.root.path)
  where = _names(crossed)
  first = crossed[0].name
  near = '' if what != 'Initializing' else nearest(
      stored(scope, (), col) or {}, tie.source)
  return tie_error(
      f'{what} {text(tie.target)} in collection {col!r} cannot land in its'
      f' source {text(tie.source)}: the {tie.describe(col)} is used inside'
      f' {where} at {scope.path_text}, and the source lies outside it, where'
      ' it is a read-only (broadcast) value.' + near,
      'Fix the source path.' if near else '',
      'Declare the tie at the common ancestor of both paths, outside the'
      f' {first}.' if inside else '',
      f'Run the source {text(tie.source)} before the {first}, so that it'
      ' exists when the target reads it.' if what == 'Initializing' else '',
      f'Write to the source outside the {first}.' if what != 'Initializing'
      else '')


def _read_only(tie: Tie, col: str, scope) -> Exception:
  return tie_error(
      f'Cannot write to {text(tie.target)} in collection {col!r} at'
      f' {scope.path_text}: the {tie.describe(col)} gives a derived,'
      ' read-only view of the source.',
      f'Write to the source {text(tie.source)} instead.',
      'Tie without a view_fn.')


def _tied(scope, col: str, write: bool, original):
  """``original(scope, col)``, seen through the ties in force at ``scope``."""
  if col in scope._variables:  # pylint: disable=protected-access
    return original(scope, col)
  if not scope.is_mutable_collection(col):
    _check_present(scope, col)
  tie = _tie_for(scope, scope.path, col)
  if tie is None:
    return original(scope, col)
  return _resolve(scope, tie, col, write, original)


def _check_present(scope, col: str):
  """A tied collection that is used must be given (or be mutable)."""
  tie = next((t for t in ties_in_force(scope)
              if col in named_collections(t.collections)), None)
  if tie is not None and col not in visible_collections(scope):
    given = visible_collections(scope)
    raise tie_error(
        f'The {tie.describe()} ties collection {col!r}, which'
        f' {scope.path_text} uses, but the variables have no collection'
        f' {col!r} and it is not mutable (collections given:'
        f' {", ".join(map(repr, sorted(given))) or "none"}).'
        + did_you_mean(col, given),
        f'Pass it to apply: variables={{..., {col!r}: ...}}.',
        f'Make it mutable: apply(..., mutable=[{col!r}]).')


def _hook(original):
  return functools.wraps(original)


def tie_aware_collection(original):
  """``Scope._collection`` that resolves ties in force."""
  @_hook(original)
  def _collection(self, col):
    if TIES_FLAG not in self.flags:
      return original(self, col)
    return _tied(self, col, False, original)
  return _collection


def tie_aware_mutable_collection(original):
  """``Scope._mutable_collection`` that writes through ties in force."""
  @_hook(original)
  def _mutable_collection(self, col):
    if TIES_FLAG not in self.flags:
      return original(self, col)
    return _tied(self, col, True, original)
  return _mutable_collection


def tie_aware_push(original):
  """``Scope.push`` whose module-level ``params`` targets share rng streams."""
  @_hook(original)
  def push(self, name=None, prefix='', reuse=False):
    child = original(self, name, prefix, reuse)
    if TIES_FLAG in child.flags:
      _share_rngs(child)
    return child
  return push


def tie_aware_param(original):
  """``Scope.param`` whose shape check names both paths of a tie."""
  @_hook(original)
  def param(self, name, init_fn, *init_args, **init_kwargs):
    try:
      return original(self, name, init_fn, *init_args, **init_kwargs)
    except flax_errors.ScopeParamShapeError:
      target = self.path + (name,)
      tie = max((t for t in ties_in_force(self) if is_within(target, t.target)
                 and t.applies_to('params')),
                key=lambda t: len(t.target), default=None)
      if tie is None:
        raise
      init_kwargs.pop('unbox', None)
      source = tie.source + target[len(tie.target):]
      expected = jax.eval_shape(
          lambda: init_fn(jax.random.key(0), *init_args, **init_kwargs))
      found = self.get_variable('params', name)
      check_like(dataclasses.replace(tie, target=target, source=source),
                 'params', found, expected)
      raise
  return param


def _share_rngs(scope):
  """Gives a module-level ``params`` target its source's rng streams.

  The tie then behaves as one module called at two places. The source scope
  is built by ``Scope.push`` on rewound copies (reserving no name), so its
  streams are Flax's own; inside ``vmap``/``scan`` they are the source's
  lifted, split streams. While initializing, the counters start afresh: a copy
  the target initializes then equals what the source draws, and the source's
  own draws are left alone.
  """
  tie = _tie_for(scope, scope.path, 'params')
  if tie is None or tie.view is not None:
    return
  source, _ = reach(scope, tie.source, rngs=True)
  if source is None:
    return
  scope.rngs = source.rngs
  scope.rng_counters = ({k: 0 for k in source.rngs}
                        if scope.get_flag('initializing', False)
                        else source.rng_counters)


def _held_elsewhere(scope, path: Path, col: str) -> str:
  """Names the collections other than ``col`` that hold ``path``, if any."""
  holders = sorted(c for c in visible_collections(scope)
                   if c != col and stored(scope, path, c) is not None)
  if not holders:
    return ''
  return (f' {text(path)} is stored in collection {holders[0]!r}: tie that'
          f' collection (collections={holders[0]!r}).')


def visible_collections(scope) -> set[str]:
  """The collections of every root up the chain of lifted transforms."""
  found = set()
  while scope is not None:
    found |= set(scope.root._variables)  # pylint: disable=protected-access
    lift = _lift(scope)
    scope = lift and lift.outer
  return found


# ---------------------------------------------------------------------------
# The invariants, checked when the declaring call of an ``init`` returns
# ---------------------------------------------------------------------------


def check_init(scope, ties: tuple[Tie, ...]):
  """Checks each tie on the variables ``init`` produced; drops target copies.

  Raises a TieError naming target, source, collection and declaring module
  when a tied collection or the source does not exist, the source is of
  another kind than the target (module or variable), or the target's copy
  holds a variable its source lacks or one of another shape or dtype.
  """
  if not scope.get_flag('initializing', False):
    return
  present = visible_collections(scope)
  for tie in ties:
    names = named_collections(tie.collections)
    for col in names:
      if col not in present and (len(names) == 1 or did_you_mean(col, present)):
        raise tie_error(
            f'The {tie.describe()} ties collection {col!r}, but init created'
            f' no collection {col!r} (it created'
            f' {", ".join(map(repr, sorted(present))) or "none"}).'
            + (_held_elsewhere(scope, tie.target, col)
               or did_you_mean(col, present)),
            'Fix the collection name in collections=.')
    found = False
    for col in sorted(c for c in present if tie.applies_to(c)):
      copy = stored(scope, tie.target, col)
      found = found or copy is not None or col in tie.used
      if copy is None:
        continue
      # A variable is reached as a scope too: its collection is the value.
      source_scope, crossed = reach(scope, tie.source)
      source = None if source_scope is None else source_scope._collection(col)  # pylint: disable=protected-access
      if isinstance(source, Mapping) and not source:
        source = None
      if source is not None:
        refuse_stale(scope, tie, col, crossed)
      if source is None and (not isinstance(copy, Mapping) or copy):
        raise tie_error(
            f'The source {text(tie.source)} of the {tie.describe(col)} does'
            ' not exist: nothing was stored there while initializing (this'
            ' init ran its target, but no module at the source path).'
            + (_held_elsewhere(scope, tie.source, col)
               or nearest(stored(scope, (), col) or {}, tie.source)),
            'Fix the source path (paths are relative to the module that'
            ' declares the tie; a leading "/" starts at the root module).',
            'Initialize with a method that also runs the source.')
      if source is not None:
        _check_copy(tie, col, copy, source)
      _drop(scope, tie.target, col)
      tie.used.add(col)  # checked: a later check of this init finds it
    if found:
      continue
    if any(stored(scope, tie.target, c) is not None for c in present):
      cols = ', '.join(repr(c) for c in sorted(present) if tie.applies_to(c))
      raise tie_error(
          f'The {tie.describe()} ties nothing: neither {text(tie.target)} nor'
          f' {text(tie.source)} holds any variable in {cols or "those"}'
          ' collections while initializing.'
          + _held_elsewhere(scope, tie.target, None),
          'Tie the collections the two modules hold (collections=...).',
          'Tie the modules that hold the collection.')
    raise tie_error(
        f'The target {text(tie.target)} of the {tie.describe()} does not'
        ' exist: no module or variable was created there while'
        ' initializing in the tied collections.'
        + (_held_elsewhere(scope, tie.target, None) or nearest(
            stored(scope, (), 'params') or {}, tie.target)),
        'Fix the target path (paths are relative to the module that'
        ' declares the tie; a leading "/" starts at the root module).',
        'Initialize with a method that runs the target.')


def _drop(scope, path: Path, col: str):
  """Removes the copy at ``path`` from ``col``, then its parents left empty.

  A lifted target's copy is stored at each level of lifting: in its inner root
  and outside, where the outer transform keeps it.
  """
  if path == scope.root.path:
    scope.root._variables.pop(col, None)  # pylint: disable=protected-access
  for end in range(len(path), 0, -1):
    if end < len(path) and stored(scope, path[:end], col):
      break
    parent = stored(scope, path[:end - 1], col)
    if isinstance(parent, MutableMapping):
      parent.pop(path[end - 1], None)


def _check_copy(tie: Tie, col: str, copy, source):
  """Raises unless ``copy`` could be read from ``source`` (through the view)."""
  if isinstance(copy, Mapping) != isinstance(source, Mapping):
    kind = lambda x: 'a module' if isinstance(x, Mapping) else 'a variable'
    raise tie_error(
        f'In the {tie.describe(col)}, the target is {kind(copy)} but the'
        f' source is {kind(source)}.',
        'Tie a module to a module, or a variable to a variable (e.g.'
        f' "{text(tie.target[1:])}/kernel": "{text(tie.source[1:])}/kernel").')
  viewed = source if tie.view is None else jax.eval_shape(
      lambda s: jax.tree_util.tree_map(lambda x: apply_view(tie, x), s,
                                       is_leaf=is_box), source)
  flat_source = dict(flatten(viewed))
  for path, leaf in flatten(copy):
    if path not in flat_source:
      raise tie_error(
          f'The target {text(tie.target + path)} of the {tie.describe(col)}'
          f' has no counterpart in the source: {text(tie.source + path)} is'
          ' not stored.' + nearest(source if isinstance(source, Mapping)
                                    else {}, path, tie.source),
          'Fix the source path: a target may only use variables its source'
          ' has.',
          'Tie modules of the same structure.')
    check_like(dataclasses.replace(tie, target=tie.target + path,
                                   source=tie.source + path),
               col, flat_source[path], leaf)
