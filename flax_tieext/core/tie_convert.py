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

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax.core.scope import CollectionFilter
from flax_tieext.core import tie_errors
from flax_tieext.core import tie_spec

_ABSENT = object()


def tie_variables(
    variables: Mapping[str, Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
    stacks: Mapping[str, int] | None = None,
) -> dict[str, Any]:
  """Turns an untied variable tree into the layout a tied model stores.

  Each target is removed after checking that it equals its source (through
  the view, for a viewed tie); a target inside a stack (``stacks``) must equal
  its source in every layer. A collection in which neither path of a tie
  holds anything is left alone. Paths are relative to the root module.

  Example::

    >>> import jax.numpy as jnp
    >>> from flax.core import tie_variables
    >>> untied = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.ones(2)}}}
    >>> tie_variables(untied, {'b': 'a'})
    {'params': {'a': {'w': Array([1., 1.], dtype=float32)}}}

  Args:
    variables: a variable dict, e.g. restored from a checkpoint of the untied
      model.
    ties: the ties, as given to ``nn.tie`` on the root module.
    collections: the tied collections (a collection filter).
    stacks: the paths of the model's stacks (``nn.scan`` / ``nn.vmap``
      modules with their variables along axis 0) mapped to their number of
      layers, e.g. ``{'encoder/layers': 12}``. A target inside a stack whose
      source is outside it has one copy of the source per layer.

  Returns:
    A new variable dict without the targets.

  Raises:
    TieError: if a target is present but its source is not, or a target
      differs from its source (shape, dtype, partitioning names or value, in
      any layer of a stack): tying would silently drop the target's values.
  """
  out = _unfreeze(variables)
  # Every target is checked in the tree as given, then removed (a target may
  # lie inside the source of another).
  found = [(tie, col, tie_spec.walk(out[col], tie.target), expected, stack)
           for tie, col, expected, stack in _viewed_sources(
               out, ties, collections, 'tie', stacks)]
  for tie, col, target, expected, stack in found:
    if target is not None:
      _check_equal(tie, col, target, expected, stack)
  for tie, col, target, _, _ in found:
    if target is not None:
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
  one copy of the source per layer. Partitioning metadata (``nn.Partitioned``,
  logical axes) is kept; a view moves the axis names with the axes (a
  transposed view swaps them), and a stack's axis gets no name.

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
    TieError: if a source is missing, a target inside a stack that
      ``stacks`` does not name would be written unstacked (known by the
      stacked variables stored beside the target: a stack that holds nothing
      but tied targets cannot be told from a module, so name it), or a view
      moves a partitioned axis in a way whose names cannot be followed.
  """
  out = _unfreeze(variables)
  # Outer targets first: a tied path inside a target's source is written
  # after the target, over what its source holds there.
  for tie, col, value, stack in sorted(
      _viewed_sources(out, ties, collections, 'untie', stacks),
      key=lambda found: len(found[0].target)):
    if stack is not None:
      value = jax.tree_util.tree_map(
          lambda x, n=stack[1]: _stacked(x, n), value, is_leaf=tie_spec.is_box)
    out[col] = _with_path(out[col], tie.target, value)
  return out


def _viewed_sources(tree, ties, collections, verb, stacks):
  """Yields ``(tie, col, source seen through the view, stack)`` of each tie.

  ``stack`` is ``(path, layers)`` of the stack that holds the target but not
  the source, or None. Skips the collections in which neither path of the
  tie holds anything.
  """
  stacks = _stack_paths(stacks)
  for tie in tie_spec.normalize(ties, collections, ()):
    stack = next(((path, n) for path, n in (stacks or {}).items()
                  if tie_spec.is_within(tie.target, path)
                  and not tie_spec.is_within(tie.source, path)), None)
    for col in [c for c in tree if tie.applies_to(c)]:
      source = tie_spec.walk(tree[col], tie.source)
      if source is None:
        if tie_spec.walk(tree[col], tie.target) is None:
          continue
        raise tie_errors.convert_source_missing(
            verb, tie, col, tie_errors.nearest(tree[col], tie.source))
      if stacks is None and verb == 'untie':
        _refuse_unnamed_stack(tree[col], tie, col)
      if stack is not None:
        _check_layers(tree[col], tie, col, stack, verb)
      yield tie, col, jax.tree_util.tree_map(
          lambda x, tie=tie: tie_spec.apply_view(tie, x), source,
          is_leaf=tie_spec.is_box), stack


def _stack_paths(stacks):
  if stacks is None:
    return None
  out = {}
  for path, layers in stacks.items():
    parsed = tuple(p for p in path.strip('/').split('/') if p not in ('', '.'))
    if not isinstance(layers, int) or layers < 1:
      raise tie_errors.bad_stack_count(path, layers)
    out[parsed] = layers
  return out


def _check_layers(tree, tie, col, stack, verb):
  """The stack's count must be the leading axis of what is stored beside.

  The variables of a stack other than the target (its siblings) have one
  layer per step along axis 0; a count that differs would write, or expect, a
  target that does not fit beside them.
  """
  path, layers = stack
  node = tie_spec.walk(tree, path)
  if not isinstance(node, Mapping):
    return
  rest = tie.target[len(path):]
  for leaf_path, leaf in tie_spec.flatten(node):
    if tie_spec.is_within(leaf_path, rest):
      continue  # the target itself
    shape = np.shape(tie_spec.unbox(leaf))
    if not shape or shape[0] != layers:
      raise tie_errors.stack_count_differs(
          verb, tie, col, path, layers, path + leaf_path, shape)


def _refuse_unnamed_stack(tree, tie, col):
  """A target below stacked variables would be written unstacked: refuse."""
  source = tie_spec.walk(tree, tie.source)
  source_leaves = {} if source is None else dict(tie_spec.flatten(source))
  for depth in range(len(tie.target) - 1, 0, -1):
    if tie_spec.is_within(tie.source, tie.target[:depth]):
      return
    node = tie_spec.walk(tree, tie.target[:depth])
    leaves = [np.shape(tie_spec.unbox(x)) for _, x in tie_spec.flatten(node)
              ] if isinstance(node, Mapping) else []
    lengths = {s[0] for s in leaves if s}
    if len(leaves) and len(lengths) == 1 and all(
        len(s) > 0 for s in leaves) and not any(
            np.shape(tie_spec.unbox(x))[:1] == tuple(lengths)
            for x in source_leaves.values()):
      (n,) = lengths
      raise tie_errors.unnamed_stack(tie, col, tie.target[:depth], n)


def _stacked(x, layers):
  """``x`` repeated along a new leading axis of ``layers`` (boxes too)."""
  if tie_spec.is_box(x):
    names = getattr(x, 'names', None)
    stacked = x.replace_boxed(_stacked(x.unbox(), layers))
    return stacked if names is None else stacked.replace(
        names=(None, *names))
  if isinstance(x, jax.Array):
    return jnp.broadcast_to(x, (layers, *x.shape))
  return np.broadcast_to(np.asarray(x), (layers, *np.shape(x))).copy()


def _check_equal(tie, col: str, target, expected, stack=None):
  """Raises unless a stored target equals what its source gives it.

  Inside a stack (``(path, layers)``), every layer of the target must.
  """
  (xs, x_def), (ys, y_def) = (
      jax.tree_util.tree_flatten(target, is_leaf=tie_spec.is_box),
      jax.tree_util.tree_flatten(expected, is_leaf=tie_spec.is_box))
  if x_def != y_def:
    raise tie_errors.not_equal(tie, col, f'they hold different variables'
                               f' ({x_def} vs {y_def}).')
  # In the order of xs (sorted keys), not of the dicts' insertion.
  paths = [tuple(k.key for k in p) for p, _ in
           jax.tree_util.tree_flatten_with_path(target, is_leaf=tie_spec.is_box)[0]]
  for path, x, y in zip(paths, xs, ys):
    leaf = tie_errors.text(tie.target + path)
    x_names, y_names = getattr(x, 'names', None), getattr(y, 'names', None)
    if stack is not None and x_names is not None:
      x_names = x_names[1:]
    if x_names != y_names:
      raise tie_errors.not_equal(tie, col, f'the partitioning names of {leaf}'
                                 f' differ ({x_names} vs {y_names}).')
    x, y = np.asarray(tie_spec.unbox(x)), np.asarray(tie_spec.unbox(y))
    layers = [x] if stack is None else list(x) if x.ndim and (
        x.shape[0] == stack[1]) else None
    if layers is None or any(l.shape != y.shape or l.dtype != y.dtype
                             for l in layers):
      hint = ''
      if stack is None and x.ndim and x.shape[1:] == y.shape:
        hint = (f' {leaf} has one more leading axis ({x.shape[0]}) than its'
                ' source, as in a stack of layers: name the stack, e.g.'
                f' stacks={{{tie.target[0]!r}: {x.shape[0]}}}.')
      elif stack is not None:
        hint = (f' {leaf} lies in the stack {tie_errors.text(stack[0])} of'
                f' {stack[1]} layers (axis 0), so it needs shape'
                f' {(stack[1], *y.shape)}.')
      raise tie_errors.not_equal(
          tie, col, f'shape or dtype of {leaf} differ'
          f' ({x.shape}:{x.dtype} vs {y.shape}:{y.dtype}).' + hint)
    for i, layer in enumerate(layers):
      if not np.array_equal(layer, y):
        where = '' if stack is None else (
            f' in layer {i} (axis 0) of the stack {tie_errors.text(stack[0])}')
        raise tie_errors.not_equal(
            tie, col, f'{leaf} differs from its source{where} (max abs'
            f' difference {float(np.max(np.abs(layer - y)))}). Tying would'
            " silently drop the target's values; untie the model or make"
            ' them equal first.')


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
