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

"""Ties of single variables: a scope's collection in which some names are tied.

A module-level tie gives a target scope its source's collection
(``flax.core.ties``). A tie of one variable (``"head/kernel"``) leaves the
module its own collection, in which that one name reads and writes the source
variable: :func:`tie_aware_names` wraps the collection in a
:class:`_TiedCollection` wherever a name of it is tied.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, MutableMapping

from flax.core.frozen_dict import FrozenDict, freeze
from flax_tieext.core.tie_spec import (
    Tie,
    apply_view,
    check_like,
    nearest,
    text,
    tie_error,
)
from flax_tieext.core.ties import (
    TIES_FLAG,
    _maps,
    cannot_land,
    given_for_target,
    held_elsewhere,
    reach,
    read_only,
    refuse_declared_inside,
    ties_in_force,
    unreachable,
)


def tie_aware_names(collection):
  """``Scope._collection`` / ``_mutable_collection`` with tied variable names.

  Wraps the tie-aware ``collection`` (``ties.tie_aware_collection`` or
  ``ties.tie_aware_mutable_collection``).
  """
  @functools.wraps(collection)
  def named_collection(self, col):
    node = collection(self, col)
    if TIES_FLAG not in self.flags:
      return node
    named = {t.target[-1]: t for t in ties_in_force(self)
             if t.target[:-1] == self.path and len(t.target) > len(self.path)
             and t.applies_to(col)}
    return _TiedCollection(self, col, node, named) if named else node
  return named_collection


def tie_aware_variables(variables):
  """``Scope.variables`` in which a tied variable is present, as in its view."""
  @functools.wraps(variables)
  def tied_variables(self):
    found = variables(self)
    if TIES_FLAG not in self.flags:
      return found
    views = {col: self._collection(col) for col in found}  # pylint: disable=protected-access
    if not any(isinstance(v, _TiedCollection) for v in views.values()):
      return found
    out = {col: dict(v) if isinstance(v, _TiedCollection) else found[col]
           for col, v in views.items()}
    return freeze(out) if isinstance(found, FrozenDict) else out
  return tied_variables


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
    initializing = (scope.get_flag('initializing', False)
                    and scope.is_mutable_collection(col))
    if not initializing and name in self._own:
      raise given_for_target(tie, col)
    parent, crossed = reach(scope, tie.source[:-1])
    node = None if parent is None else parent._collection(col)  # pylint: disable=protected-access
    found = node.get(tie.source[-1]) if isinstance(node, Mapping) else None
    if parent is None:
      raise unreachable(scope, tie, col)
    if isinstance(found, Mapping):
      return None  # a submodule: its own scope resolves the tie
    if (initializing and not _maps(crossed)
        and (found is None or write and col == 'params')):
      return None  # a copy, checked and dropped by check_init
    if crossed:
      refuse_declared_inside(scope, tie, col, crossed)
      if write or found is None:
        raise cannot_land(scope, tie, col, crossed, write)
    elif found is None and not scope.is_mutable_collection(col):
      raise _missing_variable(scope, tie, col, node)
    if write and tie.view is not None:
      raise read_only(tie, col, scope)
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
      + (held_elsewhere(scope, tie.source, col) or nearest(
          node if isinstance(node, Mapping) else {}, tie.source[-1:],
          tie.source[:-1])),
      'Fix the source path (paths are relative to the module that declares'
      ' the tie; a leading "/" starts at the root module), or the'
      ' collections.',
      "Pass the source's variables to apply.")
