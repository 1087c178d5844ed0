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

"""Tied variables through lifted transforms.

Lifted transforms build their inner scopes with ``parent=None``, so a target
inside one cannot reach a source outside it by walking up. Each transform
declares what a tie source outside it is: ``pack(..., tie_sources=...)``, one
of :data:`LIFT`, :data:`LIFT_CACHED`, :data:`BROADCAST` or :data:`CLOSE_OVER`.
``lift._partial_pack`` asks :func:`packed` what to pack, which lifts the
sources as declared and records on each inner root what it stands for, which
``ties.reach`` walks. A transform that declares nothing gets a ``TieError``
when a tie source lies outside it, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
import contextvars
import dataclasses
import functools
import inspect
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from flax import traverse_util
from flax.core import axes_scan, lift as flax_lift, meta
from flax.core.frozen_dict import freeze
from flax.core.scope import group_collections
from flax_tieext.core import tie_errors
from flax_tieext.core.tie_spec import flatten, in_filter, is_within, unbox, walk
from flax_tieext.core.ties import (  # pylint: disable=unused-import
    BROADCAST, CLOSE_OVER, LIFT, LIFT_CACHED, LINK, TIES_FLAG, Lift as _Lift,
    PackSite, TieSources, counters_now, in_force, learned as _learned,
    lift_record as _lift, locate, reach, tie_at, visible_collections)

# Scope's privates are this module's to use, as lift.py uses them.
# pylint: disable=protected-access


class Lifted(NamedTuple):
  """A tie source a transform packs beside its scopes."""

  packed: Any  # what is packed: the source's scope, or a detached copy
  real: Any  # the source's scope
  rngs_only: bool  # lifted for its rngs (its variables stay outside)
  closure: Any  # the Lift whose closed-over values it holds, or None
  scanned: bool = False  # broadcast to the scan's length (in_scan='scanned')


class ScanCall:
  """One call of a ``lift.scan`` function, as the plugin's ``lift.scan`` saw it.

  Upstream, ``scan``'s ``inner`` hands the length it computes, and its
  variable axes, to the tie sources it packs; the plugin's ``lift.scan``
  records its arguments and each call's inputs (:data:`SCAN_CALL`), which
  ``_partial_pack`` reads for the same ``scope_tree``. Only a source scanned
  over reads :attr:`stacking`, once per call.
  """

  def __init__(self, scope_tree, scan, args: tuple, kwargs: dict, xs: tuple):
    self.scope_tree, self.scan = scope_tree, scan  # (Flax's lift.scan)
    self.args, self.kwargs = args, kwargs  # lift.scan's arguments
    self.xs = xs  # the call's scanned inputs (after the carry)

  @functools.cached_property
  def stacking(self):
    """``(length, variable_broadcast, variable_carry, axes, metadata_params)``.

    ``axes``: ``{collection filter: in axis}`` of ``variable_axes``, in the
    order of the scanned groups. Flax's own rules (``lift.scan``'s
    ``inner``): the length is ``length`` or that of the scanned inputs (None
    where they disagree or there are none: Flax raises then); a collection is
    scanned when no ``variable_broadcast`` or ``variable_carry`` filter takes
    it first.
    """
    bound = inspect.signature(self.scan).bind(*self.args, **self.kwargs)
    bound.apply_defaults()
    given = bound.arguments
    in_axes, length = given['in_axes'], given['length']
    if length is None:
      def find_length(axis, x):
        if axis is not axes_scan.broadcast:
          leaves = jax.tree_util.tree_leaves(x)
          if leaves:
            return leaves[0].shape[axis]
        return ()
      lengths = set(jax.tree_util.tree_leaves(
          jax.tree_util.tree_map(find_length, in_axes, self.xs)))
      length = lengths.pop() if len(lengths) == 1 else None
    axes = dict(flax_lift._split_in_out_axes(given['variable_axes'])[0])  # pylint: disable=protected-access
    return (length, given['variable_broadcast'], given['variable_carry'],
            axes, given.get('metadata_params', {}))


# The call of a lift.scan function under way (set by the plugin's lift.scan).
SCAN_CALL = contextvars.ContextVar('flax_tieext_scan_call', default=None)


def _scanned_collections(tie, scope, call: ScanCall | None) -> list[str]:
  """The tied collections ``call`` scans over (stacked), grouped as ``pack``
  groups them; none where the source is read as a loop invariant.

  A stack tied whole to another stack (the target is the scanned module)
  holds its source's stacked collections, and is scanned like its source
  already: none. Otherwise ``in_scan='scanned'`` stacks every tied
  collection the scan scans (and needs the call's record); ``'broadcast'``
  none; the default (None) stacks them where the call is recorded (a scan
  made by the plugin's ``lift.scan``); else it reads the source as a loop
  invariant. Both ways give the same values and gradients, and refuse a
  write inside the scan alike.
  """
  if tie.target == scope.path or tie.in_scan == 'broadcast' or (
      tie.in_scan is None and call is None):
    return []
  if call is None:
    raise tie_errors.scan_not_recorded(tie, scope.path_text)
  _, broadcast, carry, axes, _ = call.stacking
  tied = {c: None for c in visible_collections(scope) if tie.applies_to(c)}
  groups = group_collections(tied, (broadcast, carry, *axes))
  return [c for group in groups[2:] for c in group]


def lifted_sources(scopes, name: str, tie_sources: TieSources | None,
                   inside, met, call: ScanCall | None = None) -> list[Lifted]:
  """Each tie source to lift (:class:`Lifted`).

  For a target inside ``scopes`` (``inside``: each one's, :func:`_ties_inside`)
  whose source lies outside all of them, as the transform declares
  (``tie_sources``): the source's scope (a variable's module) with its
  variables, or with its rngs only, or nothing.
  A source seen here only as a closed-over value is lifted as one, read-only,
  as is the source of a tie declared inside the transform (``met``: it reads
  its source as a closed-over value wherever it was declared).
  A source not stored yet has its rngs lifted only, those a ``params``
  target draws (as a module passed in): the target initializes its own copy.
  """
  crossing = tie_sources
  extra, paths = [], set()
  for scope, ties in zip(scopes, inside):
    if crossing is not None and _carries_its_source(scope, ties, crossing):
      continue
    for tie, col in ties:
      if tie.target == scope.path and call is not None:
        _check_stack(tie, col, scope, call)
      if any(is_within(tie.source, s.path) for s in scopes):
        continue
      if crossing is None:
        raise tie_errors.unsupported_transform(tie, name, scope.path_text)
      if not (crossing.lifts or crossing.maps):
        continue  # read as a closed-over value
      path = tie.source
      parent, _ = reach(scope, path[:-1])
      node = None if parent is None else walk(parent._collection(col), path[-1:])
      unstored = node is None or (isinstance(node, Mapping) and not node)
      if unstored and (col != 'params' or tie.view is not None):
        continue  # the target initializes its own copy, and draws no rngs
      if not unstored and not isinstance(node, Mapping):
        path = path[:-1]  # a variable: lift its module
      if path in paths or any(is_within(path, s.path) for s in scopes):
        continue
      paths.add(path)
      source, _ = reach(scope, path, rngs=True)
      values, crossed = reach(scope, path)
      if crossing.maps and name == 'scan' and not unstored and (
          scanned := _scanned_collections(tie, scope, call)):
        # Scanned over as the stack's own variables are (Packed.stacked).
        extra.append(Lifted(_detached(source, {
            c: values._collection(c) for c in scanned}), source, False,
                            _Lift(source, (), name, True, False, False, None),
                            scanned=True))
      elif crossing.maps or unstored:
        extra.append(Lifted(_detached(source, {}), source, True, None))
      elif crossed or (tie, col) in met:  # a closed-over value: lift it as one
        extra.append(Lifted(_detached(source, {
            c: values._collection(c) for c in visible_collections(scope)
            if tie.applies_to(c)}), source, False, crossed[0] if crossed else
                      _Lift(source, (), name, False, False, False, None)))
      else:
        extra.append(Lifted(source, source, False, None))
  return extra


def _check_stack(tie, col: str, scope, call: ScanCall):
  """A stack tied whole is scanned like its source: one of as many layers."""
  length, _, _, axes, _ = call.stacking
  axis = next((a for f, a in axes.items() if in_filter(f, col)), None)
  source, _ = reach(scope, tie.source)
  for path, leaf in flatten(source._collection(col) if source and axis is not
                            None and length is not None else {}):
    shape = jnp.shape(unbox(leaf))
    if not -len(shape) <= axis < len(shape) or shape[axis] != length:
      raise tie_errors.stack_tied_to_layer(tie, col, tie.source + path, shape,
                                           axis, length)


def _carries_its_source(scope, inside, crossing: TieSources) -> bool:
  """Whether ``scope`` is packed with its source's collections, as its own.

  A lifted scope that is a module tie's target, with no other tie inside it,
  holds its source's very collections (``Scope._collection`` gives them), so
  a transform that lifts sources packs it as it packs one shared module:
  reads, writes and gradients reach the source's variables, and only one
  scope is packed.
  """
  if not crossing.lifts or crossing.caches_trace or len(inside) != 1:
    return False  # (jit: a source outside it is refused as stale)
  tie, _ = inside[0]
  return (tie.target == scope.path and tie.view is None
          and not locate(scope, tie.source)[1])


def _ties_inside(scope):
  """``(tie, collection)`` of each resolved tie whose target is in ``scope``.

  Each target once, in the first collection that ties it (``params``, those
  the ties name, those the scope sees).
  """
  ties = in_force(scope)
  if ties is None:
    return []
  found = {}
  for col in dict.fromkeys(('params', *ties.named_collections,
                            *sorted(visible_collections(scope)))):
    form = ties.forms[col]
    for tie in (form.at.get(scope.path), *form.below.get(scope.path, ())):
      if tie is not None:
        found.setdefault(tie.target, (tie, col))
  return list(found.values())


def _detached(scope, variables):
  """A read-only root scope at ``scope``'s path: ``variables``, its rngs."""
  new = type(scope)(dict(variables), None, scope.name, False, None,
                    path=scope.path, debug_path=scope.debug_path,
                    flags=scope.flags)
  new.rngs, new.rng_counters = scope.rngs, scope.rng_counters
  return new


def without_borrowed(scope, lifted, inside):
  """``(scope as pack lifts it, collections left out)``.

  A lifted scope that is itself a target carries its source's collections
  (a tied scanned stack is scanned like its source), unless the source is
  among the ``lifted`` scopes (with its variables): then the inner target
  reaches the inner source, and lifting the collections twice would fork
  them.
  """
  sources = [t.source for t, _ in inside if t.target == scope.path]
  if not [s for s in lifted for p in sources if is_within(p, s.path)]:
    return scope, ()
  scope._populate_collections()
  borrowed = _borrowed(scope)
  if not borrowed:
    return scope, ()
  new = scope.rewound()
  new.flags = freeze({k: v for k, v in scope.flags.items() if k != TIES_FLAG})
  new._variables = {c: v for c, v in scope._variables.items()
                    if c not in borrowed}
  return new, borrowed


def _borrowed(scope) -> set[str]:
  """The collections ``scope``, a target, holds as its source's very dicts."""
  found = set()
  for col, node in scope._variables.items():
    tie = tie_at(scope, scope.path, col)
    source = tie and reach(scope, tie.source)[0]
    if source is not None and source._collection(col) is node:
      found.add(col)
  return found


def _link(outer_scopes, inner_scopes, name, packed, kinds, held: int):
  """Records on each inner root what it stands for, as ``ties.linked`` does.

  The tie sources packed are inner roots too (``kinds``: lifted for their
  rngs only, holding closed-over values); an inner root whose outer scope
  holds closed-over values holds them too, read-only. Scopes are named
  weakly (``ties.LINK``), except the tie sources packed: nothing else holds
  them, so the first ``held`` roots (those the transform holds) hold them.
  """
  roots = tuple(inner_scopes)
  weak = tuple(map(weakref.ref, roots))
  holding = weak[:held] + roots[held:]
  packed = tuple(map(weakref.ref, packed))
  for k, (outer, inner, (rngs_only, closure)) in enumerate(
      zip(outer_scopes, roots, kinds)):
    lift = _lift(outer)
    closure = closure or (lift.closure if lift else None)
    inner.flags = outer.flags  # (without_borrowed packs a copy without ties)
    inner.__dict__[LINK] = (weakref.ref(outer), holding if k < held else weak,
                            name, packed, rngs_only, closure)
    if closure:
      inner.mutable = False


class Packed:
  """What ``lift._partial_pack`` packs beyond its scopes, when ties cross it.

  When a lifted scope contains a tied target whose source lies outside every
  lifted scope, the source's scope is packed as well, as the transform
  declares in ``tie_sources`` (:func:`lifted_sources`); inside, the target
  resolves to the inner source, so reads, writes and gradients reach the one
  stored variable. ``scopes`` is what ``_partial_pack`` packs in place of its
  scope tree; :meth:`wrap` makes its ``scope_fn`` and ``repack_fn`` take and
  give the scope tree it was given, so the extra scopes stay out of the
  transform's sight.
  """

  def __init__(self, scopes, treedef, name, tie_sources, met=None, call=None):
    self.treedef = treedef
    for scope in scopes:  # what the scope sees from outside its root, too
      for col in visible_collections(scope) - set(scope.root._variables):
        scope._collection(col)
    # Ties met inside at an earlier trace count as ties in force here.
    met_here = met.ties.get(tuple(s.path for s in scopes), {}) if met else {}
    inside = [_ties_inside(s) + [(t, c) for t, c in met_here
                                 if is_within(t.target, s.path)]
              for s in scopes]
    self.extra = extra = lifted_sources(scopes, name, tie_sources, inside,
                                        met_here, call)
    # Sources scanned over (in_scan='scanned'): their indices among the scopes.
    self.stacked = [len(scopes) + i for i, e in enumerate(extra) if e.scanned]
    self.call = call
    lifted = scopes + [e.real for e in extra if not e.rngs_only]
    self.packed = [without_borrowed(s, lifted, ties)
                   for s, ties in zip(scopes, inside)]
    self.scopes = [s for s, _ in self.packed] + [e.packed for e in extra]
    self.reals = scopes + [e.real for e in extra]
    self.kinds = [(False, None)] * len(scopes) + [
        (e.rngs_only, e.closure) for e in extra]
    self.name, self.outer = name, scopes
    # A transform that reuses its trace keys it on the variables' tree: the
    # ties inside, views included, are part of what the trace computes, as
    # are the rng counters of the sources lifted (as of a module passed in).
    self.key = (met and met.generation, *(
        tuple((tie.target[len(s.path):], col, tie.view, tie.in_scan)
              for tie, col in ties)
        for s, ties in zip(scopes, inside)
    ), *(tuple(flatten(e.real.rng_counters)) for e in extra)
    ) if tie_sources is not None and tie_sources.caches_trace else None

  def keyed(self, variable_groups):
    """``variable_groups`` as the transform takes them.

    A source scanned over is broadcast to the scan's length, along each
    scanned group's axis (the scan slices it back; the broadcast's transpose
    sums its gradient); where the trace is reused, the groups are keyed by
    the ties inside.
    """
    call, self.call = self.call, None  # read once: the call's record dies here
    if self.stacked:
      variable_groups = _stacked(variable_groups, self.stacked, call)
    return (_Keyed(variable_groups, self.key) if self.key and any(self.key)
            else variable_groups)

  def wrap(self, scope_fn, repack_fn, publish_fn):
    """``pack``'s three functions of the scopes packed, for the given tree;
    what a reused trace learned at ``init`` (``ties.learned``: uses, targets
    run first, checks deferred) leaves it in its output's tree, with the
    scopes' paths it was traced at: each call records it at its own, and
    advances the sources' rng counters as Flax advances its scopes' (0.10.2)."""
    reals, treedef, extra = self.reals, self.treedef, self.extra
    old = [dict(flatten(e.real.rng_counters)) for e in extra]  # (the call's)
    n = treedef.num_leaves
    before = [set(), set(), set()]  # the init's records when a trace starts
    # A target initializing its copy draws from a fresh params counter of its
    # source's streams (ties.share_rngs); each branch of cond/switch builds
    # its inner scopes anew and must draw what the first one draws.
    counters = []
    for s in reals:
      found = in_force(s)
      counters.append(counters_now(s.rng_counters) if found is not None
                      and found.log is not None  # initializing
                      and s.path in found.forms['params'].at else None)
    calls = []

    def tied_scope_fn(variable_groups, *args, **kwargs):
      if isinstance(variable_groups, _Keyed):
        variable_groups = variable_groups.groups
      inner = scope_fn(variable_groups, *args, **kwargs)
      _link(reals, inner, self.name, self.outer, self.kinds, n)
      before[:] = map(set, _learned(self.outer[0]))
      for start, inner_scope in zip(counters, inner):
        if calls and start is not None:
          inner_scope.rng_counters = counters_now(start)
      calls.append(None)
      for (_, excluded), inner_scope in zip(self.packed, inner):
        for col in excluded:  # reach the inner source now, as pack would
          inner_scope._collection(col)
      return treedef.unflatten(inner[:n])

    def tied_repack_fn(inner_scope_tree):
      inner = list(treedef.flatten_up_to(inner_scope_tree))
      lift = _lift(inner[0]) if inner else None
      if lift is not None:
        inner += lift.siblings[len(inner):]
      # Only an inner target whose source was lifted beside it can hold the
      # source's very collections (without_borrowed, or resolved inside).
      for inner_scope in inner if extra else ():
        for col in _borrowed(inner_scope):  # its source repacks them
          del inner_scope._variables[col]
      out, paths = repack_fn(inner), tuple(s.path for s in self.outer)
      facts = tuple(frozenset(
          (t, c) for t, c in now - was if any(is_within(
              getattr(t, 'target', t), p) for p in paths))  # (a path, a Tie)
                    for now, was in zip(_learned(self.outer[0]), before))
      drawn = tuple(tuple((p, c - was.get(p, 0)) for p, c in flatten(
          e.real.rng_counters)) for e, was in zip(extra, old))
      return _Keyed(out, (paths, facts, drawn)) if self.key else out

    def tied_publish_fn(out):
      if isinstance(out, _Keyed):
        (traced, facts, drawn), out = out.key, out.groups
        rebase = tuple(zip(traced, (s.path for s in self.outer)))
        for now, new in zip(_learned(self.outer[0]), facts):
          now.update((_moved(rebase, t), c) for t, c in new)
        for e, was, counts in zip(extra, old, drawn):  # (traced: the same)
          getattr(flax_lift, 'set_from_dict', lambda *_: None)(
              e.real.rng_counters, traverse_util.unflatten_dict(
                  {p: was.get(p, 0) + c for p, c in counts}))
      return publish_fn(out)

    return tied_scope_fn, tied_repack_fn, tied_publish_fn


def _moved(rebase, x):
  """Path or tie ``x`` with what lies in a scope moved: ``(old, new)`` paths."""
  if not isinstance(x, tuple):  # a Tie: its target, source and declaration
    return dataclasses.replace(x, **{f: _moved(rebase, getattr(x, f)) for f in (
        'target', 'source', 'declared_at')})
  return next((new + x[len(old):] for old, new in rebase
               if is_within(x, old)), x)


def _stacked(variable_groups, indices, call: ScanCall):
  """Scan's ``variable_groups``, the scopes at ``indices`` broadcast.

  Scan's groups are ``(broadcast, carry, *scanned)``, the scanned ones in
  the order of ``variable_axes``; each group holds one entry per scope.
  """
  length, _, _, axes, metadata_params = call.stacking
  if length is None:
    return variable_groups  # scan raises its own error on its length
  groups = list(variable_groups)
  for k, axis in enumerate(axes.values()):
    group = list(groups[2 + k])
    for i in indices:
      group[i] = {col: meta.add_axis(jax.tree_util.tree_map(
          lambda x, a=axis: _broadcast(x, a, length), tree), axis,
                                     metadata_params)
                  for col, tree in group[i].items()}
    groups[2 + k] = tuple(group)
  return tuple(groups)


def _broadcast(x, axis: int, length: int):
  """``length`` copies of ``x`` along a new ``axis`` (no copy is made)."""
  x = jnp.expand_dims(x, axis)
  shape = list(x.shape)
  shape[axis] = length
  return jnp.broadcast_to(x, shape)


@jax.tree_util.register_pytree_node_class
class _Keyed:
  """Variable groups whose tree carries a key (``nn.jit`` keys on the tree)."""

  def __init__(self, groups, key):
    self.groups, self.key = groups, key

  def tree_flatten(self):
    return (self.groups,), self.key

  @classmethod
  def tree_unflatten(cls, key, children):
    return cls(children[0], key)


def packed(scope_tree, name=None, tie_sources=None,
           call: ScanCall | None = None) -> Packed | None:
  """What ``lift._partial_pack`` packs for ties crossing it, or None.

  None where no scope of ``scope_tree`` has ties in force, and no earlier
  trace of a transform that reuses it met a tie declared inside (its
  :class:`~flax_tieext.core.ties.PackSite` keeps them): Flax's own packing
  (whose inner roots ``ties.linked`` records).
  """
  scopes, treedef = jax.tree_util.tree_flatten(scope_tree)
  met = name.met if isinstance(name, PackSite) else None
  if met is None and not any(TIES_FLAG in s.flags for s in scopes):
    return None
  return Packed(scopes, treedef, name, tie_sources, met, call)
