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

A tie is state of the scope that declares it (:func:`declare`): the ties in
force live in the scope's ``flags`` (``tie_spec.InForce``), which Flax hands
to every scope derived from it, so a tie is in force wherever its target is
used. What they mean together is their normal form (``tie_spec.compose``),
computed once per collection and looked up by path. One policy
(:func:`route`) decides what Flax sees at a target, for module ties
(``Scope._collection`` / ``_mutable_collection`` call :func:`collection`,
which gives a target scope its source's collection) and single tied
variables (:class:`TiedNames`) alike. ``Scope.push`` calls :func:`share_rngs`,
``Scope.param`` :func:`check_param` and ``Scope.variables``
:func:`tied_variables`.
During ``init`` a ``params`` target works on a copy that starts as its
source's variables, checked and dropped when the declaring call returns
(:func:`check_init`); where a target ran first with other values than its
source's, the init runs again with the source's values stored at the target
(:func:`init_once_more`).
Lifted transforms take part through ``flax_tieext.core.tie_lift``; the
messages are ``flax_tieext.core.tie_errors``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import threading
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import jax
import numpy as np

from flax.core.frozen_dict import FrozenDict, freeze
from flax.core.scope import LazyRng
from flax_tieext.core import tie_errors
from flax_tieext.core.tie_spec import (
    InForce, Path, Form, Tie, absolute, apply_view, apply_views, check_like,
    flatten, is_within, named_collections, unbox, walk)

# Scope's privates are this module's to use, as lift.py uses them.
# pylint: disable=protected-access

TIES_FLAG = '__ties__'
# On an inner root of a lifted transform: what it stands for, recorded by
# ``pack`` when it makes the root (:func:`linked`, or ``tie_lift`` where ties
# are in force): ``(outer scope, inner roots, pack's name, outer scopes packed,
# lifted for its rngs only, Lift of the closed-over values it holds)``, made
# into a :class:`Lift` when a tie asks (:func:`lift_record`). The scopes are
# held weakly (``weakref.ref``; :func:`deref`): the record keeps nothing
# alive and makes no cycle with the roots it names, so an inner root dies
# when Flax drops it, and a module kept from inside a transform keeps no
# outer scope, as in Flax. Only a tie source packed beside the transform's
# scopes, which nothing else holds, is held strongly by those scopes.
LINK = '_tie_link'


def deref(ref):
  """The scope a link's reference names: a weak one's (None once freed)."""
  return ref() if type(ref) is weakref.ref else ref


@dataclasses.dataclass(frozen=True)
class TieSources:
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


# remat, cond, switch, while_loop, map_variables, fold_rngs
LIFT = TieSources(lifts=True)
LIFT_CACHED = TieSources(lifts=True, caches_trace=True)  # jit
BROADCAST = TieSources(maps=True)  # vmap, scan
CLOSE_OVER = TieSources()  # vjp, jvp, value_and_grad, custom_vjp

# Each released transform's declaration, by the name it gives ``pack``
# (upstream, an argument of ``pack`` at each transform). A transform not
# listed (added later) declares nothing: a tie source outside it is refused.
BY_PACK_NAME = {
    'remat': LIFT, 'cond': LIFT, 'switch': LIFT, 'while_loop': LIFT,
    'map_variables': LIFT, 'fold_rngs': LIFT, 'jit': LIFT_CACHED,
    'vmap': BROADCAST, 'scan': BROADCAST, 'vjp': CLOSE_OVER,
    'jvp': CLOSE_OVER, 'value_and_grad': CLOSE_OVER, 'custom_vjp': CLOSE_OVER,
}
# The transforms whose traces (branches, a loop's body) return one structure.
BRANCHES = frozenset({'cond', 'switch', 'while_loop'})
# The transforms that lift a scope's streams by the LazyRng method Flax has
# (``clear_suffix``; ``fold`` before 0.10.2; none before 0.9: path kept).
RESTARTS_RNGS = frozenset({'jit', 'fold_rngs'})
RESTART = getattr(LazyRng, 'clear_suffix', getattr(LazyRng, 'fold', None))
# The names of the transforms that reuse their trace (``nn.jit``).
CACHES_TRACE = frozenset(n for n, s in BY_PACK_NAME.items() if s.caches_trace)


def sources_of(name) -> TieSources | None:
  """The declaration of the transform that gives ``pack`` ``name``, or None.

  None for a name no released transform gives (a user's ``pack``, whose name
  may be any object, hashable or not).
  """
  if isinstance(name, PackSite):
    name = name.name
  return BY_PACK_NAME.get(name) if isinstance(name, str) else None


class Lift:
  """What an inner root scope of a lifted transform stands for.

  Made from what ``pack`` records on the inner root (``LINK``), as Flax
  records ``parent`` on a child: one reference per root, no search afterwards.
  ``outer`` and ``siblings`` are given as scopes or weak references to them
  (:func:`deref`), and read as scopes (None for one freed).
  """

  __slots__ = ('_outer', '_siblings', 'name', 'maps', 'caches_trace',
               'rngs_only', 'closure', 'site')

  def __init__(self, outer, siblings: tuple, name: str, maps: bool,
               caches_trace: bool, rngs_only: bool, closure: Any,
               site: Any = None):
    self._outer = outer  # the outer scope
    self._siblings = siblings  # the inner roots of the same pack (tie sources included)
    self.name = str(name)  # the pack's name (of its PackSite, if any)
    self.maps = maps  # the transform maps over an axis (see TieSources)
    self.caches_trace = caches_trace  # the transform reuses its trace (see TieSources)
    self.rngs_only = rngs_only  # a tie source lifted for its rngs (variables: outside)
    self.closure = closure  # the Lift of the transform whose closed-over values it holds
    self.site = site  # a transform reusing its trace: (PackSite, outer paths)

  @property
  def outer(self):
    return deref(self._outer)

  @property
  def siblings(self) -> tuple:
    return tuple(map(deref, self._siblings))


class PackSite:
  """One ``pack`` of a transform that reuses its trace (``nn.jit``).

  Made once per ``pack`` call, so it stands for one trace cache; it keeps
  the ties met inside that trace (:class:`MetInside`). The patched ``pack``
  hands it to each packing of it through :data:`PACK_SITE`, and the records
  of the packing carry it where they carry the pack's name (``str`` of it is
  the name); Flax's ``pack`` and ``_partial_pack`` see the name only.
  """

  __slots__ = ('name', 'met')

  def __init__(self, name: str):
    self.name = name
    self.met: MetInside | None = None

  def __str__(self):
    return self.name


# The site of the packing under way (a one-element list that ``_partial_pack``
# empties; see ``_patch._pack``).
PACK_SITE = contextvars.ContextVar('flax_tieext_pack_site', default=None)
# A Module.sow under way (see _patch._module_sow): a write, never an init's.
SOWING = contextvars.ContextVar('flax_tieext_sowing', default=None)


def linked(scope_fn, scope_tree, name):
  """``pack``'s ``scope_fn``, recording on each inner root where it comes from.

  Upstream, ``pack`` records the outer scope on the inner root it makes from
  it, and ``rewound`` carries it, as Flax records and carries a child's
  ``parent``; the plugin wraps the ``scope_fn`` of ``lift._partial_pack``.
  Untied code pays a tuple per root (and no Python call of its own beyond
  the wrapper's): the :class:`Lift` is made when a tie asks
  (:func:`lift_record`). Every scope is held weakly (``LINK``): neither the
  record nor ``scope_fn`` keeps a scope alive.
  """
  outer = tuple(map(weakref.ref,
                    jax.tree_util.default_registry.flatten(scope_tree)[0]))

  def linking_scope_fn(*args, **kwargs):
    inner_tree = scope_fn(*args, **kwargs)
    inner = jax.tree_util.default_registry.flatten(inner_tree)[0]
    roots = ()
    for i in inner:
      if i.parent is None:
        roots += (weakref.ref(i),)
    for o, i in zip(outer, inner):  # pack makes one inner scope per leaf
      if i.parent is None:
        i.__dict__[LINK] = (o, roots, name, outer, False, None)
    return inner_tree

  return linking_scope_fn


def in_force(scope) -> InForce | None:
  flags = scope.flags
  return flags[TIES_FLAG] if TIES_FLAG in flags else None


def tie_at(scope, path: Path, col: str) -> Tie | None:
  """The resolved tie whose target is ``path`` in ``col``, or None."""
  found = in_force(scope)
  return found.forms[col].at.get(path) if found is not None else None


def declare(scope, ties: Mapping[str, Any], collections: Any = 'params',
            stacked=(), in_scan: str | None = None) -> tuple[Tie, ...]:
  """Puts ``ties`` in force at ``scope`` and every scope derived from it.

  ``ties``, ``collections`` and ``in_scan`` are what ``lift.tie`` takes;
  ``stacked``, more such triples declared with them (stacked ``nn.tie``
  classes). Their records (``tie_spec.absolute``) are returned. ``scope`` is
  changed in place, as its constructor would have set it. A tie equal to one in
  force is kept (declaring again is a no-op). The ties in force are checked
  together at once (for the collections they name), as their union: a tie that
  gives a target in force another source, or closes a cycle with them, raises a
  ``TieError``.
  """
  records = sum([absolute(t, c, scope.path, in_scan=s)
                 for t, c, s in (*stacked, (ties, collections, in_scan))], ())
  present = in_force(scope)
  declared = present.declared if present is not None else ()
  known = set(map(id, declared))  # absolute gives the same records again
  added = tuple([t for t in records if id(t) not in known])
  log = present.log if present is not None else None
  new_log = (log is None and bool(declared or added)
             and scope.get_flag('initializing', False))
  if added or new_log:
    now = InForce(declared + added, forms=None if added else present.forms,
                  log=InitLog() if new_log else log)
    now.check(added)  # refuses a conflict where it is declared
    scope.flags = freeze({**scope.flags, TIES_FLAG: now})
    share_rngs(scope)
  return records


# ---------------------------------------------------------------------------
# Where a path is stored
# ---------------------------------------------------------------------------


def lift_record(scope) -> Lift | None:
  """What the root of ``scope`` stands for in a lifted transform, or None."""
  root = scope.root
  found = root.__dict__.get(LINK)
  if type(found) is tuple:  # recorded by pack (see LINK): made into a Lift once
    outer, roots, name, packed, rngs_only, closure = found
    sources = sources_of(name)
    found = root.__dict__[LINK] = Lift(
        outer, roots, str(name), sources is not None and sources.maps,
        sources is None or sources.caches_trace, rngs_only, closure,
        (name, tuple(deref(s).path for s in packed))
        if isinstance(name, PackSite) else None)
  return found


class MetInside:
  """Ties declared inside one transform that reuses its trace (``nn.jit``).

  Their source lies outside it. Met while tracing (at ``init``, or a first
  ``apply``), they are lifted by every later ``pack`` of the transform
  (``tie_lift.packed``), so the trace takes the source as an input, as for a
  tie declared outside. The trace that met one read the source as a
  closed-over value: ``generation`` counts the ties met, and keys every later
  trace of the transform, so that none reuses such a trace. Kept by the
  transform's :class:`PackSite`.
  """

  def __init__(self):
    self.ties: dict[tuple, dict] = {}  # by the paths packed: {(tie, col): None}
    self.generation = 0

  def add(self, paths: tuple, tie: Tie, col: str):
    met = self.ties.setdefault(paths, {})
    if (tie, col) not in met:
      met[tie, col] = None
      self.generation += 1


def locate(scope, path: Path, rngs: bool = False, col: str | None = None):
  """``(scope at or above path, records of the transforms crossed)``.

  Walks up the parents, then over the inner roots of the same lifted
  transform (one lifted for its rngs only counts for ``rngs``; a copy of
  closed-over values, for a ``col`` it holds), then out (closed over).
  """
  crossed = ()
  while scope is not None:
    s = scope
    while s is not None:
      if path[:len(s.path)] == s.path:
        return s, crossed
      s = s.parent
    lift = lift_record(scope)
    if lift is None:
      break
    for sib in lift.siblings:
      if sib is None:
        continue
      info = lift_record(sib)
      if (sib is not scope.root and is_within(path, sib.path)
          and (rngs or not info.rngs_only) and (col is None or not info.closure
          or walk(sib._variables.get(col), path[len(sib.path):]))):
        return sib, crossed + ((info.closure,) if info.closure else ())
    crossed += (lift,)
    scope = lift.outer
  return None, crossed


def reach(scope, path: Path, rngs: bool = False, col: str | None = None):
  """``(scope at path, transforms crossed)``, built with Flax's ``push``.

  The scope is pushed on a rewound copy (reserving no name), so ties on the
  way are followed as ``Scope`` follows them; it is built once per scope it starts
  from and kept there (every target of one source reaches it again).
  """
  base, crossed = locate(scope, path, rngs, col)
  if base is None or len(path) == len(base.path):
    return base, crossed
  reached = vars(base).setdefault('_tie_reached', {})
  if path not in reached:
    found = base.rewound()
    for name in path[len(base.path):]:
      found = found.push(name, reuse=True)
    reached[path] = found
  return reached[path], crossed


def stored(scope, path: Path, col: str):
  """What is stored at ``path`` itself in ``col`` (no tie followed), or None."""
  base, _ = locate(scope, path, col=col)
  return base and walk(base.root._variables.get(col),
                       path[len(base.root.path):])


def visible_collections(scope) -> set[str]:
  """The collections of every root up the chain of lifted transforms."""
  found = set()
  while scope is not None:
    found |= set(scope.root._variables)
    lift = lift_record(scope)
    scope = lift and lift.outer
  return found


class InitLog:
  """What one ``init`` learns: the (target, collection) pairs that resolved.

  Kept with the ties in force (:class:`InForce`, put there by
  :func:`declare` while initializing), which Flax carries to every scope
  derived from them, across lifted transforms too; a new init starts a new
  one. The tie records stay immutable, and the log is no part of what
  ``nn.jit`` keys its traces by.
  """

  def __init__(self):
    self.used: set[tuple[Path, str]] = set()


class InitRun:
  """One ``init`` call, as the checks at the end of its declaring calls see it.

  ``seeds`` holds, for each target that ran before its source and computed
  with a copy that differs from the values stored for the source,
  ``(tie, col, the source's values through the view, the first use's)``: the
  ``init`` then runs again with them (:func:`init_once_more`).
  """

  def __init__(self, replaying: bool = False):
    self.replaying = replaying
    self.first: set[tuple[Path, str]] = set()  # targets that ran first
    self.seeds: list[tuple[Tie, str, Any, Any]] = []
    # Copies whose source, outside the declaring module, had not run when
    # its call returned: checked when the init's function returns.
    self.deferred: set[tuple[Tie, str]] = set()


_INIT_RUNS = threading.local()


def _init_runs() -> list[InitRun]:
  runs = getattr(_INIT_RUNS, 'runs', None)
  if runs is None:
    runs = _INIT_RUNS.runs = []
  return runs


def init_once_more(init, again):
  """``init()`` (one ``init`` call); again, seeded, where a target ran first.

  A target that runs before its source cannot read values that do not exist
  yet: it computes with its own copy. Where that copy differs from what the
  source stores (:func:`_ran_first`), everything the init computed from it
  (its output, and state such as a ``stats`` total written from both uses)
  is another model's. The init then runs again with the source's values
  stored at each such target, which the target reads as its copy from its
  first use: one shared module's first call would have made them, where
  they are drawn from the source's rng streams. Where the source then
  stores other values (computed from its input, which the target's use
  changed), the first use's own values are what one shared module's first
  call made: the init runs once more with them stored at the source, which
  every use then reads (through the view, the source's first values).

  Args:
    init: runs the init, giving ``(output, variables)``.
    again: ``again(seeds)`` runs the same init (function, arguments, rngs)
      with the variables ``seeds`` stored before it starts.

  Returns:
    ``(output, variables)`` of the last run.
  """
  runs, out, seeds = _init_runs(), None, ()
  for at_source in (None, False, True):
    runs.append(run := InitRun(replaying=at_source is not None))
    try:
      out = init() if at_source is None else again(_seed_tree(seeds, at_source))
    finally:
      runs.pop()
    if not run.seeds or at_source:
      return out
    seeds = seeds or run.seeds  # the first run's: the first use's values
  return out


def _seed_tree(seeds, at_source: bool):
  """The variables ``seeds`` store: at each target, or at each source."""
  tree = {}
  for tie, col, seen, first in reversed(seeds):  # the first checked wins
    path, values = (tie.source, first) if at_source else (tie.target, seen)
    node = tree.setdefault(col, {})
    for name in path[:-1]:
      node = node.setdefault(name, {})
    node[path[-1]] = jax.tree_util.tree_map(lambda v: v, values)
  return tree


def check_deferred(root):
  """Checks the copies whose source had not run when their tie's call returned.

  ``flax.core.init`` calls it on the root scope when the init's function
  returns: a source outside the module that declares the tie (a block's own
  tie to a module beside it) may run after the target, as one shared module
  may be called first at either place.
  """
  runs = _init_runs()
  if not runs or not runs[-1].deferred:
    return
  deferred, runs[-1].deferred = runs[-1].deferred, set()
  sources = {}
  for tie, col in sorted(deferred, key=lambda d: (d[0].target, d[1])):
    _check_copy_of(root, tie, col, sources, set())


def learned(scope) -> tuple[set, set, set]:
  """The init's ``(used, first, deferred)`` (:func:`route`,
  :func:`check_init`; empty outside one)."""
  found, runs = in_force(scope), _init_runs()
  return (found.log.used if found is not None and found.log else set(),
          *((runs[-1].first, runs[-1].deferred) if runs else (set(), set())))


def _near(scope, path: Path, col: str | None) -> str:
  """What exists near ``path``: the collection that holds it, or names."""
  base = scope.root.path
  return held_elsewhere(scope, path, col) or tie_errors.nearest(
      stored(scope, (), col or 'params') or {}, path[len(base):], base)


def held_elsewhere(scope, path: Path, col: str | None) -> str:
  """Names a collection other than ``col`` that holds ``path``, if any."""
  return tie_errors.held_in(path, sorted([
      c for c in visible_collections(scope)
      if c != col and stored(scope, path, c) is not None]))


# ---------------------------------------------------------------------------
# The one resolution policy
# ---------------------------------------------------------------------------

SOURCE = 'source'  # the source's storage (read-only across a transform)
COPY = 'copy'  # init: the target's own copy, starting as the source's values


class Refused(enum.Enum):
  """Why a use of a tied collection is refused (:func:`refused` says it)."""

  MISSING = 'a tied collection used, neither given nor mutable'
  UNREACHABLE = 'a source outside every scope the use reaches'
  KINDS = 'a module tied to a variable'
  GIVEN = 'values given at apply for a target'
  INSIDE = 'a tie declared inside a transform that cannot lift it'
  CANNOT_LAND = 'a write, or init, of a closed-over source'
  READ_ONLY = 'a write through a view'
  NOT_STORED = 'a source that is not stored'


def route(scope, tie: Tie, col: str, *, write: bool, given: bool,
          found: bool, crossed) -> str:
  """Routes a use of the target of ``tie`` in ``col``: what Flax sees there.

  Module ties and single tied variables both ask here; they differ only in
  what they hand Flax (a collection, or one name of it).

  Args:
    scope: the scope that uses the target.
    tie: the resolved tie (its source is the final one).
    col: the collection used.
    write: whether Flax writes (``_mutable_collection``, a put).
    given: whether values are stored at the target itself.
    found: whether the source holds anything in ``col``.
    crossed: the records of the lifted transforms between target and source.

  Returns:
    :data:`SOURCE` or :data:`COPY`; or why the use is refused, a
    :class:`Refused` that the caller raises (:func:`refused`): values given
    at ``apply`` for a target; a source outside a transform that declares
    nothing; a write or initialization that cannot land in a closed-over
    source; a write through a view; a source that is not stored.
  """
  initializing = (scope.get_flag('initializing', False)
                  and scope.is_mutable_collection(col))
  copy = initializing and not (crossed and any(
      lift.maps for lift in crossed)) and (
      col == 'params' or bool(crossed) or not found)
  inside = (declared_inside(tie, col, crossed)
            if crossed and (found or not copy) else None)
  if given and not initializing:  # apply would ignore them
    return Refused.GIVEN
  if inside is not None:
    return Refused.INSIDE
  if not copy:
    if crossed and (write or not found):
      return Refused.CANNOT_LAND
    if write and tie.view is not None:
      return Refused.READ_ONLY
    if not found and not write and not scope.is_mutable_collection(col):
      return Refused.NOT_STORED
  if found or copy:  # (as used, or as run first)
    learned(scope)[not found].add((tie.target, col))
  return COPY if copy else SOURCE


def refused(scope, tie: Tie, col: str, why: Refused, *, write: bool = False,
            crossed=()) -> tie_errors.TieError:
  """The TieError of a use of ``col`` at ``scope`` that ``why`` refuses.

  The one place that says why, and names what exists nearby.
  """
  where = scope.path_text
  if why == Refused.MISSING:
    return tie_errors.collection_missing(tie, col, where,
                                         visible_collections(scope))
  if why == Refused.UNREACHABLE:
    return tie_errors.unreachable(tie, col, where)
  if why == Refused.KINDS:
    return tie_errors.kinds_differ(tie, col, target_is_module=True)
  if why == Refused.GIVEN:
    return tie_errors.given_for_target(tie, col)
  if why == Refused.INSIDE:
    return tie_errors.declared_inside(
        tie, col, where, declared_inside(tie, col, crossed).name)
  if why == Refused.CANNOT_LAND:  # (nothing stored yet: the path may be right)
    tree = None if write else stored(scope, (), col)
    return tie_errors.cannot_land(
        tie, col, where, [lift.name for lift in crossed], write,
        tree and tie_errors.nearest(tree, tie.source),
        is_within(tie.declared_at, scope.root.path))
  if why == Refused.READ_ONLY:
    return tie_errors.read_only(tie, col, where)
  return tie_errors.source_not_stored(tie, col, where,
                                      _near(scope, tie.source, col))


def declared_inside(tie: Tie, col: str, crossed):
  """The transform ``tie`` was declared inside of, where that is refused.

  A tie declared inside a lifted transform reads its source outside as a
  closed-over value (the transform did not lift it: the tie was not in force
  when it packed its scopes), current wherever the transform traces at every
  call. A transform that reuses its trace (``nn.jit``) would keep a stale
  copy: the first trace that meets the tie remembers it with its pack
  (:class:`PackSite`), and every later one lifts the source
  (:class:`MetInside`). A transform that declares nothing is refused.
  """
  for lift in crossed:
    if lift.caches_trace and tie_at(lift.outer, tie.target, col) is None:
      if lift.site is None:
        return lift
      at, paths = lift.site
      if at.met is None:
        at.met = MetInside()
      at.met.add(paths, tie, col)
  return None


def _resolve(scope, ties: InForce, form: Form, col: str, write: bool):
  """``col`` of ``scope`` at its first use: a module tie's source's, or its own.

  A tied collection that is used must be given (or be mutable). For a module
  tie the source's storage is read once and the use routed (:func:`route`);
  a use refused raises before anything is stored (:func:`refused`). The
  source's tree is then seen through the tie's view (``apply_views``), and
  handed to Flax, or copied into the target's own dict.
  """
  tie, crossed, node = form.at.get(scope.path), (), None
  if (col in ties.named_collections and col not in scope.root._variables
      and not scope.is_mutable_collection(col)
      and col not in visible_collections(scope)):
    tie, how = ties.named_collections[col], Refused.MISSING
  elif tie is None:
    return _untied(scope, col, write)
  else:
    base, crossed = locate(scope, tie.source, col=col)
    # A final source lies below no target: its dicts are reached by name.
    node = base and walk(base.root._variables.get(col),
                         tie.source[len(base.root.path):])
    how = (Refused.UNREACHABLE if base is None else
           Refused.KINDS if node is not None and not isinstance(node, Mapping) else
           # A source whose every variable is tied elsewhere stores nothing:
           # the target's tied paths below it resolve on their own.
           route(scope, tie, col, write=write,
                 found=bool(node) or tie.target in form.below,
                 given=_given(scope, col), crossed=crossed))
    if how == COPY and not node and col != 'params' and not write:
      return _untied(scope, col, write)  # nothing of its own yet
  if isinstance(how, Refused):
    raise refused(scope, tie, col, how, write=write, crossed=crossed)
  seen = node if tie.view is None else apply_views(tie, node)
  if how == COPY:  # dropped by check_init
    return _own(scope, col, None if node else tie, seen, landing=(
        (lambda: refused(scope, tie, col, Refused.CANNOT_LAND, write=True,
                         crossed=crossed))
        if node and crossed and col != 'params' else None))
  if crossed or tie.view is not None:  # a closed-over value, or a view:
    return freeze(seen) if crossed else seen  # never cached
  if write:
    seen = reach(scope, tie.source)[0]._mutable_collection(col)
  elif not seen:
    return FrozenDict()  # a mutable collection the source has not written
  scope._variables[col] = seen
  return seen


def _given(scope, col: str) -> bool:
  """Whether values are stored at ``scope``'s own path in ``col``.

  Not so below an inner root that is itself a target: it holds its source's
  variables, carried into the transform (``tie_lift``); values given for it
  were refused outside.
  """
  root = scope.root
  lift = lift_record(root) if scope is not root else None
  if lift is not None and tie_at(lift.outer, root.path, col) is not None:
    return False
  return bool(stored(scope, scope.path, col))


def _own(scope, col: str, first: Tie | None, seen, landing=None):
  """The scope's own dict of ``col``, a copy of ``seen``, stored where Flax
  stores it: at once, or inside a branch of ``nn.cond`` / ``nn.switch`` /
  ``nn.while_loop`` (``BRANCHES``) without ``first`` at the target's first
  write of its own, so that the branches return no copy holding the source's
  values alone, as one shared module (:class:`FirstCopy`).
  """
  def store():
    if scope.parent is None:
      return scope._variables.setdefault(col, fresh)
    parent = scope.parent._mutable_collection(col)
    if isinstance(parent, TiedNames):  # the copy is the parent's own entry
      parent = parent.own
    return parent.setdefault(scope.name, fresh)
  # (The parent resolved now: a target records its use. What it holds here
  # already, values seeded at the target, is the copy.)
  held = (scope.parent._collection(col) if first is None and scope.parent
          is not None and _in_a_branch(scope) else None)
  later = [] if held is not None and scope.name not in held else None
  fresh = (FirstCopy(first, col, landing=landing, later=later)
           if first or landing or later is not None else {})
  _fill(fresh, seen)
  if later is not None:
    later.append(store)
  scope._variables[col] = fresh if later is not None else store()
  return scope._variables[col]


def _in_a_branch(scope) -> bool:
  """Whether ``scope`` runs inside a transform in ``BRANCHES``, at any depth."""
  lift = lift_record(scope)
  while lift is not None and lift.name not in BRANCHES:
    lift = lift.outer and lift_record(lift.outer)
  return lift is not None


class FirstCopy(dict):
  """A target's copy, while initializing, that no write can leave.

  Flax writes a variable here when it creates it; a second write, or a sow
  (:data:`SOWING`), would be lost with the copy, and raises the tie's
  TieError: the source does not exist yet to take it (the target runs
  first), or, with ``landing``, it is a closed-over value of a transform
  the target is inside (``landing``'s error, as at ``apply``); ``later``
  stores it (:func:`_own`). A submodule's dict (Flax adds it empty) is too.
  """

  def __init__(self, tie: Tie | None, col: str, at: Path = (), landing=None,
               later=None):
    super().__init__()
    self.tie, self.col, self.at, self.landing, self.later = (tie, col, at,
                                                             landing, later)

  def __setitem__(self, name, value):
    if type(value) is dict or isinstance(value, Mapping):
      if type(value) is dict and not value:
        value = FirstCopy(self.tie, self.col, self.at + (name,), self.landing,
                          self.later)
    elif (name in self or SOWING.get()) and (self.tie or self.landing):
      raise (self.landing() if self.landing else tie_errors.written_before_source(
          self.tie, self.col, self.at + (name,)))
    elif self.later:
      self.later.pop()()
    super().__setitem__(name, value)


# A copy that leaves a transform is a dict again (JAX knows no subclass).
jax.tree_util.register_pytree_with_keys(
    FirstCopy,
    lambda d: ([(jax.tree_util.DictKey(k), d[k]) for k in sorted(d)],
               tuple(sorted(d))),
    lambda names, values: dict(zip(names, values)),
    lambda d: ([d[k] for k in sorted(d)], tuple(sorted(d))))


def _fill(own, source):
  """Adds to ``own`` what ``source`` holds and ``own`` lacks (leaves shared).

  The source's values are no write of the target's: a :class:`FirstCopy`
  takes them as a dict does (its dicts are FirstCopies).
  """
  for name, value in (source.items() if isinstance(source, Mapping) else ()):
    if type(value) is dict or isinstance(value, Mapping):
      if name not in own:
        own[name] = {}
      _fill(own[name], value)
    elif name not in own:
      dict.__setitem__(own, name, value)


class TiedNames(MutableMapping):
  """A scope's collection in which some names are tied variables.

  A tied name reads and writes its source variable; every other name (and a
  tied name whose source is a module, resolved in the submodule's own scope)
  is the scope's own. Membership, iteration and length agree.
  """

  def __init__(self, scope, col: str, own, ties: dict[str, Tie]):
    self._scope, self._col, self.own, self._ties = scope, col, own, ties

  def _source(self, name: str, write: bool = False):
    """``(parent dict, name)`` of the source variable, or None for our own."""
    tie = self._ties.get(name)
    if tie is None:
      return None
    scope, col = self._scope, self._col
    parent, crossed = reach(scope, tie.source[:-1], col=col)
    if parent is None:
      raise refused(scope, tie, col, Refused.UNREACHABLE)
    node = parent._collection(col)
    found = node.get(tie.source[-1]) if isinstance(node, Mapping) else None
    if isinstance(found, Mapping):
      return None  # a submodule: its own scope resolves the tie
    how = route(scope, tie, col, write=write, given=name in self.own,
                found=found is not None, crossed=crossed)
    if how == COPY:
      runs = _init_runs()
      if write and found is None and (SOWING.get() or name in self.own and not (
          runs and runs[-1].replaying)):  # (seeded: a write-back)
        raise tie_errors.written_before_source(tie, col, ())
      if write or found is None:
        return None  # the target's own copy, checked and dropped by check_init
    elif isinstance(how, Refused):
      raise refused(scope, tie, col, how, write=write, crossed=crossed)
    if write:
      node = parent._mutable_collection(col)
    return node, tie.source[-1]

  def __getitem__(self, name):
    where = self._source(name)
    if where is None:
      return self.own[name]
    parent, key = where
    if key not in parent:
      raise KeyError(name)
    return apply_view(self._ties[name], parent[key])

  def __contains__(self, name):
    where = self._source(name)
    return name in self.own if where is None else where[1] in where[0]

  def __setitem__(self, name, value):
    where = self._source(name, write=True)
    if where is None:
      self.own[name] = value
      return
    parent, key = where
    if key in parent and not SOWING.get():  # (a sow reduces what it read)
      check_like(self._ties[name], self._col, parent[key], value)
    parent[key] = value

  def __delitem__(self, name):
    del self.own[name]

  def __iter__(self) -> Iterator[str]:
    yield from self.own
    for name in self._ties:
      if name not in self.own and name in self:
        yield name

  def __len__(self) -> int:
    return sum(1 for _ in self)


# ---------------------------------------------------------------------------
# What Scope's methods call when ties are in force (TIES_FLAG in its flags)
# ---------------------------------------------------------------------------


def _untied(scope, col: str, write: bool):
  """``col`` as Flax finds it for ``scope`` (the ties of its parents followed)."""
  if write:
    return scope._mutable_collection(col, untied=True)
  return scope._collection(col, untied=True)


def collection(scope, col: str, write: bool = False):
  """``Scope._collection`` of a scope with ties in force.

  The normal form of ``col`` says what the ties make of ``scope.path``.
  Where a module tie targets ``scope``, ``col`` is its source's
  (:func:`_resolve`); otherwise Flax's own (``untied=True``). Where variable
  ties target names in it, those names are their sources' (:class:`TiedNames`).
  With ``write``, this is ``Scope._mutable_collection``.
  """
  ties = scope.flags[TIES_FLAG]
  form = ties.forms[col]
  if col in scope._variables:  # resolved before, or its own (Flax's callers
    node = scope._variables[col]  # check that a write may land, first)
  else:
    node = _resolve(scope, ties, form, col, write)
  named = form.named.get(scope.path)
  if not named:
    return node
  if isinstance(node, TiedNames):  # its source's, whose tied names are ours
    node = node.own
  return TiedNames(scope, col, node, named)


def tied_variables(scope, variables):
  """``Scope.variables()`` of ``scope``: its own dicts, with its tied names in.

  A tie of one variable (``"head/kernel"``) leaves the module its own
  collection, in which that one name reads and writes the source variable
  (:class:`TiedNames`). ``Scope.variables`` copies a scope's own dicts and
  passes them here; a name a variable tie targets is shown as its view gives
  it. A ``FrozenDict`` gives one.
  """
  views = {col: scope._collection(col) for col in variables}
  if not any(isinstance(v, TiedNames) for v in views.values()):
    return variables
  out = {col: dict(v) if isinstance(v, TiedNames) else variables[col]
         for col, v in views.items()}
  return freeze(out) if isinstance(variables, FrozenDict) else out


def share_rngs(scope):
  """Gives a module-level ``params`` target its source's rng streams.

  ``Scope.push`` calls it on each child with ties in force. The streams are
  Flax's own, built by ``Scope.push`` at the source's path, as each transform
  crossed lifts them (:func:`lifted_rngs`). While initializing the ``params``
  counter starts afresh, so that a copy the target initializes equals what
  the source draws, and the source's own draws are left alone; the other
  streams count on with the source's (:class:`InitCounters`).
  """
  ties = scope.flags[TIES_FLAG]
  tie = ties.forms['params'].at.get(scope.path)
  source, crossed = (None, ()) if tie is None or tie.view is not None else (
      reach(scope, tie.source, rngs=True))
  if source is not None:
    scope.rngs = lifted_rngs(source.rngs, crossed)
    scope.rng_counters = (InitCounters(source.rng_counters)
                          if ties.log is not None  # initializing
                          else source.rng_counters)


def lifted_rngs(rngs, crossed):
  """``rngs``, of a scope outside the transforms ``crossed`` (that did not
  lift it), as each lifts a scope's: by ``RESTART`` (``RESTARTS_RNGS``), or
  on the key it made (split, traced) of the one shared with its outer scope."""
  for lift in reversed(crossed):  # the outermost first
    root, outer = next(filter(None, lift.siblings), None), lift.outer
    if root is None or outer is None:
      continue
    rngs = {k: rngs[k] for k in root.rngs if k in rngs}
    for k, rng in rngs.items():  # (Scope keeps LazyRngs)
      if lift.name in RESTARTS_RNGS and RESTART:
        rngs[k] = RESTART(rng)
      elif rng.rng is getattr(outer.rngs.get(k), 'rng', None):
        rngs[k] = LazyRng(root.rngs[k].rng, rng.suffix)
  return rngs


class InitCounters(dict):
  """A module-level ``params`` target's rng counters while initializing.

  ``params`` counts afresh, so that what the target initializes into its
  copy is what its source draws first, and the source's own draws are left
  alone; every other stream (dropout) counts on with the source's counter,
  as one module called twice does. A child's counters (Flax keeps them
  here, under a tuple key) are such counters of the source's child.
  """

  def __init__(self, source: dict):
    super().__init__(params=0)
    self.source = source

  def _child(self, key):
    if not dict.__contains__(self, key):  # made in the source's, if new
      made = self.source.setdefault(key, {
          k: 0 for k in self.source if isinstance(k, str)})
      dict.__setitem__(self, key, InitCounters(made))
    return dict.__getitem__(self, key)

  def __getitem__(self, key):
    if key == 'params':
      return dict.__getitem__(self, key)
    if isinstance(key, str):
      return self.source[key]
    return self._child(key)

  def __setitem__(self, key, value):
    if key == 'params':
      dict.__setitem__(self, key, value)
    elif isinstance(key, str):
      self.source[key] = value
    else:  # a child's new counters (Flax's push): the source's child's too
      self.source.setdefault(key, value)
      dict.__setitem__(self, key, InitCounters(self.source[key]))

  def __contains__(self, key):  # every child: Flax's push then asks get()
    return not isinstance(key, str) or key == 'params' or key in self.source

  def get(self, key, default=None):
    return self[key] if key in self else default

  def keys(self):
    return ['params', *[k for k in self.source if k != 'params']]

  def __iter__(self):
    return iter(self.keys())

  def items(self):
    return [(k, self[k]) for k in self.keys()]

  def values(self):
    return [self[k] for k in self.keys()]

  def __len__(self):
    return len(self.keys())


def counters_now(counters):
  """A copy of rng counters now (of InitCounters: the source's still shared)."""
  if not isinstance(counters, InitCounters):
    return dict(counters)
  now = InitCounters(counters.source)
  for key, value in dict.items(counters):
    dict.__setitem__(now, key, counters_now(value)
                     if isinstance(value, InitCounters) else value)
  return now


def check_param(scope, name: str, value, abs_value):
  """``Scope.param`` found ``name`` stored: a tied one must be like its init.

  ``abs_value`` is what the target's ``init_fn`` gives. Under a tie, while
  initializing, a parameter read from its source must have that shape and
  dtype (through the view, for a viewed tie); at apply, as in Flax, only the
  shape (dtypes are the caller's). The TieError names the tie.
  """
  if value is abs_value:  # what init_fn gave, just stored
    return
  ties = scope.flags[TIES_FLAG]
  target = scope.path + (name,)
  tie = ties.forms['params'].covering(target)
  if tie is None or _alike(abs_value, value):
    return
  if ties.log is None and all(
      np.shape(v) == np.shape(a) for v, a in zip(
          jax.tree_util.tree_leaves(value), jax.tree_util.tree_leaves(abs_value))):
    return  # another dtype at apply: the caller's
  check_like(dataclasses.replace(
      tie, target=target, source=tie.source + target[len(tie.target):]),
             'params', scope.get_variable('params', name), abs_value)


def refuse_unknown_collection(scope, name: str):
  """``Scope.param`` found no ``name``: the tie that should have given it.

  Raises the TieError that names it, where a tie covering the parameter names
  only collections that no scope has, or a ``params`` tie's target is a
  misspelling of the parameter's path (Flax's error would not say why the
  parameter is missing).
  """
  path = scope.path + (name,)
  given = visible_collections(scope)
  declared = scope.flags[TIES_FLAG].declared
  for tie in declared:
    names = named_collections(tie.collections)
    if not is_within(path, tie.target) or any(c in given for c in names):
      continue
    for col in names:
      if not scope.is_mutable_collection(col):
        raise tie_errors.collection_unknown(
            tie, col, given, held_elsewhere(scope, tie.target, col))
  for tie in declared:
    near, common = path[:len(tie.target)], scope
    while common is not None and not is_within(tie.target, common.path):
      common = common.parent
    if common is not None and len(tie.target) > len(common.path) and (
        tie.target[len(common.path)] not in common.reservations  # never made
    ) and tie.applies_to('params') and near != tie.target and (
        tie_errors.did_you_mean('/'.join(tie.target), ['/'.join(near)])):
      raise tie_errors.target_misspelled(tie, path, near)


def _alike(a, b) -> bool:
  """Whether two arrays (boxed or not) have one shape and dtype."""
  if a is b:
    return True
  # A tracer's abstract value is an attribute: most calls make no other call.
  x, y = getattr(a, 'aval', None), getattr(b, 'aval', None)
  x = _aval(a) if x is None else x
  y = _aval(b) if y is None else y
  return (getattr(x, 'shape', None) == getattr(y, 'shape', False)
          and getattr(x, 'dtype', None) == getattr(y, 'dtype', False))


def _aval(x):
  """``x``'s abstract value where it has one, or ``x`` (unboxed)."""
  x = unbox(x)
  aval = getattr(x, 'aval', None)
  return x if aval is None else aval


# ---------------------------------------------------------------------------
# The invariants, checked when the declaring call of an ``init`` returns
# ---------------------------------------------------------------------------


def check_init(scope, ties: tuple[Tie, ...]):
  """Checks the ties declared at ``scope`` on what ``init`` stored.

  Each target's copy is checked against its final source and dropped (the
  deepest first, so that a target inside a target's source is its own).
  Raises a TieError naming target, source, collection and declaring module
  when a tied collection, the source or the target does not exist, the source
  is of another kind than the target (module or variable), or the target's
  copy holds a variable its source lacks or one of another shape or dtype.
  """
  found_ties = in_force(scope)
  if found_ties is None or not scope.get_flag('initializing', False):
    return
  declared = {id(t): t for t in [
      *ties, *[t for t in found_ties.declared if t.declared_at == scope.path]]}
  present = visible_collections(scope)
  used = learned(scope)[0]
  sources = {}  # source path -> reach(scope, path): each looked up once
  for tie in declared.values():
    names = named_collections(tie.collections)
    for col in names:
      if col not in present and (len(names) == 1 or
                                 tie_errors.did_you_mean(col, present)):
        raise tie_errors.collection_unknown(
            tie, col, present, held_elsewhere(scope, tie.target, col), True)
    found = False
    for col in sorted([c for c in present if tie.applies_to(c)]):
      form = found_ties.forms[col]
      top = form.covering(tie.target)
      for resolved in sorted([*(top,)[:top is not None],
                              *form.below.get(tie.target, ())],
                             key=lambda t: -len(t.target)):
        found = _check_copy_of(scope, resolved, col, sources, used) or found
        found = found or (resolved.target, col) in used
    if not found:
      _refuse_untied(scope, tie, present)


def _check_copy_of(scope, tie: Tie, col: str, sources, used) -> bool:
  """Checks and drops the copy of ``tie``'s target; whether there was one."""
  copy = stored(scope, tie.target, col)
  if copy is None:
    return False
  # A variable is reached as a scope too: its collection is the value.
  key = (tie.source, col)
  if key not in sources:
    source_scope, crossed = reach(scope, tie.source)
    source = source_scope and source_scope._collection(col)
    if isinstance(source, Mapping) and not source:
      source = None
    sources[key] = source, crossed, None
  source, crossed, flat = sources[key]
  inside = declared_inside(tie, col, crossed)  # (met before its source too)
  if inside is not None:
    raise tie_errors.declared_inside(tie, col, scope.path_text, inside.name)
  runs = _init_runs()
  if source is not None:
    if flat is None and tie.view is None:  # flattened once per source
      flat = dict(flatten(source))
      sources[key] = source, crossed, flat
    _check_copy(tie, col, copy, source, flat if tie.view is None else None)
    if runs:
      seen = _ran_first(scope, tie, col, copy, source, runs[-1].first)
      if seen is not None:  # the first use's values, where they can be stored
        first = copy if tie.view is None and not any(isinstance(
            unbox(v), jax.core.Tracer) for v in jax.tree_util.tree_leaves(
                copy)) else source
        runs[-1].seeds.append((tie, col, seen, first))
  elif not isinstance(copy, Mapping) or copy:
    if runs and not is_within(tie.source, scope.path):  # it may run later
      runs[-1].deferred.add((tie, col))
      return True
    raise tie_errors.source_missing_at_init(tie, col,
                                            _near(scope, tie.source, col))
  _drop(scope, tie.target, col)
  used.add((tie.target, col))  # checked: a later check finds it
  return True


def _ran_first(scope, tie: Tie, col: str, copy, source, first):
  """The source's values (viewed) where the target ran first without them.

  The target ran first where its use found no source (``first``, recorded by
  :func:`route`; a trace that ``nn.jit`` replays hands it on, see
  ``tie_lift.Packed.wrap``). Its copy then matters
  where its values differ from the source's (through the view); traced
  values cannot be compared, and count as differing. None otherwise.
  """
  if (tie.target, col) not in first:
    return None
  seen = apply_views(tie, source)
  flat = dict(flatten(seen))
  pairs = [(unbox(leaf), unbox(flat.get(path)))
           for path, leaf in flatten(copy)]
  if all(a is b or not isinstance(a, jax.core.Tracer) and not
         isinstance(b, jax.core.Tracer) and np.array_equal(a, b)
         for a, b in pairs):
    return None
  return seen


def _refuse_untied(scope, tie: Tie, present):
  """A declared tie that tied nothing: say whether its target exists."""
  if any(stored(scope, tie.target, c) is not None for c in present):
    cols = ', '.join(repr(c) for c in sorted(present) if tie.applies_to(c))
    raise tie_errors.ties_nothing(tie, cols,
                                  held_elsewhere(scope, tie.target, None))
  raise tie_errors.target_missing(tie, _near(scope, tie.target, None))


def _drop(scope, path: Path, col: str):
  """Removes the copy at ``path`` from ``col``, then its parents left empty.

  A lifted target's copy is stored at each level of lifting: in its inner root
  and outside, where the outer transform keeps it.
  """
  if path == scope.root.path:
    scope.root._variables.pop(col, None)
  for end in range(len(path), 0, -1):
    if end < len(path) and stored(scope, path[:end], col):
      break
    parent = stored(scope, path[:end - 1], col)
    if isinstance(parent, MutableMapping):
      dropped = parent.pop(path[end - 1], None)
      _forget(scope, path[:end], col, dropped)


def _forget(scope, path: Path, col: str, dropped):
  """Makes the scope at ``path`` above ``scope`` forget a dict just dropped.

  Its call may still be running (a tie declared in a child of a module that
  has stored nothing else yet): it finds its collection anew, where Flax
  creates it, at its next write.
  """
  s = scope
  while s is not None and s.path != path:
    s = s.parent
  if s is not None and dropped is not None and s._variables.get(col) is dropped:
    del s._variables[col]


def _check_copy(tie: Tie, col: str, copy, source, flat_source=None):
  """Raises unless ``copy`` could be read from ``source`` (through the view)."""
  if (is_module := isinstance(copy, Mapping)) != isinstance(source, Mapping):
    raise tie_errors.kinds_differ(tie, col, target_is_module=is_module)
  if flat_source is None:
    flat_source = dict(flatten(jax.eval_shape(
        lambda s: apply_views(tie, s), source)))
  for path, leaf in flatten(copy):
    if path not in flat_source:
      raise tie_errors.no_counterpart(tie, col, path, tie_errors.nearest(
          source if isinstance(source, Mapping) else {}, path, tie.source))
    if not _alike(flat_source[path], leaf):
      check_like(dataclasses.replace(tie, target=tie.target + path,
                                     source=tie.source + path),
                 col, flat_source[path], leaf)
