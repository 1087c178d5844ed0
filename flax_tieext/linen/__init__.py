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

``flax_tieext.linen.checkpoint`` / ``remat`` / ``scan`` behave exactly as
``nn.checkpoint`` / ``nn.remat`` / ``nn.scan`` do once the patch is
installed, whether or not it is. ``flax_tieext.linen.tie`` is ``nn.tie``; a tie lives in Flax's
scopes, so it needs the patch installed and says so otherwise.
"""

import functools as _functools

from flax_tieext.errors import TieError as _TieError
from flax_tieext.linen import partitioning as partitioning
from flax_tieext.linen import transforms as _transforms
from flax_tieext.linen.transforms import checkpoint as checkpoint
from flax_tieext.linen.transforms import remat as remat
from flax_tieext.linen.transforms import scan as scan


def _machinery() -> bool:
  """Makes Flax's ``Scope`` and ``pack`` tie-aware; False where it cannot.

  Here it cannot: the patch, while installed, binds its own in place of this
  one (``flax_tieext._patch``).
  """
  return False


def _requires_install(tie_transform):
  """``tie_transform``, and what it makes, refused while the patch is not installed.

  A tie lives in Flax's ``Scope`` and ``_partial_pack``, which only the
  installed patch makes tie-aware; without them it would silently not hold.
  So declaring a tie, binding a tied Module class made earlier, calling a
  method of one bound earlier (or calling a tied scope function) raise
  ``TieError`` after ``uninstall()``; each of them binds the tie-aware
  machinery first where the patch is installed.
  """
  def refuse_unless_installed():
    if not _machinery():
      raise _TieError(
          f'{tie_transform.__name__} needs the tie-aware Scope machinery, which'
          ' is not installed in Flax (FLAX_TIEEXT_AUTOPATCH=0 was set, or'
          ' flax_tieext.uninstall() was called). Call flax_tieext.install()'
          ' first.')

  @_functools.wraps(tie_transform)
  def guarded(*args, **kwargs):
    refuse_unless_installed()
    tied = tie_transform(*args, **kwargs)
    cls = tied.func if isinstance(tied, _functools.partial) else tied
    if isinstance(cls, type) and '_tie_guarded' in vars(cls):
      return tied  # a tied class made once, guarded then
    if isinstance(cls, type):
      post_init, call = cls.__post_init__, cls._call_wrapped_method
      cls._tie_guarded = True

      def __post_init__(self):  # pylint: disable=invalid-name
        refuse_unless_installed()
        post_init(self)

      def _call_wrapped_method(self, fun, args, kwargs):
        refuse_unless_installed()  # bound before uninstall(), or install()
        return call(self, fun, args, kwargs)

      cls.__post_init__ = __post_init__
      cls._call_wrapped_method = _call_wrapped_method
      return tied

    @_functools.wraps(tied)
    def tied_fn(*args, **kwargs):
      refuse_unless_installed()
      return tied(*args, **kwargs)

    return tied_fn
  return guarded


tie = _requires_install(_transforms.tie)
