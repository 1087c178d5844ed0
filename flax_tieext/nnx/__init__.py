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

"""NNX twins of ``flax.nnx`` transforms.

``flax_tieext.nnx.remat`` is ``nnx.remat`` with ``static_argnames``; it
behaves exactly as ``flax.nnx.remat`` does once the patch is installed,
whether or not it is. Where the installed Flax's ``nnx.remat`` has graph and
tree modes it is Flax main's own (``transforms/autodiff.py``, which moves into
Flax verbatim); on older releases, ``flax_tieext._compat.nnx_remat``. Ties
need no transform in NNX: a module used at two places *is* shared (see
``docs/nnx.md``).
"""

import flax.nnx as _flax_nnx  # pylint: disable=unused-import

from flax_tieext import _compat

remat = _compat.our_nnx_remat()
