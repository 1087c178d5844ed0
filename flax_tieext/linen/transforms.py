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

"""Module-level lifted transforms added or extended by flax_tieext.

Written as a part of ``flax/linen/transforms.py``: each public function is
transplanted verbatim into that file by ``tools/make_patches.py``. Like
upstream's transforms these are thin: they map Module methods to the
functional-core transforms in ``flax_tieext.core.lift`` via
``lift_transform``.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax

from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.linen.transforms import lift_transform
from flax.linen.transforms import Target
from flax_tieext.core import lift
# pylint: enable=g-importing-member,unused-import

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

# TODO(static_argnames): replaced by the static_argnames implementation.
from flax.linen.transforms import checkpoint  # pylint: disable=g-import-not-at-top
remat = checkpoint

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------

def tie(target, ties, collections='params', *, methods=None):
  raise NotImplementedError
