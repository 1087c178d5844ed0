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

"""Ties of single variables, as ``Scope.variables()`` shows them.

A tie of one variable (``"head/kernel"``) leaves the module its own
collection, in which that one name reads and writes the source variable
(``flax.core.ties.TiedNames``, handed out by the ``_collection`` hooks).
``Scope.variables()`` copies a scope's own dicts; :func:`tie_aware_variables`
shows the tied names in it too, as their views give them.
"""

from __future__ import annotations

import functools

from flax.core.frozen_dict import FrozenDict, freeze
from flax_tieext.core.ties import TIES_FLAG, TiedNames


def tie_aware_variables(variables):
  """``Scope.variables`` in which a tied variable is present, as in its view."""
  @functools.wraps(variables)
  def tied_variables(self):
    if TIES_FLAG not in self.flags:
      return variables(self)
    found = variables(self)
    views = {col: self._collection(col) for col in found}  # pylint: disable=protected-access
    if not any(isinstance(v, TiedNames) for v in views.values()):
      return found
    out = {col: dict(v) if isinstance(v, TiedNames) else found[col]
           for col, v in views.items()}
    return freeze(out) if isinstance(found, FrozenDict) else out
  return tied_variables
