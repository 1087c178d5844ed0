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

"""Converting variable trees between the untied and the tied layout.

A tied model stores only the sources; an untied twin (a checkpoint from before
the tie, another library's layout) stores every target as well.
:func:`tie_variables` and :func:`untie_variables` convert between the two,
with the same ties that ``nn.tie`` / ``lift.tie`` take.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from flax.core.scope import CollectionFilter
from flax_tieext.core import tie_errors
from flax_tieext.core import tie_spec

_ABSENT = object()
_UNSTACKED = ((), (), 0, ())  # (paths, layers, at, names) of no stack
_MERGES = ('first', 'mean')


def tie_variables(
    variables: Mapping[str, Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
    stacks: Mapping[str, int] | None = None,
    merge: str | Callable[[Any, list[Any]], Any] | None = None,
) -> dict[str, Any]:
  """Turns an untied variable tree into the layout a tied model stores.

  Each target is removed after checking that it equals its source (through
  the view, for a viewed tie); a target inside a stack (``stacks``) must equal
  its source in every layer. A collection in which neither path of a tie
  holds anything is left alone. Paths are relative to the root module.

  A checkpoint trained untied has copies that differ. They are refused unless
  ``merge`` says what the source becomes: ``'first'`` keeps the source's
  values, ``'mean'`` stores the mean of the source and every copy (each layer
  of a stack is one copy), and a function ``merge(source, copies)`` returns
  the new source from the source's array and the list of copies, each shaped
  like the source (traced under ``jax.jit``). Only the leaves whose copies
  differ are merged. A viewed copy is never merged, as the view is not
  inverted: one that equals the view of the source is left out (it holds
  nothing the source does not), one that differs is refused.

  The arrays stay where they are: values are compared by jitted reductions
  whose scalar result is replicated, a merged source keeps the source's
  sharding, and nothing is gathered to the host, so arrays sharded over the
  processes of a ``jax.distributed`` job convert in place (every process
  calls ``tie_variables`` with its part of the same global arrays).

  Example::

    >>> import jax.numpy as jnp
    >>> from flax.core import tie_variables
    >>> untied = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.ones(2)}}}
    >>> tie_variables(untied, {'b': 'a'})
    {'params': {'a': {'w': Array([1., 1.], dtype=float32)}}}
    >>> trained = {'params': {'a': {'w': jnp.zeros(2)}, 'b': {'w': jnp.ones(2)}}}
    >>> tie_variables(trained, {'b': 'a'}, merge='mean')
    {'params': {'a': {'w': Array([0.5, 0.5], dtype=float32)}}}

  Args:
    variables: a variable dict, e.g. restored from a checkpoint of the untied
      model.
    ties: the ties, as given to ``nn.tie`` on the root module.
    collections: the tied collections (a collection filter).
    stacks: the paths of the model's stacks (``nn.scan`` / ``nn.vmap``
      modules with their variables along axis 0) mapped to their number of
      layers, e.g. ``{'encoder/layers': 12}``; nested stacks each one, the
      outer one's layers first (``{'ens': 2, 'ens/layers': 12}``). A target
      inside stacks that do not hold its source has one copy of the source
      per layer of each. A stack that is the target (or lies inside it) is
      scanned like its source: a plain copy of the source's stack.
    merge: what a source becomes when its copies differ: None (refuse),
      ``'first'``, ``'mean'`` or a function ``(source, copies) -> source``.

  Returns:
    A new variable dict without the targets.

  Raises:
    TieError: if a target is present but its source is not, a target differs
      from its source in kind (a module tied to a variable), shape, dtype or
      partitioning names, or in value (in any layer of a stack) while
      ``merge`` is None: tying would silently drop the target's values. Also
      if ``merge`` is ``'mean'`` or a function and a viewed copy differs from
      the view of its source, or a function returns another shape or dtype
      than the source's. Also if a path of ``stacks`` names no stack, or it
      gives a stack tied whole another count than its source's stack.
  """
  if merge is not None and not callable(merge) and merge not in _MERGES:
    raise tie_errors.bad_merge(merge, _MERGES)
  out = _given(variables, ties, collections, 'tie_variables')
  # Every stored target is checked in the tree as given, then removed (a
  # target may lie inside the source of another).
  found = [(tie, col, target, expected, stack)
           for tie, col, expected, stack in _viewed_sources(
               out, ties, collections, 'tie', stacks)
           if (target := tie_spec.walk(out[col], tie.target)) is not None]
  for tie, col, target, expected, stack in found:
    _check_like(tie, col, target, expected, stack)
  out = _merge_copies(out, found, merge)
  for tie, col, _, _, _ in found:
    out[col] = _with_path(out[col], tie.target, _ABSENT)
  return out


def untie_variables(
    variables: Mapping[str, Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
    stacks: Mapping[str, int] | None = None,
) -> dict[str, Any]:
  """Materialises each tied target as a copy of its source.

  The inverse of :func:`tie_variables`: the result loads into the untied
  model. A target inside a stack (``stacks``) whose source is outside it gets
  one copy of the source per layer; a stack tied whole (to another stack) is
  a plain copy. Partitioning metadata (``nn.Partitioned``, logical axes) is
  kept; a view moves the axis names with the axes (a transposed view swaps
  them), and a stack's axis gets the name that the variables beside the
  target give it (``metadata_params={nn.PARTITION_NAME: 'layers'}``), if any.

  A copy lives where its source does: a plain tie shares the source's array,
  a view is computed on the source's devices (its sharding follows the view,
  as jit propagates it), and a stack's copies are sharded as the source with
  the new layer axis unsharded.

  Example::

    >>> import jax.numpy as jnp
    >>> from flax.core import untie_variables
    >>> tied = {'params': {'a': {'w': jnp.ones(2)}}}
    >>> untie_variables(tied, {'b': 'a'})['params']['b']
    {'w': Array([1., 1.], dtype=float32)}

  Args:
    variables: a variable dict of the tied model.
    ties: the ties, as given to ``nn.tie`` on the root module.
    collections: the tied collections (a collection filter).
    stacks: the model's stacks and their number of layers, as for
      :func:`tie_variables`.

  Returns:
    A new variable dict with every target present.

  Raises:
    TieError: if a source is missing, a target is present (untied already)
      with other values than its source gives it (writing over it would drop
      them) or the tree shows it to be of another kind (a module tied to a
      variable), a target inside a stack that ``stacks`` does not name would
      be written unstacked (known by the stacked variables stored beside the
      target: a stack that holds nothing but tied targets cannot be told from
      a module, so name it), a path of ``stacks`` names no stack, or gives a
      tied stack another count than its source's stack, or a view moves a
      partitioned axis in a way whose names cannot be followed.
  """
  out = _given(variables, ties, collections, 'untie_variables')
  # Outer targets first: a tied path inside a target's source is written
  # after the target, over what its source holds there.
  found = sorted(_viewed_sources(out, ties, collections, 'untie', stacks),
                 key=lambda found: len(found[0].target))
  for tie, col, value, stack in found:  # untied already: only as written
    present = tie_spec.walk(out[col], tie.target)
    if present and not holds(tie, col, present, value, stack):
      raise tie_errors.convert_target_present(tie, col)
  for tie, col, value, stack in found:
    if stack[1]:
      value = jax.tree_util.tree_map(
          lambda x, s=stack: stack_layers(x, *s[1:]), value,
          is_leaf=tie_spec.is_box)
    out[col] = _with_path(out[col], tie.target, value)
  return out


def _given(variables, ties, collections, api: str):
  """``variables`` unfrozen, the arguments of ``api`` checked."""
  if not isinstance(variables, Mapping) or not all(
      isinstance(v, Mapping) for v in variables.values()):
    raise tie_errors.bad_argument(
        api, 'variables', variables, "a variable dict, {collection: tree}"
        " (e.g. {'params': {...}}), as init returns it")
  tie_spec.given(ties, api)
  tie_spec.collections_given(collections, api)
  return _unfreeze(variables)


def _viewed_sources(tree, ties, collections, verb, stacks):
  """Yields ``(tie, col, source seen through the view, stack)`` of each tie.

  ``stack`` is ``(paths, layers, at, names)`` of the stacks that hold the
  target but not the source, outer first: their layers take the axes from
  ``at`` on, named as beside the target. Skips the collections in which
  neither path of the tie holds anything.
  """
  stacks = _stack_paths(stacks, api=f'{verb}_variables')
  normal = tie_spec.normalize(ties, collections, ())
  known = {p[:n] for col in tree.values() for p, _ in tie_spec.flatten(col)
           for n in range(1, len(p))} | {t.target[:n] for t in normal
                                         for n in range(1, len(t.target))}
  for path, layers in (stacks or {}).items():  # else a typo: left unnamed
    if path not in known and not any(
        tie_spec.is_within(path, t.target) for t in normal):
      raise tie_errors.no_stack(f'{verb}_variables', '/'.join(path), layers,
                                ['/'.join(p) for p in known])
  for tie in normal:
    around = sorted(p for p in stacks or () if len(tie.target) > len(p)
                    and tie_spec.is_within(tie.target, p))
    inner = [(p, axis) for axis, p in enumerate(around)
             if not tie_spec.is_within(tie.source, p)]
    cols = [c for c in tree if tie.applies_to(c)]
    for col in cols:
      source = tie_spec.walk(tree[col], tie.source)
      if source is None:
        # Left alone where neither path is stored, unless no collection
        # stores the source (a misspelled one) and no tie empties it.
        if tie_spec.walk(tree[col], tie.target) is None and (any(
            tie_spec.walk(tree[c], tie.source) is not None for c in cols
        ) or any(tie_spec.is_within(t.target, tie.source) for t in normal)):
          continue
        raise tie_errors.convert_source_missing(
            verb, tie, col, tie_errors.nearest(tree[col], tie.source))
      for target in (tie_spec.walk(tree[c], tie.target) for c in tree):
        if target is not None and isinstance(target, Mapping) != isinstance(
            source, Mapping):  # as nn.tie refuses it, where a tree shows it
          raise tie_errors.kinds_differ(tie, col, isinstance(target, Mapping))
      _check_tied_stacks(source, tie, col, stacks or {}, verb)
      if stacks is None and verb == 'untie':
        refuse_unnamed_stack(tree[col], tie, col)
      names = tuple(check_layers(tree[col], tie, col, (p, stacks[p]), verb,
                                 axis) for p, axis in inner)
      yield tie, col, tie_spec.apply_views(tie, source), (
          tuple(p for p, _ in inner), tuple(stacks[p] for p, _ in inner),
          inner[0][1] if inner else 0, names)


def _stack_paths(stacks, sep: str = '/', api: str = 'tie_variables'):
  """``stacks`` by path, checked (``sep='.'``: NNX's attribute paths)."""
  if stacks is None:
    return None
  if not isinstance(stacks, Mapping) or not all(
      isinstance(p, str) and isinstance(n, int) and n > 0
      for p, n in stacks.items()):
    raise tie_errors.bad_argument(
        api, 'stacks', stacks, "a mapping of each stack's path to its number"
        " of layers (a positive int), e.g. {'encoder/layers': 12}")
  return {tuple(p for p in path.strip(sep).split(sep) if p not in ('', '.')):
          layers for path, layers in stacks.items()}


def _check_tied_stacks(source, tie, col, stacks, verb):
  """A stack that is the target or lies in it is tied to the source's twin.

  It is a plain copy of it, layer axis included (scanned like its source):
  ``stacks`` may not give the two different counts.
  """
  for path, layers in stacks.items():
    twin = tie.source + path[len(tie.target):]
    if not tie_spec.is_within(path, tie.target) or stacks.get(
        twin, layers) == layers:
      continue
    n = next((s[0] for _, x in tie_spec.flatten(tie_spec.walk(
        source, path[len(tie.target):]) or {}) if (s := np.shape(
            tie_spec.unbox(x)))), 'N')
    raise tie_errors.tie_error(
        f'Cannot {verb} {tie_errors.text(tie.target)} and'
        f' {tie_errors.text(tie.source)} in collection {col!r}: stacks gives'
        f' the stack {tie_errors.text(path)} {layers} layers but its source,'
        f' the stack {tie_errors.text(twin)}, {stacks[twin]}. A tied stack is'
        ' scanned like its source: a plain copy of it, layer axis included.',
        'Give both stacks the number of layers of the source:'
        f' stacks={{{"/".join(twin)!r}: {n}, {"/".join(path)!r}: {n}}}.')


def check_layers(tree, tie, col, stack, verb, axis: int = 0):
  """The stack's count must be ``axis`` of what is stored beside; its name.

  The variables beside the target have one layer per step along ``axis``
  (after those of the stacks around it): a count that differs would write,
  or expect, a target that does not fit. Returns the axis's name, or None.
  """
  path, layers = stack
  name = None
  for leaf_path, leaf in _beside(tree, path, tie.target):
    shape = np.shape(tie_spec.unbox(leaf))
    if len(shape) <= axis or shape[axis] != layers:
      raise tie_errors.stack_count_differs(
          verb, tie, col, path, layers, path + leaf_path, shape, axis)
    name = name or (*(getattr(leaf, 'names', None) or ()), *[None] * axis,
                    None)[axis]
  return name


def _beside(tree, path, target):
  """``[(path below path, leaf)]`` of what ``path`` holds beside ``target``."""
  node = tie_spec.walk(tree, path)
  return [(p, x) for p, x in tie_spec.flatten(node) if not tie_spec.is_within(
      path + p, target)] if isinstance(node, Mapping) else []


def refuse_unnamed_stack(tree, tie, col):
  """A target below stacked variables would be written unstacked: refuse."""
  leads = lambda leaves: {np.shape(tie_spec.unbox(x))[:1] for _, x in leaves}
  source = leads(tie_spec.flatten(tie_spec.walk(tree, tie.source)))
  for depth in range(len(tie.target) - 1, 0, -1):
    if tie_spec.is_within(tie.source, tie.target[:depth]):
      return
    beside = leads(_beside(tree, tie.target[:depth], tie.target))
    if len(beside) == 1 and () not in beside and not beside & source:
      ((n,),) = beside
      raise tie_errors.unnamed_stack(tie, col, tie.target[:depth], n)


def stack_layers(x, layers: tuple[int, ...], at: int = 0, names=None):
  """``x`` repeated along new axes of ``layers`` (their counts) at ``at``.

  A box's partitioning names gain ``names`` there (None: unnamed). A
  ``jax.Array`` is broadcast on its devices; a ``NamedSharding`` gains
  unsharded axes.
  """
  if tie_spec.is_box(x):
    old = getattr(x, 'names', None)
    stacked = x.replace_boxed(stack_layers(x.unbox(), layers, at))
    return stacked if old is None else stacked.replace(names=(
        *old[:at], *(names or (None,) * len(layers)), *old[at:]))
  if not isinstance(x, jax.Array):
    return np.array(_stacked(np, np.asarray(x), layers, at))
  sharding = x.sharding
  if isinstance(sharding, NamedSharding):
    spec = tuple(sharding.spec)  # (axes past its end are unsharded)
    sharding = NamedSharding(sharding.mesh, PartitionSpec(
        *spec[:at], *(None,) * len(layers), *spec[at:]),
                             memory_kind=sharding.memory_kind)
  else:
    sharding = None  # one device: jit keeps it there
  return _broadcast(layers, at, sharding)(x)


def _stacked(xp, x, layers, at):
  return xp.broadcast_to(xp.expand_dims(x, tuple(range(at, at + len(
      layers)))), (*x.shape[:at], *layers, *x.shape[at:]))


@functools.lru_cache(maxsize=64)
def _broadcast(layers: tuple[int, ...], at: int, sharding):
  return jax.jit(functools.partial(_stacked, jnp, layers=layers, at=at),
                 out_shardings=sharding)


def _leaf_pairs(target, expected):
  """``[(path, target leaf, expected leaf)]`` of two trees of one structure."""
  flat = jax.tree_util.tree_flatten_with_path(target, is_leaf=tie_spec.is_box)[0]
  ys = jax.tree_util.tree_leaves(expected, is_leaf=tie_spec.is_box)
  # In the order of the leaves (sorted keys), not of the dicts' insertion.
  return [(tuple(k.key for k in path), x, y) for (path, x), y in zip(flat, ys)]


def _check_like(tie, col: str, target, expected, stack=_UNSTACKED):
  """Raises unless a stored target is shaped as what its source gives it.

  The same variables, partitioning names, shapes and dtypes; inside stacks
  (``(paths, layers, at, names)``), with the axes of ``layers`` at ``at``.
  """
  paths, layers, at, _ = stack
  x_def = jax.tree_util.tree_structure(target, is_leaf=tie_spec.is_box)
  y_def = jax.tree_util.tree_structure(expected, is_leaf=tie_spec.is_box)
  if x_def != y_def:
    raise tie_errors.not_equal(tie, col, f'they hold different variables'
                               f' ({x_def} vs {y_def}).')
  for path, x, y in _leaf_pairs(target, expected):
    leaf = tie_errors.text(tie.target + path)
    x_names, y_names = getattr(x, 'names', None), getattr(y, 'names', None)
    if x_names is not None:
      x_names = (*x_names[:at], *x_names[at + len(layers):])
    if x_names != y_names:
      raise tie_errors.not_equal(tie, col, f'the partitioning names of {leaf}'
                                 f' differ ({x_names} vs {y_names}).')
    (x_shape, x_dtype), (y_shape, y_dtype) = (
        tie_spec.shape_dtype(tie_spec.unbox(x)), tie_spec.shape_dtype(tie_spec.unbox(y)))
    wanted = (*y_shape[:at], *layers, *y_shape[at:])
    if x_shape != wanted or x_dtype != y_dtype:
      more = x_shape[:len(x_shape) - len(y_shape)]
      raise tie_errors.not_equal(
          tie, col, f'shape or dtype of {leaf} differ ({x_shape}:{x_dtype}'
          f' vs {wanted}:{y_dtype}, what its source gives it).' + (
              f' {leaf} has one more leading axis per stack it lies in,'
              f' {more}, than its source: name the stacks (outer first), e.g.'
              f' stacks={{{tie.target[0]!r}: {more[0]}}}.'
              if not paths and more and x_shape[len(more):] == y_shape
              else ''))


def holds(tie, col: str, target, expected, stack) -> bool:
  """Whether a stored target equals what its source gives it."""
  try:
    _check_like(tie, col, target, expected, stack or _UNSTACKED)
  except tie_errors.TieError:
    return False
  return all(_compare(tie_spec.unbox(x), tie_spec.unbox(y),
                      _axes(stack or _UNSTACKED))[0].all()
             for _, x, y in _leaf_pairs(target, expected))


def _copies(found):
  """``[(tie, col, path, target, expected, stack)]`` of each stored target leaf.

  Each a copy of its final source's leaf: a leaf inside two targets (a tie
  inside the target of another) is the copy of the tie whose target is
  deeper, whose source is the final one.
  """
  targets = {(col, tie.target) for tie, col, _, _, _ in found}
  return [(tie, col, path, x, y, stack)
          for tie, col, target, expected, stack in found
          for path, x, y in _leaf_pairs(target, expected)
          if not any((col, (tie.target + path)[:n]) in targets
                     for n in range(len(tie.target) + 1,
                                    len(tie.target + path) + 1))]


def _merge_copies(out, found, merge) -> dict[str, Any]:
  """``out`` with each source whose copies differ merged as ``merge`` says.

  With ``merge=None``, the first copy that differs is a TieError. A viewed
  copy is never merged (the view is not inverted): it must equal the view of
  the source, and is then left out, as it holds nothing the source does not.
  """
  if merge == 'first':
    return out  # the source's values, whatever its copies hold
  by_source, differ = {}, {}
  for copy in _copies(found):
    tie, col, path, x, y, stack = copy
    by_source.setdefault((col, tie.source + path), []).append(copy)
    same, gap = _compare(tie_spec.unbox(x), tie_spec.unbox(y), _axes(stack))
    if not same.all():
      differ.setdefault((col, tie.source + path), []).append((copy, same, gap))
  for (col, source), differing in differ.items():
    viewed = next((c for c, _, _ in differing if c[0].view is not None), None)
    if merge is None:
      (tie, _, path, _, _, stack), same, gap = differing[0]
      layer = np.unravel_index(np.argmin(same), np.shape(same))
      raise tie_errors.copies_differ(
          tie, col, tie.target + path, source, float(gap[layer]),
          tuple(map(int, layer)), stack, viewed and viewed[0])
    if viewed is not None:
      raise tie_errors.merge_through_view(
          viewed[0], col, viewed[0].target + viewed[2], source, _name(merge))
    leaf = tie_spec.walk(out[col], source)
    value = _merged(merge, col, source, tie_spec.unbox(leaf), [
        (tie_spec.unbox(x), _axes(stack))
        for tie, _, _, x, _, stack in by_source[col, source]
        if tie.view is None])
    out[col] = _with_path(out[col], source, leaf.replace_boxed(value)
                          if tie_spec.is_box(leaf) else value)
  return out


def _name(merge) -> str:
  return repr(merge) if isinstance(merge, str) else getattr(
      merge, '__name__', repr(merge))


def _axes(stack) -> tuple[int, ...]:
  """The axes of a stacked copy that hold its layers."""
  return tuple(range(stack[2], stack[2] + len(stack[1])))


def _compare(x, y, stacked: tuple[int, ...]):
  """``(equal, max abs difference)`` of ``x`` and ``y``, per layer if stacked.

  ``stacked`` are the axes of ``x`` that ``y`` lacks, its stacks' layers. A
  jitted reduction on the arrays' devices whose small result is replicated,
  so every process of a job reads the same answer from its own devices.
  """
  sharding = next((a.sharding for a in (x, y) if isinstance(a, jax.Array)),
                  None)
  same, gap = _comparison(stacked, _replicated(sharding))(x, y)
  return _read(same), _read(gap)


@functools.lru_cache(maxsize=64)
def _comparison(stacked: tuple[int, ...], out_sharding):
  def compare(x, y):
    y = jnp.expand_dims(y, stacked)
    axes = tuple(i for i in range(jnp.ndim(x)) if i not in stacked)
    same = jnp.all(x == y, axis=axes)
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
      x, y = x.astype(jnp.float32), y.astype(jnp.float32)
    return same, jnp.max(jnp.abs(x - y), axis=axes, initial=0)
  return jax.jit(compare, out_shardings=out_sharding)


def _one_device(sharding) -> bool:
  # By its devices, not by type: ``jax.sharding.SingleDeviceSharding`` is
  # deprecated from JAX 0.12.1 on, and its replacements are not in older JAX.
  return not isinstance(sharding, NamedSharding) and len(
      sharding.device_set) == 1


def _replicated(sharding):
  """A sharding replicated over the devices of ``sharding`` (None: none)."""
  if sharding is None or _one_device(sharding):
    return sharding
  devices = getattr(sharding, '_device_assignment', None) or sorted(
      sharding.device_set, key=lambda d: d.id)
  return NamedSharding(Mesh(np.array(devices), ('devices',)), PartitionSpec())


def _read(x):
  """The value of a replicated ``jax.Array``, from this process's copy."""
  return jax.device_get(x.addressable_data(0))


def _merged(merge, col: str, source: tuple[str, ...], value, copies):
  """The merge of ``value`` (a source) and ``copies`` (``(array, layer axes)``).

  Computed under jit where the source lives, with the source's sharding.
  """
  merge_fn = functools.partial(_merge_fn, merge, tuple(s for _, s in copies))
  arrays = [c for c, _ in copies]
  result = jax.eval_shape(merge_fn, value, arrays)
  wanted = tie_spec.shape_dtype(value)
  got = tie_spec.shape_dtype(result) if isinstance(
      result, jax.ShapeDtypeStruct) else None
  if got != wanted:
    raise tie_errors.merge_result_unlike(
        col, source, _name(merge), result if got is None else
        f'{got[0]}:{got[1]}', f'{wanted[0]}:{wanted[1]}')
  if not isinstance(value, jax.Array):
    return jax.device_get(jax.jit(merge_fn)(value, arrays))
  return jax.jit(merge_fn, out_shardings=None if _one_device(
      value.sharding) else value.sharding)(value, arrays)


def _merge_fn(merge, stacked, source, copies):
  layers = [layer for copy, axes in zip(copies, stacked)
            for layer in jnp.moveaxis(copy, axes, range(len(axes))).reshape(
                (-1, *jnp.shape(source)))]
  if merge == 'mean':
    return jnp.mean(jnp.stack([source, *layers]), axis=0).astype(
        jnp.result_type(source))
  return merge(source, layers)


def _unfreeze(tree):
  if isinstance(tree, Mapping):
    return {k: _unfreeze(v) for k, v in tree.items()}
  return tree


def _with_path(tree, path, value):
  tree = dict(tree)
  child = value if len(path) == 1 else _with_path(tree.get(path[0], {}),
                                                  path[1:], value)
  if child is _ABSENT or value is _ABSENT and not child:
    tree.pop(path[0], None)
  else:
    tree[path[0]] = child
  return tree
