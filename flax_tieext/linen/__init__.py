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

"""Module-level twins of ``flax.linen`` transforms.

``flax_tieext.linen.checkpoint`` / ``remat`` behave exactly as
``nn.checkpoint`` / ``nn.remat`` do once the patch is installed, whether or
not it is. ``flax_tieext.linen.tie`` is ``nn.tie``; a tie lives in Flax's
scopes, so it needs the patch installed and says so otherwise.
"""

from flax_tieext._patch import requires_install as _requires_install
from flax_tieext.linen import partitioning as partitioning
from flax_tieext.linen import transforms as _transforms
from flax_tieext.linen.transforms import checkpoint as checkpoint
from flax_tieext.linen.transforms import remat as remat

tie = _requires_install(_transforms.tie)
