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

"""Lifted transforms added or extended by flax_tieext.

This module is written as a part of ``flax/core/lift.py``: every public
function here is transplanted verbatim into that file by
``tools/make_patches.py`` (the upstream-ready diffs in ``patches/``), so
function bodies use only names that ``flax/core/lift.py`` itself defines or
imports. The import block below is the only part that differs.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax

from flax.core.lift import pack
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.core.scope import Scope
from flax_tieext.core import ties
# pylint: enable=g-importing-member,unused-import

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

# TODO(static_argnames): replaced by the static_argnames implementation.
from flax.core.lift import checkpoint  # pylint: disable=g-import-not-at-top
remat = checkpoint

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------

def tie(fn, ties, collections='params'):
  raise NotImplementedError
