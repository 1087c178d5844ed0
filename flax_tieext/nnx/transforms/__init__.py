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

"""NNX transforms extended by flax_tieext (as in ``flax/nnx/transforms/``).

``remat`` is ``flax_tieext.nnx.remat``: Flax main's (``autodiff.py``) where
the installed ``nnx.remat`` has graph and tree modes, otherwise
``flax_tieext._compat.nnx_remat``. The patch binds it as ``nnx.remat``.
"""

from flax_tieext import _compat

if _compat.NNX_REMAT_MODES:
  from flax_tieext.nnx.transforms.autodiff import remat  # pylint: disable=g-import-not-at-top
else:
  remat = _compat.nnx_remat
