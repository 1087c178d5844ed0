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

A tie is state of the scope that declares it (:func:`declare`): its records
live in the scope's ``flags``, which Flax hands to every scope derived from it,
so the tie is in force wherever its target is used. The hooks on ``Scope``
give a target scope its source's collections (:func:`_resolve`), a
module-level ``params`` target its source's rng streams (:func:`_share_rngs`),
and during ``init`` a ``params`` target a copy that starts as its source's
variables and is checked and dropped when the declaring call returns
(:func:`check_init`). Lifted transforms take part through
``flax.core.tie_lift``, single tied variables through ``flax.core.tie_vars``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, MutableMapping

import jax

from flax import errors as flax_errors
from flax.core.frozen_dict import FrozenDict, freeze
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
# On an inner root of a lifted transform: what it stands for, recorded by
# tie_lift and kept by rewound(): ``outer`` (the scope it was lifted from),
# ``siblings`` (the inner roots of the same pack), the transform's ``name``,
# ``maps`` and ``caches_trace``, ``rngs_only`` (a source lifted for its rngs)
# and ``closure`` (the record of the transform whose closed-over values it
# holds, or None).
LIFT_FLAG = '__tie_lift__'
_FIX_PATH = ('Fix the {} path (paths are relative to the module that declares'
             ' the tie; a leading "/" starts at the root module).')


def ties_in_force(scope) -> tuple[Tie, ...]:
  return scope.flags.get(TIES_FLAG, ())


def declare(scope, ties: tuple[Tie, ...]) -> tuple[Tie, ...]:
  """Puts ``ties`` in force at ``scope`` and every scope derived from it.

  ``scope`` is changed in place, as its constructor would have set it. A tie
  equal to one in force is kept (declaring again is a no-op); one for the same
  target and collections replaces it. Returns the ties in force that ``ties``
  declared.
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
  return scope.root.flags.get(LIFT_FLAG)


def _tie_for(scope, path: Path, col: str) -> Tie | None:
  """The tie in force at ``scope`` whose target is ``path`` (the last wins)."""
  found = [t for t in ties_in_force(scope)
           if t.target == path and t.applies_to(col)]
  return found[-1] if found else None


def _base(scope, path: Path, rngs: bool = False):
  """``(scope at or above path, records of the transforms crossed)``.

  Walks up the parents, then over the inner roots of the same lifted
  transform (one lifted for its rngs only counts for ``rngs``), then out of
  the transform, beyond which variables are closed over.
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


def reach(scope, path: Path, rngs: bool = False):
  """``(scope at path, transforms crossed)``, built with Flax's ``push``.

  The scope is pushed on rewound copies (reserving no name), so ties on the
  way are followed by the same hooks.
  """
  base, crossed = _base(scope, path, rngs)
  if base is not None:
    for name in path[len(base.path):]:
      base = base.rewound().push(name, reuse=True)
  return base, crossed


def stored(scope, path: Path, col: str):
  """What is stored at ``path`` itself in ``col`` (no tie followed), or None."""
  base, _ = _base(scope, path)
  root = base and base.root
  return root and walk(root._variables.get(col), path[len(root.path):])  # pylint: disable=protected-access


def visible_collections(scope) -> set[str]:
  """The collections of every root up the chain of lifted transforms."""
  found = set()
  while scope is not None:
    found |= set(scope.root._variables)  # pylint: disable=protected-access
    scope = _lift(scope) and _lift(scope).outer
  return found


def _maps(crossed) -> bool:
  return any(lift.maps for lift in crossed)


# ---------------------------------------------------------------------------
# Scope hooks (installed on flax.core.scope.Scope)
# ---------------------------------------------------------------------------


def _resolve(scope, tie: Tie, col: str, write: bool, original):
  """The collection ``col`` of ``scope``, the target of ``tie``."""
  initializing = (scope.get_flag('initializing', False)
                  and scope.is_mutable_collection(col))
  if not initializing and stored(scope, scope.path, col):
    raise given_for_target(tie, col)
  source, crossed = reach(scope, tie.source)
  if source is None:
    raise unreachable(scope, tie, col)
  node = source._collection(col)  # pylint: disable=protected-access
  if node is not None and not isinstance(node, Mapping):
    raise kinds_differ(tie, col, target_is_module=True)
  if initializing and not _maps(crossed) and (
      col == 'params' or crossed or not node):
    if node:
      refuse_declared_inside(scope, tie, col, crossed)
    if col != 'params' and not write:
      return original(scope, col)  # nothing of its own yet
    own = _own(scope, col)  # a copy, checked and dropped by check_init
    _fill(own, node, tie)
    return own
  tie.used.add(col)
  if crossed:  # a closed-over value: read-only, never cached
    refuse_declared_inside(scope, tie, col, crossed)
    if write or not node:
      raise cannot_land(scope, tie, col, crossed, write)
    return freeze(viewed(tie, node))
  if tie.view is not None:
    if write:
      raise read_only(tie, col, scope)
    return viewed(tie, node)
  if write:
    node = source._mutable_collection(col)  # pylint: disable=protected-access
  elif not node and not isinstance(node, dict):
    if scope.is_mutable_collection(col):
      return FrozenDict()
    raise tie_error(
        f'The source {text(tie.source)} of the {tie.describe(col)} is not'
        f' stored (looked up from {scope.path_text}).'
        + nearest(stored(scope, (), col) or {},
                  tie.source[len(scope.root.path):], scope.root.path),
        _FIX_PATH.format('source'),
        "Pass the source's variables to apply (init them with a method that"
        ' runs the source).')
  scope._variables[col] = node  # pylint: disable=protected-access
  return node


def given_for_target(tie: Tie, col: str):
  """Values given at ``apply`` for a target would be ignored."""
  return tie_error(
      f'Values were given for {text(tie.target)} in collection {col!r},'
      f' but it is the target of the {tie.describe()}: only the source'
      f' {text(tie.source)} is stored, so they would be ignored.',
      'Convert variables saved from an untied model with'
      ' tie_variables(variables, ties), which checks that each target'
      ' equals its source and removes it.')


def kinds_differ(tie: Tie, col: str, target_is_module: bool):
  """A module tied to a variable, or a variable to a module."""
  kinds = ('a module', 'a variable')[::1 if target_is_module else -1]
  target, source = ((tie.target + tie.source[-1:], tie.source)
                    if target_is_module else
                    (tie.target, tie.source + tie.target[-1:]))
  rel = lambda path: '/'.join(path[len(tie.declared_at):])
  return tie_error(
      f'In the {tie.describe(col)}, the target is {kinds[0]} but the source'
      f' is {kinds[1]}.',
      'Tie a module to a module, or a variable to a variable (e.g.'
      f' "{rel(target)}": "{rel(source)}").')


def viewed(tie: Tie, node):
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
  for name, value in (source.items() if isinstance(source, Mapping) else ()):
    if isinstance(value, Mapping):
      _fill(own.setdefault(name, {}), value, tie)
    elif name not in own:
      own[name] = apply_view(tie, value)


def refuse_declared_inside(scope, tie: Tie, col: str, crossed):
  """A tie declared inside a lifted transform reaches only what it lifts.

  Its source outside the transform was not lifted into it (the pack saw no
  tie in force), so there is no value to read that would stay current: under
  ``nn.jit`` the compiled function would keep a stale copy. The same rule
  holds for every transform, whether or not other ties are in force.
  """
  lift = next((lift for lift in crossed
               if tie not in ties_in_force(lift.outer)), None)
  if lift is not None:
    raise _declared_inside(scope, tie, col, lift.name)


def unreachable(scope, tie: Tie, col: str):
  """The source of ``tie`` lies outside every scope ``scope`` can reach.

  Past the outermost lifted transform whose pack saw no tie in force (and so
  recorded nothing): the tie was declared inside it.
  """
  root = scope.root
  while _lift(root) is not None:
    root = _lift(root).outer.root
  if root.parent is None and root.path:  # an inner root of a transform
    # Flax's pack labels it 'name(module)' (remat(block_1)).
    label = root.debug_path[-1] if root.debug_path else ''
    where = label.split('(', 1)[0] if '(' in label else 'transform'
    return _declared_inside(scope, tie, col, where)
  return tie_error(f'Cannot reach the source of the {tie.describe(col)} from'
                   f' {scope.path_text}.',
                   'Declare the tie at a module that contains both paths.')


def _declared_inside(scope, tie: Tie, col: str, where: str):
  return tie_error(
      f'The {tie.describe(col)} is used inside nn.{where} at'
      f' {scope.path_text}, and its source {text(tie.source)} lies outside'
      f' that {where}, but the tie is declared inside the {where}: a tie'
      ' declared inside a lifted transform reaches only the paths inside it'
      + (' (the compiled function would keep a stale copy of the source).'
         if where == 'jit' else '.'),
      'Declare the tie at a module that contains both paths (their common'
      f' ancestor), outside the {where}.')


def cannot_land(scope, tie: Tie, col: str, crossed, write: bool):
  """A write, or an initialization, of a source that is a closed-over value."""
  first = crossed[0].name
  near = '' if write else nearest(stored(scope, (), col) or {}, tie.source)
  return tie_error(
      f'{"A write to" if write else "Initializing"} {text(tie.target)} in'
      f' collection {col!r} cannot land in its source {text(tie.source)}: the'
      f' {tie.describe(col)} is used inside'
      f' {" and ".join(f"nn.{lift.name}" for lift in crossed)} at'
      f' {scope.path_text}, and the source lies outside it, where it is a'
      ' read-only (broadcast) value.' + near,
      'Fix the source path.' if near else '',
      'Declare the tie at the common ancestor of both paths, outside the'
      f' {first}.' if is_within(tie.declared_at, scope.root.path) else '',
      f'Write to the source outside the {first}.' if write else
      f'Run the source {text(tie.source)} before the {first}, so that it'
      ' exists when the target reads it.')


def read_only(tie: Tie, col: str, scope):
  return tie_error(
      f'Cannot write to {text(tie.target)} in collection {col!r} at'
      f' {scope.path_text}: the {tie.describe(col)} gives a derived,'
      ' read-only view of the source.',
      f'Write to the source {text(tie.source)} instead.',
      'Tie without a view_fn.')


def _check_present(scope, col: str):
  """A tied collection that is used must be given (or be mutable)."""
  tie = next((t for t in ties_in_force(scope)
              if col in named_collections(t.collections)), None)
  given = tie and visible_collections(scope)
  if tie is not None and col not in given:
    raise tie_error(
        f'The {tie.describe()} ties collection {col!r}, which'
        f' {scope.path_text} uses, but the variables have no collection'
        f' {col!r} and it is not mutable (collections given:'
        f' {", ".join(map(repr, sorted(given))) or "none"}).'
        + did_you_mean(col, given),
        f'Pass it to apply: variables={{..., {col!r}: ...}}.',
        f'Make it mutable: apply(..., mutable=[{col!r}]).')


def _collection_hook(write: bool):
  def make(original):
    @functools.wraps(original)
    def collection(self, col):
      if TIES_FLAG not in self.flags or col in self._variables:  # pylint: disable=protected-access
        return original(self, col)
      if not self.is_mutable_collection(col):
        _check_present(self, col)
      tie = _tie_for(self, self.path, col)
      if tie is None:
        return original(self, col)
      return _resolve(self, tie, col, write, original)
    return collection
  return make


tie_aware_collection = _collection_hook(write=False)
tie_aware_collection.__doc__ = '``Scope._collection`` that resolves ties.'
tie_aware_mutable_collection = _collection_hook(write=True)
tie_aware_mutable_collection.__doc__ = (
    '``Scope._mutable_collection`` that writes through ties.')


def tie_aware_push(original):
  """``Scope.push`` whose module-level ``params`` targets share rng streams."""
  @functools.wraps(original)
  def push(self, name=None, prefix='', reuse=False):
    child = original(self, name, prefix, reuse)
    if TIES_FLAG in child.flags:
      _share_rngs(child)
    return child
  return push


def tie_aware_param(original):
  """``Scope.param`` whose shape check names both paths of a tie."""
  @functools.wraps(original)
  def param(self, name, init_fn, *init_args, **init_kwargs):
    try:
      return original(self, name, init_fn, *init_args, **init_kwargs)
    except flax_errors.ScopeParamShapeError:
      target = self.path + (name,)
      tie = max((t for t in ties_in_force(self) if is_within(target, t.target)
                 and t.applies_to('params')),
                key=lambda t: len(t.target), default=None)
      if tie is not None:
        init_kwargs.pop('unbox', None)
        check_like(dataclasses.replace(
            tie, target=target, source=tie.source + target[len(tie.target):]),
                   'params', self.get_variable('params', name),
                   jax.eval_shape(lambda: init_fn(jax.random.key(0),
                                                  *init_args, **init_kwargs)))
      raise
  return param


def _share_rngs(scope):
  """Gives a module-level ``params`` target its source's rng streams.

  They are Flax's own, built by ``Scope.push`` at the source's path (inside
  ``vmap``/``scan``, the source's lifted, split streams). While initializing
  the counters start afresh, so that a copy the target initializes equals what
  the source draws, and the source's own draws are left alone.
  """
  tie = _tie_for(scope, scope.path, 'params')
  source = None if tie is None or tie.view is not None else reach(
      scope, tie.source, rngs=True)[0]
  if source is not None:
    scope.rngs = source.rngs
    scope.rng_counters = ({k: 0 for k in source.rngs}
                          if scope.get_flag('initializing', False)
                          else source.rng_counters)


# ---------------------------------------------------------------------------
# The invariants, checked when the declaring call of an ``init`` returns
# ---------------------------------------------------------------------------


def held_elsewhere(scope, path: Path, col: str | None) -> str:
  """Names a collection other than ``col`` that holds ``path``, if any."""
  holders = sorted(c for c in visible_collections(scope)
                   if c != col and stored(scope, path, c) is not None)
  return holders and (
      f' {text(path)} is stored in collection {holders[0]!r}: tie that'
      f' collection (collections={holders[0]!r}).') or ''


def check_init(scope, ties: tuple[Tie, ...]):
  """Checks each tie on the variables ``init`` produced; drops target copies.

  Raises a TieError naming target, source, collection and declaring module
  when a tied collection, the source or the target does not exist, the source
  is of another kind than the target (module or variable), or the target's
  copy holds a variable its source lacks or one of another shape or dtype.
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
            + (held_elsewhere(scope, tie.target, col)
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
      source = source_scope and source_scope._collection(col)  # pylint: disable=protected-access
      if isinstance(source, Mapping) and not source:
        source = None
      if source is not None:
        refuse_declared_inside(scope, tie, col, crossed)
        _check_copy(tie, col, copy, source)
      elif not isinstance(copy, Mapping) or copy:
        raise tie_error(
            f'The source {text(tie.source)} of the {tie.describe(col)} does'
            ' not exist: nothing was stored there while initializing (this'
            ' init ran its target, but no module at the source path).'
            + (held_elsewhere(scope, tie.source, col)
               or nearest(stored(scope, (), col) or {}, tie.source)),
            _FIX_PATH.format('source'),
            'Initialize with a method that also runs the source.')
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
          + held_elsewhere(scope, tie.target, None),
          'Tie the collections the two modules hold (collections=...).',
          'Tie the modules that hold the collection.')
    raise tie_error(
        f'The target {text(tie.target)} of the {tie.describe()} does not'
        ' exist: no module or variable was created there while'
        ' initializing in the tied collections.'
        + (held_elsewhere(scope, tie.target, None)
           or nearest(stored(scope, (), 'params') or {}, tie.target)),
        _FIX_PATH.format('target'),
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
    raise kinds_differ(tie, col, target_is_module=isinstance(copy, Mapping))
  flat_source = dict(flatten(jax.eval_shape(lambda s: viewed(tie, s), source)))
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
