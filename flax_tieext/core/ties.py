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
scopes of every lifted transform). So a tie is in force wherever its target is
used: in every method, in ``setup``, under ``bind`` and ``apply(method=...)``.
The rules, each stated once:

* **Storage** (:func:`_resolve`). A target scope's collection *is* its
  source's dict, kept where Flax keeps a scope's collections; a scope below a
  target reaches it through its parent, as in Flax. A tied variable is read
  and written through its parent's collection (:class:`_TiedCollection`).
* **Reach** (:func:`_base`). The source is found up the parents, then among
  the inner roots of the same lifted transform, then outside it. What lies
  outside a transform is a closed-over, read-only value.
* **Lifting** (:func:`lifted_sources`). What a transform does with a source
  outside it is its own declaration (:data:`CROSSINGS`): lift it with the
  target (as Flax lifts a Module attribute), lift only its rngs (a mapped
  transform: the variables are broadcast), or read it as a closure.
* **Rngs** (:func:`_share_rngs`). A module-level ``params`` target draws from
  its source's rng streams: outside ``init`` with the source's counters (one
  module called twice); during ``init`` with fresh counters, so that a copy
  it initializes equals what the source draws.
* **Init.** A ``params`` target works on a copy that starts as its source's
  variables; a variable the source lacks (or all of them, if the target runs
  first) is initialized into the copy. Other collections use the source once
  it exists, so writes land as in one module. When the declaring call
  returns, :func:`check_init` checks each copy against its source and drops
  it: the stored values are the source's, whichever use runs first.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

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
# root stands for (a _Lift). Flags, so that rewound() keeps it.
LIFT_FLAG = '__tie_lift__'


@dataclasses.dataclass(frozen=True)
class Crossing:
  """What a lifted transform does with a tie source that lies outside it.

  Attributes:
    lifts: the source's scope is lifted with the target, with its variables
      (as Flax lifts a Module attribute). Otherwise the source is read as a
      closed-over, read-only value.
    maps: the transform maps over an axis: the source's rngs are lifted (and
      split like every lifted scope's), its variables stay a broadcast value.
    caches_trace: the transform reuses its trace, so a closed-over source
      would go stale.
  """

  lifts: bool = False
  maps: bool = False
  caches_trace: bool = False


LIFT = Crossing(lifts=True)
# What each of Flax's lifted transforms does with a tie source outside it, by
# the name it gives pack. Upstream this is pack's ``tie_sources`` argument,
# passed by each transform; a transform that declares nothing gets a TieError
# when a tie source lies outside it, never a guess.
CROSSINGS = {
    'remat': LIFT, 'cond': LIFT, 'switch': LIFT, 'while_loop': LIFT,
    'map_variables': LIFT, 'fold_rngs': LIFT,
    'jit': Crossing(lifts=True, caches_trace=True),
    'vmap': Crossing(maps=True), 'scan': Crossing(maps=True),
    'vjp': Crossing(), 'jvp': Crossing(), 'value_and_grad': Crossing(),
    'custom_vjp': Crossing(),
}


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


@dataclasses.dataclass(frozen=True, eq=False)
class _Lift:
  """What an inner root scope of a lifted transform stands for."""

  outer: Any  # the outer scope
  siblings: tuple  # the inner roots of the same pack (tie sources included)
  name: str  # the pack's name
  rngs_only: bool  # a tie source lifted for its rngs (variables: outside)
  closure: str | None  # the transform whose closed-over values it holds


def _lift(scope) -> _Lift | None:
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
  """``(scope at or above path, names of the transforms crossed)``.

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
    crossed += (lift.name,)
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
  return ' and '.join(f'nn.{name}' for name in crossed)


def _maps(crossed) -> bool:
  """Whether a crossed transform maps over an axis (its sources broadcast)."""
  return any(CROSSINGS.get(name, LIFT).maps for name in crossed)


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
  where = next((name for name in crossed
                if CROSSINGS.get(name, LIFT).caches_trace), None)
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
  first = crossed[0]
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
  tie = None
  if col not in scope._variables:  # pylint: disable=protected-access
    if not scope.is_mutable_collection(col):
      _check_present(scope, col)
    tie = _tie_for(scope, scope.path, col)
  node = (original(scope, col) if tie is None
          else _resolve(scope, tie, col, write, original))
  named = {t.target[-1]: t for t in ties_in_force(scope)
           if t.target[:-1] == scope.path and len(t.target) > len(scope.path)
           and t.applies_to(col)}
  return _TiedCollection(scope, col, node, named) if named else node


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


class _TiedCollection(MutableMapping):
  """A scope's collection in which some names are tied variables.

  A tied name reads and writes its source variable; every other name (and a
  tied name whose source is a module, resolved in the submodule's own scope)
  is the scope's own. Membership, iteration and length agree.
  """

  def __init__(self, scope, col: str, own, ties: dict[str, Tie]):
    self._scope, self._col, self._own, self._ties = scope, col, own, ties

  def _source(self, name: str, write: bool = False):
    """``(parent dict, name)`` of the source variable, or None for our own."""
    tie = self._ties.get(name)
    if tie is None:
      return None
    scope, col = self._scope, self._col
    parent, crossed = reach(scope, tie.source[:-1])
    node = None if parent is None else parent._collection(col)  # pylint: disable=protected-access
    found = node.get(tie.source[-1]) if isinstance(node, Mapping) else None
    if parent is None or isinstance(found, Mapping):
      return None  # a submodule: its own scope resolves the tie
    if (scope.get_flag('initializing', False) and not _maps(crossed)
        and scope.is_mutable_collection(col)
        and (found is None or write and col == 'params')):
      return None  # a copy, checked and dropped by check_init
    if crossed:
      refuse_stale(scope, tie, col, crossed)
      if write or found is None:
        raise _cannot_land(scope, tie, col, crossed,
                           'A write to' if write else 'Initializing')
    elif found is None and not scope.is_mutable_collection(col):
      raise _missing_variable(scope, tie, col, node)
    if write and tie.view is not None:
      raise _read_only(tie, col, scope)
    tie.used.add(col)
    if write:
      node = parent._mutable_collection(col)  # pylint: disable=protected-access
    return node, tie.source[-1]

  def __getitem__(self, name):
    where = self._source(name)
    if where is None:
      return self._own[name]
    parent, key = where
    if key not in parent:
      raise KeyError(name)
    return apply_view(self._ties[name], parent[key])

  def __contains__(self, name):
    where = self._source(name)
    return name in self._own if where is None else where[1] in where[0]

  def __setitem__(self, name, value):
    where = self._source(name, write=True)
    if where is None:
      self._own[name] = value
      return
    parent, key = where
    if key in parent:
      check_like(self._ties[name], self._col, parent[key], value)
    parent[key] = value

  def __delitem__(self, name):
    del self._own[name]

  def __iter__(self) -> Iterator[str]:
    yield from self._own
    for name in self._ties:
      if name not in self._own and name in self:
        yield name

  def __len__(self) -> int:
    return sum(1 for _ in self)


def _missing_variable(scope, tie: Tie, col: str, node):
  """The source variable is not stored: say where it is, or what is near."""
  return tie_error(
      f'The source {text(tie.source)} of the {tie.describe(col)} is not'
      f' stored (looked up from {scope.path_text}).'
      + (_held_elsewhere(scope, tie.source, col) or nearest(
          node if isinstance(node, Mapping) else {}, tie.source[-1:],
          tie.source[:-1])),
      'Fix the source path (paths are relative to the module that declares'
      ' the tie; a leading "/" starts at the root module), or the'
      ' collections.',
      "Pass the source's variables to apply.")


def _held_elsewhere(scope, path: Path, col: str) -> str:
  """Names the collections other than ``col`` that hold ``path``, if any."""
  holders = sorted(c for c in visible_collections(scope)
                   if c != col and stored(scope, path, c) is not None)
  if not holders:
    return ''
  return (f' {text(path)} is stored in collection {holders[0]!r}: tie that'
          f' collection (collections={holders[0]!r}).')


# ---------------------------------------------------------------------------
# Lifting (called by lift._partial_pack)
# ---------------------------------------------------------------------------


def lifted_sources(scopes, name: str):
  """``(packed, scope, rngs_only, closure)`` of each tie source to lift.

  For a target inside ``scopes`` whose source lies outside all of them, as
  the transform declares (:data:`CROSSINGS`): the source's scope (a
  variable's module) with its variables, or with its rngs only, or nothing.
  A source seen here only as a closed-over value is lifted as one, read-only.
  A source not stored yet is not lifted: the target initializes its own copy,
  and the transform sees exactly what it sees without the tie.
  """
  crossing = CROSSINGS.get(name)
  extra, paths = [], set()
  for scope in scopes:
    for tie in ties_in_force(scope):
      if not is_within(tie.target, scope.path) or any(
          is_within(tie.source, s.path) for s in scopes):
        continue
      if crossing is None:
        raise tie_error(
            f'The target of the {tie.describe()} is inside the lifted'
            f' transform {name!r} at {scope.path_text}, and its source lies'
            f' outside it, but {name!r} does not declare what it does with a'
            ' tie source outside it.',
            'Declare the tie inside the transform, with both paths inside it.')
      if not (crossing.lifts or crossing.maps):
        continue  # read as a closed-over value
      col = next((c for c in ('params', *named_collections(tie.collections),
                              *visible_collections(scope))
                  if tie.applies_to(c)), 'params')
      path = tie.source
      parent, _ = reach(scope, path[:-1])
      node = None if parent is None else walk(parent._collection(col), path[-1:])  # pylint: disable=protected-access
      if node is None or (isinstance(node, Mapping) and not node):
        continue  # nothing stored yet: the target initializes its own copy
      if not isinstance(node, Mapping):
        path = path[:-1]  # a variable: lift its module
      if path in paths or any(is_within(path, s.path) for s in scopes):
        continue
      paths.add(path)
      source, _ = reach(scope, path, rngs=True)
      values, crossed = reach(scope, path)
      if crossing.maps:
        extra.append((_detached(source, {}), source, True, None))
      elif crossed:  # only a closed-over value here: lift it as one
        extra.append((_detached(source, {
            c: values._collection(c) for c in visible_collections(scope)  # pylint: disable=protected-access
            if tie.applies_to(c)}), source, False, crossed[0]))
      else:
        extra.append((source, source, False, None))
  return extra


def _detached(scope, variables):
  """A read-only root scope at ``scope``'s path: ``variables``, its rngs."""
  new = type(scope)(dict(variables), None, scope.name, False, None,
                    path=scope.path, debug_path=scope.debug_path,
                    flags=scope.flags)
  new.rngs, new.rng_counters = scope.rngs, scope.rng_counters
  return new


def without_borrowed(scope, lifted):
  """``(scope as pack lifts it, collections left out)``.

  A lifted scope that is itself a target carries its source's collections
  (a tied scanned stack is scanned like its source), unless the source is
  among the ``lifted`` scopes (with its variables): then the inner target
  reaches the inner source, and lifting the collections twice would fork
  them.
  """
  if not any(t.target == scope.path
             and any(is_within(t.source, s.path) for s in lifted)
             for t in ties_in_force(scope)):
    return scope, ()
  scope._populate_collections()  # pylint: disable=protected-access
  borrowed = _borrowed(scope)
  if not borrowed:
    return scope, ()
  new = scope.rewound()
  new.flags = freeze({k: v for k, v in scope.flags.items() if k != TIES_FLAG})
  new._variables = {c: v for c, v in scope._variables.items()  # pylint: disable=protected-access
                    if c not in borrowed}
  return new, borrowed


def _borrowed(scope) -> set[str]:
  """The collections ``scope``, a target, holds as its source's very dicts."""
  found = set()
  for col, node in scope._variables.items():  # pylint: disable=protected-access
    tie = _tie_for(scope, scope.path, col)
    if tie is not None:
      source, _ = reach(scope, tie.source)
      if source is not None and source._collection(col) is node:  # pylint: disable=protected-access
        found.add(col)
  return found


def visible_collections(scope) -> set[str]:
  """The collections of every root up the chain of lifted transforms."""
  found = set()
  while scope is not None:
    found |= set(scope.root._variables)  # pylint: disable=protected-access
    lift = _lift(scope)
    scope = lift and lift.outer
  return found


def _link(outer_scopes, inner_scopes, name, kinds):
  """Records on each inner root what it stands for (:data:`LIFT_FLAG`)."""
  siblings = tuple(inner_scopes)
  for outer, inner, (rngs_only, closure) in zip(outer_scopes, inner_scopes,
                                                kinds):
    lift = _lift(outer)
    closure = closure or (lift.closure if lift else None)
    inner.flags = freeze({**outer.flags, LIFT_FLAG: _Lift(
        outer, siblings, name, rngs_only, closure)})
    if closure:
      inner.mutable = False


def tie_aware_partial_pack(original):
  """``lift._partial_pack`` in which tie sources take part in the packing.

  When a lifted scope contains a tied target whose source lies outside every
  lifted scope, the source's scope is packed as well, as the transform
  declares (:func:`lifted_sources`); inside, the target resolves to the inner
  source, so reads, writes and gradients reach the one stored variable. The
  extra scopes are not visible to the transform: ``scope_fn`` returns, and
  ``repack_fn`` takes, the scope tree it was given. Without ties in force this
  is Flax's own ``_partial_pack``.
  """
  @_hook(original)
  def _partial_pack(scope_tree, in_variable_filters, out_variable_filters,
                    rng_filters, name=None):
    scopes, treedef = jax.tree_util.tree_flatten(scope_tree)
    if not any(TIES_FLAG in s.flags for s in scopes):
      # Flax's own packing; its inner roots only learn where they stand, for
      # a tie declared inside the transform.
      scope_fn, *rest = original(scope_tree, in_variable_filters,
                                 out_variable_filters, rng_filters, name)

      def linked_scope_fn(*args, **kwargs):
        inner = scope_fn(*args, **kwargs)
        _link(scopes, treedef.flatten_up_to(inner), name,
              [(False, None)] * len(scopes))
        return inner

      return (linked_scope_fn, *rest)
    for scope in scopes:  # what the scope sees from outside its root, too
      for col in visible_collections(scope) - set(scope.root._variables):  # pylint: disable=protected-access
        scope._collection(col)  # pylint: disable=protected-access
    extra = lifted_sources(scopes, name)
    lifted = scopes + [real for _, real, only, _ in extra if not only]
    packed = [without_borrowed(s, lifted) for s in scopes]
    reals = scopes + [real for _, real, _, _ in extra]
    kinds = [(False, None)] * len(scopes) + [(o, c) for _, _, o, c in extra]
    scope_fn, repack_fn, *rest = original(
        [s for s, _ in packed] + [s for s, _, _, _ in extra],
        in_variable_filters, out_variable_filters, rng_filters, name)

    def tied_scope_fn(*args, **kwargs):
      inner = scope_fn(*args, **kwargs)
      _link(reals, inner, name, kinds)
      for (_, excluded), inner_scope in zip(packed, inner):
        for col in excluded:  # reach the inner source now, as pack would
          inner_scope._collection(col)  # pylint: disable=protected-access
      return treedef.unflatten(inner[:len(scopes)])

    def tied_repack_fn(inner_scope_tree):
      inner = list(treedef.flatten_up_to(inner_scope_tree))
      if inner and _lift(inner[0]) is not None:
        inner += _lift(inner[0]).siblings[len(inner):]
      for inner_scope in inner:
        for col in _borrowed(inner_scope):  # its source repacks them
          del inner_scope._variables[col]  # pylint: disable=protected-access
      return repack_fn(inner)

    return (tied_scope_fn, tied_repack_fn, *rest)
  return _partial_pack


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
