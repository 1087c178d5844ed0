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

"""NNX twins of ``flax.nnx`` transforms, and ties for NNX tree mode.

``flax_tieext.nnx.remat`` is ``nnx.remat`` with ``static_argnames``; it
behaves exactly as ``flax.nnx.remat`` does once the patch is installed,
whether or not it is. Where the installed Flax's ``nnx.remat`` has graph and
tree modes it is Flax main's own (``transforms/autodiff.py``, which moves into
Flax verbatim); on older releases, ``flax_tieext._compat.nnx_remat``.

In graph mode ties need no transform: a module or Variable used at two places
*is* shared. Tree mode (``graph=False``) refuses such aliases; ``tie``
declares them so that tree mode keeps one Variable at two places
(``tielib.py``, see ``docs/nnx.md``), and ``tie_state`` / ``untie_state``
convert states between the tied and the untied layout.
"""

from flax_tieext import _compat
# Tree mode, which tielib needs (Flax 0.12.8 and later of the matrix).
from flax_tieext.nnx._tree_mode import TREE_MODE as _TREE_MODE
from flax_tieext.nnx.transforms import remat as remat

if _TREE_MODE:
  from flax_tieext.nnx.tielib import tie, tie_state, untie_state  # pylint: disable=g-import-not-at-top
else:

  def _needs_tree_mode(*args, **kwargs):
    del args, kwargs
    from flax_tieext.errors import TieError  # pylint: disable=g-import-not-at-top
    raise TieError(
        f'flax_tieext.nnx ties are for NNX tree mode (graph=False), which Flax'
        f' {_compat.FLAX_VERSION} does not have; in graph mode, share the'
        ' module or Variable by reference instead (docs/nnx.md).'
    )

  tie = tie_state = untie_state = _needs_tree_mode
