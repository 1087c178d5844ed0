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

"""Ties as declared: paths, :class:`Tie` records, views, and their checks.

What ``lift.tie`` is given (a mapping from target path to source path, or to
``(source path, view_fn)``) becomes a tuple of :class:`Tie` records with
absolute paths here, before any scope is involved, and :func:`compose` states
what a set of ties means together (their normal form), which :class:`InForce`
keeps for the ties in force at a scope, indexed by path (:class:`Form`). The
mechanism that makes a tie hold inside scopes and lifted transforms is
``flax_tieext.core.ties``; the conversion of variable trees between the tied and
untied layouts is ``flax_tieext.core.tie_convert``; the messages are
``flax_tieext.core.tie_errors``. They use the helpers below for paths and views
of partitioned values.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax.core import meta
from flax_tieext.core import tie_errors
from flax_tieext.core.tie_errors import Path, text


@dataclasses.dataclass(frozen=True)
class Tie:
  """One tie, as declared (paths are absolute). Immutable.

  Linen's ties (``sep='/'``) tie modules or variables in ``collections``;
  NNX's (``sep='.'``, ``collections=None``) tie one Variable to another,
  paths from the tied module, written as NNX writes attribute paths.
  """

  target: Path
  source: Path
  collections: Any  # a hashable collection filter
  view: Callable[[Any], Any] | None
  declared_at: Path
  # In a normal form: the tie as declared that this one resolves (or is
  # implied by), which :func:`compose` composes again with other ties.
  raw: Tie | None = dataclasses.field(default=None, repr=False)
  sep: str = '/'  # how the user writes its paths: '/' (Linen) or '.' (NNX)
  # The mapping the tie was declared in (``given``'s items), named where a
  # union of declarations is invalid. No part of the tie's meaning.
  declared_in: tuple = dataclasses.field(default=(), repr=False, compare=False)
  # How the source enters an ``nn.scan`` around the target: one of IN_SCAN,
  # or None (chosen per scan call: ``tie_lift.lifted_sources``).
  in_scan: str | None = None

  def text(self, path: Path) -> str:
    return text(path, self.sep)

  def applies_to(self, col: str) -> bool:
    return in_filter(self.collections, col)

  def describe(self, col: str | None = None) -> str:
    viewed = ' (viewed)' if self.view is not None else ''
    tie = f'tie {self.text(self.target)} -> {self.text(self.source)}{viewed}'
    if self.collections is None:  # NNX: a Variable's type is its collection
      return tie
    names = named_collections(self.collections)
    cols = (f'in collection {col!r}' if col is not None else
            f'for collection {names[0]!r}' if len(names) == 1 else
            f'for collections {", ".join(map(repr, names))}' if names else
            'for all collections' if self.collections is True else
            f'for collections {self.collections!r}')
    return f'{tie} {cols}, declared at {text(self.declared_at)}'


def in_filter(f, col: str) -> bool:
  """Flax's ``scope.in_filter``; the usual filters (names) are checked here."""
  if isinstance(f, tuple):  # what lift._hashable_filter makes of names
    return col in f
  if isinstance(f, str):
    return f == col
  from flax.core import scope  # pylint: disable=g-import-not-at-top
  return scope.in_filter(f, col)


def is_within(path: Path, prefix: Path) -> bool:
  return path[: len(prefix)] == prefix


def _parse_path(path: Any, decl: Path, what: str, sep: str = '/') -> Path:
  """``path`` as an absolute path.

  Linen's (``sep='/'``) is relative to ``decl``; NNX's (``sep='.'``,
  ``'head.kernel'`` or ``('layers', 0, 'kernel')``) starts at the tied module.
  """
  if isinstance(path, str):
    parts = path.split(sep)
  elif sep != '/' and isinstance(path, tuple) and all(
      isinstance(p, (str, int)) for p in path):
    parts = [str(p) for p in path]
  else:
    raise tie_errors.path_not_a_str(what, decl, path, sep)
  out = [] if isinstance(path, str) and path.startswith('/') else list(decl)
  for part in parts:
    if part == '..':
      if not out:
        raise tie_errors.above_root(what, path, decl, sep)
      out.pop()
    elif part not in ('', '.'):
      out.append(part)
  return tuple(out)


def normalize(ties: Mapping[str, Any], collections: Any,
              declared_at: Path, sep: str = '/') -> tuple[Tie, ...]:
  """Resolves user-written ties declared at ``declared_at`` to :class:`Tie`s.

  ``sep`` is how the paths are written: ``'/'`` in Linen, ``'.'`` in NNX
  (with ``collections=None``).

  The paths become absolute (:func:`absolute`), then the mapping is put in
  normal form (:func:`compose`): chains (``a -> b``, ``b -> c``) resolve to
  their end (``a -> c``); self-ties, cycles, two sources for one target and
  ties between a module and its own ancestor are refused.
  """
  return compose(absolute(ties, collections, declared_at, sep))


def absolute(ties: Mapping[str, Any], collections: Any,
             declared_at: Path, sep: str = '/',
             in_scan: str | None = None) -> tuple[Tie, ...]:
  """The ties as declared, with absolute paths: what a scope puts in force.

  Self-ties and two spellings of one target are refused here. The rest is
  the normal form's of the ties in force where they are declared: a mapping
  invalid alone may be part of a valid union (stacked ``nn.tie`` classes).
  """
  key = (given(ties, sep=sep), tuple(collections) if isinstance(
      collections, list) else collections, tuple(declared_at), sep, in_scan)
  try:
    return _normalized(*key)
  except TypeError:  # an unhashable spec or filter: not memoized
    return _normalized.__wrapped__(*key)


def given(ties: Mapping[Any, Any], api: str = 'lift.tie',
          sep: str = '/') -> tuple:
  """``ties.items()`` as ``api`` takes them, checked, and hashable.

  Checked before anything is cached by them: ``ties`` must be a mapping, and
  a view (``(source, view_fn)``) callable. A view that cannot be hashed (a
  dataclass with ``__call__``) is keyed by identity (:class:`ByIdentity`):
  a tie is part of the keys of ``nn.jit``'s traces and of the tie caches.

  Raises:
    TieError: naming the argument or the tie, and what to pass.
  """
  if not isinstance(ties, Mapping):
    raise tie_errors.not_a_mapping(ties, api)
  items = []
  for target, spec in ties.items():
    if isinstance(spec, tuple) and len(spec) == 2 and not (
        sep != '/' and isinstance(spec[1], (str, int))):  # (NNX: keys)
      if not callable(spec[1]):
        raise tie_errors.bad_source_spec(target, spec, api=api)
      try:
        hash(spec[1])
      except TypeError:
        spec = (spec[0], ByIdentity(spec[1]))
    items.append((target, spec))
  return tuple(items)


# How a tie source outside an ``nn.scan`` enters it (``lift.tie``'s
# ``in_scan``): as a loop invariant the scan closes over, or broadcast to the
# stack's length before the scan and scanned over like the stack's own. None
# (the default) chooses at each scan call (``tie_lift.lifted_sources``).
IN_SCAN = ('broadcast', 'scanned')


def collections_given(collections: Any, api: str = 'lift.tie') -> Any:
  """``collections`` as ``api`` takes it, checked: a Flax collection filter."""
  from flax.core.scope import DenyList  # pylint: disable=g-import-not-at-top
  f = collections.deny if isinstance(collections, DenyList) else collections
  if not isinstance(f, (str, bool)) and not (
      isinstance(f, Collection) and all(isinstance(c, str) for c in f)):
    raise tie_errors.bad_argument(
        api, 'collections', collections, "a collection filter: a name"
        " ('params'), a list of names (['params', 'batch_stats']), True (all)"
        " or nn.DenyList(filter)")
  return collections


def in_scan_given(in_scan: Any, api: str = 'lift.tie') -> str | None:
  """``in_scan`` as ``api`` takes it, checked (None or one of :data:`IN_SCAN`)."""
  if in_scan is not None and (not isinstance(in_scan, str) or in_scan not in IN_SCAN):
    raise tie_errors.bad_in_scan(in_scan, api, IN_SCAN)
  return in_scan


class ByIdentity:
  """A view that cannot be hashed, as a key: the one object, kept alive here.

  Equal only to a key of the same object, so a trace or a class keyed by it
  is reused only for that very view (two equal views give two keys, never one
  key for two different computations).
  """

  __slots__ = ('fn', '__weakref__')

  def __init__(self, fn: Callable[[Any], Any]):
    self.fn = fn

  def __call__(self, x):
    return self.fn(x)

  def __eq__(self, other):
    return isinstance(other, ByIdentity) and other.fn is self.fn

  def __hash__(self):
    return id(self.fn)

  def __repr__(self):
    return repr(self.fn)


@functools.lru_cache(maxsize=1024)
def _normalized(items, collections, declared_at: Path,
                sep: str, in_scan: str | None) -> tuple[Tie, ...]:
  """:func:`absolute` of ``ties.items()``; the same ties give the same records.

  Memoized: a module declares its ties each time it is bound (every ``init``,
  ``apply``, clone), and one declaration should cost one lookup, not a pass
  over all of its ties (:func:`compose` is memoized too).
  """
  from flax.core import lift  # pylint: disable=g-import-not-at-top
  col_filter = lift._hashable_filter(collections)  # pylint: disable=protected-access
  raw: dict[Path, tuple[Path, Any, str]] = {}
  for target_text, spec in items:
    view = None
    if isinstance(spec, tuple) and len(spec) == 2 and callable(spec[1]):
      spec, view = spec
    elif isinstance(spec, tuple) and sep == '/':  # (NNX: a path of keys)
      raise tie_errors.bad_source_spec(target_text, spec, declared_at)
    target = _parse_path(target_text, declared_at, 'target', sep)
    source = _parse_path(spec, declared_at, 'source', sep)
    if target in raw and raw[target][:2] != (source, view):
      raise tie_errors.spelled_twice(raw[target][2], target_text, declared_at,
                                     target, raw[target], (source, view), sep)
    if target == source:
      raise tie_errors.self_tie(target_text, spec, declared_at, target, sep)
    raw[target] = (source, view, target_text)
  return tuple(
      Tie(target, source, col_filter, view, tuple(declared_at), sep=sep,
          declared_in=items, in_scan=in_scan)
      for target, (source, view, _) in raw.items())


@functools.lru_cache(maxsize=1024)
def compose(ties: tuple[Tie, ...]) -> tuple[Tie, ...]:
  """The normal form of a set of ties: each target mapped to its stored path.

  The one rule for every set of ties in force at a scope (one mapping,
  stacked declarations, ties of an ancestor and of a submodule's class,
  module and variable ties alike), whatever the order of keys or
  declarations:

  * a path resolves through the tie whose target is its longest prefix
    (``b/d`` under a tie ``b -> c`` is ``c/d``), repeatedly: chains collapse
    to their final source, and their views compose;
  * a chain that comes back to a path it passed, or into it (``a -> b/x``,
    ``b -> a/y``), is a cycle (``TieError`` naming it): passing through one
    tie at two paths (``a/p`` and ``a/q``) is not; a target at or inside its
    own final source, or around it, is refused;
  * a target has one final source: two ties of one target whose chains end
    at different sources, or a target inside another target whose source
    gives it another final source, are a ``TieError`` naming the target and
    both sources (a tie that agrees with its ancestor's is kept, for its
    target's checks). A tie declared by the target module itself (inside the
    outer target) is its own: it is followed first, as the tie of the longest
    prefix;
  * a target whose source holds tied paths holds them tied alike (``c -> b``
    with ``b/d -> a/d`` gives ``c/d -> a/d``).

  A tie of a normal form stands for the tie as declared that it comes from
  (``raw``), so normal forms stacked mean what their ties in one mapping
  mean.

  Returns the resolved ties, one per target, sorted by target: ``source`` is
  the final source (a path no tie names), ``view`` the composed view.
  """
  declared = {id(t.raw or t): t.raw or t for t in ties}.values()
  by_target: dict[Path, Tie] = {}
  others = []  # more ties of a target in by_target: their chains must agree
  for tie in sorted(declared, key=lambda t: (t.target, t.source,
                                           t.declared_at)):
    if is_within(tie.target, tie.source) or is_within(tie.source, tie.target):
      inner, outer = ((tie.target, tie.source) if len(tie.target)
                      > len(tie.source) else (tie.source, tie.target))
      raise tie_errors.ancestor(tie, inner, outer)
    known = by_target.setdefault(tie.target, tie)
    if (known.source, known.view, known.in_scan) != (
        tie.source, tie.view, tie.in_scan):
      others.append(tie)

  owner = Form(tuple(by_target.values())).covering  # (the longest prefix)

  def follow(tie: Tie, under: Path = ()):
    """``(final path, view)`` of ``tie.target + under``, through ``tie``."""
    steps = [(tie, under)]  # each tie followed, and the path below its target
    path, view = tie.source + under, tie.view
    while (next_tie := owner(path)) is not None:
      rest = path[len(next_tie.target):]
      low = len(rest)
      for k in range(len(steps) - 1, -1, -1):
        # Back at a path it passed (or inside it), the part below that path
        # untouched since: the same ties lead there again, without end.
        before = steps[k][1]
        if steps[k][0].target == next_tie.target and low >= len(before):
          paths = [t.target + r for t, r in steps[k:]] + [path]
          raise tie_errors.cycle([t for t, _ in steps[k:]],
                                 [p[:len(p) - len(before)] for p in paths])
        low = min(low, len(before))
      steps.append((next_tie, rest))
      path = next_tie.source + rest
      if next_tie.view is not None:
        view = next_tie.view if view is None else _compose(view, next_tie.view)
    return path, view

  resolved: dict[Path, Tie] = {}
  for target, tie in by_target.items():
    source, view = follow(tie)
    if is_within(target, source) or is_within(source, target):
      raise tie_errors.ancestor(tie, target, source)
    outer = owner(target[:-1])
    if outer is not None and not is_within(tie.declared_at, outer.target):
      # Inside another target, declared outside it: it must agree.
      implied = follow(outer, target[len(outer.target):])
      if implied != (source, view):
        raise tie_errors.two_sources(target, (source, tie),
                                     (implied[0], outer))
    resolved[target] = dataclasses.replace(tie, source=source, view=view,
                                           raw=tie)
  for tie in others:  # (in two declarations): both chains end at one path
    known = resolved[tie.target]
    found = follow(tie)
    if found != (known.source, known.view):
      raise tie_errors.two_sources(tie.target, (known.source, known.raw),
                                   (found[0], tie))
    if tie.in_scan != known.in_scan:
      raise tie_errors.two_in_scans(known.raw, tie)

  # A target holds the tied paths of its source tied alike.
  for _ in range(len(resolved) + 1):
    below = Form(tuple(resolved.values())).below
    implied = {}
    for tie in resolved.values():
      for inner in below.get(tie.source, ()):
        target = tie.target + inner.target[len(tie.source):]
        if target not in resolved:
          view = (inner.view if tie.view is None else tie.view if inner.view
                  is None else _compose(tie.view, inner.view))
          implied[target] = dataclasses.replace(
              tie, target=target, source=inner.source, view=view)
    if not implied:
      break
    resolved.update(implied)
  return tuple(resolved[t] for t in sorted(resolved))


@dataclasses.dataclass(frozen=True)
class _Composed:
  """Views, applied innermost first: equal where views and order are."""

  views: tuple[Callable[[Any], Any], ...]

  def __call__(self, x):
    for view in reversed(self.views):
      x = view(x)
    return x


def _compose(outer, inner) -> _Composed:
  views = lambda f: f.views if isinstance(f, _Composed) else (f,)
  return _Composed(views(outer) + views(inner))


class Form:
  """The normal form of the ties in force for one collection, indexed by path.

  Attributes:
    at: target path -> resolved tie (its final source).
    named: module path -> {name: tie} of the targets directly below it.
    below: path -> the ties whose target lies strictly below it.
  """

  def __init__(self, ties: tuple[Tie, ...]):
    self.at = {t.target: t for t in ties}
    self.named: dict[Path, dict[str, Tie]] = {}
    self.below: dict[Path, list[Tie]] = {}
    for tie in ties:
      self.named.setdefault(tie.target[:-1], {})[tie.target[-1]] = tie
      for end in range(len(tie.target)):
        self.below.setdefault(tie.target[:end], []).append(tie)

  def covering(self, path: Path) -> Tie | None:
    """The tie whose target is ``path`` or its nearest ancestor."""
    for end in range(len(path), 0, -1):
      tie = self.at.get(path[:end])
      if tie is not None:
        return tie
    return None


class Forms(dict):
  """Collection -> the :class:`Form` of ``declared``, derived on first use.

  A conflict among the ties of a collection raises when its form is derived.
  """

  def __init__(self, declared: tuple[Tie, ...]):
    super().__init__()
    self.declared = declared

  def __missing__(self, col: str) -> Form:
    found = self[col] = Form(compose(tuple(
        t for t in self.declared if t.applies_to(col))))
    return found


class InForce:
  """The ties declared at a scope and its ancestors, as a scope keeps them.

  Compared and hashed by the declarations alone: ``nn.jit`` keys its trace
  on a scope's flags, where the ties are kept, so what a call derives and
  learns (the normal forms, the init log) must not make a new key. Not a
  dataclass, which Flax's fingerprint would take apart field by field.

  Attributes:
    declared: the ties, as declared.
    forms: collection -> :class:`Form` of ``declared``, derived on first use
      (:class:`Forms`).
    log: while initializing, what this init learns (shared by every scope of
      it); None outside an init.
  """

  def __init__(self, declared: tuple[Tie, ...], forms: Forms | None = None,
               log: Any = None):
    self.declared = declared
    self.forms = Forms(declared) if forms is None else forms
    self.log = log

  def __eq__(self, other):
    return isinstance(other, InForce) and self.declared == other.declared

  def __hash__(self):
    return hash(self.declared)

  def __repr__(self):
    return f'InForce({self.declared!r})'

  def check(self, added: tuple[Tie, ...]):
    """Derives the forms ``added`` takes part in: a conflict raises here."""
    for f in {t.collections for t in added}:
      for col in (*named_collections(f), 'params'):
        if in_filter(f, col):
          self.forms[col]  # pylint: disable=pointless-statement

  @functools.cached_property
  def named_collections(self) -> dict[str, Tie]:
    """Each collection a declaration names -> the first tie naming it."""
    found = {}
    for tie in self.declared:
      for col in named_collections(tie.collections):
        found.setdefault(col, tie)
    return found


def named_collections(f) -> tuple[str, ...]:
  """The collections a filter names (none for ``True``, a deny list, ...)."""
  if isinstance(f, str):
    return (f,)
  if isinstance(f, tuple) and all([isinstance(x, str) for x in f]):
    return f
  return ()


def walk(node, names):
  for name in names:
    if not isinstance(node, Mapping) or name not in node:
      return None
    node = node[name]
  return node


def flatten(tree, prefix=()) -> list[tuple[Path, Any]]:
  """``[(path, leaf)]`` of a nested mapping (one call per mapping)."""
  if not isinstance(tree, Mapping):
    return [(prefix, tree)]
  out = []
  for k, v in tree.items():
    if type(v) is dict or isinstance(v, Mapping):  # (a dict without a call)
      out += flatten(v, prefix + (k,))
    else:
      out.append((prefix + (k,), v))
  return out


def shape_dtype(x) -> tuple[tuple[int, ...], np.dtype]:
  """Shape and dtype of a leaf, read from its metadata (never its values)."""
  # A Python scalar (a counter's 0) has JAX's dtype for it: the dtype it has
  # once it crosses a transform (int32 without x64, not NumPy's int64).
  dtype = x.dtype if hasattr(x, 'dtype') else jax.dtypes.canonicalize_dtype(
      np.result_type(x))
  return tuple(np.shape(x)), np.dtype(dtype)


def check_like(tie: Tie, col: str, existing, value):
  """Raises unless ``value`` has the shapes and dtypes of ``existing``."""
  def specs(tree):
    return list(map(shape_dtype, jax.tree_util.tree_leaves(meta.unbox(tree))))
  if specs(existing) != specs(value):
    raise tie_errors.unlike(tie, col, specs(existing), specs(value))


is_box = meta.is_axis_metadata  # a boxed variable (nn.Partitioned, ...)


def apply_views(tie: Tie, tree):
  """``apply_view`` on each variable of ``tree``, the source's subtree."""
  def one(keys, x):
    return apply_view(tie, x, [str(getattr(k, 'key', k)) for k in keys])
  return jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_box)


def unbox(x):
  return x.unbox() if isinstance(x, meta.AxisMetadata) else x


def apply_view(tie: Tie, value, under=()):
  """``tie.view(value)``; on a partitioned box, the axis names follow the axes.

  A named axis lands on the one output axis whose size follows its size
  (``jax.eval_shape`` of the view with that axis made longer), or, for a
  view that only takes the stored shape or whose output does not show the
  axis's length (a slice), where its indices land.
  Raises a TieError, naming the variable (``under`` is its path below a
  module tie's source), when the view moves a named axis in a way that
  cannot be followed (e.g. a reshape), rather than keep names that no longer
  fit.
  """
  if tie.view is None or not is_box(value):
    return value if tie.view is None else tie.view(value)
  array = value.unbox()
  names = getattr(value, 'names', None)
  if names is None or all(n is None for n in names):
    return value.replace_boxed(tie.view(array))
  seen = jax.eval_shape(tie.view, array).shape
  out = [None] * len(seen)
  for axis, name in enumerate(names):
    if name is not None:
      at = _lands(tie.view, array, axis, seen)
      if at is None or out[at] is not None:
        raise tie_errors.view_loses_axis(tie, name, tie.source + tuple(under))
      out[at] = name
  return dataclasses.replace(value, value=tie.view(array), names=tuple(out))


def _lands(view, array, axis: int, seen) -> int | None:
  """The output axis of ``view`` that ``axis`` of ``array`` becomes, or None."""
  shape = np.shape(array)
  size = max((*shape, *seen)) + 1
  try:
    longer = jax.eval_shape(view, jax.ShapeDtypeStruct(
        shape[:axis] + (size,) + shape[axis + 1:], array.dtype)).shape
  except Exception:  # pylint: disable=broad-except
    return _probed(view, shape, axis)  # a view of the stored shape only
  hits = [i for i, (a, b) in enumerate(zip(seen, longer)) if a != b]
  if not hits:  # its length does not show (a slice): where its indices land
    return _probed(view, shape, axis)
  if len(longer) == len(seen) and len(hits) == 1 and (
      longer[hits[0]] == size and seen[hits[0]] == shape[axis]):
    return hits[0]
  return None


def _probed(view, shape, axis: int) -> int | None:
  """Where an index along ``axis`` lands, the view applied to JAX arrays.

  The one output axis that the index varies along, each index at most once
  (the axis permuted, sliced, flipped or gathered; a reshape repeats them).
  """
  with jax.ensure_compile_time_eval():
    index = jnp.arange(shape[axis]).reshape(
        [-1 if i == axis else 1 for i in range(len(shape))])
    moved = jnp.asarray(view(jnp.broadcast_to(index, shape)))
    hits = []
    for i in range(moved.ndim):
      line = moved[tuple(slice(None) if j == i else slice(0, 1)
                         for j in range(moved.ndim))]
      if moved.shape[i] > 1 and bool(
          jnp.array_equal(moved, jnp.broadcast_to(line, moved.shape))) and (
              jnp.unique(line).size == line.size):
        hits.append(i)
  return hits[0] if len(hits) == 1 else None
