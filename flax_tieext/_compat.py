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
instead of comparing version strings. ``missing_features()`` is the single
check the monkeypatch runs before it touches anything.
"""

from __future__ import annotations

import importlib.metadata

import flax
import flax.core.lift as _core_lift
import flax.core.scope as _core_scope
import flax.linen.partitioning as _partitioning
import flax.linen.transforms as _linen_transforms
import jax

FLAX_VERSION: str = getattr(flax, '__version__', None) or importlib.metadata.version('flax')
JAX_VERSION: str = jax.__version__


def _version_tuple(v: str) -> tuple[int, ...]:
  out = []
  for part in v.split('.')[:3]:
    digits = ''.join(ch for ch in part if ch.isdigit())
    out.append(int(digits) if digits else 0)
  return tuple(out)


FLAX_VERSION_INFO = _version_tuple(FLAX_VERSION)
JAX_VERSION_INFO = _version_tuple(JAX_VERSION)

# What the patch needs from Flax, as (owner, attribute, why). Checked by
# presence, not by version number, so that an unknown release is judged on
# what it actually offers.
REQUIRED_ATTRIBUTES = (
    (_core_lift, 'pack', 'the primitive every lifted transform builds on'),
    (_core_lift, '_partial_pack', 'the scope rewriting shared by all lifted transforms'),
    (_core_lift, '_dedup_scopes', 'scope de-duplication inside pack'),
    (_core_lift, 'checkpoint', 'lifted jax.checkpoint'),
    (_core_lift, 'remat', 'alias of lift.checkpoint'),
    (_linen_transforms, 'lift_transform', 'Module-level lifting of core transforms'),
    (_linen_transforms, 'checkpoint', 'nn.checkpoint'),
    (_linen_transforms, 'remat', 'nn.remat'),
    (_partitioning, 'remat', 'nn.partitioning.remat'),
    (_core_scope.Scope, 'push', 'child scope creation'),
    (_core_scope.Scope, '_collection', 'read access to a collection'),
    (_core_scope.Scope, '_mutable_collection', 'write access to a collection'),
    (_core_scope.Scope, 'get_variable', 'variable reads'),
    (_core_scope.Scope, 'has_variable', 'variable lookup'),
    (_core_scope.Scope, 'put_variable', 'variable writes'),
)


def missing_features() -> list[str]:
  """Returns a description of everything the installed Flax lacks."""
  missing = []
  for owner, attr, why in REQUIRED_ATTRIBUTES:
    if not hasattr(owner, attr):
      name = getattr(owner, '__name__', repr(owner))
      missing.append(f'{name}.{attr} ({why})')
  return missing



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
