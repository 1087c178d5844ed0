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

"""Every difference between supported Flax / JAX releases, in one place.

The rest of the package asks this module *what the installed Flax offers*
instead of comparing version strings. What the monkeypatch needs from Flax is
derived from its bindings (``_patch.missing_features()``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import sys
from collections.abc import Callable
from typing import Any
import warnings

import flax
import jax

FLAX_VERSION: str = getattr(flax, '__version__', None) or importlib.metadata.version('flax')
JAX_VERSION: str = jax.__version__


def adapt_partial_pack(partial_pack):
  """Builds the ``_partial_pack`` replacement for the installed Flax.

  Args:
    partial_pack: flax_tieext's ``_partial_pack`` (5 return values).

  Returns:
    A function building the binding's replacement from Flax's original: the
    function itself, or, on Flax <= 0.9, a version that also returns the
    ``invalidate_scopes_fn`` those releases expect (invalidating every inner
    scope handed out, as upstream does).
  """

  def make(original):
    if 'invalidate_scopes_fn' not in original.__code__.co_varnames:
      return partial_pack

    def partial_pack_with_invalidate(*args, **kwargs):
      scope_fn, repack_fn, *rest = partial_pack(*args, **kwargs)
      handed_out = []

      def tracking_scope_fn(*a, **k):
        for s in handed_out:
          s.invalidate()
        tree = scope_fn(*a, **k)
        handed_out[:] = jax.tree_util.tree_leaves(tree)
        return tree

      def invalidate_scopes_fn():
        for s in handed_out:
          s.invalidate()

      return (tracking_scope_fn, repack_fn, *rest, invalidate_scopes_fn)

    return partial_pack_with_invalidate

  return make


# -- NNX ---------------------------------------------------------------------
# nnx.remat is patched where the installed Flax has it; a Flax without NNX
# lacks nothing the rest of the patch needs.

try:
  # pylint: disable-next=g-import-not-at-top,g-importing-member
  from flax.typing import MISSING, Missing
except ImportError:  # Flax 0.8: no shared sentinel

  class Missing:
    """The type of ``MISSING``, the "argument not given" sentinel."""

  MISSING = Missing()

# Some releases import flax.nnx with a DeprecationWarning of their own (Flax
# 0.11 / 0.12.0 on jax 0.8: "jax.array_ref is deprecated"): not the user's to
# fix, and an error under `-W error` if flax_tieext were the one to show it.
with warnings.catch_warnings():
  warnings.filterwarnings(
      'ignore', category=DeprecationWarning, module=r'flax\.nnx'
  )
  try:
    import flax.nnx as _nnx  # pylint: disable=g-import-not-at-top
  except ImportError:
    _nnx = None

# Flax's own nnx.remat, read before the patch replaces it (None without it).
NNX_REMAT = getattr(_nnx, 'remat', None)


def _nnx_remat_aliases() -> tuple[tuple[Any, str], ...]:
  if NNX_REMAT is None:
    return ()
  return tuple(
      (module, name)
      for module_name, module in sorted(sys.modules.items())
      if module is not None and module_name.split('.')[0] == 'flax'
      for name, value in list(vars(module).items())
      if value is NNX_REMAT
  )


# Every (module, name) by which Flax exports its own nnx.remat, found by
# presence before the patch: the loaded Flax modules holding the object, such
# as flax.nnx and the module that defines it (flax.nnx.transforms.autodiff, or
# flax.nnx.nnx.transforms... in older releases). Empty without NNX.
NNX_REMAT_ALIASES = _nnx_remat_aliases()


def nnx_remat_decorator(**options) -> Callable[[Callable[..., Any]], Any]:
  """Flax's own ``nnx.remat`` as a decorator taking ``options``.

  Options that are ``None`` take Flax's defaults, resolved now as Flax
  resolves them when ``nnx.remat`` is called: ``graph`` and ``graph_updates``
  (newer releases only) from ``nnx.set_graph_mode`` / ``set_graph_updates``.
  Flax's own decorator form is not used: it calls ``remat`` by its module
  name, which the patch replaces.
  """
  options = {k: v for k, v in options.items() if v is not None}
  accepted = inspect.signature(NNX_REMAT).parameters
  for option, setting in (
      ('graph', 'set_graph_mode'), ('graph_updates', 'set_graph_updates')
  ):
    context = getattr(getattr(_nnx, 'graphlib', None), setting, None)
    if option in accepted and option not in options and context is not None:
      options[option] = context.current_value()
  return functools.partial(NNX_REMAT, **options)
