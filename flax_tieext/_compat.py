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

"""What the installed Flax and JAX offer, asked by presence, not version.

Their versions (for messages), what the loaded ``flax.nnx`` has of
``nnx.remat``, and ``nnx.remat`` with ``static_argnames`` for the releases
whose own has no graph and tree modes. What the monkeypatch needs from Flax is
derived from its bindings (``_patch.missing_features()``); the hooks it binds
into Flax's ``Scope`` and ``pack`` are in ``_patch``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Callable, Iterable
from typing import Any
import warnings

import flax
import jax

from flax_tieext.core import _static_args

FLAX_VERSION: str = getattr(flax, '__version__', None) or importlib.metadata.version('flax')
JAX_VERSION: str = jax.__version__


# nnx.remat is patched where the installed Flax has it; a Flax without NNX
# lacks nothing the rest of the patch needs.

try:
  # pylint: disable-next=g-import-not-at-top,g-importing-member
  from flax.typing import MISSING, Missing
except ImportError:  # Flax 0.8: no shared sentinel

  class Missing:
    """The type of ``MISSING``, the "argument not given" sentinel."""

  MISSING = Missing()

# flax.nnx is imported only when the user imports it: it takes longer to
# import than flax.linen, and Linen users need none of it. Its facts are read
# once it is loaded, before the patch replaces anything (_patch binds
# nnx.remat right after flax.nnx is imported).
NNX = 'flax.nnx'
_NNX_FACTS = ('NNX_REMAT', 'NNX_REMAT_ALIASES', 'NNX_REMAT_MODES',
              'NNX_REMAT_BINDS_DEFAULTS')
_nnx_facts: dict[str, Any] = {}


def nnx_facts() -> dict[str, Any]:
  """What the loaded ``flax.nnx`` offers (nothing if it is not loaded).

  Read once, when first asked for after ``flax.nnx`` is loaded.
  """
  if _nnx_facts or NNX not in sys.modules:
    return _nnx_facts or dict.fromkeys(_NNX_FACTS)
  remat = getattr(sys.modules[NNX], 'remat', None)
  _nnx_facts.update({
      # Flax's own nnx.remat (None without it).
      'NNX_REMAT': remat,
      # Every (module, name) by which Flax exports it, found by presence: the
      # loaded Flax modules holding the object, such as flax.nnx and the
      # module that defines it (flax.nnx.transforms.autodiff, or
      # flax.nnx.nnx.transforms... in older releases). Empty without NNX.
      'NNX_REMAT_ALIASES': () if remat is None else tuple(
          (module, name)
          for module_name, module in sorted(sys.modules.items())
          if module is not None and module_name.split('.')[0] == 'flax'
          for name, value in list(vars(module).items())
          if value is remat
      ),
      # Whether it has graph and tree modes (graph=, graph_updates=), as Flax
      # main has: then flax_tieext.nnx.remat is Flax main's own with
      # static_argnames (flax_tieext/nnx/transforms/autodiff.py); without
      # them, nnx_remat below.
      'NNX_REMAT_MODES': remat is not None and 'graph_updates' in (
          inspect.signature(remat).parameters),
      # Whether the function it returns binds a call's defaults and traces
      # them (0.9 on: resolve_kwargs, keywords taken), so a str default is a
      # TypeError; Flax 0.8's takes positional arguments only and leaves
      # defaults to Python.
      'NNX_REMAT_BINDS_DEFAULTS': remat is not None and any(
          p.kind is p.VAR_KEYWORD for p in inspect.signature(
              remat(lambda x: x), follow_wrapped=False).parameters.values()),
  })
  return _nnx_facts


def __getattr__(name: str) -> Any:
  """``NNX_REMAT``, ``NNX_REMAT_ALIASES``, ``NNX_REMAT_MODES``,
  ``NNX_REMAT_BINDS_DEFAULTS``: imports flax.nnx."""
  if name not in _NNX_FACTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  # Some releases import flax.nnx with a DeprecationWarning of their own
  # (Flax 0.11 / 0.12.0 on jax 0.8: "jax.array_ref is deprecated"): not the
  # user's to fix, and an error under `-W error` if flax_tieext showed it.
  with warnings.catch_warnings():
    warnings.filterwarnings(
        'ignore', category=DeprecationWarning, module=r'flax\.nnx'
    )
    try:
      importlib.import_module(NNX)
    except ImportError:
      pass
  return nnx_facts()[name]


def nnx_remat(
    f: Any = MISSING,
    *,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Iterable[str] = (),
    policy: Callable[..., bool] | None = None,
) -> Any:
  """``nnx.remat`` with ``static_argnames``, for an ``nnx.remat`` without modes.

  Flax 0.8.5 to 0.12.0: the release's own ``nnx.remat`` of ``f``, with the
  static arguments resolved by ``_static_args.StaticArgs``, as Flax main's
  does, and closed over at each call. Used as a decorator too, which Flax
  0.8's ``nnx.remat`` is not.
  """
  if isinstance(f, Missing):
    return functools.partial(
        nnx_remat, prevent_cse=prevent_cse, static_argnums=static_argnums,
        static_argnames=static_argnames, policy=policy)
  statics = _static_args.StaticArgs(
      f, static_argnums, static_argnames, transform='nnx.remat',
      supplies_first=False, rebuilds=True)
  remat = functools.partial(
      nnx_facts()['NNX_REMAT'], prevent_cse=prevent_cse, policy=policy)
  if statics.as_flax:  # static_argnums as the release's nnx.remat reads it
    plain = remat(f, static_argnums=statics.plain)
    return functools.wraps(f)(lambda *args, **kwargs: statics.apply(
        lambda _, args, kwargs: plain(*args, **kwargs), args, kwargs))

  # One remat per static value, kept as jax.checkpoint keeps its traces (an
  # LRU of JAX's size, alive with this wrapper): the same static value traces
  # once, as on the release's own remat; an unhashable container, which its
  # graph mode makes anew at each call, traces at each call (Static).
  @functools.lru_cache(maxsize=2048)
  def merged(static):
    def call(args, kwargs):  # positional only: older graph modes need that
      args, kwargs = statics.merge(static, args, kwargs)
      return f(*args, **kwargs)
    return remat(call)

  unstatic = merged(((), ()))  # without static arguments: made once
  signature = _static_args.call_signature(f)
  # A str default stays untraced where arguments are made static or the
  # release's own nnx.remat leaves defaults to Python; else it is traced and
  # refused, as the release refuses it.
  omit_str = (statics.static_argnums != () or statics.static_argnames != ()
              or not nnx_facts()['NNX_REMAT_BINDS_DEFAULTS'])

  @functools.wraps(f)
  def wrapper(*args, **kwargs):
    return statics.apply(
        lambda static, args, kwargs: (
            merged(static) if any(static) else unstatic)(args, kwargs),
        *_static_args.bind_call(signature, args, kwargs, omit_str))

  return wrapper
