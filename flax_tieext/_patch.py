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

"""The monkeypatch: installs flax_tieext's transforms into Flax, reversibly.

Every replaced attribute is listed once: in :func:`_bindings`, applied by
``install()``, in :func:`_machinery_bindings` (the hooks that make ``Scope``
and ``pack`` tie-aware), applied at the first tie, and in ``_ON_IMPORT``
(``nn.partitioning.remat``, ``nnx.remat``), applied when the program imports
their modules. So a program that declares no tie runs Flax's own ``Scope``
and imports nothing it did not import. ``install()``
records the exact original object of each binding *on the Flax module that owns
it*, so the record survives ``importlib.reload(flax_tieext)`` and a second
``install()`` is a no-op; ``uninstall()`` puts every original object back (or
deletes attributes Flax never had, such as ``flax.linen.tie``).

What wraps what when a tie is made, outermost first:

==========================  ===================================================
``nn.tie``, ``lift.tie``    ``flax_tieext.linen._requires_install``: refused
                            unless installed; binds the machinery (once)
``ties.declare``            :func:`_activating`: binds the machinery (once), for
                            ``flax_tieext.lift.tie``, which has no guard
``Scope``'s methods,        the hooks of :func:`_machinery_bindings`, one per
``lift._partial_pack``      method, each over Flax's own
``lift.scan``               :func:`_scan`: each call records its length and
                            axes' arguments, for a source scanned over
==========================  ===================================================
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import inspect
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any, Callable
import warnings

from flax import errors as flax_errors
import flax.core as flax_core
import flax.core.lift as _core_lift
import flax.core.scope as core_scope
import flax.linen as nn
import flax.linen.transforms as linen_transforms

from flax_tieext import _compat
from flax_tieext import errors
from flax_tieext import _static_args_diagnostics as diagnostics
from flax_tieext import linen as our_linen
from flax_tieext.core import _static_args
from flax_tieext.core import lift
from flax_tieext.core import tie_convert
from flax_tieext.core import tie_lift
from flax_tieext.core import ties
from flax_tieext.linen import transforms

AUTOPATCH_ENV = 'FLAX_TIEEXT_AUTOPATCH'
# Where the record of originals lives: an attribute of flax.core.lift, so that
# it is shared by every copy of this module (reloads included).
_STATE_ATTR = '_flax_tieext_patch_state'
_MISSING = object()
_lock = threading.RLock()


class PatchError(RuntimeError):
  """Raised by :func:`install` when the installed Flax cannot be patched."""


@dataclasses.dataclass
class _Binding:
  owner: Any
  attr: str
  # Builds the replacement from the original (``_MISSING`` if Flax has none).
  make: Callable[[Any], Any]


class _Use:
  """A replacement that does not need Flax's original: ``obj`` itself.

  Its docstring, which ``help()`` and the API page show, is written as for
  Flax, where ``nn.tie`` and ``static_argnames`` would need no plugin. Here
  its examples need the patch,
  so the docstring shown gains ``import flax_tieext`` (:func:`with_import`),
  on ``obj`` and on what it wraps (``flax_tieext.lift.tie`` for a guard).
  """

  def __init__(self, obj):
    self.obj = obj

  def __call__(self, original):
    del original
    shown = self.obj
    while callable(shown):
      if shown.__doc__:
        shown.__doc__ = with_import(shown.__doc__)
      shown = getattr(shown, '__wrapped__', None)
    return self.obj


SHOWN_IMPORT = 'import flax_tieext  # installs tie and static_argnames into Flax'


def with_import(doc: str) -> str:
  """``doc`` with ``>>> import flax_tieext`` first in its first example.

  First: an example's ``from flax.core import tie_variables`` needs it before.
  """
  lines = doc.splitlines(keepends=True)
  first = next((i for i, line in enumerate(lines) if line.lstrip().startswith('>>> ')), None)
  if first is None or SHOWN_IMPORT in doc:
    return doc
  indent = lines[first][:len(lines[first]) - len(lines[first].lstrip())]
  return ''.join([*lines[:first], f'{indent}>>> {SHOWN_IMPORT}\n', *lines[first:]])


def _bindings() -> list[_Binding]:
  """Every attribute the patch replaces, and how to build its replacement."""
  use = _Use
  return [
      # static_argnames: the transforms themselves.
      _Binding(_core_lift, 'checkpoint', use(lift.checkpoint)),
      _Binding(_core_lift, 'remat', use(lift.remat)),
      _Binding(flax_core, 'remat', use(lift.remat)),
      _Binding(linen_transforms, 'checkpoint', use(transforms.checkpoint)),
      _Binding(linen_transforms, 'remat', use(transforms.remat)),
      _Binding(nn, 'checkpoint', use(transforms.checkpoint)),
      _Binding(nn, 'remat', use(transforms.remat)),
      # (nn.partitioning.remat and nnx.remat: _ON_IMPORT, once imported.)
      # ... and nn.scan, which passes on the keywords a scanned remat makes
      # static (Flax's own scan for every other target).
      _Binding(linen_transforms, 'scan', use(transforms.scan)),
      _Binding(nn, 'scan', use(transforms.scan)),
      # static_argnames' diagnostics: the resolver's errors explained.
      _Binding(_static_args.StaticArgs, '__init__', diagnostics.explained_init),
      _Binding(_static_args.StaticArgs, 'apply', diagnostics.explained_apply),
      # tie: the new transforms ...
      _Binding(_core_lift, 'tie', use(_guarded(lift.tie))),
      _Binding(linen_transforms, 'tie', use(our_linen.tie)),
      _Binding(nn, 'tie', use(our_linen.tie)),
      _Binding(flax_core, 'tie_variables', use(tie_convert.tie_variables)),
      _Binding(flax_core, 'untie_variables', use(tie_convert.untie_variables)),
      # ... whose first use brings in the machinery below: their guard asks
      # for it, and so does a declaration.
      _Binding(our_linen, '_machinery', use(_bind_machinery)),
      _Binding(ties, 'declare', _activating),
      # ... and an init computes its output again where a target ran first
      # (bound now: the first tie may be declared inside the first init).
      _Binding(flax_core, 'init', _core_init),
      _Binding(core_scope, 'init', _core_init),
      # ... and pack records on each inner root the scope it is made from
      # (bound now: a tie declared inside a transform asks it of scopes packed
      # before the first tie).
      _Binding(_core_lift, 'pack', _pack),
      _Binding(_core_lift, '_partial_pack', _partial_pack),
      _Binding(core_scope.Scope, 'rewound', _scope_rewound),
      # ... and a scan call records what it scans, for a source scanned over
      # (bound now: nn.scan takes lift.scan when it is applied, often at
      # import time of the user's model).
      _Binding(_core_lift, 'scan', _scan),
      _Binding(flax_core, 'scan', _scan),
  ]


# ``flax.core.lift.tie``'s guard, made once: the patch binds one object.
_guarded = functools.cache(our_linen._requires_install)  # pylint: disable=protected-access


def _machinery_bindings() -> list[_Binding]:
  """The hooks that make Flax's ``Scope`` and ``pack`` tie-aware.

  Bound at the first tie (:func:`_bind_machinery`): until then no scope holds
  one and every hook would take its untied path, Flax's own method, so a
  program that makes no tie runs Flax's own ``Scope`` and ``pack``.

  One hook per method, so no hook wraps another: each runs the method it is
  bound over, Flax's own. A second hook for a method already listed would
  wrap the one listed before it (bound in list order, undone in reverse).
  """
  scope = core_scope.Scope
  return [
      _Binding(scope, 'push', _scope_push),
      _Binding(scope, 'param', _scope_param),
      # (module and single-variable ties alike: one hook per Scope method).
      _Binding(scope, '_collection', _scope_collection),
      _Binding(scope, '_mutable_collection',
               functools.partial(_scope_collection, write=True)),
      _Binding(scope, 'variables', _scope_variables),
      # (a sow writes the call's values: a target's copy refuses it first).
      _Binding(nn.Module, 'sow', _module_sow),
  ]


# -- The hooks ------------------------------------------------------------------
# Upstream, Flax's own methods make these calls into flax_tieext.core (the
# plugin cannot edit a released Flax's method bodies): each hook runs Flax's
# method and makes them around it when the scope holds ties.


def _calling_with(var, record, fn, /, *args, **kwargs):
  """``fn(*args, **kwargs)`` with ``var`` holding ``[record]`` for the call.

  The cell is emptied when the call returns: a context copied during the call
  (``contextvars.copy_context``, an asyncio task) keeps an empty list, never
  the record or what it holds.
  """
  cell = [record]
  token = var.set(cell)
  try:
    return fn(*args, **kwargs)
  finally:
    cell.clear()
    var.reset(token)


def _pack(pack):
  """``lift.pack``: a transform that reuses its trace has a site.

  Upstream each transform passes ``pack`` its declaration (``tie_sources=``),
  and ``pack`` hands it to ``_partial_pack``. Here, for ``nn.jit``, a
  :class:`ties.PackSite` made once per ``pack`` call (one trace cache) keeps
  the ties met inside it; each call of the packed function hands it to its
  ``_partial_pack`` in a one-element list (``ties.PACK_SITE``), which
  ``_partial_pack`` empties. Flax's ``pack`` gets the arguments as given,
  and any other name (a user's, hashable or not) changes nothing.
  """
  @functools.wraps(pack)
  def sited_pack(fn, in_variable_filters, out_variable_filters, rng_filters,
                 name=None, enable_kwargs=False):
    packed = pack(fn, in_variable_filters, out_variable_filters, rng_filters,
                  name, enable_kwargs)
    if type(name) is not str or name not in ties.CACHES_TRACE:  # pylint: disable=unidiomatic-typecheck
      return packed
    site = ties.PackSite(name)

    @functools.wraps(packed)
    def sited(scope_tree, *args, **kwargs):  # as Flax's wrapper
      return _calling_with(ties.PACK_SITE, site, packed, scope_tree, *args, **kwargs)
    sited.__wrapped__ = packed.__wrapped__  # Flax's: fn
    return sited
  return sited_pack


def _partial_pack(pack):
  """``lift._partial_pack``: inner roots are linked; tie sources are packed.

  Every inner root records the scope it is made from (``ties.linked``), as
  Flax records a child's parent, so a tie declared inside the transform
  reaches its source outside. Where ties are in force, the tie sources
  outside the scopes are packed too: upstream each transform passes
  ``pack`` what it declares of them (``tie_sources=``); a released transform
  does not, so it is looked up by the name the transform gives ``pack``
  (``ties.BY_PACK_NAME``; a transform not listed declares nothing). A scan
  call's record (:func:`_scan`) is read here, once, and emptied.
  """
  @functools.wraps(pack)
  def tied_partial_pack(scope_tree, in_variable_filters, out_variable_filters,
                        rng_filters, name=None):
    call, site = None, None
    if isinstance(name, str) and name == 'scan':
      cell = tie_lift.SCAN_CALL.get()
      if cell and cell[0].scope_tree is scope_tree:
        call = cell.pop()
    elif type(name) is str and name in ties.CACHES_TRACE:  # pylint: disable=unidiomatic-typecheck
      cell = ties.PACK_SITE.get()
      site = cell.pop() if cell else None
    # What the plugin's records name the pack by: its site, if it has one.
    label = name if site is None else site
    tied = _machinery_bound and tie_lift.packed(
        scope_tree, label, ties.sources_of(name), call)
    if not tied:
      scope_fn, *rest = pack(scope_tree, in_variable_filters,
                             out_variable_filters, rng_filters, name)
      return (ties.linked(scope_fn, scope_tree, label), *rest)
    # (Flax 0.8 returns invalidate_scopes_fn after publish_results_fn.)
    scope_fn, repack_fn, variable_groups, rng_groups, publish_fn, *rest = pack(
        tied.scopes, in_variable_filters, out_variable_filters, rng_filters,
        name)
    scope_fn, repack_fn, publish_fn = tied.wrap(scope_fn, repack_fn, publish_fn)
    return (scope_fn, repack_fn, tied.keyed(variable_groups), rng_groups,
            publish_fn, *rest)
  return tied_partial_pack


@functools.cache  # one object for lift.scan and its alias flax.core.scan
def _scan(scan):
  """``lift.scan``: each call records what it scans (``tie_lift.ScanCall``).

  Upstream, ``scan``'s ``inner`` hands its length and variable axes to the
  tie sources it packs. Here the scan function records the arguments it was
  made with and the inputs of each call, for the ``_partial_pack`` of that
  call; only a tie source scanned over (``in_scan='scanned'``) reads them.
  The record lives in a one-element list that ``_partial_pack`` empties and
  the call empties when it returns: a context copied inside the call
  (``contextvars.copy_context``, an asyncio task) keeps no argument of it.
  The scan function takes its arguments as Flax's does (``scope_tree``, then
  whatever ``inner`` takes) and is wrapped as Flax wraps it.
  """
  def recording_scan(*scan_args, **scan_kwargs):
    scan_fn = scan(*scan_args, **scan_kwargs)

    @functools.wraps(scan_fn)
    def recording_scan_fn(scope_tree, *args, **kwargs):  # as Flax's wrapper
      call = tie_lift.ScanCall(scope_tree, scan, scan_args, scan_kwargs, args[1:])
      return _calling_with(tie_lift.SCAN_CALL, call, scan_fn, scope_tree, *args, **kwargs)
    recording_scan_fn.__wrapped__ = scan_fn.__wrapped__  # Flax's: its inner
    return recording_scan_fn
  return _taking_parameters_of(scan, recording_scan)


def _taking_parameters_of(original, body):
  """``body`` behind a function with ``original``'s very parameters.

  Their names, kinds and defaults, so that a call binds (or fails to bind)
  exactly as it does on ``original``, and ``inspect.signature`` of the
  function itself (``follow_wrapped=False``) is ``original``'s; ``body``
  gets the call's arguments as bound. Wrapped as ``functools.wraps`` wraps.
  """
  parameters, passed, defaults = [], [], {}
  kinds = inspect.Parameter
  signature = inspect.signature(original, follow_wrapped=False)
  for p in signature.parameters.values():
    text, arg = p.name, p.name
    if p.default is not p.empty:
      defaults[p.name] = p.default
      text += f'=_defaults[{p.name!r}]'
    if p.kind is kinds.VAR_POSITIONAL:
      text, arg = f'*{p.name}', f'*{p.name}'
    elif p.kind is kinds.VAR_KEYWORD:
      text, arg = f'**{p.name}', f'**{p.name}'
    elif p.kind is kinds.KEYWORD_ONLY:
      if not any(t.startswith('*') for t in parameters):
        parameters.append('*')
      arg = f'{p.name}={p.name}'
    elif p.kind is not kinds.POSITIONAL_ONLY and any(
        q.kind is kinds.POSITIONAL_ONLY for q in signature.parameters.values()
    ) and '/' not in parameters:
      parameters.append('/')
    parameters.append(text)
    passed.append(arg)
  name = getattr(original, '__name__', 'wrapper')
  source = (f'def {name}({", ".join(parameters)}):\n'
            f'  return _body({", ".join(passed)})\n')
  namespace = {'_defaults': defaults, '_body': body}
  exec(source, namespace)  # pylint: disable=exec-used
  return functools.wraps(original)(namespace[name])


def _scope_rewound(rewound):
  """``Scope.rewound``: a rewound inner root stands for what the root does.

  Upstream the link ``pack`` records is a field of the inner root that
  ``rewound`` carries, as it carries ``flags`` (a module's scope is rewound
  after each of its compact methods).
  """
  @functools.wraps(rewound)
  def linked_rewound(self, rewind_rngs=False):
    scope = rewound(self, rewind_rngs)
    link = self.__dict__.get(ties.LINK)
    if link is not None:
      scope.__dict__[ties.LINK] = link
    return scope
  return linked_rewound


@functools.cache  # one object for flax.core.init and its alias scope.init
def _core_init(init):
  """``flax.core.init``: where a target ran first, init runs again, seeded.

  Upstream, ``init``'s wrapper would call ``ties.init_once_more`` itself. A
  target that runs before its source computes with a copy; where the copy
  differs from what ``init`` stores for the source, the init runs again with
  the source's values stored at the target (``apply`` of them with the
  ``initializing`` flag, as ``init`` is ``apply`` of ``{}``), so its output
  and every collection it returns are computed from the source's values.
  """
  @functools.wraps(init)
  def tied_init(fn, mutable=True, flags=None):
    @functools.wraps(fn)
    def fn_then_check(root, *args, **kwargs):
      y = fn(root, *args, **kwargs)
      ties.check_deferred(root)  # copies whose source ran after them
      return y

    first = init(fn_then_check, mutable, flags)
    first.__wrapped__ = fn  # as Flax's init wraps it
    if mutable is False:  # nothing can be stored: no target runs first
      return first

    @functools.wraps(first)
    def wrapper(rngs, *args, **kwargs):
      def again(seeds):
        keys = rngs if isinstance(rngs, Mapping) else {'params': rngs}
        return core_scope.apply(
            fn_then_check, mutable=mutable,
            flags={**(flags or {}), 'initializing': True},
        )(seeds, *args, rngs=keys, **kwargs)
      return ties.init_once_more(
          lambda: first(rngs, *args, **kwargs), again)
    wrapper.__wrapped__ = fn
    return wrapper
  return tied_init


def _scope_push(push):
  """``Scope.push``: a child under ties gets its source's rng streams."""
  @functools.wraps(push)
  def tied_push(self, name=None, prefix='', reuse=False):
    scope = push(self, name, prefix, reuse)
    if ties.TIES_FLAG in self.flags:
      ties.share_rngs(scope)
    return scope
  return tied_push


def _scope_collection(collection, write=False):
  """``Scope._collection`` (``_mutable_collection`` with ``write``) under ties."""
  @functools.wraps(collection)
  def tied_collection(self, col, untied=False):
    if not untied and ties.TIES_FLAG in self.flags:
      return ties.collection(self, col, write)
    return collection(self, col)
  return tied_collection


def _module_sow(sow):
  """``Module.sow``: its write is the call's values, never an init's.

  Upstream, ``sow`` would say so to ``put_variable``; here it writes with
  ``ties.SOWING`` set, so that the copy of a tie's target that runs before
  its source refuses it (``ties.FirstCopy``, ``ties.TiedNames``): one module
  called at both places keeps the values sown by either, a dropped copy
  cannot (a second ``init`` run, seeded with the source's values, appended
  to them).
  """
  @functools.wraps(sow)
  def tied_sow(self, col, name, *args, **kwargs):
    if self.scope is None or ties.TIES_FLAG not in self.scope.flags:
      return sow(self, col, name, *args, **kwargs)
    return _calling_with(ties.SOWING, col, sow, self, col, name, *args,
                         **kwargs)
  return tied_sow


def _scope_param(param):
  """``Scope.param``: a tied parameter is checked against its target's init.

  Upstream, ``param`` calls ``ties.check_param`` where it has the stored value
  and what ``init_fn`` gives, and ``ties.refuse_unknown_collection`` before it
  raises that it found none; here ``init_fn``'s result is recorded and the
  same calls follow Flax's return or error.
  """
  @functools.wraps(param)
  def tied_param(self, name, init_fn, *init_args, **init_kwargs):
    if ties.TIES_FLAG not in self.flags:
      return param(self, name, init_fn, *init_args, **init_kwargs)
    made = []

    def recorded(*args, **kwargs):
      made.append(init_fn(*args, **kwargs))
      return made[-1]

    try:
      value = param(self, name, recorded, *init_args, **init_kwargs)
    except flax_errors.ScopeParamShapeError:
      ties.check_param(self, name, self.get_variable('params', name), made[0])
      raise
    except (flax_errors.ScopeParamNotFoundError,
            flax_errors.ScopeCollectionNotFound):
      ties.refuse_unknown_collection(self, name)
      raise
    if made:
      ties.check_param(self, name, value, made[0])
    return value
  return tied_param


def _scope_variables(variables):
  """``Scope.variables``: the names variable ties target are in it."""
  @functools.wraps(variables)
  def tied_variables(self):
    found = variables(self)
    if ties.TIES_FLAG in self.flags:
      found = ties.tied_variables(self, found)
    return found
  return tied_variables


def _nnx_scan(scan):
  """``nnx.scan``: tied sources scanned over, and errors that name the tie.

  A source that an NNX tie broadcasts into a stack, given ``None`` in the
  scan's prefix, is scanned over where the tie's ``in_scan`` says so
  (``tielib.scanned_sources``: the call runs Flax's own scan with that
  source broadcast to the stack and its prefix 0). Where JAX refuses the
  leading axes of what the scan slices, such a source may be among them; the
  hook asks ``tielib.sliced_source`` and raises its TieError from JAX's
  error, or lets the error pass. Any other call runs Flax's own. Upstream,
  ``scan`` would ask where it calls ``jax.lax.scan``. Without tree mode
  (``graph=``) there are no NNX ties, and Flax's ``scan`` stays.
  """
  params = inspect.signature(scan).parameters
  if 'graph' not in params:
    return scan
  missing, default_axes = params['f'].default, params['in_axes'].default

  def scan_naming_ties(f=missing, **scan_kwargs):
    if f is missing:  # a decorator with arguments
      return functools.partial(scan_naming_ties, **scan_kwargs)
    scanned = scan(f, **scan_kwargs)

    @functools.wraps(scanned)
    def call(*args, **kwargs):
      from flax_tieext.nnx import tielib  # pylint: disable=g-import-not-at-top
      if not any(map(tielib.broadcasts, args)):  # no tie of the plugin's
        return scanned(*args, **kwargs)
      in_axes = scan_kwargs.get('in_axes', default_axes)
      stacked = None if kwargs else tielib.scanned_sources(in_axes, args)
      if stacked is not None:  # tied sources the scan slices (in_scan)
        args, axes, check = stacked
        out = scan(f, **{**scan_kwargs, 'in_axes': axes})(*args)
        check()
        return out
      try:
        return scanned(*args, **kwargs)
      except ValueError as error:
        if isinstance(error, errors.TieError):
          raise
        try:
          sliced = tielib.sliced_source(in_axes, args)
        except Exception:  # pylint: disable=broad-except
          sliced = None  # the explanation failed: Flax's error stands
        if sliced is None:
          raise
        raise sliced from error
    call.__wrapped__ = scanned.__wrapped__  # Flax's: f

    return call

  scan_naming_ties = _taking_parameters_of(scan, scan_naming_ties)
  return scan_naming_ties


def _activating(declare):
  """``ties.declare`` that binds the tie machinery first (once)."""
  @functools.wraps(declare)
  def declare_with_machinery(*args, **kwargs):
    _bind_machinery()
    return declare(*args, **kwargs)
  return declare_with_machinery


# Whether this copy of the module has seen the machinery bound (a reloaded
# copy starts unbound, and _bind_machinery finds the record bound already).
_machinery_bound = False


def _bind_machinery() -> bool:
  """Applies :func:`_machinery_bindings` to an installed patch, once.

  Returns whether the patch is installed (the guard of ``nn.tie`` asks).
  """
  global _machinery_bound
  if _machinery_bound:  # a global read: no lock once bound
    return True
  with _lock:
    record = _state()
    if record is None:
      return False
    if not any(attr == 'push' for _, attr, _ in record):
      _apply(_machinery_bindings(), record)
    _machinery_bound = True
    return True


def _partitioning_bindings() -> list[_Binding]:
  """``nn.partitioning.remat``."""
  import flax.linen.partitioning as partitioning  # pylint: disable=g-import-not-at-top

  return [_Binding(partitioning, 'remat', _Use(our_linen.partitioning.remat))]


def _nnx_bindings() -> list[_Binding]:
  """``nnx.remat``, under every name Flax exports it by (none without NNX).

  Also ``nnx.scan``, which names a tied source it slices (:func:`_nnx_scan`).
  """
  aliases = _compat.nnx_facts()['NNX_REMAT_ALIASES']  # read before binding
  if not aliases:
    return []
  from flax_tieext.nnx.transforms import remat  # pylint: disable=g-import-not-at-top
  return [*(_Binding(owner, attr, _Use(remat)) for owner, attr in aliases),
          _Binding(sys.modules[_compat.NNX], 'scan', _nnx_scan)]


# Modules the patch does not import, each with its bindings, applied right
# after the program imports it (or at install, if it already has): importing
# them is slow (flax.nnx) or would change what Flax looks like
# (flax.linen.partitioning is not an attribute of flax.linen until imported).
_ON_IMPORT = {
    'flax.linen.partitioning': _partitioning_bindings,
    _compat.NNX: _nnx_bindings,
}


class _BindOnImport(importlib.abc.MetaPathFinder):
  """Binds the bindings of a module of ``_ON_IMPORT`` right after its import."""

  def find_spec(self, fullname, path, target=None):
    if fullname not in _ON_IMPORT:
      return None
    for finder in sys.meta_path:
      find = getattr(finder, 'find_spec', None)
      spec = None if finder is self or find is None else find(
          fullname, path, target)
      if spec is not None and spec.loader is not None:
        break
    else:
      return None
    exec_module = spec.loader.exec_module

    def exec_module_then_bind(module):
      exec_module(module)
      try:
        _bind_imported(fullname)
      except Exception as e:  # not an ImportError: the module did import
        raise PatchError(
            f'flax_tieext could not patch {fullname}: {e!r}') from e

    spec.loader.exec_module = exec_module_then_bind
    return spec


def _import_hooks() -> list[Any]:
  # By class name, so that a hook of a reloaded copy of this module is found.
  return [f for f in sys.meta_path
          if type(f).__name__ == _BindOnImport.__name__]


def _bind_imported(just_imported: str | None = None) -> None:
  """Applies the bindings of each imported module of ``_ON_IMPORT``, once.

  A binding already in the record of originals is not applied again; a
  module still executing its own import (``flax.nnx`` importing
  ``flax.linen.partitioning``) is bound when its import completes
  (``just_imported``: the module whose ``exec_module`` just returned). The
  import hook goes once every module is bound.
  """
  with _lock:
    record = _state()
    if record is None:
      return
    imported = [name for name in _ON_IMPORT
                if name == just_imported or _imported(name)]
    for name in imported:
      done = {(id(owner), attr) for owner, attr, _ in record}
      _apply([b for b in _ON_IMPORT[name]()
              if (id(b.owner), b.attr) not in done], record)
    if len(imported) == len(_ON_IMPORT):
      for hook in _import_hooks():
        sys.meta_path.remove(hook)


def _imported(name: str) -> bool:
  module = sys.modules.get(name)
  spec = getattr(module, '__spec__', None)
  return module is not None and not getattr(spec, '_initializing', False)


def missing_features() -> list[str]:
  """What the installed Flax lacks that the patch builds on.

  Checked by presence, not version: every original a binding wraps (the Scope
  hooks, ``_partial_pack``). A binding that puts its own object in place
  (``nn.remat``, ``nn.tie``, ...) needs nothing from Flax.
  """
  return [
      f'{getattr(b.owner, "__name__", b.owner)}.{b.attr}'
      for b in [*_bindings(), *_machinery_bindings()]
      if not isinstance(b.make, _Use)
      and _owner_dict_get(b.owner, b.attr) is _MISSING
  ]


def _state() -> list[tuple[Any, str, Any]] | None:
  return getattr(_core_lift, _STATE_ATTR, None)


def is_installed() -> bool:
  """Returns True if the flax_tieext patch is currently installed in Flax."""
  return _state() is not None


def _owner_dict_get(owner, attr):
  # Read from the owner's own namespace so that a method inherited by a
  # subclass is not mistaken for one defined on it.
  return vars(owner).get(attr, _MISSING)


def install() -> None:
  """Installs ``static_argnames`` and ``tie`` into Flax (idempotent).

  Raises:
    PatchError: if the installed Flax lacks something the patch needs. Flax is
      left untouched in that case.
  """
  with _lock:
    if is_installed():
      return
    missing = missing_features()
    if missing:
      raise PatchError(
          f'flax_tieext cannot patch Flax {_compat.FLAX_VERSION} (jax'
          f' {_compat.JAX_VERSION}): it lacks ' + '; '.join(missing) + '. The'
          ' flax_tieext.lift and flax_tieext.linen transforms may still work'
          ' on their own; supported releases are listed in the README.'
      )
    record = []
    _apply(_bindings(), record)
    setattr(_core_lift, _STATE_ATTR, record)
    sys.meta_path.insert(0, _BindOnImport())
    _bind_imported()
    # nn.partitioning.remat's docstring shows the import from now on, as the
    # docstrings of what is bound now do, bound or not (help(), the API page).
    _Use(our_linen.partitioning.remat)(_MISSING)


def _apply(bindings: list[_Binding], record: list[tuple[Any, str, Any]]):
  """Applies ``bindings``, recording each original; all or none of them."""
  done = len(record)
  try:
    for b in bindings:
      original = _owner_dict_get(b.owner, b.attr)
      replacement = b.make(original)
      record.append((b.owner, b.attr, original))
      setattr(b.owner, b.attr, replacement)
  except BaseException:
    _restore(record[done:])
    del record[done:]
    raise


def _restore(record):
  for owner, attr, original in reversed(record):
    if original is _MISSING:
      if attr in vars(owner):
        delattr(owner, attr)
    else:
      setattr(owner, attr, original)


def uninstall() -> None:
  """Restores every patched Flax attribute to its exact original object."""
  global _machinery_bound
  with _lock:
    record = _state()
    if record is None:
      return
    _machinery_bound = False
    _restore(record)
    delattr(_core_lift, _STATE_ATTR)
    for hook in _import_hooks():
      sys.meta_path.remove(hook)


def autopatch() -> None:
  """Runs at ``import flax_tieext`` unless ``FLAX_TIEEXT_AUTOPATCH=0``.

  On a Flax the patch cannot handle, warns once and leaves Flax untouched.
  """
  if os.environ.get(AUTOPATCH_ENV, '1').strip().lower() in ('0', 'false', 'no', 'off'):
    return
  try:
    install()
  except PatchError as e:
    warnings.warn(str(e), RuntimeWarning, stacklevel=3)
