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

A *tie* declares that the variables of a target path (a module, or one
variable) in some collections *are* those of a source path. ``lift.tie``
records its ties in the scope ``flags``, which Flax hands to every child scope
and to every inner scope of a lifted transform, so a tie is known wherever its
target is used. The rules, each stated once:

* **Storage** (:func:`locate`). A target scope reads and writes its source's
  collection dict; a tied variable is read and written through its parent's
  collection (:class:`_TiedCollection`). Reads see the current value, writes
  land in program order, gradients sum over all uses.
* **Lifting** (:func:`lifted_sources`). A transform that lifts a scope holding
  a target lifts the source's scope with it, as Flax lifts a Module passed in
  as an attribute. A transform that maps over an axis (``vmap``, ``scan``)
  lifts only the source's rngs (split like every lifted scope's) and sees its
  variables as a broadcast, read-only value; one that differentiates with
  respect to the lifted variables (``vjp``, ``jvp``, ...) sees the source as a
  closure. A lifted scope that is itself a target carries its source's
  variables, so a tied scanned stack is scanned like its source.
* **Rngs** (:func:`_share_rngs`). Outside ``init``, a module-level tie of
  ``params`` makes the target the same module instance: it draws from the
  source's rng streams and counters, derived by ``Scope.push``.
* **Init** (:func:`_initializes`). While initializing, a ``params`` target
  initializes its own copy, as if untied, and so does a target of another
  collection whose source does not exist yet; when the declaring call
  returns, ``tie_checks.check_init`` checks each copy against the source and
  drops it. The stored values are therefore the source's own, whichever use
  runs first.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import jax

from flax.core.frozen_dict import FrozenDict
from flax_tieext import errors
from flax_tieext.core.tie_spec import (
    Path,
    Tie,
    apply_view,
    check_like,
    is_box,
    is_within,
    named_collections,
    nearest,
    text,
    tie_error,
    walk,
)

TIES_FLAG = '__ties__'

# What a transform does with the variables it lifts decides what it does with a
# tie source outside it. ``pack`` does not record it, so it is stated here, by
# pack name; any other transform lifts a source like a Module attribute.
_MAPS = frozenset({'vmap', 'scan'})
_DIFFERENTIATES = frozenset({'vjp', 'jvp', 'value_and_grad', 'custom_vjp'})
_CACHES_TRACES = frozenset({'jit'})  # a closed-over value would go stale


# ---------------------------------------------------------------------------
# Declaring ties
# ---------------------------------------------------------------------------


def ties_in_force(scope) -> tuple[Tie, ...]:
  return scope.flags.get(TIES_FLAG, ())


def declare(scope, ties: tuple[Tie, ...]):
  """Returns a scope like ``scope`` (a rewound copy) with ``ties`` in force."""
  scope._check_valid()  # pylint: disable=protected-access
  targets = {t.target for t in ties}
  flags = dict(scope.flags)
  flags[TIES_FLAG] = tuple(
      t for t in ties_in_force(scope) if t.target not in targets) + ties
  new = type(scope)(scope._variables, None, scope.name, scope.mutable,  # pylint: disable=protected-access
                    scope.parent, path=scope.path,
                    debug_path=scope.debug_path, flags=flags)
  new.rngs, new.rng_counters = scope.rngs, scope.rng_counters
  new._tie_lift = scope._tie_lift  # pylint: disable=protected-access
  _share_rngs(new)
  return new


# ---------------------------------------------------------------------------
# Where a path is stored
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Lift:
  """What an inner root scope of a lifted transform stands for."""

  outer: Any  # the outer scope
  siblings: tuple  # the inner roots of the same pack (tie sources included)
  transform: str  # the pack's name
  rngs_only: bool  # a tie source lifted for its rngs only
  closure: str | None  # the mapping transform its variables are broadcast by


def _reach(scope, path: Path, rngs: bool = False):
  """A scope at or above ``path`` seen from ``scope``: ``(scope, crossed)``.

  Walks up the parents, then over the inner roots of the same lifted
  transform, then out of the transform (``crossed`` names the transforms whose
  boundary was crossed: what lies beyond is only a closed-over value).
  """
  crossed = []
  while scope is not None:
    s = scope
    while s is not None:
      if is_within(path, s.path):
        return s, tuple(crossed)
      s = s.parent
    lift = scope.root._tie_lift  # pylint: disable=protected-access
    if lift is None:
      break
    for sib in lift.siblings:
      if sib is scope.root or not is_within(path, sib.path):
        continue
      info = sib._tie_lift  # pylint: disable=protected-access
      if rngs or not info.closure:
        return sib, tuple(crossed)
      if not info.rngs_only:  # a broadcast value, lifted again
        return sib, tuple(crossed) + (info.closure,)
    crossed.append(lift.transform)
    scope = lift.outer
  return None, tuple(crossed)


def locate(scope, path: Path, col: str, rngs: bool = False):
  """Where ``path`` is stored in ``col``, seen from ``scope``.

  Follows every tie on the way (the innermost target wins, so chains resolve
  across declarations). Returns ``(base, rest, crossed)``: a scope ``base``
  whose path is a prefix of the stored path, the remaining names, and the
  transforms crossed (see :func:`_reach`); ``base`` is None when unreachable.
  """
  seen = [path]
  crossed: tuple[str, ...] = ()
  while True:
    new = _follow(scope, path, col)
    if new is None:
      base, more = _reach(scope, path, rngs)
      crossed += more
      if base is None:
        return None, path, crossed
      new = _follow(base, path, col, len(base.path))
      if new is None:
        return base, path[len(base.path):], crossed
      scope = base
    if new in seen:
      raise errors.TieError(
          'Ties declared at different modules form a cycle: '
          + ' -> '.join(text(p) for p in seen + [new])
          + f' (collection {col!r}). Pick one stored source.')
    seen.append(new)
    path = new


def _follow(scope, path: Path, col: str, below: int = -1) -> Path | None:
  """Where the innermost tie in force at ``scope`` maps ``path``, or None.

  Inside a lifted transform, a tie whose target holds an inner root that
  holds ``col`` was already followed when the root was lifted: the root's
  data is the source's.
  """
  root, best = scope.root, None
  lifted = col in root._variables and is_within(path, root.path)  # pylint: disable=protected-access
  for t in ties_in_force(scope):
    if (t.view is None and len(t.target) > below
        and (best is None or len(t.target) > len(best.target))
        and is_within(path, t.target)
        and not (lifted and is_within(root.path, t.target))
        and t.applies_to(col)):
      best = t
  return None if best is None else best.source + path[len(best.target):]


def stored(scope, path: Path, col: str):
  """What is stored at ``path`` itself in ``col`` (no tie followed), or None."""
  base, _ = _reach(scope, path)
  if base is None:
    return None
  root = base.root
  return walk(root._variables.get(col), path[len(root.path):])  # pylint: disable=protected-access


def _tie_of(scope, path: Path, col: str, exact: bool = True) -> Tie | None:
  """The innermost tie at ``scope`` whose target is (or holds) ``path``."""
  found = [t for t in ties_in_force(scope) if (
      t.target == path if exact else is_within(path, t.target))
           and t.applies_to(col)]
  return max(found, key=lambda t: len(t.target), default=None)


def _storage(scope, tie: Tie, col: str, write: bool):
  """``(storage, crossed)``: what ``tie``'s target uses in ``col`` (None: own).

  While initializing, a target may initialize its own copy (see
  :func:`_initializes`). Otherwise a target uses its source's storage; across
  a transform boundary the source is a closed-over, read-only value, except
  for a lifted root that is itself the target: it keeps what the transform
  lifted for it.
  """
  base, rest, crossed = locate(
      scope, tie.source + scope.path[len(tie.target):], col)
  if base is None:
    raise tie_error(
        f'Cannot reach the source of the {tie.describe(col)} from'
        f' {scope.path_text}.',
        'Declare the tie at a module that contains both paths.')
  lifted_target = (scope.parent is None and scope.path == tie.target
                   and scope.is_mutable_collection(col))
  if (crossed and lifted_target) or _initializes(
      scope, col, crossed, lambda: walk(base._collection(col), rest)):  # pylint: disable=protected-access
    return None, crossed
  if not crossed:
    node = base._mutable_collection(col) if write else base._collection(col)  # pylint: disable=protected-access
    for name in rest:
      if write:
        node = node.setdefault(name, {})
      elif isinstance(node, Mapping) and name in node:
        node = node[name]
      else:
        return _missing(scope, tie, col), crossed
    return node, crossed
  refuse_stale(scope, tie, col, crossed)
  node = walk(base._collection(col), rest)  # pylint: disable=protected-access
  if write or not node:
    what = 'A write to' if write else 'Initializing'
    inside = is_within(tie.declared_at, scope.root.path)
    raise tie_error(
        f'{what} {text(tie.target)} in collection {col!r} cannot land in its'
        f' source {text(tie.source)}: the {tie.describe(col)} is used inside'
        f' {" and ".join(crossed)} at {scope.path_text}, and the source lies'
        ' outside it, where it is a read-only (broadcast) value.',
        'Declare the tie at the common ancestor of both paths, outside the'
        f' {crossed[0]}.' if inside else '',
        f'Run the source {text(tie.source)} before the {crossed[0]}, so that'
        ' it exists when the target reads it.' if not write else '',
        f'Write to the source outside the {crossed[0]}.' if write else '')
  return node, crossed


def refuse_stale(scope, tie: Tie, col: str, crossed):
  """A closed-over source inside a transform that caches its trace is stale."""
  where = next((t for t in crossed if t in _CACHES_TRACES), None)
  if where is not None:
    raise tie_error(
        f'The {tie.describe(col)} is used inside nn.{where} at'
        f' {scope.path_text}, but its source lies outside that {where} and was'
        f' not lifted into it (the tie is declared inside the {where}): the'
        ' compiled function would keep a stale copy of the source.',
        f'Declare the tie at a module that contains both paths, outside the'
        f' {where}.')


def _initializes(scope, col: str, crossed, source_exists) -> bool:
  """Whether a target at ``scope`` initializes its own copy of ``col``.

  Only while initializing. Parameters always get a copy, checked against the
  source and dropped when the declaring call returns
  (``tie_checks.check_init``), so the stored values are the source's
  whichever use runs first. Another
  collection uses its source once it exists, so that the target's writes land
  as in one shared module. A source outside a mapping transform is never
  copied: it is a broadcast value.
  """
  return (scope.get_flag('initializing', False)
          and scope.is_mutable_collection(col) and not set(crossed) & _MAPS
          and (bool(crossed) or col == 'params' or not source_exists()))


def _missing(scope, tie: Tie, col: str):
  if scope.is_mutable_collection(col):
    return FrozenDict()
  raise tie_error(
      f'The source {text(tie.source)} of the {tie.describe(col)} is not'
      f' stored (looked up from {scope.path_text}).'
      + nearest(stored(scope, (), col) or {},
                tie.source[len(scope.root.path):], scope.root.path),
      'Fix the source path (paths are relative to the module that declares'
      ' the tie; a leading "/" starts at the root module).',
      "Pass the source's variables to apply.")


# ---------------------------------------------------------------------------
# Scope hooks (installed on flax.core.scope.Scope)
# ---------------------------------------------------------------------------


def _hook(original):
  return functools.wraps(original)


def _tied(scope, col: str, write: bool, original):
  """``original(scope, col)``, seen through the ties in force at ``scope``."""
  if TIES_FLAG not in scope.flags:
    return original(scope, col)
  borrowed = scope._tie_borrowed  # pylint: disable=protected-access
  if borrowed is not None and col in borrowed:
    return borrowed[col]
  tie = None
  if col not in scope._variables:  # pylint: disable=protected-access
    tie = _tie_of(scope, scope.path, col)
    lift = scope._tie_lift  # pylint: disable=protected-access
    if (tie is None and lift is not None and not write
        and not scope.is_mutable_collection(col)
        and _tie_of(scope, scope.path, col, exact=False)):
      # An inner root below a target, without the collection lifted: it
      # reads what its outer scope reads (a closed-over, read-only value).
      return lift.outer._collection(col)  # pylint: disable=protected-access
  node, crossed = _storage(scope, tie, col, write) if tie else (None, ())
  if node is None:
    node = original(scope, col)
  elif tie.view is not None:
    if write:
      raise _read_only(tie, col, scope)
    return jax.tree_util.tree_map(lambda x: apply_view(tie, x), node,
                                  is_leaf=is_box)
  else:
    tie.used.add(col)
    if not crossed and (node or isinstance(node, dict)):  # not a placeholder
      scope._tie_borrowed = {**(borrowed or {}), col: node}  # pylint: disable=protected-access
  named = {t.target[-1]: t for t in ties_in_force(scope)
           if len(t.target) == len(scope.path) + 1
           and t.target[:-1] == scope.path and t.applies_to(col)}
  return _TiedCollection(scope, col, node, named) if named else node


def tie_aware_collection(original):
  """``Scope._collection`` that resolves ties in force."""
  @_hook(original)
  def _collection(self, col):
    return _tied(self, col, False, original)
  return _collection


def tie_aware_mutable_collection(original):
  """``Scope._mutable_collection`` that writes through ties in force."""
  @_hook(original)
  def _mutable_collection(self, col):
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


def _share_rngs(scope):
  """Gives a module-level ``params`` target its source's rngs and counters.

  The tie then behaves as one module called at two places. The source scope
  is built by ``Scope.push`` on rewound copies (reserving no name), so its
  streams are Flax's own; inside ``vmap``/``scan`` they come from the source's
  lifted, split rngs. While initializing the target keeps its own streams:
  its copy is dropped, and the source's values must not depend on it.
  """
  tie = _tie_of(scope, scope.path, 'params')
  if tie is None or tie.view is not None or scope.get_flag(
      'initializing', False):
    return
  base, rest, _ = locate(scope, tie.source, 'params', rngs=True)
  if base is None:
    return
  for name in rest:
    base = base.rewound().push(name, reuse=True)
  scope.rngs, scope.rng_counters = base.rngs, base.rng_counters


class _TiedCollection(MutableMapping):
  """A scope's collection in which some names are tied variables."""

  def __init__(self, scope, col: str, own, ties: dict[str, Tie]):
    self._scope, self._col, self._own, self._ties = scope, col, own, ties

  def _source(self, name: str, write: bool, value: Any = None):
    """``(parent dict, name)`` of the stored variable, or None for its own.

    A name whose source (or value) is a dict is a submodule: a module-level
    tie resolves it in the submodule's own scope.
    """
    tie = self._ties.get(name)
    if tie is None or isinstance(value, Mapping):
      return None
    base, rest, crossed = locate(self._scope, tie.source[:-1], self._col)
    found = None if base is None else walk(
        base._collection(self._col), rest + tie.source[-1:])  # pylint: disable=protected-access
    if base is None or isinstance(found, Mapping) or _initializes(
        self._scope, self._col, crossed, lambda: found is not None):
      return None
    if tie.view is not None and write:
      raise _read_only(tie, self._col, self._scope)
    tie_at_parent = dataclasses.replace(tie, target=tie.target[:-1],
                                        source=base.path + rest)
    parent, _ = _storage(self._scope, tie_at_parent, self._col, write)
    if parent is None:
      return None
    tie.used.add(self._col)
    return parent, tie.source[-1]

  def __getitem__(self, name):
    where = self._source(name, False)
    if where is None:
      return self._own[name]
    parent, key = where
    if key not in parent:
      raise KeyError(name)
    tie = self._ties[name]
    return parent[key] if tie.view is None else apply_view(tie, parent[key])

  def __contains__(self, name):
    where = self._source(name, False)
    return name in self._own if where is None else where[1] in where[0]

  def __setitem__(self, name, value):
    where = self._source(name, True, value)
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
    return iter(self._own)

  def __len__(self) -> int:
    return len(self._own)


def _read_only(tie: Tie, col: str, scope) -> errors.TieError:
  return tie_error(
      f'Cannot write to {text(tie.target)} in collection {col!r} at'
      f' {scope.path_text}: the {tie.describe(col)} gives a derived,'
      ' read-only view of the source.',
      f'Write to the source {text(tie.source)} instead.',
      'Tie without a view_fn.')


# ---------------------------------------------------------------------------
# Lifting (called by lift._partial_pack)
# ---------------------------------------------------------------------------


def lifted_sources(scopes, transform: str) -> list[tuple[Any, bool]]:
  """``(scope, rngs_only)`` of each tie source to lift along with ``scopes``.

  For a target inside ``scopes`` whose source lies outside all of them: the
  source's module (for a variable, its parent). See the module docstring for
  what each transform lifts. A source not stored yet is not lifted: the
  target initializes its own copy, and the transform sees exactly what it
  sees without the tie (so ``nn.jit`` may reuse an untied call site's trace).
  """
  if transform in _DIFFERENTIATES:
    return []
  rngs_only = transform in _MAPS
  extra, paths = [], set()
  for scope in scopes:
    for tie in ties_in_force(scope):
      if not is_within(tie.target, scope.path):
        continue
      col = next((c for c in ('params', *named_collections(tie.collections),
                              *scope.root._variables)  # pylint: disable=protected-access
                  if tie.applies_to(c)), 'params')
      base, rest, crossed = locate(scope, tie.source, col, rngs=True)
      if base is None or crossed:
        continue
      path = base.path + rest
      lift = base.root._tie_lift  # pylint: disable=protected-access
      seen = lift.outer if lift and lift.rngs_only else base  # a closure
      node = walk(seen._collection(col), path[len(seen.path):])  # pylint: disable=protected-access
      if node is None or (isinstance(node, Mapping) and not node):
        continue  # nothing stored yet: the target initializes its own copy
      if not isinstance(node, Mapping):
        path = path[:-1]  # a variable: lift its module
      if path in paths or any(is_within(path, s.path) for s in scopes) or (
          rngs_only and any(is_within(s.path, path) for s in scopes)):
        continue
      base, _ = _reach(scope, path, rngs=True)
      for name in path[len(base.path):]:
        base = base.rewound().push(name, reuse=True)
      paths.add(path)
      extra.append((base, rngs_only))
  return extra


def lifted_variables(scope, scopes) -> Mapping[str, Any]:
  """The variables a transform lifts for ``scope``, among ``scopes``.

  A scope that is itself a target carries its source's collections when the
  source is not lifted with variables in the same pack (a tied scanned stack
  is scanned like its source).
  """
  lift = scope._tie_lift  # pylint: disable=protected-access
  if lift is not None and lift.rngs_only:  # its variables are a closure
    return {col: node for col in visible_collections(scope)
            if (node := lift.outer._collection(col))}  # pylint: disable=protected-access
  ties = [t for t in ties_in_force(scope) if t.target == scope.path]
  if not ties:
    return scope._variables  # pylint: disable=protected-access
  out = dict(scope._variables)  # pylint: disable=protected-access
  for col in visible_collections(scope):
    if col in out or not any(t.applies_to(col) for t in ties):
      continue
    scope._collection(col)  # pylint: disable=protected-access
    node = (scope._tie_borrowed or {}).get(col)  # pylint: disable=protected-access
    base, rest, _ = locate(scope, scope.path, col)
    if node is not None and not any(
        is_within(base.path + rest, s.path) for s in scopes):
      out[col] = node
  return out


def visible_collections(scope) -> set[str]:
  """The collections of every root up the chain of lifted transforms."""
  found = set()
  while scope is not None:
    found |= set(scope.root._variables)  # pylint: disable=protected-access
    lift = scope.root._tie_lift  # pylint: disable=protected-access
    scope = lift and lift.outer
  return found


def link_inner_scopes(outer_scopes, inner_scopes, transform, rngs_only):
  """Records on each inner root what it stands for (``Scope._tie_lift``)."""
  siblings = tuple(inner_scopes)
  for outer, inner, only in zip(outer_scopes, inner_scopes, rngs_only):
    closure = transform if only else outer.root._tie_lift and (  # pylint: disable=protected-access
        outer.root._tie_lift.closure)  # pylint: disable=protected-access
    inner._tie_lift = _Lift(outer, siblings, transform, only, closure)  # pylint: disable=protected-access
    if closure:
      inner.mutable = False


def inner_scopes_of(inner_scopes) -> tuple:
  """All inner roots of the pack that created ``inner_scopes``."""
  for scope in inner_scopes:
    lift = scope.root._tie_lift  # pylint: disable=protected-access
    if lift is not None:
      return lift.siblings
  return ()
