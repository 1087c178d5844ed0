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


"""Test helpers for running other projects' suites with flax_tieext installed.

``flax_tieext.testing.autopatch`` is a pytest plugin; load it explicitly with
``pytest -p flax_tieext.testing.autopatch`` (it is not an auto-loading entry
point, so a plain ``pytest`` never sees the patch).
"""
