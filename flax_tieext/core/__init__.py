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

"""Functional-core twins of ``flax.core``: ``lift`` and the tie machinery."""

from flax_tieext import _compat

# On a Flax with the features natively, these are Flax's own modules.
_compat.defer_to_flax(__name__, {'lift': 'flax.core.lift', 'ties': 'flax.core.ties'})

from flax_tieext.core import lift as lift  # pylint: disable=g-import-not-at-top
from flax_tieext.core import ties as ties  # pylint: disable=g-import-not-at-top
