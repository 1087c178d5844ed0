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

"""flax_tieext: tied variables through Flax's lifted transforms, and
``static_argnames`` for every Flax checkpoint / remat.

Importing this package installs both features into Flax (``nn.tie``,
``lift.tie``, and a ``static_argnames`` argument on ``nn.checkpoint``,
``nn.remat``, ``nn.partitioning.remat``, ``lift.checkpoint``,
``lift.remat`` and ``nnx.remat``) unless the environment variable
``FLAX_TIEEXT_AUTOPATCH=0`` is set. The same transforms are always available,
unpatched, as ``flax_tieext.lift``, ``flax_tieext.linen`` and
``flax_tieext.nnx``. The patch does not import ``flax.nnx``: ``nnx.remat`` is
replaced when your program imports it.
"""

__version__ = '0.1.0.dev0'

from flax_tieext import core as core
from flax_tieext import linen as linen
from flax_tieext.core import lift as lift
from flax_tieext.errors import TieError as TieError
from flax_tieext.core.tie_convert import tie_variables as tie_variables
from flax_tieext.core.tie_convert import untie_variables as untie_variables
from flax_tieext._patch import PatchError as PatchError
from flax_tieext._patch import install as install
from flax_tieext._patch import is_installed as is_installed
from flax_tieext._patch import uninstall as uninstall
from flax_tieext._patch import autopatch as _autopatch

_autopatch()
del _autopatch


def __getattr__(name: str):
  # flax_tieext.nnx imports flax.nnx, which `import flax_tieext` does not.
  if name == 'nnx':
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module('flax_tieext.nnx')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
