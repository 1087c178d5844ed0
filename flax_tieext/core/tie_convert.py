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
import numpy as np

from flax.core.scope import CollectionFilter
from flax_tieext.core import tie_spec
from flax_tieext.errors import TieError

_ABSENT = object()


def tie_variables(
    variables: Mapping[str, Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
) -> dict[str, Any]:
  """Turns an untied variable tree into the layout a tied model stores.

  Each target is removed after checking that it equals its source (through
  the view, for a viewed tie). A collection in which neither path of a tie
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

  Returns:
    A new variable dict without the targets.

  Raises:
    TieError: if a target is present but its source is not, or a target
      differs from its source (shape, dtype, partitioning names or value):
      tying would silently drop the target's values.
  """
  out = _unfreeze(variables)
  for tie, col, expected in _viewed_sources(out, ties, collections, 'tie'):
    target = tie_spec.walk(out[col], tie.target)
    if target is not None:
      _check_equal(tie, col, target, expected)
      out[col] = _with_path(out[col], tie.target, _ABSENT)
  return out


def untie_variables(
    variables: Mapping[str, Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
) -> dict[str, Any]:
  """Materialises each tied target as a copy of its source.

  The inverse of :func:`tie_variables`: the result loads into the untied
  model. Partitioning metadata (``nn.Partitioned``, logical axes) is kept; a
  view moves the axis names with the axes (a transposed view swaps them).

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

  Returns:
    A new variable dict with every target present.

  Raises:
    TieError: if a source is missing, or a view moves a partitioned axis in a
      way whose names cannot be followed.
  """
  out = _unfreeze(variables)
  for tie, col, value in _viewed_sources(out, ties, collections, 'untie'):
    out[col] = _with_path(out[col], tie.target, value)
  return out


def _viewed_sources(tree, ties, collections, verb):
  """Yields ``(tie, col, source value seen through the view)`` of each tie.

  Skips the collections in which neither path of the tie holds anything.
  """
  for tie in tie_spec.normalize(ties, collections, ()):
    for col in [c for c in tree if tie.applies_to(c)]:
      source = tie_spec.walk(tree[col], tie.source)
      if source is None:
        if tie_spec.walk(tree[col], tie.target) is None:
          continue
        raise TieError(
            f'Cannot {verb} {tie_spec.text(tie.target)} and'
            f' {tie_spec.text(tie.source)} in collection {col!r}: the target'
            ' is present but the source is missing from the variables.'
            + tie_spec.nearest(tree[col], tie.source)
            + ' Fix the source path in the ties.'
        )
      yield tie, col, jax.tree_util.tree_map(
          lambda x, tie=tie: tie_spec.apply_view(tie, x), source,
          is_leaf=tie_spec.is_box)


def _check_equal(tie, col: str, target, expected):
  """Raises unless a stored target equals what its source gives it."""
  what = (f'Cannot tie {tie_spec.text(tie.target)} to'
          f' {tie_spec.text(tie.source)} in collection {col!r}:')
  (xs, x_def), (ys, y_def) = (
      jax.tree_util.tree_flatten(target, is_leaf=tie_spec.is_box),
      jax.tree_util.tree_flatten(expected, is_leaf=tie_spec.is_box))
  if x_def != y_def:
    raise TieError(f'{what} they hold different variables ({x_def} vs'
                   f' {y_def}).')
  for x, y in zip(xs, ys):
    x_names, y_names = getattr(x, 'names', None), getattr(y, 'names', None)
    if x_names != y_names:
      raise TieError(f'{what} their partitioning names differ ({x_names} vs'
                     f' {y_names}).')
    x, y = np.asarray(tie_spec.unbox(x)), np.asarray(tie_spec.unbox(y))
    if x.shape != y.shape or x.dtype != y.dtype:
      raise TieError(f'{what} shape or dtype differ ({x.shape}:{x.dtype} vs'
                     f' {y.shape}:{y.dtype}).')
    if not np.array_equal(x, y):
      raise TieError(
          f'{what} the target differs from its source (max abs difference'
          f' {float(np.max(np.abs(x - y)))}). Tying would silently drop the'
          " target's values; untie the model or make them equal first."
      )


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
