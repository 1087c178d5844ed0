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
variable) in some collections *are* the variables of a source path. The target
has no storage of its own. This module implements ties inside Flax's own
machinery, so that they survive lifting:

* **Storage.** A ``Scope`` keeps, per collection, a reference to its sub-dict of
  the root variable dict (see ``Scope._mutable_collection``). A tied target
  scope simply holds a reference to the *source's* sub-dict instead, so reads,
  writes (in program order) and gradients go to the one stored variable.
  Variable-level ties redirect ``get_variable`` / ``has_variable`` /
  ``put_variable`` for one name the same way.
* **Declaration.** ``lift.tie`` records the ties in the scope ``flags``, which
  Flax already hands to every child scope (``Scope.push``) and to every inner
  scope a lifted transform creates (``lift._partial_pack``). The ties are
  therefore known wherever the target is used, however deeply it is lifted.
* **Lifting.** Lifted transforms create inner scopes with ``parent=None``. When
  a transform lifts a subtree that contains a tied target whose source lies
  outside it, ``lift._partial_pack`` lifts the source scope with it (exactly as
  Flax lifts a Module passed in as an attribute), and the inner target resolves
  to the inner source: reads, writes and gradients reach the stored variable.
  Transforms that map over an axis (``vmap``, ``scan``) or differentiate with
  respect to the lifted variables (``vjp``, ``jvp``, ``custom_vjp``) instead see
  a source outside them as a broadcast, read-only value (a closure), and so
  does a tie declared *inside* a lifted region whose source lies outside it.
  A write that could not land in the stored variable raises :class:`TieError`.

Paths are tuples of names from the root module. Users write them as
``/``-separated strings, see :func:`flax_tieext.lift.tie`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import threading
from typing import Any
from collections.abc import Callable, Mapping, Sequence

import jax

from flax.core import meta
from flax.core.frozen_dict import FrozenDict

def _hashable(collections):
  """Flax's own hashable form of a collection filter (``DenyList`` too)."""
  from flax.core import lift  # pylint: disable=g-import-not-at-top
  return lift._hashable_filter(collections)  # pylint: disable=protected-access


def _scope_lib():
  # flax.core.scope decorates Scope's methods with the hooks below, so this
  # module must not import it at module level.
  from flax.core import scope  # pylint: disable=g-import-not-at-top
  return scope


# The scope flag under which the ties in force are recorded.
TIES_FLAG = '__ties__'

Path = tuple[str, ...]


class TieError(ValueError):
  """A tie that cannot be declared, resolved, or written through.

  Every ``TieError`` names the tie (target and source path), the collection
  and the scope where the tie was declared, says what was found nearby and how
  to fix it.
  """


@dataclasses.dataclass(frozen=True)
class Tie:
  """One resolved tie, as recorded in scope flags.

  Attributes:
    target: absolute path of the tied target (a module, or a variable).
    source: absolute path of the stored variable(s) it shares.
    collections: the collection filter the tie applies to (hashable).
    view: ``None``, or a function deriving the target's read-only value from
      the source's.
    declared_at: absolute path of the scope that declared the tie.
  """

  target: Path
  source: Path
  collections: Any
  view: Callable[[Any], Any] | None
  declared_at: Path

  def applies_to(self, col: str) -> bool:
    return _scope_lib().in_filter(self.collections, col)

  def describe(self, col: str | None = None) -> str:
    arrow = ' (viewed)' if self.view is not None else ''
    where = f' in collection {col!r}' if col is not None else (
        f' for collections {_filter_text(self.collections)}')
    return (f'tie {_text(self.target)} -> {_text(self.source)}{arrow}{where},'
            f' declared at {_text(self.declared_at)}')


def _text(path: Sequence[str]) -> str:
  return '/' + '/'.join(path)


def _filter_text(f) -> str:
  if f is True:
    return 'all'
  if isinstance(f, str):
    return repr(f)
  if isinstance(f, (tuple, list, set, frozenset)):
    return '[' + ', '.join(repr(x) for x in f) + ']'
  return repr(f)


# ---------------------------------------------------------------------------
# Declaring ties
# ---------------------------------------------------------------------------


def _parse_path(path: str, base: Path, what: str, decl: Path) -> Path:
  if not isinstance(path, str):
    raise TieError(
        f'The {what} path of a tie declared at {_text(decl)} must be a str, got'
        f' {type(path).__name__} {path!r}. Write paths as "/"-separated module'
        ' names, e.g. "block_1/attn", "head/kernel", "." or "/encoder/embed".'
    )
  if path in ('.', ''):
    return tuple(base)
  if path.startswith('/'):
    parts, start = path[1:].split('/'), ()
  else:
    parts, start = path.split('/'), tuple(base)
  out = list(start)
  for part in parts:
    if part in ('', '.'):
      continue
    if part == '..':
      if not out:
        raise TieError(f'The {what} path {path!r} of a tie declared at'
                       f' {_text(decl)} goes above the root module.')
      out.pop()
      continue
    out.append(part)
  return tuple(out)


def _is_within(path: Path, prefix: Path) -> bool:
  return path[: len(prefix)] == prefix


def normalize(
    ties: Mapping[str, Any],
    collections,
    declared_at: Path,
) -> tuple[Tie, ...]:
  """Resolves user-written ties declared at ``declared_at`` to :class:`Tie`s.

  Chains (``a -> b``, ``b -> c``) resolve to their end (``a -> c``); self-ties,
  cycles and ties between a module and its own ancestor are refused.
  """
  if not isinstance(ties, Mapping):
    raise TieError(
        f'ties must be a mapping from target path to source path (or to'
        f' (source path, view_fn)), got {type(ties).__name__}.'
    )
  raw: dict[Path, tuple[Path, Any, str, str]] = {}
  for target_text, spec in ties.items():
    view = None
    if isinstance(spec, tuple):
      if len(spec) != 2 or not callable(spec[1]):
        raise TieError(
            f'The source of tie {target_text!r} (declared at'
            f' {_text(declared_at)}) must be a path, or a (path, view_fn)'
            f' pair, got {spec!r}.'
        )
      spec, view = spec
    target = _parse_path(target_text, declared_at, 'target', declared_at)
    source = _parse_path(spec, declared_at, 'source', declared_at)
    if target == source:
      raise TieError(
          f'Tie {target_text!r} -> {spec!r} declared at {_text(declared_at)}'
          f' ties {_text(target)} to itself. A tie needs two distinct paths:'
          ' remove it, or name the module whose variables should be shared.'
      )
    if target in raw:
      raise TieError(f'Target {_text(target)} is tied twice at'
                     f' {_text(declared_at)}.')
    raw[target] = (source, view, target_text, spec)

  resolved = []
  for target, (source, view, target_text, source_text) in raw.items():
    seen = [target]
    while source in raw:
      if source in seen:
        cycle = ' -> '.join(_text(p) for p in seen + [source])
        raise TieError(
            f'The ties declared at {_text(declared_at)} form a cycle: {cycle}.'
            ' Every chain of ties must end at a path that is stored: pick one'
            ' of them as the source and tie the others to it.'
        )
      seen.append(source)
      next_source, next_view, _, _ = raw[source]
      if next_view is not None:
        view = next_view if view is None else _compose(view, next_view)
      source = next_source
    for a, b in ((target, source), (source, target)):
      if _is_within(a, b):
        raise TieError(
            f'Tie {target_text!r} -> {source_text!r} declared at'
            f' {_text(declared_at)}: {_text(a)} lies inside {_text(b)}. A'
            ' module cannot share the variables of its own ancestor or'
            ' descendant; tie two sibling paths instead.'
        )
    resolved.append(Tie(target, source, _hashable(collections), view,
                        tuple(declared_at)))
  return tuple(resolved)


def _compose(outer, inner):
  return lambda x: outer(inner(x))


def ties_in_force(scope) -> tuple[Tie, ...]:
  flags = scope.flags
  return flags[TIES_FLAG] if TIES_FLAG in flags else ()


def declare(scope, ties: tuple[Tie, ...]):
  """Returns a scope like ``scope`` in which ``ties`` are in force.

  The new scope shares ``scope``'s storage, parent, rngs and rng counters (like
  ``Scope.rewound``), and carries the ties in its flags so every child scope and
  every inner scope of a lifted transform sees them.
  """
  scope._check_valid()  # pylint: disable=protected-access
  _refuse_given_targets(scope, ties)
  _check_collections_present(scope, ties)
  outer = ties_in_force(scope)
  targets = {t.target for t in ties}
  kept = tuple(t for t in outer if t.target not in targets)
  flags = dict(scope.flags)
  flags[TIES_FLAG] = kept + ties
  # The new scope shares the storage references of ``scope`` (new collections
  # must land where ``scope``'s would). When ``scope`` is itself a target
  # (``"."``), it forgets its own (empty) references to the tied collections,
  # so that they resolve to the source.
  variables = scope._variables  # pylint: disable=protected-access
  for col in list(variables):
    if any(t.target == scope.path and t.applies_to(col) for t in ties):
      del variables[col]
  new_scope = type(scope)(
      variables,
      rngs=None,
      name=scope.name,
      mutable=scope.mutable,
      parent=scope.parent,
      path=scope.path,
      debug_path=scope.debug_path,
      flags=flags,
  )
  new_scope.rngs = scope.rngs
  new_scope.rng_counters = scope.rng_counters
  for attr in _LINK_ATTRS:
    if hasattr(scope, attr):
      setattr(new_scope, attr, getattr(scope, attr))
  _redirect_rngs(new_scope)
  return new_scope


def _root_collections(scope) -> list[str]:
  return list(scope.root._variables.keys())  # pylint: disable=protected-access


def _refuse_given_targets(scope, ties):
  """Values supplied for a tied target would be silently ignored: refuse."""
  for tie in ties:
    for col in _root_collections(scope):
      if not tie.applies_to(col):
        continue
      node = _peek(scope, tie.target, col, follow_ties=False)
      if node is _ABSENT or (isinstance(node, Mapping) and not node):
        continue
      raise TieError(
          f'Values were given for {_text(tie.target)} in collection {col!r},'
          f' but it is the target of the {tie.describe()}: only the source'
          f' {_text(tie.source)} is stored, and the given values would be'
          ' ignored. Convert variables saved from an untied model with'
          ' flax_tieext.tie_variables(variables, ties), which checks that each'
          ' target equals its source and removes it.'
      )


def _check_collections_present(scope, ties):
  """A tie of a named collection the model does not have is a mistake."""
  if _is_inner_root(scope.root):
    return
  present = _root_collections(scope)
  for tie in ties:
    names = _named_collections(tie.collections)
    for col in names:
      if col in present or _scope_lib().in_filter(scope.mutable, col):
        continue
      nearest = difflib.get_close_matches(col, present, n=3)
      hint = f' Did you mean {", ".join(map(repr, nearest))}?' if nearest else ''
      raise TieError(
          f'The {tie.describe()} ties collection {col!r}, but the variables'
          f' have no collection {col!r} and it is not mutable (collections'
          f' present: {", ".join(map(repr, present)) or "none"}).{hint} Pass'
          f' it to apply (e.g. variables={{..., {col!r}: ...}}), make it'
          f' mutable, or tie another collection.'
      )


def _named_collections(f) -> tuple[str, ...]:
  if isinstance(f, str):
    return (f,)
  if isinstance(f, tuple) and all(isinstance(x, str) for x in f):
    return f
  return ()


# ---------------------------------------------------------------------------
# Finding the storage of a path
# ---------------------------------------------------------------------------

# Attributes set by ``lift._partial_pack`` on the inner root scopes it creates:
#   _tie_outer: the outer scope the inner root stands in for.
#   _tie_siblings: all inner roots created by the same pack (tie sources too).
#   _tie_transform: the name of the lifted transform (``pack(name=...)``).
_LINK_ATTRS = ('_tie_outer', '_tie_siblings', '_tie_transform')

# Transforms whose lifted variables are plain inputs and outputs (no mapped
# axis, not differentiated): a tie source outside them is lifted with them.
LIFTS_TIE_SOURCES = frozenset(
    {'remat', 'checkpoint', 'jit', 'map_variables', 'cond', 'switch',
     'while_loop'})
# Transforms inside which a closed-over value would be stale on a later call.
_NO_CLOSURE = frozenset({'jit'})

_ABSENT = object()


def _is_inner_root(scope) -> bool:
  return getattr(scope, '_tie_outer', None) is not None


def _locate(scope, path: Path):
  """Finds a scope from which ``path`` can be reached by dict lookups.

  Returns ``(base, rest, crossed)``: ``base`` is a scope whose path is a prefix
  of ``path``, ``rest`` the remaining names, and ``crossed`` the names of the
  lifted transforms whose boundary had to be crossed by closure (empty when
  the path is reachable inside the current transform).
  """
  crossed = []
  cur = scope
  while cur is not None:
    s = cur
    while s is not None:
      if _is_within(path, s.path):
        return s, path[len(s.path):], tuple(crossed)
      s = s.parent
    root = cur.root
    for sibling in getattr(root, '_tie_siblings', ()):
      if sibling is not root and _is_within(path, sibling.path):
        return sibling, path[len(sibling.path):], tuple(crossed)
    outer = getattr(root, '_tie_outer', None)
    if outer is not None:
      crossed.append(getattr(root, '_tie_transform', None) or 'a transform')
    cur = outer
  return None, path, tuple(crossed)


def _canonical(scope, path: Path, col: str):
  """Where ``path`` is stored in ``col``, following every tie on the way.

  While some tie in force maps a prefix of ``path`` to another path, follows
  the one with the longest target (the innermost declaration), so that
  chains resolve across declarations (an outer tie ``inner/src -> src`` and
  an inner one ``leaf -> src`` declared at ``inner`` store one ``/src``) and
  through nested ones (``b -> a`` at the root and ``b/b -> b/a`` at ``b``
  store ``b/b/x`` at ``a/a/x``). The ties consulted are those in force at
  ``scope`` and, once located, at the scope found above ``path``.

  Returns:
    ``(base, rest, crossed)`` as ``_locate`` does, for the stored path.
  """
  seen, crossed = [path], ()

  def follow(ties, path, below=()):
    candidates = [t for t in ties
                  if t.view is None and t.applies_to(col)
                  and _is_within(path, t.target) and len(t.target) > len(below)]
    if not candidates:
      return None
    tie = max(candidates, key=lambda t: len(t.target))
    new_path = tie.source + path[len(tie.target):]
    if new_path in seen:
      raise TieError(
          'Ties declared at different modules form a cycle: '
          + ' -> '.join(_text(p) for p in seen + [new_path])
          + f' (collection {col!r}). Declare them at one module, where a'
          ' cycle is reported with its ties, and pick one stored source.'
      )
    seen.append(new_path)
    return new_path

  while True:
    jumped = follow(ties_in_force(scope), path)
    if jumped is not None:
      path = jumped
      continue
    base, rest, more = _locate(scope, path)
    crossed += more
    if base is None:
      return base, rest, crossed
    jumped = follow(ties_in_force(base), path, below=base.path)
    if jumped is None:
      return base, rest, crossed
    scope, path = base, jumped


def _canonical_path(scope, path: Path, col: str) -> Path:
  base, rest, _ = _canonical(scope, path, col)
  return path if base is None else base.path + rest


def _peek(scope, path: Path, col: str, follow_ties: bool = True):
  """The stored node at ``path`` in ``col`` (read-only), or ``_ABSENT``.

  With ``follow_ties=False``, looks at ``path`` itself in the variable tree
  (what a user passed), not where a tie stores it.
  """
  if follow_ties:
    base, rest, _ = _canonical(scope, path, col)
  else:
    base, rest, _ = _locate(scope, path)
  if base is None:
    return _ABSENT
  node = base._collection(col)  # pylint: disable=protected-access
  for name in rest:
    if not isinstance(node, Mapping) or name not in node:
      return _ABSENT
    node = node[name]
  return node


def _storage(scope, tie: Tie, path: Path, col: str, write: bool):
  """The stored collection dict at ``path`` (a module path) for ``tie``.

  Returns ``(node, crossed)``: the dict (``None`` when reading one that does
  not exist yet) and the transforms crossed by closure to reach it.
  """
  base, rest, crossed = _canonical(scope, path, col)
  if base is None:
    raise TieError(
        f'Cannot reach {_text(path)} from {scope.path_text} for the'
        f' {tie.describe(col)}. Declare the tie at a module that contains'
        ' both paths.'
    )
  if crossed:
    unsafe = [t for t in crossed if t in _NO_CLOSURE]
    if unsafe:
      raise TieError(
          f'The {tie.describe(col)} is used inside nn.{unsafe[0]} at'
          f' {scope.path_text}, but its source {_text(tie.source)} lies'
          f' outside that {unsafe[0]} and was not lifted into it (the tie is'
          f' declared inside the {unsafe[0]}). A compiled function would keep'
          ' a stale copy of the source. Declare the tie at a module that'
          f' contains both paths, outside the {unsafe[0]}.'
      )
    if write:
      raise TieError(
          f'A write to {_text(tie.target)} in collection {col!r} cannot land'
          f' in its source {_text(tie.source)}: the {tie.describe(col)} is'
          f' used inside {" and ".join(crossed)} at {scope.path_text}, and the'
          ' source lies outside it, where it is visible only as a read-only'
          ' (broadcast) value. Declare the tie at the common ancestor of both'
          ' paths, outside the transform, or initialize and update the'
          ' source outside the transform.'
      )
  if write:
    node = base._mutable_collection(col)  # pylint: disable=protected-access
    for i, name in enumerate(rest):
      if name not in node:
        _record_created(base.path + rest[: i + 1])
      node = node.setdefault(name, {})
    return node, crossed
  node = base._collection(col)  # pylint: disable=protected-access
  if col not in base._variables:  # pylint: disable=protected-access
    return None, crossed  # Flax's empty placeholder: nothing is stored yet
  for name in rest:
    if not isinstance(node, Mapping) or name not in node:
      return None, crossed
    node = node[name]
  return node, crossed


def _module_tie(scope, col: str) -> Tie | None:
  for tie in ties_in_force(scope):
    if tie.target == scope.path and tie.applies_to(col):
      return tie
  return None


def _variable_tie(scope, col: str, name: str) -> Tie | None:
  ties = ties_in_force(scope)
  if not ties:
    return None
  path = scope.path + (name,)
  for tie in ties:
    if tie.target == path and tie.applies_to(col):
      return tie
  return None


def _check_source_exists(scope, tie: Tie):
  """Raises unless the source is stored in at least one tied collection."""
  cols = [c for c in _root_collections(scope) if tie.applies_to(c)]
  if any(_peek(scope, tie.source, c) is not _ABSENT for c in cols):
    return
  _raise_missing_source(scope, tie, cols[0] if len(cols) == 1 else None)


def _raise_missing_source(scope, tie: Tie, col: str | None):
  """Raises a TieError naming the deepest stored prefix of the source."""
  cols = [col] if col else [
      c for c in _root_collections(scope) if tie.applies_to(c)]
  parent, names = (), set()
  base, rest, _ = _locate(scope, tie.source)
  for c in cols if base is not None else ():
    node, prefix = base._collection(c), base.path  # pylint: disable=protected-access
    for name in rest:
      if not isinstance(node, Mapping) or name not in node:
        break
      node, prefix = node[name], prefix + (name,)
    if not isinstance(node, Mapping):
      continue
    if len(prefix) > len(parent) or not names:
      parent, names = prefix, set(node)
    elif prefix == parent:
      names |= set(node)
  missing = tie.source[min(len(parent), len(tie.source) - 1)]
  nearest = difflib.get_close_matches(missing, sorted(names), n=3, cutoff=0.5)
  near = (f' Nearest existing names under {_text(parent)}: '
          f'{", ".join(nearest)}.' if nearest else
          f' Names under {_text(parent)}: {", ".join(sorted(names)) or "none"}.')
  where = f'collection {col!r}' if col else 'any tied collection'
  raise TieError(
      f'The source {_text(tie.source)} of the {tie.describe(col)} is not'
      f' stored in {where} (looked up from {scope.path_text}).{near} Fix the'
      ' source path, or pass the source\'s variables to apply.'
  )


def _read_only_view(tie: Tie, col: str, scope):
  raise TieError(
      f'Cannot write to {_text(tie.target)} in collection {col!r} at'
      f' {scope.path_text}: the {tie.describe(col)} gives a derived,'
      ' read-only view of the source. Write to the source'
      f' {_text(tie.source)} instead, or tie without a view_fn.'
  )


def own_variables(scope) -> Mapping[str, Any]:
  """``scope``'s variables without the collections it borrows through a tie."""
  variables = scope._variables  # pylint: disable=protected-access
  if not ties_in_force(scope):
    return variables
  tied = [col for col in variables if _module_tie(scope, col) is not None]
  if not tied:
    return variables
  return {k: v for k, v in variables.items() if k not in tied}


# ---------------------------------------------------------------------------
# Scope hooks (installed on flax.core.scope.Scope by the patch)
# ---------------------------------------------------------------------------


def _hook(original):
  def decorate(fn):
    fn.__wrapped__ = original
    fn.__name__ = original.__name__
    fn.__qualname__ = original.__qualname__
    fn.__doc__ = original.__doc__
    fn.__flax_tieext_hook__ = True
    return fn
  return decorate


def tie_aware_collection(original):
  """``Scope._collection`` that resolves a tied target to its source."""

  @_hook(original)
  def _collection(self, col):
    if col not in self._variables and TIES_FLAG in self.flags:  # pylint: disable=protected-access
      tie = _module_tie(self, col)
      if tie is not None:
        _record(self, tie)
        node, crossed = _storage(self, tie, tie.source, col, write=False)
        if node is None:
          if not self.is_mutable_collection(col):
            _check_source_exists(self, tie)
          return FrozenDict()
        if tie.view is not None:
          return jax.tree_util.tree_map(tie.view, node)
        if not crossed:
          self._variables[col] = node  # pylint: disable=protected-access
        return node
    if (col not in self._variables and self.parent is None  # pylint: disable=protected-access
        and _is_inner_root(self) and _borrows(self._tie_outer, col)):  # pylint: disable=protected-access
      # An inner root below a target whose source is a read-only closure
      # (see _storage) reads the tied collection through its outer scope.
      return self._tie_outer._collection(col)  # pylint: disable=protected-access
    return original(self, col)

  return _collection


def tie_aware_mutable_collection(original):
  """``Scope._mutable_collection`` that writes a tied target to its source."""

  @_hook(original)
  def _mutable_collection(self, col):
    if col not in self._variables and TIES_FLAG in self.flags:  # pylint: disable=protected-access
      tie = _module_tie(self, col)
      if tie is not None:
        if tie.view is not None:
          _read_only_view(tie, col, self)
        _record(self, tie)
        node, _ = _storage(self, tie, tie.source, col, write=True)
        self._variables[col] = node  # pylint: disable=protected-access
        return node
    return original(self, col)

  return _mutable_collection


def tie_aware_get_variable(original):
  """``Scope.get_variable`` that reads a tied variable from its source."""

  @_hook(original)
  def get_variable(self, col, name, default=None):
    tie = _variable_tie(self, col, name)
    if tie is None:
      _record_source_use(self, col, name)
      return original(self, col, name, default)
    _record(self, tie)
    parent, _ = _storage(self, tie, tie.source[:-1], col, write=False)
    if parent is None or tie.source[-1] not in parent:
      return default
    value = parent[tie.source[-1]]
    return _apply_view(tie.view, value)

  return get_variable


def tie_aware_has_variable(original):
  """``Scope.has_variable`` that looks a tied variable up at its source."""

  @_hook(original)
  def has_variable(self, col, name):
    tie = _variable_tie(self, col, name)
    if tie is None:
      _record_source_use(self, col, name)
      return original(self, col, name)
    _record(self, tie)
    parent, _ = _storage(self, tie, tie.source[:-1], col, write=False)
    found = parent is not None and tie.source[-1] in parent
    if not found and not self.is_mutable_collection(col):
      _raise_missing_source(self, tie, col)
    return found

  return has_variable


def tie_aware_put_variable(original):
  """``Scope.put_variable`` that writes a tied variable to its source."""

  @_hook(original)
  def put_variable(self, col, name, value):
    tie = _variable_tie(self, col, name)
    if tie is None:
      return original(self, col, name, value)
    self._check_valid()  # pylint: disable=protected-access
    self._validate_trace_level()  # pylint: disable=protected-access
    if tie.view is not None:
      _read_only_view(tie, col, self)
    if not self.is_mutable_collection(col):
      return original(self, col, name, value)  # raises Flax's own error
    _record(self, tie)
    parent, _ = _storage(self, tie, tie.source[:-1], col, write=True)
    _check_like(tie, col, parent.get(tie.source[-1], _ABSENT), value)
    parent[tie.source[-1]] = value
    return None

  return put_variable


def tie_aware_push(original):
  """``Scope.push`` whose children of a params tie draw the source's rngs."""

  @_hook(original)
  def push(self, name=None, prefix='', reuse=False):
    child = original(self, name, prefix, reuse)
    if TIES_FLAG in child.flags:
      _redirect_rngs(child)
      _record_push(child)
    return child

  return push


def _apply_view(view, value):
  if view is None:
    return value
  if isinstance(value, meta.AxisMetadata):
    return value.replace_boxed(view(value.unbox()))
  return view(value)


def _check_like(tie: Tie, col: str, existing, value):
  if existing is _ABSENT:
    return
  a, b = jax.tree_util.tree_leaves(existing), jax.tree_util.tree_leaves(value)
  sa = [(getattr(x, 'shape', ()), getattr(x, 'dtype', type(x))) for x in a]
  sb = [(getattr(x, 'shape', ()), getattr(x, 'dtype', type(x))) for x in b]
  if sa != sb:
    raise TieError(
        f'Shape or dtype mismatch in the {tie.describe(col)}: the source'
        f' {_text(tie.source)} has {_shapes(sa)}, but {_text(tie.target)}'
        f' would store {_shapes(sb)}. Tied paths must hold variables of the'
        ' same shape and dtype; use a view_fn (e.g. jnp.transpose) for a'
        ' derived shape.'
    )


def _shapes(specs) -> str:
  return ', '.join(f'{tuple(s)}:{getattr(d, "name", d)}' for s, d in specs)


def _redirect_rngs(scope):
  """A module-level tie of ``params`` makes the target draw the source's rngs.

  A tie behaves as one module called at two places: whichever place runs first
  initializes the shared parameters from the *source's* rng streams, so the
  result does not depend on the order of the two calls.
  """
  tie = _module_tie(scope, 'params')
  if tie is None or tie.view is not None:
    return
  base, rest, crossed = _canonical(scope, tie.source, 'params')
  if base is None:
    return
  rngs, counters = base.rngs, base.rng_counters
  for name in rest:
    rngs = {k: _lazy_rng_child(v, name) for k, v in rngs.items()}
    counters = counters.setdefault(_child_rng_key(name),
                                   {k: 0 for k in rngs})
  scope.rngs = rngs
  scope.rng_counters = counters
  del crossed


def _lazy_rng_child(rng, name):
  return _scope_lib().LazyRng.create(rng, name)


def _child_rng_key(name):
  return (_scope_lib().child_rng_token, name)


# ---------------------------------------------------------------------------
# Lifting (called by lift._partial_pack)
# ---------------------------------------------------------------------------


def lifted_sources(scopes, transform_name) -> list:
  """The scopes of tie sources that must be lifted along with ``scopes``.

  A tied target inside one of ``scopes`` whose source lies outside all of them
  needs the source's variables inside the transform. For transforms in
  ``LIFTS_TIE_SOURCES`` the source scope is lifted with the others (as Flax
  lifts a Module passed in as an attribute); other transforms see the source as
  a read-only closure.
  """
  if transform_name not in LIFTS_TIE_SOURCES:
    return []
  extra, paths = [], set()
  for scope in scopes:
    for tie in ties_in_force(scope):
      if not _is_within(tie.target, scope.path):
        continue
      tie = _resolved_tie(scope, tie)
      if any(_is_within(tie.source, s.path) for s in scopes):
        continue
      path = _source_scope_path(scope, tie)
      if path in paths or any(_is_within(path, s.path) for s in scopes):
        continue
      source_scope = _scope_at(scope, path)
      if source_scope is None:
        continue
      paths.add(path)
      extra.append(source_scope)
  return extra


def _resolved_tie(scope, tie: Tie) -> Tie:
  """``tie`` with its source resolved through other declarations' ties."""
  cols = [c for c in _root_collections(scope) if tie.applies_to(c)]
  col = 'params' if tie.applies_to('params') else (cols[0] if cols else None)
  if col is None:
    return tie
  source = _canonical_path(scope, tie.source, col)
  return tie if source == tie.source else dataclasses.replace(tie, source=source)


def _source_scope_path(scope, tie: Tie) -> Path:
  """The module path holding ``tie``'s source: itself, or a variable's parent.

  Decided by what is stored at the source (a dict is a module, a leaf a
  variable); before anything is stored there, by which scope is reachable.
  """
  base, _, _ = _locate(scope, tie.source)
  cols = set(_root_collections(scope))
  if base is not None:
    cols |= set(_root_collections(base))
  for col in sorted(cols):
    if not tie.applies_to(col):
      continue
    node = _peek(scope, tie.source, col)
    if isinstance(node, Mapping):
      return tie.source
    if node is not _ABSENT:
      return tie.source[:-1]
  parent = tie.source[:-1]
  if base is not None and base.path == tie.source:
    return tie.source  # a lifted scope stands exactly at the source
  if _locate(scope, parent)[0] is None:
    return tie.source
  if _is_within(tie.target, parent) and len(tie.target) > len(parent) + 1:
    return tie.source
  if _is_within(scope.path, parent):
    return tie.source
  return parent


def _scope_at(scope, path: Path):
  """An outer scope at ``path``, without reserving any name.

  Built like ``Scope.push`` from the nearest scope above ``path`` in the
  current transform (through a ``rewound`` copy, so no name is reserved on the
  real parent): it shares the storage and the rng counters of the scope the
  source module gets.
  """
  base, rest, crossed = _locate(scope, path)
  if base is None or crossed:
    return None
  cur = base
  for name in rest:
    cur = cur.rewound().push(name, reuse=True)
  return cur


def link_inner_scopes(outer_scopes, inner_scopes, transform_name):
  """Records on each inner root what it stands in for (see ``_LINK_ATTRS``).

  An inner root that is itself a tied target borrows its tied collections from
  the inner source right away, so that Flax's ``_populate_collections`` (which
  enumerates the root's collections) sees them when a further transform lifts
  one of its descendants.
  """
  siblings = tuple(inner_scopes)
  for outer, inner in zip(outer_scopes, inner_scopes):
    inner._tie_outer = outer  # pylint: disable=protected-access
    inner._tie_siblings = siblings  # pylint: disable=protected-access
    inner._tie_transform = transform_name  # pylint: disable=protected-access
  for inner in inner_scopes:
    if TIES_FLAG not in inner.flags:
      continue
    _redirect_rngs(inner)
    for col in {c for s in siblings for c in s._variables}:  # pylint: disable=protected-access
      if _module_tie(inner, col) is not None:
        inner._collection(col)  # pylint: disable=protected-access


def _borrows(scope, col: str) -> bool:
  """Whether ``scope`` lies at or below a target that borrows ``col``."""
  while scope is not None:
    s = scope
    while s is not None:
      if TIES_FLAG in s.flags and _module_tie(s, col) is not None:
        return True
      s = s.parent
    scope = getattr(scope.root, '_tie_outer', None)
  return False


def inner_scopes_of(inner_scope_tree_leaves) -> tuple:
  """All inner roots of the pack that created ``inner_scope_tree_leaves``."""
  for leaf in inner_scope_tree_leaves:
    siblings = getattr(leaf.root, '_tie_siblings', None)
    if siblings is not None:
      return siblings
  return ()


# ---------------------------------------------------------------------------
# Checks at the end of an initializing call
# ---------------------------------------------------------------------------


class _Tracker(threading.local):

  def __init__(self):
    self.stack: list[dict] = []


_tracker = _Tracker()


def _record(scope, tie: Tie):
  for frame in _tracker.stack:
    if tie in frame['ties']:
      frame['used'].add(tie)


def _record_created(path):
  for frame in _tracker.stack:
    frame['created'].add(path)


def _record_push(scope):
  for frame in _tracker.stack:
    frame['pushed'].add(scope.path)


def _record_source_use(scope, col, name):
  if _tracker.stack:
    path = scope.path + (name,)
    for frame in _tracker.stack:
      frame['variables'].add(path)


@contextlib.contextmanager
def checking(scope, ties: tuple[Tie, ...]):
  """Checks, at the end of an initializing call, that every tie resolved.

  Only ``init`` records what is created (outside it, nothing is tracked and
  the hooks stay as cheap as a flag lookup).
  """
  try:
    if not scope.flags.get('initializing', False):
      yield
      return
    frame = {'ties': set(ties), 'used': set(), 'pushed': set(),
             'variables': set(), 'created': set()}
    _tracker.stack.append(frame)
    try:
      yield
    finally:
      _tracker.stack.remove(frame)
    _check_resolved(scope, ties, frame)
  except Exception as e:  # pylint: disable=broad-except
    _reraise_shape_error(e, ties)
    raise


def _reraise_shape_error(e, ties):
  from flax import errors  # pylint: disable=g-import-not-at-top
  if not isinstance(e, errors.ScopeParamShapeError):
    return
  message = str(e)
  for tie in ties:
    if f'"{_text(tie.target)}' in message or f'in "{_text(tie.target)}/' in message:
      raise TieError(
          f'Shape mismatch in the {tie.describe("params")}: {message} The'
          f' stored parameter is the one of the source {_text(tie.source)};'
          f' {_text(tie.target)} expects another shape. Tie paths holding'
          ' variables of the same shape, or use a view_fn.'
      ) from e


def _check_resolved(scope, ties, frame):
  """Raises for a tie whose target or source was never created.

  A path is judged only below the deepest ancestor whose body ran while this
  call was traced: a transform such as ``nn.jit`` may reuse an earlier trace
  for an identical module, and its children are then not seen again.
  """
  known = frame['pushed'] | frame['variables'] | {scope.path}
  ran = {p[:i] for p in known for i in range(len(p))}
  for tie in ties:
    checks = [('source', tie.source)]
    if tie not in frame['used']:
      checks.insert(0, ('target', tie.target))
    elif not any(_is_within(p, tie.source) for p in frame['created']):
      continue  # the source was stored before the tie was used
    for role, path in checks:
      if path in known:
        continue
      depth = max(i for i in range(len(path)) if path[:i] in known)
      parent = path[:depth]
      if parent not in ran:
        continue  # the body of ``parent`` did not run in this trace
      names = sorted({p[depth] for p in known
                      if _is_within(p, parent) and len(p) > depth})
      nearest = difflib.get_close_matches(path[depth], names, n=3, cutoff=0.5)
      near = (f' Nearest existing names under {_text(parent)}:'
              f' {", ".join(nearest)}.' if nearest else
              f' Names that exist under {_text(parent)}:'
              f' {", ".join(names) or "none"}.')
      raise TieError(
          f'The {role} {_text(path)} of the {tie.describe()} does not exist:'
          f' no module or variable {_text(path[:depth + 1])} was created'
          f' while initializing.{near} Fix the path (paths are relative to'
          ' the module that declares the tie; a leading "/" starts at the'
          ' root module).'
      )


def machinery_installed() -> bool:
  return bool(getattr(_scope_lib().Scope.push, '__flax_tieext_hook__', False))


# ---------------------------------------------------------------------------
# Converting variable trees
# ---------------------------------------------------------------------------


def _flat_ties(ties, collections):
  return normalize(ties, collections, ())


def _get_path(tree, path):
  node = tree
  for name in path:
    if not isinstance(node, Mapping) or name not in node:
      return _ABSENT
    node = node[name]
  return node


def _unfreeze(tree):
  if isinstance(tree, Mapping):
    return {k: _unfreeze(v) for k, v in tree.items()}
  return tree


def _with_path(tree, path, value):
  tree = dict(tree)
  if len(path) == 1:
    if value is _ABSENT:
      tree.pop(path[0], None)
    else:
      tree[path[0]] = value
    return tree
  child = tree.get(path[0], {})
  tree[path[0]] = _with_path(child, path[1:], value)
  if value is _ABSENT and not tree[path[0]]:
    del tree[path[0]]
  return tree


def tie_variables(variables, ties: Mapping[str, Any], collections='params'):
  """Turns an untied variable tree into the layout a tied model stores.

  Each target is removed after checking that it equals its source (through
  the view, for a viewed tie). Paths are relative to the root module.

  Example::

    >>> import jax.numpy as jnp
    >>> import flax_tieext
    >>> untied = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.ones(2)}}}
    >>> flax_tieext.tie_variables(untied, {'b': 'a'})
    {'params': {'a': {'w': Array([1., 1.], dtype=float32)}}}

  Args:
    variables: a variable dict, e.g. restored from a checkpoint of the untied
      model.
    ties: the ties, as given to ``nn.tie`` on the root module.
    collections: the tied collections (a collection filter).

  Returns:
    A new variable dict without the targets.

  Raises:
    TieError: if a source is missing or a target differs from its source.
  """
  out = _unfreeze(variables)
  for tie, col, expected in _viewed_sources(out, ties, collections, 'tie'):
    target = _get_path(out[col], tie.target)
    if target is not _ABSENT:
      _check_equal(tie, col, target, expected)
      out[col] = _with_path(out[col], tie.target, _ABSENT)
  return out


def _check_equal(tie: Tie, col: str, target, expected):
  """Raises unless a stored target equals what its source gives it."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  what = (f'Cannot tie {_text(tie.target)} to {_text(tie.source)} in'
          f' collection {col!r}:')
  (xs, x_def), (ys, y_def) = (jax.tree_util.tree_flatten(target),
                              jax.tree_util.tree_flatten(expected))
  if x_def != y_def:
    raise TieError(f'{what} they hold different variables ({x_def} vs'
                   f' {y_def}).')
  for x, y in zip(map(np.asarray, xs), map(np.asarray, ys)):
    if x.shape != y.shape or x.dtype != y.dtype:
      raise TieError(f'{what} shape or dtype differ ({x.shape}:{x.dtype} vs'
                     f' {y.shape}:{y.dtype}).')
    if not np.array_equal(x, y):
      raise TieError(
          f'{what} the target differs from its source (max abs difference'
          f' {float(np.max(np.abs(x - y)))}). Tying would silently drop the'
          " target's values; untie the model or make them equal first."
      )


def untie_variables(variables, ties: Mapping[str, Any], collections='params'):
  """Materialises each tied target as a copy of its source.

  The inverse of :func:`tie_variables`: the result loads into the untied model.

  Example::

    >>> import jax.numpy as jnp
    >>> import flax_tieext
    >>> tied = {'params': {'a': {'w': jnp.ones(2)}}}
    >>> flax_tieext.untie_variables(tied, {'b': 'a'})['params']['b']
    {'w': Array([1., 1.], dtype=float32)}

  Args:
    variables: a variable dict of the tied model.
    ties: the ties, as given to ``nn.tie`` on the root module.
    collections: the tied collections (a collection filter).

  Returns:
    A new variable dict with every target present.
  """
  out = _unfreeze(variables)
  for tie, col, value in _viewed_sources(out, ties, collections, 'untie'):
    out[col] = _with_path(out[col], tie.target, value)
  return out


def _viewed_sources(tree, ties, collections, verb):
  """Yields ``(tie, col, source value seen through the view)`` of each tie."""
  for tie in _flat_ties(ties, collections):
    for col in [c for c in tree if tie.applies_to(c)]:
      source = _get_path(tree[col], tie.source)
      if source is _ABSENT:
        raise TieError(
            f'Cannot {verb} {_text(tie.target)} and {_text(tie.source)} in'
            f' collection {col!r}: the source is missing from the variables.'
            + _nearest_hint(tree[col], tie.source)
        )
      yield tie, col, jax.tree_util.tree_map(
          lambda x, view=tie.view: _apply_view(view, x), source)


def _nearest_hint(tree, path) -> str:
  node, depth = tree, 0
  for name in path:
    if not isinstance(node, Mapping) or name not in node:
      break
    node, depth = node[name], depth + 1
  names = sorted(node) if isinstance(node, Mapping) else []
  nearest = difflib.get_close_matches(path[depth], names, n=3, cutoff=0.5)
  where = _text(path[:depth])
  if nearest:
    return f' Nearest existing names under {where}: {", ".join(nearest)}.'
  return f' Names under {where}: {", ".join(names) or "none"}.'
