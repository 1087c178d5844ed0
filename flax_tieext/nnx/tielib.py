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

"""Ties in tree-mode NNX: one Variable at two places under ``graph=False``.

In graph mode an NNX module may hold one Variable at two places and every
API keeps the sharing. Tree mode (``graph=False``, Flax FLIP 5310) treats a
module as a JAX pytree, which cannot share: an alias is refused with
"Duplicate Param ... does not support Variable aliasing". :func:`tie` brings
the sharing back the way ``eqx.nn.Shared`` does, by tree surgery: the tied
module's pytree holds each tied Variable once (at its source), and every
unflatten, which is how each tree-mode API and transform rebuilds the module,
puts the source Variable back at the target. The whole mechanism is the
module's pytree flatten and unflatten; graph mode, which uses the graph
protocol, is left exactly as it is.
"""

from __future__ import annotations

import copy
import copyreg
from collections.abc import Mapping
import functools
import types
import typing as tp
import weakref

import jax

from flax import nnx
from flax import traverse_util
from flax.nnx import reprlib
from flax.nnx import variablelib

from flax.core import meta

from flax_tieext.core import tie_convert
from flax_tieext.core import tie_errors
from flax_tieext.core import tie_spec
from flax_tieext.errors import TieError
from flax_tieext.nnx import _tree_mode

if not _tree_mode.TREE_MODE:
  raise ImportError(
      'flax_tieext.nnx.tielib is for NNX tree mode (graph=False), which this'
      ' Flax does not have (Flax 0.12.8 and later of the supported releases'
      ' do); in graph mode, share a module or Variable by reference.'
  )

M = tp.TypeVar('M', bound=nnx.Module)
Path = tuple[str, ...]
TieSpec = tp.Union[str, tuple[str, tp.Callable[[tp.Any], tp.Any]]]


Tie = tie_spec.Tie  # Linen's record; NNX's say so with sep='.'


def _name(fn) -> str:
  return getattr(fn, '__qualname__', None) or repr(fn)


def _records(ties, inherited: tuple[Tie, ...] = (),
             api: str = 'flax_tieext.nnx.tie', in_scan: str | None = None
             ) -> tuple[Tie, ...]:
  """The ties of a tied class, or the normal form of ``ties`` and ``inherited``.

  ``ties`` in NNX's spelling (``'head.kernel'``); the normal form is Linen's
  (``tie_spec.compose``): chains resolve to their final source, stacked
  declarations mean their union, cycles and self-ties are refused.
  """
  if isinstance(ties, type) and hasattr(ties, '_tieext_ties'):
    return ties._tieext_ties  # pylint: disable=protected-access
  items = dict(tie_spec.given(ties, api, '.'))  # checked before any use
  in_scan = tie_spec.in_scan_given(in_scan, api)
  return tie_spec.compose(inherited + tie_spec.absolute(items, None, (), '.', in_scan))


# --------------------------------------------------------------------------
# Paths in a module
# --------------------------------------------------------------------------
class _Attributes(Mapping):
  """A module's attributes as a tree, as ``tie_errors.nearest`` reads one."""

  def __init__(self, node):
    self._vars = vars(node)

  def __getitem__(self, key):
    value = self._vars[key]
    return _Attributes(value) if isinstance(value, nnx.Pytree) else value

  def __iter__(self):
    return (k for k in self._vars if not k.startswith('_'))

  def __len__(self):
    return sum(1 for _ in self)


def _lookup(root, path: Path, record: Tie, role: str, where: str):
  """The value at ``path`` in ``root``, or a TieError naming what is near."""
  value = _get(root, path)
  if value is _MISSING:
    raise tie_errors.tie_error(
        f'{where}: {record.describe()}: the {role} {record.text(path)} does'
        ' not exist.' + tie_errors.nearest(_Attributes(root), path, sep='.'),
        f'Fix the {role} path: attribute paths from the tied module, such as'
        " 'head.kernel' or 'layers.0.kernel'.")
  return value


# --------------------------------------------------------------------------
# Read-only views
# --------------------------------------------------------------------------
_WHOLE = object()  # get_value() without an index
_VIEW_SLOTS = ('_tie_source', '_tie_record')


@functools.cache
def _view_type(var_type: type[nnx.Variable]) -> type[nnx.Variable]:
  """A ``var_type`` whose value is computed from its source on every read."""

  def get_value(self, *, index=_WHOLE):
    try:
      source, fn = self._tie_source, self._tie_record.view
    except AttributeError:
      tie = self.get_metadata().get('tie_view', 'a tie through a view')
      raise TieError(
          f'The {var_type.__name__} target of the {tie} was rebuilt without'
          ' its source, so its view cannot be computed. Two things copy it'
          ' apart from its source: (1) a transform, nnx.split or nnx.state'
          ' given a submodule that holds the target but not the tied module'
          ' that declares the tie: pass the tied module itself (its pytree'
          ' rebuilds the view from the source); (2) a graph-mode transform or'
          ' nnx.merge(graph=True), which copies Variables one by one: pass'
          ' graph=False, or tie without a view (a shared reference, which'
          ' graph mode keeps).'
      ) from None
    value = fn(source.get_value())
    if not (index is _WHOLE or index is ... or isinstance(index, variablelib.Missing)):
      value = value[index]
    return value

  def set_value(self, value, *, index=_WHOLE):
    del value, index
    raise TieError(
        f'{type(self).__name__} is a read-only view of its tie source: write'
        ' to the source Variable instead.'
    )

  def update_from_state(self, other):
    if type(other) is type(self):  # a copy of the view: it holds no value
      return var_type.update_from_state(self, other)
    return _check_given(self, other.get_raw_value())

  def set_raw_value(self, value, *, _unsafe_bypass_check=False):
    if getattr(self, '_tie_source', None) is None or isinstance(
        value, jax.ShapeDtypeStruct):  # building the view, or a copy of it
      return var_type.set_raw_value(
          self, value, _unsafe_bypass_check=_unsafe_bypass_check)
    return _check_given(self, value)

  def describe(self):
    """What a repr shows: the view's function and shape, not its value.

    Representations copy a Variable without its source (``nnx.display``,
    ``repr``), so they show the view, never read it.
    """
    record = getattr(self, '_tie_record', None)
    return {'view': _name(record.view) if record is not None else '?',
            'value': self.get_raw_value()}

  def __nnx_repr__(self):
    yield reprlib.Object(type=type(self).__name__,
                         comment=' # a read-only view of its tie source')
    for name, value in describe(self).items():
      yield reprlib.Attr(name, value)

  def __treescope_repr__(self, path, subtree_renderer):
    import treescope  # pylint: disable=g-import-not-at-top
    return treescope.repr_lib.render_object_constructor(
        object_type=type(self), attributes=describe(self), path=path,
        subtree_renderer=subtree_renderer)

  def __reduce_ex__(self, protocol):
    return _reduced(self, protocol, var_type, _new_view, (var_type,))

  def __getstate__(self):  # copy and pickle keep the source
    state = dict(var_type.__getstate__(self))
    for name in _VIEW_SLOTS:
      if hasattr(self, name):
        state[name] = getattr(self, name)
    return state

  def __setstate__(self, state):
    state = dict(state)
    slots = {name: state.pop(name) for name in _VIEW_SLOTS if name in state}
    var_type.__setstate__(self, state)
    for name, value in slots.items():
      object.__setattr__(self, name, value)

  return types.new_class(
      f'{var_type.__name__}View', (var_type,), {},
      lambda ns: ns.update(
          __slots__=_VIEW_SLOTS, __module__=__name__,
          get_value=get_value, set_value=set_value,
          update_from_state=update_from_state, set_raw_value=set_raw_value,
          __getstate__=__getstate__, __setstate__=__setstate__,
          __reduce_ex__=__reduce_ex__,
          __nnx_repr__=__nnx_repr__, __treescope_repr__=__treescope_repr__,
          __doc__=f'A read-only view of another Variable, as a {var_type.__name__}.',
      ),
  )


def _new_view(var_type: type[nnx.Variable]):
  """An empty view of ``var_type`` (for pickle)."""
  cls = _view_type(var_type)
  return cls.__new__(cls)


_SHARDING_METADATA = ('sharding', 'sharding_names', 'out_sharding')


@functools.lru_cache(maxsize=256)
def _view_shape(fn, shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.eval_shape(fn, jax.ShapeDtypeStruct(shape, dtype))


def _make_view(source: nnx.Variable, record: Tie):
  """A read-only Variable of ``source``'s type: ``record.view(source)``."""
  raw = source.get_raw_value()
  # The source's metadata, less its sharding: it describes the source's axes.
  metadata = {k: v for k, v in source.get_metadata().items()
              if k not in _SHARDING_METADATA}
  metadata['tie_view'] = record.describe()  # kept by copies, for errors
  view = _view_type(type(source))._new(
      _view_shape(record.view, tuple(raw.shape), raw.dtype), metadata)
  object.__setattr__(view, '_tie_source', source)
  object.__setattr__(view, '_tie_record', record)
  return view


def _check_given(view, value):
  """An update of a view target: it must be the view, or it would be lost."""
  record = view._tie_record  # pylint: disable=protected-access
  want = view.get_value()
  try:
    same = (jax.numpy.shape(value) == jax.numpy.shape(want)
            and bool(jax.numpy.array_equal(value, want)))
  except jax.errors.ConcretizationTypeError:
    same = False  # a traced value: it cannot be checked
  if not same:
    raise TieError(
        f'{record.describe()}: an update (nnx.update) gives the target'
        f' {record.text(record.target)} a value of its own that is not the view'
        f' of its source {record.text(record.source)} as the model holds it; a'
        ' tied model holds the target only as that view, so the value would'
        ' be lost. Convert an untied state or checkpoint first with'
        ' flax_tieext.nnx.tie_state(state, TiedModel), which checks each'
        ' target against its source in the state and leaves it out, or load'
        ' it into the untied model.'
    )


def _is_view_of(value, source) -> bool:
  return getattr(value, '_tie_source', None) is source


# --------------------------------------------------------------------------
# Tree surgery: the pytree holds the source once, unflatten puts it back
# --------------------------------------------------------------------------
def _target_trie(ties: tuple[Tie, ...]) -> dict:
  trie: dict = {}
  for record in ties:
    node = trie
    for key in record.target[:-1]:
      node = node.setdefault(key, {})
    node[record.target[-1]] = None
  return trie


def _without_targets(node, trie: dict):
  """A shallow copy of ``node`` without the target slots (copies on the way)."""
  shallow = object.__new__(type(node))
  attrs = vars(shallow)
  attrs.update(vars(node))
  for key, rest in trie.items():
    if key not in attrs:
      continue
    if rest is None:
      del attrs[key]
    elif isinstance(attrs[key], nnx.Pytree):
      attrs[key] = _without_targets(attrs[key], rest)
  return shallow


def _expected(record: Tie, source):
  """What the target slot holds when it shares ``source``."""
  if (record.view is not None and isinstance(source, nnx.Variable)
      and hasattr(source.get_raw_value(), 'dtype')):
    return _make_view(source, record)
  return source  # a leaf that is not an array (a prefix, a sharding) mirrors


def _check_still_tied(module, ties: tuple[Tie, ...]):
  """A target that no longer holds its source would be dropped: refuse it."""
  for record in ties:
    parent = _get(module, record.target[:-1])
    if not isinstance(parent, nnx.Pytree):
      continue
    slot = vars(parent).get(record.target[-1], _MISSING)
    source = _get(module, record.source)
    if slot is _MISSING or slot is source or _is_view_of(slot, source):
      continue
    raise TieError(
        f'{type(module).__name__}: {record.describe()}: the target no longer'
        f' holds its source (it holds {type(slot).__name__}); a tied module'
        ' stores the target only as its source, so the new value would be'
        ' lost. Assign to the source, or declare the model without this tie.'
    )


_MISSING = object()


def _get(node, path: Path):
  for key in path:
    if not isinstance(node, nnx.Pytree) or key not in vars(node):
      return _MISSING
    node = vars(node)[key]
  return node


def _retie(module, ties: tuple[Tie, ...]):
  """Puts each source (or its view) back at its target, in place."""
  ranks = vars(module).get(_BROADCAST_RANKS, (None,) * len(ties))
  for record, rank in zip(ties, ranks):
    parent = _get(module, record.target[:-1])
    source = _get(module, record.source)
    if parent is _MISSING or source is _MISSING:
      continue
    if rank is not None:
      _check_broadcast(module, record, source, rank)
    object.__setattr__(parent, record.target[-1], _expected(record, source))
  return module


# The rank of each source that a tie broadcasts into a stack (None for the
# others), recorded at construction: a static attribute of the tied module,
# so it travels in the pytree's structure into every transform.
_BROADCAST_RANKS = '_tieext_broadcast_ranks'


def _check_broadcast(module, record: Tie, source, rank: int):
  """A source broadcast into a stack must reach each slice whole."""
  shape = getattr(source.get_raw_value(), 'shape', None) if isinstance(
      source, nnx.Variable) else None
  if shape is not None and len(shape) < rank:
    raise _sliced(module, record, source, f'rank {rank} -> {len(shape)}')


class SlicedSourceError(TieError, ValueError):
  """A source broadcast into a stack, sliced by ``nnx.scan``.

  Raised from the ``ValueError`` of the failed call it explains, and a
  ``ValueError`` itself, so ``except ValueError`` still catches it.
  """


def _sliced(module, record: Tie, source, how: str) -> TieError:
  return SlicedSourceError(
      f'{type(module).__name__}: {record.describe()}: the source'
      f' {record.text(record.source)} lies outside the stack'
      f' {record.text(record.target[:-1])} and is broadcast into it, but a'
      f' transform sliced it ({how}), so each slice would read a part of it.'
      ' Give it None in the transform\'s prefix, e.g.'
      f' in_axes=nnx.prefix(model, {{{type(source).__name__}: None, ...: 0}},'
      ' graph=False).'
  )


def broadcasts(arg) -> bool:
  """Whether ``arg`` is a tied module that broadcasts a source into a stack.

  Read from the module's own record (:func:`_bind`), without walking it:
  the patched ``nnx.scan`` asks it of each of its arguments, and looks no
  further where none is.
  """
  return isinstance(arg, nnx.Pytree) and _BROADCAST_RANKS in getattr(
      arg, '__dict__', ())


def sliced_source(in_axes, args) -> TieError | None:
  """The error for the first broadcast source that ``in_axes`` slices.

  Asked by the patched ``nnx.scan`` where its call fails and an argument
  broadcasts a tied source (:func:`broadcasts`): such a source must be given
  None in the scan's prefix.
  When it is not and its leading axis matches the stack's, the rebuild
  inside the scan refuses it (:func:`_check_broadcast`); when the lengths
  differ, ``jax.lax.scan`` refuses first, naming only the leading sizes.
  """
  broadcast = {}  # id of a broadcast source -> (module, its tie)
  for module in args:
    if not broadcasts(module):
      continue
    for record, rank in zip(getattr(module, '_tieext_ties', ()),
                            vars(module)[_BROADCAST_RANKS]):
      if rank is not None:
        broadcast[id(_get(module, record.source))] = module, record
  if not broadcast:
    return None
  found = []

  def visit(path, axis, leaf):
    del path
    if axis is not None and axis is not nnx.Carry and id(leaf) in broadcast:
      found.append((axis, leaf))

  try:  # the prefix matching nnx.scan does (Flax's own, as its releases have it)
    from flax.nnx import extract  # pylint: disable=g-import-not-at-top
    extract.broadcast_prefix_map(
        visit, in_axes, args, is_leaf=lambda x: isinstance(x, nnx.Variable),
        prefix_leaf=lambda x: x is None or x is nnx.Carry)
  except Exception:  # pylint: disable=broad-except
    return None  # a prefix this Flax reads otherwise: JAX's error stands
  if not found:
    return None
  axis, source = found[0]
  module, record = broadcast[id(source)]
  return _sliced(module, record, source, f'nnx.scan, in_axes {axis}')


def _scans_over(record: Tie, source) -> bool:
  """Whether ``nnx.scan`` scans the broadcast ``source`` (``in_scan``).

  ``'scanned'``: yes; ``'broadcast'``: no; the default (None): for an
  ``nnx.Param``, which a forward pass reads, not for other Variables (state a
  layer may write, which only a loop invariant takes back).
  """
  if record.in_scan is None:
    return isinstance(source, nnx.Param)
  return record.in_scan == 'scanned'


def scanned_sources(in_axes, args):
  """``(args, in_axes, check)`` with the broadcast sources scanned over, or None.

  Asked by the patched ``nnx.scan`` before its call: where an argument is a
  tied module whose prefix in ``in_axes`` gives a source broadcast into a
  stack ``None`` and the tie scans it (:func:`_scans_over`), the source is
  broadcast to the stack's length (that of the module's leaves scanned along
  axis 0) in a copy of the module, and its prefix becomes 0: the scan slices
  it back, one slice per layer, as the stack's own Variables (the
  broadcast's transpose sums the gradient). ``check()``, after the call,
  refuses a write that landed in a slice of a scanned source.
  """
  if not isinstance(in_axes, tuple) or len(in_axes) != len(args):
    return None
  is_var = lambda x: isinstance(x, nnx.Variable)
  new_args, new_axes, scanned = list(args), list(in_axes), []
  for i, (module, axes) in enumerate(zip(args, in_axes)):
    ranks = vars(module)[_BROADCAST_RANKS] if broadcasts(module) else None
    if not ranks or isinstance(axes, int) or axes is None or axes is nnx.Carry:
      continue
    leaves, treedef = jax.tree.flatten(module, is_leaf=is_var)
    try:
      prefixes = treedef.flatten_up_to(axes)
    except (ValueError, TypeError):
      continue  # a prefix of another shape: nnx.scan reads it its own way
    lengths = {leaf.get_raw_value().shape[0] for leaf, ax in zip(leaves, prefixes)
               if ax == 0 and is_var(leaf) and getattr(leaf.get_raw_value(), 'ndim', 0)}
    if len(lengths) != 1:
      continue
    (length,) = lengths
    position = {id(leaf): k for k, leaf in enumerate(leaves)}
    for record, rank in zip(module._tieext_ties, ranks):  # pylint: disable=protected-access
      source = _get(module, record.source)
      k = position.get(id(source))
      if rank is None or k is None or prefixes[k] is not None or not _scans_over(
          record, source):
        continue
      value = source.get_raw_value()
      leaves[k] = source.replace(jax.numpy.broadcast_to(value, (length, *value.shape)))
      prefixes[k] = 0
      scanned.append((module, record, leaves[k], leaves[k].get_raw_value()))
    if scanned and scanned[-1][0] is module:
      new_args[i] = jax.tree.unflatten(treedef, leaves)
      new_axes[i] = treedef.unflatten(prefixes)
  if not scanned:
    return None

  def check():
    for module, record, stacked, value in scanned:
      if stacked.get_raw_value() is not value:
        raise TieError(
            f'{type(module).__name__}: {record.describe()}: nnx.scan wrote to'
            f' the source {record.text(record.source)}, which the tie scans'
            ' over (one slice per layer), so the write cannot land in the one'
            ' source. Pass in_scan=\'broadcast\' to flax_tieext.nnx.tie: the'
            ' scan then reads it as a loop invariant and takes its writes.')

  return tuple(new_args), tuple(new_axes), check


# --------------------------------------------------------------------------
# Binding, with the checks a user needs at construction
# --------------------------------------------------------------------------
def _stack_axes(target_shape, source_shape) -> int | None:
  """How many leading axes ``target_shape`` adds to ``source_shape`` (or None)."""
  extra = len(target_shape) - len(source_shape)
  if extra >= 0 and tuple(target_shape[extra:]) == tuple(source_shape):
    return extra
  return None


def _check_pair(where: str, record: Tie, target, source) -> int | None:
  """Raises unless ``target`` can be ``source`` (or its view).

  The checks of :func:`tie`, which :func:`tie_state` makes too. Returns the
  rank of a source that is broadcast into a stack (the target has more
  leading axes), or None.
  """
  for role, value in (('target', target), ('source', source)):
    if not isinstance(value, nnx.Variable):
      raise TieError(
          f'{where}: {record.describe()}: the {role}'
          f' {record.text(getattr(record, role))} is a {type(value).__name__},'
          ' not a Variable. Ties share Variables; to share a whole module,'
          ' assign it at both places (graph mode) or tie each Variable.'
      )
  if type(target) is not type(source):
    raise TieError(
        f'{where}: {record.describe()}: the target is a'
        f' {type(target).__name__}, the source a {type(source).__name__}.'
        ' A tied target becomes its source, so filters such as nnx.Param'
        ' would see it change kind; make both the same Variable type.'
    )
  raw = source.get_raw_value()
  want = (_view_shape(record.view, tuple(raw.shape), raw.dtype)
          if record.view is not None else raw)
  have = target.get_raw_value()
  t_shape, s_shape = tuple(have.shape), tuple(want.shape)
  if _stack_axes(s_shape, t_shape):
    raise TieError(
        f'{where}: {record.describe()}: the source {record.text(record.source)}'
        f' has shape {s_shape}'
        f'{"" if record.view is None else " (after the view)"}, the target'
        f' {t_shape}: the source lies inside a stack of {s_shape[0]} (a module'
        ' made by nnx.vmap or iterated by nnx.scan) and the target does not,'
        ' so one target would read many values. Tie a target inside the same'
        ' stack, or move the source out of the stack.'
    )
  # A target inside a stack, the source outside it: the tie broadcasts the
  # source into every slice (the transform's prefix gives it None).
  stacked = _stack_axes(t_shape, s_shape)
  tie_spec.check_like(record, None, want, jax.ShapeDtypeStruct(
      t_shape[stacked or 0:], have.dtype))
  return raw.ndim if stacked else None


def _bind(module, ties: tuple[Tie, ...]):
  """Checks ``ties`` on a constructed ``module`` and puts each source in place."""
  where = type(module).__name__
  ranks = []  # of each source broadcast into a stack (None for the others)
  for record in ties:
    target = _lookup(module, record.target, record, 'target', where)
    source = _lookup(module, record.source, record, 'source', where)
    ranks.append(_check_pair(where, record, target, source))
  for record in ties:
    parent = _get(module, record.target[:-1])
    object.__setattr__(parent, record.target[-1],
                       _expected(record, _get(module, record.source)))
  if any(rank is not None for rank in ranks):
    object.__setattr__(module, _BROADCAST_RANKS, tuple(ranks))


# --------------------------------------------------------------------------
# The public entry point
# --------------------------------------------------------------------------
def tie(module_class: type[M], ties: tp.Mapping[tp.Any, TieSpec],
        in_scan: str | None = None) -> type[M]:
  """``module_class`` with Variables that are one Variable at two places.

  NNX in graph mode shares by reference: ``self.head.kernel =
  self.embed.embedding`` stores one Variable, and every use reads and writes
  it. Tree mode (``graph=False`` on ``nnx.split``, ``nnx.state``, ``nnx.jit``,
  ``nnx.grad``, ``nnx.remat``, ``nnx.scan``, ...) treats the module as a JAX
  pytree, which cannot share, and refuses the alias. ``tie`` declares the
  sharing instead: each ``target`` path becomes the Variable at its
  ``source`` path, as in graph mode, and the module's pytree holds it once,
  at the source, so tree-mode APIs see one leaf (one gradient, one optimizer
  update, one checkpoint entry). Every tree-mode transform rebuilds its
  input from that pytree, and the rebuild puts the source back at the
  target, so inside the transform both places read and write one Variable
  and gradients sum over both uses. Graph mode is unchanged: it sees the
  shared reference, as it would without ``tie``.

  ``ties`` maps a target to a source, attribute paths relative to the module
  in NNX's spelling (``'head.kernel'``, ``'layers.0.kernel'``); a source may
  be ``(source, view_fn)``, a read-only view such as a transpose, recomputed
  from the source on every read (a tree-mode feature: graph-mode transforms
  copy Variables one by one and the view refuses to be read there).

  A target inside a stack of modules (made by ``nnx.vmap``) may be tied to a
  source outside it: give the source ``None`` in the transform's prefix
  (``nnx.prefix(model, {Mask: None, ...: 0})``), and every slice reads it.
  ``in_scan`` says how ``nnx.scan`` (with ``import flax_tieext``) reads
  it, as ``nn.tie``'s does: ``'scanned'`` broadcasts the source to the
  stack's length before the loop and scans over it like the stack's own
  Variables (read-only: a write to it inside the scan raises);
  ``'broadcast'`` reads it as a loop invariant, the scan's broadcast input,
  which takes writes; ``None`` (the default) scans an ``nnx.Param`` over
  and reads other Variables as loop invariants. The same values and
  gradients either way (``docs/scaling.md`` says what each costs).

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> import flax_tieext.nnx
    ...
    >>> class LM(nnx.Module):
    ...   def __init__(self, vocab, features, *, rngs):
    ...     self.embed = nnx.Embed(vocab, features, rngs=rngs)
    ...     self.head = nnx.Linear(features, vocab, use_bias=False, rngs=rngs)
    ...   def __call__(self, tokens):
    ...     return self.head(self.embed(tokens))
    ...
    >>> TiedLM = flax_tieext.nnx.tie(
    ...     LM, {'head.kernel': ('embed.embedding', jnp.transpose)})
    >>> model = TiedLM(8, 4, rngs=nnx.Rngs(0))
    >>> graphdef, params = nnx.split(model, nnx.Param, graph=False)
    >>> jax.tree.map(jnp.shape, nnx.to_pure_dict(params))
    {'embed': {'embedding': (8, 4)}}
    >>> grads = nnx.grad(lambda m: m(jnp.arange(3)).sum(), graph=False)(model)
    >>> grads.embed.embedding.shape  # one gradient: both uses, summed
    (8, 4)

  Args:
    module_class: an ``nnx.Module`` subclass.
    ties: ``{target: source}`` or ``{target: (source, view_fn)}``.
    in_scan: how ``nnx.scan`` reads a source that a tie broadcasts into a
      stack: ``None`` (the default), ``'scanned'`` or ``'broadcast'`` (above).

  Returns:
    A subclass of ``module_class`` of the same name whose instances are tied
    once ``__init__`` returns.

  Raises:
    TieError: at construction, for a path that does not exist (naming the
      nearest attributes), a target or source that is not a Variable, Variable
      types, shapes or dtypes that differ, or a source inside a stack whose
      target is not; at flattening, for a target that was reassigned.
  """
  if not (isinstance(module_class, type) and issubclass(module_class, nnx.Pytree)
          and module_class._pytree__is_pytree):  # pylint: disable=protected-access
    raise tie_errors.not_tieable(
        'flax_tieext.nnx.tie', 'module_class', module_class,
        'an nnx.Module class (a subclass that is a pytree)',
        "flax_tieext.nnx.tie(LM, {'head.kernel': 'embed.embedding'})")
  all_ties = _records(ties, getattr(module_class, '_tieext_ties', ()), in_scan=in_scan)
  trie = _target_trie(all_ties)
  parent = module_class
  root = getattr(module_class, '_tieext_root', module_class)

  @functools.wraps(module_class.__init__)
  def __init__(self, *args, **kwargs):
    parent.__init__(self, *args, **kwargs)
    if type(self)._tieext_ties is all_ties:  # the outermost tie binds them all
      _bind(self, all_ties)

  def _pytree__flatten_with_paths(self):
    _check_still_tied(self, all_ties)
    return parent._pytree__flatten_with_paths(_without_targets(self, trie))

  def _pytree__flatten(self):
    _check_still_tied(self, all_ties)
    return parent._pytree__flatten(_without_targets(self, trie))

  def _pytree__unflatten(cls, static, children):
    return _retie(parent._pytree__unflatten.__func__(cls, static, children), all_ties)

  def __reduce_ex__(self, protocol):
    # The class has module_class's name, under which pickle would find
    # module_class: pickle it as the tie that makes it.
    return _reduced(self, protocol, root, _new_tied, (root, all_ties))

  namespace = dict(
      __module__=module_class.__module__,
      __qualname__=module_class.__qualname__,
      __doc__=module_class.__doc__,
      __init__=__init__,
      _tieext_ties=all_ties,
      _tieext_root=root,
      _pytree__flatten_with_paths=_pytree__flatten_with_paths,
      _pytree__flatten=_pytree__flatten,
      _pytree__unflatten=classmethod(_pytree__unflatten),
      __reduce_ex__=__reduce_ex__,
  )
  if any(record.view is not None for record in all_ties):
    # NNX deep-copies a module through graph mode, which copies a view
    # without its source; through the pytree, the copy's view reads the
    # copy's source.
    def __deepcopy__(self, memo=None):
      del memo
      leaves, treedef = jax.tree.flatten(self)
      return jax.tree.unflatten(treedef, copy.deepcopy(leaves))

    namespace['__deepcopy__'] = __deepcopy__
  tied = types.new_class(module_class.__name__, (module_class,), {},
                         lambda ns: ns.update(namespace))
  _TIED.setdefault((root, all_ties), tied)
  return tied


# Each tied class by what makes it, for unpickling; weak values: a class no
# longer used is freed, as without the registry.
_TIED: tp.MutableMapping[tuple[type, tuple[Tie, ...]], type] = (
    weakref.WeakValueDictionary())


def _new_tied(root: type, records: tuple[Tie, ...]):
  """An empty instance of ``tie(root, records)`` (for pickle)."""
  cls = _TIED.get((root, records))
  if cls is None:
    cls = root
    for in_scan in dict.fromkeys(r.in_scan for r in records):
      cls = tie(cls, {r.target: r.source if r.view is None else (r.source, r.view)
                      for r in records if r.in_scan == in_scan}, in_scan=in_scan)
  return cls.__new__(cls)


def _reduced(obj, protocol, base: type, new, args):
  """``obj`` pickled as ``base`` pickles it, made by ``new(*args)``.

  Tied classes and views are made at run time under their base's name, where
  pickle would not find them.
  """
  reduced = base.__reduce_ex__(obj, protocol)
  if isinstance(reduced, tuple) and reduced[0] is copyreg.__newobj__:
    return (new, args, *reduced[2:])
  return reduced



# --------------------------------------------------------------------------
# Converting states between the tied and the untied layout
# --------------------------------------------------------------------------
def _flat(state: nnx.State) -> dict[Path, tp.Any]:
  """``state``'s Variables by path, integer keys (``nnx.List``) spelled as str."""
  return {tuple(str(k) for k in key): value for key, value in state.flat_state()}


def _from_flat(flat: dict[Path, tp.Any]) -> nnx.State:
  key = lambda path: tuple(int(k) if k.isdigit() else k for k in path)
  return nnx.from_flat_state([(key(p), v) for p, v in flat.items()])


def _tree(flat: dict[Path, tp.Any]) -> dict[str, tp.Any]:
  """The values of ``flat``'s Variables, nested as the core's checks read them."""
  return traverse_util.unflatten_dict(
      {p: v.get_raw_value() for p, v in flat.items()})


def untie_state(state: nnx.State, ties,
                stacks: tp.Mapping[str, int] | None = None) -> nnx.State:
  """The state of the untied model: each target holds a copy of its source.

  ``state`` is a tree-mode state of a tied module (``nnx.state(model,
  graph=False)``), which holds each tied Variable once; the result also holds
  every target, as the same module class without :func:`tie` stores it (a
  view's target holds the view of its source), ready for that model's
  ``nnx.update`` or a checkpoint in the untied layout. ``ties`` is the tied
  class or the mapping given to :func:`tie`.

  Example::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import flax_tieext.nnx
    ...
    >>> state = nnx.State({'embed': {'embedding': nnx.Param(jnp.ones((8, 4)))}})
    >>> ties = {'head.kernel': ('embed.embedding', jnp.transpose)}
    >>> untied = flax_tieext.nnx.untie_state(state, ties)
    >>> untied['head']['kernel'].shape
    (4, 8)
    >>> tied = flax_tieext.nnx.tie_state(untied, ties)
    >>> sorted(nnx.to_pure_dict(tied))
    ['embed']

  Args:
    state: a tree-mode state of the tied model.
    ties: the tied class, or the mapping given to :func:`tie`.
    stacks: the model's stacks of modules (made by ``nnx.vmap``) that hold a
      target whose source lies outside them, mapped to their number of
      layers, e.g. ``{'blocks': 12}``: the target gets one copy of the source
      per layer. ``{}`` says that no tie has such a target.

  Raises:
    TieError: a source missing from ``state``, a target already in it with
      other values than its source gives it, or a
      target inside a stack that ``stacks`` does not name (known by the
      stacked Variables beside it), which would be written unstacked.
  """
  records = _records(ties, api='flax_tieext.nnx.untie_state')
  flat = _flat(state)
  tree = _tree(flat)
  stacks = tie_convert._stack_paths(  # pylint: disable=protected-access
      stacks, sep='.', api='flax_tieext.nnx.untie_state')
  for record in records:
    if record.source not in flat:
      raise tie_errors.convert_source_missing(
          'untie', record, None,
          tie_errors.nearest(tree, record.source, sep='.'))
    # A target inside a stack, its source outside: named, or refused.
    stack = next(((path, n) for path, n in (stacks or {}).items()
                  if tie_spec.is_within(record.target[:-1], path)
                  and not tie_spec.is_within(record.source, path)), None)
    if stacks is None:
      tie_convert.refuse_unnamed_stack(tree, record, None)
    elif stack is not None:
      tie_convert.check_layers(tree, record, None, stack, 'untie')
    source = flat[record.source]
    value = source.get_value()
    if record.view is not None:
      value = record.view(value)
    value = jax.numpy.array(value, copy=True)
    names = {k: v for k, v in source.get_metadata().items()
             if k in _SHARDING_METADATA and isinstance(v, tuple)}
    if record.view is not None:  # the axis names follow the axes (as Linen)
      names = {k: tie_spec.apply_view(
          record, meta.Partitioned(source.get_value(), v)).names
               for k, v in names.items()}
    if stack is not None:  # as nnx.vmap stacks: a new unnamed axis 0
      value = tie_convert.stack_layers(value, stack[1:])
      names = {k: (None, *v) for k, v in names.items()}
    if record.target in flat:  # untied already: only as it would be written
      if not tie_convert.holds(record, None, flat[record.target].get_value(),
                               value, None):
        raise tie_errors.convert_target_present(record, None)
      continue
    flat[record.target] = source.replace(value)
    if names:
      flat[record.target].set_metadata(**names)
  return _from_flat(flat)


def tie_state(state: nnx.State, ties) -> nnx.State:
  """The state of the tied model: targets removed, once checked equal.

  The inverse of :func:`untie_state`: converts a state (a checkpoint) of the
  untied model into the layout a :func:`tie` model stores, refusing a target
  whose value differs from its source (or from the view of it), which the
  tied model could not represent.

  A target inside a stack of modules (made by ``nnx.vmap``) whose source
  lies outside it must equal its source in every layer.

  Raises:
    TieError: a missing target or source, a target and source that
      :func:`tie` would refuse (Variable types, shapes or dtypes that differ),
      or a target that differs from its source (naming both paths and the
      largest difference).
  """
  records = _records(ties, api='flax_tieext.nnx.tie_state')
  flat = _flat(state)
  for record in records:
    for role in ('source', 'target'):
      path = getattr(record, role)
      if path not in flat:
        raise TieError(
            f'tie_state: {record.describe()}: the {role} {record.text(path)} is'
            ' not in the state.' + tie_errors.nearest(_tree(flat), path, sep='.')
        )
    stacked = _check_pair('tie_state', record, flat[record.target],
                          flat[record.source]) is not None
    want = flat[record.source].get_value()
    if record.view is not None:
      want = record.view(want)
    have = flat[record.target].get_value()
    if stacked:  # every layer of the stack must be the source
      want = jax.numpy.broadcast_to(want, jax.numpy.shape(have))
    if not bool(jax.numpy.array_equal(have, want)):
      difference = float(jax.numpy.max(jax.numpy.abs(have - want)))
      raise TieError(
          f'tie_state: {record.describe()}: the target differs from its source'
          f' (largest difference {difference:g}), so the tied model cannot'
          ' hold both. Tie only Variables that are equal, or load this state'
          ' into the untied model.'
      )
  for record in records:
    del flat[record.target]
  return _from_flat(flat)
