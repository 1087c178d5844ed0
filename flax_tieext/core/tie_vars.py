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
(``ties.TiedNames``, which ``Scope._collection`` gives under
ties). ``Scope.variables()`` copies a scope's own dicts; it passes them to
:func:`tied_variables`, which shows the tied names in them too, as their
views give them.
"""

from __future__ import annotations

from flax.core.frozen_dict import FrozenDict, freeze
from flax_tieext.core.ties import TiedNames


def tied_variables(scope, variables):
  """``variables`` of ``scope`` (ties in force), with its tied names in.

  ``Scope.variables`` calls it on the scope's own dicts; a name a variable
  tie targets is shown as its view gives it. A ``FrozenDict`` gives one.
  """
  views = {col: scope._collection(col) for col in variables}  # pylint: disable=protected-access
  if not any(isinstance(v, TiedNames) for v in views.values()):
    return variables
  out = {col: dict(v) if isinstance(v, TiedNames) else variables[col]
         for col, v in views.items()}
  return freeze(out) if isinstance(variables, FrozenDict) else out
