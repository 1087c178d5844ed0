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
absolute paths here, before any scope is involved. The mechanism that makes a
tie hold inside scopes and lifted transforms is ``flax.core.ties``; the
conversion of variable trees between the tied and untied layouts is
``flax.core.tie_convert``. Both use the helpers below for paths, views of
partitioned values, and error messages.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from flax.core import meta
from flax_tieext.errors import TieError

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Tie:
  """One tie, as recorded in scope flags (paths are absolute)."""

  target: Path
  source: Path
  collections: Any  # a hashable collection filter
  view: Callable[[Any], Any] | None
  declared_at: Path
  used: set = dataclasses.field(default_factory=set, compare=False,
                                repr=False)  # collections read across a lift

  def applies_to(self, col: str) -> bool:
    return in_filter(self.collections, col)

  def describe(self, col: str | None = None) -> str:
    viewed = ' (viewed)' if self.view is not None else ''
    names = named_collections(self.collections)
    cols = (f'in collection {col!r}' if col is not None else
            f'for collection {names[0]!r}' if len(names) == 1 else
            f'for collections {", ".join(map(repr, names))}' if names else
            'for all collections' if self.collections is True else
            f'for collections {self.collections!r}')
    return (f'tie {text(self.target)} -> {text(self.source)}{viewed} {cols},'
            f' declared at {text(self.declared_at)}')


def in_filter(f, col: str) -> bool:
  from flax.core import scope  # pylint: disable=g-import-not-at-top
  return scope.in_filter(f, col)


def text(path) -> str:
  return '/' + '/'.join(path)


def is_within(path: Path, prefix: Path) -> bool:
  return path[: len(prefix)] == prefix


def tie_error(what: str, *options: str) -> TieError:
  """A TieError: what happened, then numbered options (only those that apply)."""
  options = [o for o in options if o]
  if len(options) == 1:
    return TieError(f'{what}\n\nTo fix it: {options[0]}')
  listed = ''.join(f'\n  {i}. {o}' for i, o in enumerate(options, 1))
  return TieError(f'{what}\n\nOptions:{listed}' if options else what)


def nearest(tree: Mapping[str, Any], path: Path, base: Path = ()) -> str:
  """Names that exist where ``path`` stops matching ``tree``, nearest first."""
  node, depth = tree, 0
  for name in path:
    if not isinstance(node, Mapping) or name not in node:
      break
    node, depth = node[name], depth + 1
  if depth == len(path):
    return ''
  names = sorted(node) if isinstance(node, Mapping) else []
  near = difflib.get_close_matches(path[depth], names, n=3, cutoff=0.5)
  where = text(base + path[:depth])
  dotted = path[depth].split('.')
  if len(dotted) > 1 and all(dotted):
    return (f' Paths are "/"-separated: for {path[depth]!r} write'
            f' {"/".join(dotted)!r}.')
  if near:
    return f' Nearest existing names under {where}: {", ".join(near)}.'
  return f' Names that exist under {where}: {", ".join(names) or "none"}.'


def _parse_path(path: Any, decl: Path, what: str) -> Path:
  if not isinstance(path, str):
    raise TieError(
        f'The {what} path of a tie declared at {text(decl)} must be a str, got'
        f' {type(path).__name__} {path!r}. Write paths as "/"-separated module'
        ' names, e.g. "block_1/attn", "head/kernel", "." or "/encoder/embed".')
  out = [] if path.startswith('/') else list(decl)
  for part in path.split('/'):
    if part == '..':
      if not out:
        raise TieError(f'The {what} path {path!r} of a tie declared at'
                       f' {text(decl)} goes above the root module.')
      out.pop()
    elif part not in ('', '.'):
      out.append(part)
  return tuple(out)


def normalize(ties: Mapping[str, Any], collections: Any,
              declared_at: Path) -> tuple[Tie, ...]:
  """Resolves user-written ties declared at ``declared_at`` to :class:`Tie`s.

  Chains (``a -> b``, ``b -> c``) resolve to their end (``a -> c``); self-ties,
  cycles and ties between a module and its own ancestor are refused.
  """
  from flax.core import lift  # pylint: disable=g-import-not-at-top
  if not isinstance(ties, Mapping):
    raise TieError('ties must be a mapping from target path to source path'
                   f' (or to (source path, view_fn)), got {type(ties).__name__}.')
  raw: dict[Path, tuple[Path, Any, str]] = {}
  for target_text, spec in ties.items():
    view = None
    if isinstance(spec, tuple):
      if len(spec) != 2 or not callable(spec[1]):
        raise TieError(
            f'The source of tie {target_text!r} (declared at'
            f' {text(declared_at)}) must be a path, or a (path, view_fn)'
            f' pair, got {spec!r}.')
      spec, view = spec
    target = _parse_path(target_text, declared_at, 'target')
    source = _parse_path(spec, declared_at, 'source')
    if target in raw and raw[target][:2] != (source, view):
      differ = (f'different sources ({text(raw[target][0])} and'
                f' {text(source)})' if raw[target][0] != source else
                f'the source {text(source)} with different views')
      raise TieError(
          f'Ties {raw[target][2]!r} and {target_text!r} declared at'
          f' {text(declared_at)} both name {text(target)}, with {differ}. A'
          ' target has one source: keep one of them.')
    if target == source:
      raise TieError(
          f'Tie {target_text!r} -> {spec!r} declared at {text(declared_at)}'
          f' ties {text(target)} to itself. A tie needs two distinct paths:'
          ' remove it, or name the module whose variables should be shared.')
    raw[target] = (source, view, target_text)
  resolved = []
  for target, (source, view, target_text) in raw.items():
    seen = [target]
    while source in raw:
      if source in seen:
        raise TieError(
            f'The ties declared at {text(declared_at)} form a cycle: '
            + ' -> '.join(text(p) for p in seen + [source])
            + '. Every chain of ties must end at a stored path: pick one of'
            ' them as the source and tie the others to it.')
      seen.append(source)
      source, next_view, _ = raw[source]
      if next_view is not None:
        view = next_view if view is None else _compose(view, next_view)
    for a, b in ((target, source), (source, target)):
      if is_within(a, b):
        raise TieError(
            f'Tie {target_text!r} declared at {text(declared_at)}: {text(a)}'
            f' lies inside {text(b)}. A module cannot share the variables of'
            ' its own ancestor or descendant; tie two sibling paths instead.')
    resolved.append(Tie(target, source, lift._hashable_filter(collections),  # pylint: disable=protected-access
                        view, tuple(declared_at)))
  return tuple(resolved)


def _compose(outer, inner):
  return lambda x: outer(inner(x))


def named_collections(f) -> tuple[str, ...]:
  if isinstance(f, str):
    return (f,)
  if isinstance(f, tuple) and all(isinstance(x, str) for x in f):
    return f
  return ()


def did_you_mean(name, names) -> str:
  near = difflib.get_close_matches(name, list(names), n=1)
  return f' Did you mean {near[0]!r}?' if near else ''


def walk(node, names):
  for name in names:
    if not isinstance(node, Mapping) or name not in node:
      return None
    node = node[name]
  return node


def flatten(tree, prefix=()):
  if isinstance(tree, Mapping):
    for k, v in tree.items():
      yield from flatten(v, prefix + (k,))
  else:
    yield prefix, tree


def check_like(tie: Tie, col: str, existing, value):
  """Raises unless ``value`` has the shapes and dtypes of ``existing``."""
  def specs(tree):
    return [(tuple(np.shape(x)), np.dtype(getattr(x, 'dtype', None)
                                          or np.result_type(x)))
            for x in jax.tree_util.tree_leaves(meta.unbox(tree))]
  if specs(existing) != specs(value):
    shapes = lambda t: ', '.join(f'{s}:{d}' for s, d in specs(t))
    raise tie_error(
        f'Shape or dtype mismatch in the {tie.describe(col)}: the source'
        f' {text(tie.source)} has {shapes(existing)}, but {text(tie.target)}'
        f' has {shapes(value)}. Tied paths must hold variables of the same'
        ' shape and dtype.',
        'Tie paths that hold variables of the same shape and dtype.',
        'Use a view_fn (e.g. jnp.transpose) for a derived shape.')


def is_box(x) -> bool:
  return isinstance(x, meta.AxisMetadata)


def unbox(x):
  return x.unbox() if is_box(x) else x


def apply_view(tie: Tie, value):
  """``tie.view(value)``; on a partitioned box, the axis names follow the axes.

  Raises a TieError when the view moves a named axis in a way that cannot be
  followed (e.g. a reshape), rather than keep names that no longer fit.
  """
  if tie.view is None or not is_box(value):
    return value if tie.view is None else tie.view(value)
  array = value.unbox()
  names = getattr(value, 'names', None)
  if names is None or all(n is None for n in names):
    return value.replace_boxed(tie.view(array))
  shape = np.shape(array)
  with jax.ensure_compile_time_eval():
    out = [None] * np.ndim(jax.eval_shape(tie.view, array))
    for axis, name in enumerate(names):
      if name is None:
        continue
      probe = np.arange(shape[axis]).reshape(
          [-1 if i == axis else 1 for i in range(len(shape))])
      moved = np.asarray(tie.view(np.broadcast_to(probe, shape)))
      hits = [i for i in range(moved.ndim) if moved.shape[i] == shape[axis]
              and np.array_equal(moved, np.broadcast_to(np.arange(
                  shape[axis]).reshape([-1 if j == i else 1
                                        for j in range(moved.ndim)]),
                  moved.shape))]
      if len(hits) != 1 or out[hits[0]] is not None:
        raise tie_error(
            f'The view of the {tie.describe()} moves the partitioned axis'
            f' {name!r} of {text(tie.source)} in a way whose axis names'
            ' cannot be followed.',
            'Use a view that permutes axes (e.g. jnp.transpose).',
            'Unbox the variables first (flax.linen.unbox).')
      out[hits[0]] = name
  return dataclasses.replace(value, value=tie.view(array), names=tuple(out))

