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
"""Tied variables that take part in Flax's scope rewriting (work in progress)."""

class TieError(ValueError):
  """A tie cannot be declared, resolved, or written through."""


def _passthrough(original):
  return original

lift_tie_sources = tie_aware_push = tie_aware_collection = _passthrough
tie_aware_mutable_collection = tie_aware_get_variable = _passthrough
tie_aware_has_variable = tie_aware_put_variable = _passthrough


def tie_variables(variables, ties, collections='params'):
  raise NotImplementedError


def untie_variables(variables, ties, collections='params'):
  raise NotImplementedError
