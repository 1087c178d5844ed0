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

"""Lifted transforms added or extended by flax_tieext.

This module is written as a part of ``flax/core/lift.py``: every public
function here is transplanted verbatim into that file by
``tools/make_patches.py`` (the upstream-ready diffs in ``patches/``), so
function bodies use only names that ``flax/core/lift.py`` itself defines or
imports. The import block below is the only part that differs.
"""

# pylint: disable=g-importing-member,unused-import
import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax

from flax.core.frozen_dict import freeze
from flax.core.lift import pack
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.core.scope import Filter
from flax.core.scope import group_collections
from flax.core.scope import in_filter
from flax.core.scope import intersect_filters
from flax.core.scope import Scope
from flax.core.scope import union_filters
from flax_tieext.core import tie_spec
from flax_tieext.core import ties as ties_lib
# pylint: enable=g-importing-member,unused-import

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

def _as_static_argnums(static_argnums, transform):
  """``static_argnums`` as a tuple of ints (an int is accepted alone)."""
  if isinstance(static_argnums, int):
    return (static_argnums,)
  try:
    nums = tuple(static_argnums)
  except TypeError:
    nums = None
  if nums is None or not all(isinstance(i, int) for i in nums):
    raise TypeError(
        f'{transform}: static_argnums must be an int or a sequence of ints,'
        f' got {static_argnums!r}. To make arguments static by name, use'
        ' static_argnames.'
    )
  return nums


def _as_static_argnames(static_argnames, transform):
  """``static_argnames`` as a tuple of str (a str is accepted alone)."""
  if isinstance(static_argnames, str):
    return (static_argnames,)
  try:
    names = tuple(static_argnames)
  except TypeError:
    names = None
  if names is None or not all(isinstance(n, str) for n in names):
    raise TypeError(
        f'{transform}: static_argnames must be a str or a sequence of str,'
        f' got {static_argnames!r}.'
    )
  return names


def _passed_signature(fn, supplies_first=True):
  """Splits ``fn``'s signature into its leading parameter and the rest.

  The leading parameter is the one the transform supplies itself (the scope of
  a scope function, ``self`` of a Module method); the rest is what the caller
  passes. With ``supplies_first=False`` the caller passes every argument and
  there is no leading parameter. A function whose signature cannot be
  inspected is treated as ``(*args, **kwargs)``.
  """
  import inspect  # pylint: disable=g-import-not-at-top

  kind = inspect.Parameter
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    signature = inspect.Signature([
        kind('args', kind.VAR_POSITIONAL),
        kind('kwargs', kind.VAR_KEYWORD),
    ])
  params = list(signature.parameters.values())
  leading = None
  if supplies_first and params and params[0].kind in (
      kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD
  ):
    leading = params.pop(0).name
  return leading, signature.replace(parameters=params), signature


def _or_list(names):
  """'`a`', '`a` and `b`', '`a`, `b` and `c`'."""
  names = [f'`{n}`' for n in names]
  if len(names) == 1:
    return names[0]
  return ', '.join(names[:-1]) + ' and ' + names[-1]


def _static_argnames_code(names):
  names = tuple(names)
  return repr(names[0]) if len(names) == 1 else repr(names)


def _is_array(x):
  """True for a JAX array (tracers included) or an unhashable NumPy array."""
  return isinstance(x, jax.Array) or (
      hasattr(x, '__array__')
      and hasattr(x, 'shape')
      and type(x).__hash__ is None
  )


def _describe_array(x):
  return f'an array of shape {tuple(x.shape)} and dtype {x.dtype}'


class _StaticArgs:
  """The static arguments of one function, resolved through its signature.

  ``checkpoint`` builds one when it wraps a function; the Module transforms
  (``nn.checkpoint``, ``nn.partitioning.remat``) build one per wrapped method,
  because the scope function they lift only sees ``*args, **kwargs``. Indices
  in ``static_argnums`` are turned into parameter names here, once, so that at
  each call :meth:`split` finds every static value however it was passed
  (positionally, by keyword, or omitted so that its default applies) and
  :meth:`merge` rebuilds the call inside the rematerialized function. Static
  values are closed over rather than handed to ``jax.checkpoint``'s own
  ``static_argnums``, which works on every supported JAX release.

  All error messages about static arguments are written here, in the terms of
  the transform the user called (``transform``) and its numbering of
  ``static_argnums`` (``first_index`` is the index of the first argument the
  caller passes: 1 when ``self`` counts as 0, else 0). A transform that passes
  every argument on, none of its own, such as ``nnx.remat``, sets
  ``supplies_first=False``: then the first parameter of ``fn`` is an argument
  like any other, numbered 0.
  """

  def __init__(
      self,
      fn: Callable[..., Any],
      static_argnums: int | Iterable[int] = (),
      static_argnames: str | Iterable[str] = (),
      *,
      transform: str = 'lift.checkpoint',
      first_index: int = 0,
      strict: bool = True,
      supplies_first: bool = True,
  ):
    import inspect  # pylint: disable=g-import-not-at-top

    kind = inspect.Parameter
    self.transform = transform
    self.first_index = first_index
    fn_name = getattr(fn, '__qualname__', None) or getattr(fn, '__name__', None)
    # 'Model.__call__', without the '<locals>' of a class defined in a function
    self.fn_name = (fn_name or type(fn).__name__).split('<locals>.')[-1]
    self.leading, self.signature, full_signature = _passed_signature(
        fn, supplies_first
    )
    self.display = f'{self.fn_name}{full_signature}'
    params = self.signature.parameters.values()
    self.positional = [
        p.name
        for p in params
        if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)
    ]
    self.var_positional = next(
        (p.name for p in params if p.kind is kind.VAR_POSITIONAL), None
    )
    self.var_keyword = next(
        (p.name for p in params if p.kind is kind.VAR_KEYWORD), None
    )
    # parameter name -> how the user asked for it to be static
    self.names: dict[str, str] = {}
    # names only a **kwargs parameter can receive -> how they were asked for
    self.keyword_names: dict[str, str] = {}
    # positions past the named positional parameters (into *args), or
    # negative positions when there is an *args -> the index the user gave
    self.positions: dict[int, int] = {}
    # With strict=False, an index or name this signature cannot take is kept
    # here instead of raised: one transform can wrap several methods, and an
    # argument need only exist in one of them (see nn.checkpoint(methods=)).
    self.unresolved: dict[tuple[str, Any], ValueError] = {}
    for i in _as_static_argnums(static_argnums, transform):
      self._resolve(('static_argnums', i), self._add_index, i, strict)
    for name in _as_static_argnames(static_argnames, transform):
      self._resolve(('static_argnames', name), self._add_name, name, strict)
    self.any = bool(self.names or self.keyword_names or self.positions)

  # -- wrap time --------------------------------------------------------------

  def _resolve(self, key, add, item, strict):
    try:
      add(item)
    except ValueError as e:
      if strict:
        raise
      self.unresolved[key] = e

  def _add_index(self, i):
    n = len(self.positional)
    if i < 0 and self.var_positional is not None:
      self.positions[i] = i  # counted from the end of each call's arguments
      return
    j = n + i if i < 0 else i - self.first_index
    if 0 <= j < n:
      self.names.setdefault(self.positional[j], f'static_argnums index {i}')
    elif j >= n and self.var_positional is not None:
      self.positions[j] = i
    elif j == -1 and self.first_index == 1 and self.leading is not None:
      raise ValueError(
          f'{self.transform}: static_argnums index {i} refers to'
          f' `{self.leading}` of {self.display}, which the transform passes'
          ' on by itself and cannot be static.\n'
          + self._numbering()
          + self._name_it_instead()
      )
    else:
      raise ValueError(
          f'{self.transform}: static_argnums index {i} is out of range for'
          f' {self.display}.\n'
          + self._numbering()
          + self._name_it_instead()
      )

  def _add_name(self, name):
    import difflib  # pylint: disable=g-import-not-at-top
    import inspect  # pylint: disable=g-import-not-at-top

    kind = inspect.Parameter
    if not name.isidentifier():
      # Such as '*args[0]', the label an earlier message of ours gave an
      # extra positional argument: **kwargs would accept it and never use it.
      by_position = (
          f' An extra positional argument that *{self.var_positional}'
          ' collects has no name: make it static by position with'
          f' static_argnums={self._var_positional_index(name)}.\n'
          + self._numbering()
          if self.var_positional and name.startswith('*')
          else ' The parameters that can be static are: '
          + ', '.join(self._nameable())
          + '.'
      )
      raise ValueError(
          f"{self.transform}: static_argnames contains {name!r}, which is not"
          f' a parameter name of {self.display}.' + by_position
      )
    param = self.signature.parameters.get(name)
    if param is not None and param.kind not in (
        kind.VAR_POSITIONAL, kind.VAR_KEYWORD
    ):
      self.names[name] = 'static_argnames'
    elif param is not None:
      stars = '*' if param.kind is kind.VAR_POSITIONAL else '**'
      raise ValueError(
          f"{self.transform}: static_argnames contains '{name}', the"
          f' {stars}{name} parameter of {self.display}. It collects several'
          ' arguments and cannot be static as a whole: name the individual'
          ' keyword arguments instead'
          + (
              ', or use static_argnums for extra positional arguments.'
              if param.kind is kind.VAR_POSITIONAL
              else '.'
          )
      )
    elif name == self.leading:
      raise ValueError(
          f"{self.transform}: static_argnames contains '{name}', the first"
          f' parameter of {self.display}. The transform passes it on by'
          ' itself; it cannot be static. Remove it from static_argnames.'
      )
    elif self.var_keyword is not None:
      # Not a named parameter, but **kwargs may receive it.
      self.keyword_names[name] = 'static_argnames'
    else:
      candidates = self._nameable()
      close = difflib.get_close_matches(name, candidates, n=1)
      raise ValueError(
          f"{self.transform}: static_argnames contains '{name}', which is not"
          f' a parameter of {self.display}.\n'
          + (f'Did you mean static_argnames={close[0]!r}?\n' if close else '')
          + (
              'The parameters that can be static are: '
              + ', '.join(candidates)
              + '.'
              if candidates
              else f'{self.fn_name} takes no arguments that could be static.'
          )
      )

  def _nameable(self):
    import inspect  # pylint: disable=g-import-not-at-top

    kind = inspect.Parameter
    return [
        p.name
        for p in self.signature.parameters.values()
        if p.kind not in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD)
    ]

  def _var_positional_index(self, label):
    """``static_argnums`` index of ``'*args[k]'`` (k = 0 for any other label)."""
    import re  # pylint: disable=g-import-not-at-top

    match = re.search(r'\[(\d+)\]', label)
    k = int(match.group(1)) if match else 0
    return len(self.positional) + self.first_index + k

  def _make_static(self, labels):
    """The argument that makes ``labels`` static: names, or indices into *args."""
    names = [l for l in labels if not l.startswith('*')]
    nums = [self._var_positional_index(l) for l in labels if l.startswith('*')]
    parts = []
    if names:
      parts.append(f'static_argnames={_static_argnames_code(names)}')
    if nums:
      parts.append(
          'static_argnums='
          + (str(nums[0]) if len(nums) == 1 else repr(tuple(nums)))
      )
    return ' and '.join(parts)

  def _numbering(self, mark=None):
    """The signature, one parameter a line, in this transform's numbering."""
    import inspect  # pylint: disable=g-import-not-at-top

    kind = inspect.Parameter
    if self.leading is None:
      head = f'{self.transform} numbers the arguments of {self.fn_name} so:'
    elif self.first_index == 1:
      head = (
          f'{self.transform} counts `{self.leading}` as 0 in static_argnums:'
      )
    else:
      head = (
          f'{self.transform} does not count `{self.leading}` in'
          ' static_argnums; the first argument after it is 0:'
      )
    n = len(self.positional)
    rows = []
    if self.leading is not None:
      index = '0' if self.first_index == 1 else '-'
      rows.append((index, '', self.leading, 'cannot be static'))
    for param in self.signature.parameters.values():
      note = 'static' if param.name in self.names else ''
      if param.name == mark:
        note = '<- ' + self.names.get(mark, 'static')
      if param.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD):
        k = self.positional.index(param.name)
        neg = '' if self.var_positional else str(k - n)
        rows.append((str(k + self.first_index), neg, str(param), note))
      elif param.kind is kind.VAR_POSITIONAL:
        rows.append((f'{n + self.first_index}+', '', str(param), note))
      else:
        rows.append(('-', '', str(param), note or 'by name only'))
    lines = [head]
    for index, neg, text, note in rows:
      numbers = f'{index:>4} | {neg:<3}' if neg else f'{index:>4}      '
      lines.append(f'  {numbers} {text}' + (f'    ({note})' if note else ''))
    return '\n'.join(lines) + '\n'

  def _name_it_instead(self, received=None):
    candidate = self._probable_flag(None, received or {})
    example = repr(candidate) if candidate else "'<name>'"
    return (
        'Name the argument instead of counting, which also covers keyword'
        f' and omitted calls: static_argnames={example}.'
    )

  # -- call time --------------------------------------------------------------

  def _where(self, label):
    return f'`{label}` of {self.display}'

  def _probable_flag(self, hit, received):
    """A non-static parameter near ``hit`` that looks like a flag or mode."""
    import inspect  # pylint: disable=g-import-not-at-top

    kind = inspect.Parameter
    order = list(self.signature.parameters)
    at = order.index(hit) if hit in order else 0
    best = None
    for position, param in enumerate(self.signature.parameters.values()):
      if param.kind in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD):
        continue
      if param.name == hit or param.name in self.names:
        continue
      value = received.get(param.name, param.default)
      if isinstance(value, (bool, str)):
        rank = 0
      elif value is None:
        rank = 1
      else:
        continue
      key = (rank, abs(position - at), position < at)
      if best is None or key < best[0]:
        best = (key, param.name)
    return best and best[1]

  def _index_of(self, name):
    if name in self.positional:
      return self.positional.index(name) + self.first_index
    return None

  def _check_static(self, label, value, origin, received):
    """Rejects static values JAX could not specialize on."""
    leaves = jax.tree_util.tree_leaves(value)
    array = next((x for x in leaves if _is_array(x)), None)
    if array is not None:
      meant = self._probable_flag(label, received)
      if isinstance(array, jax.core.Tracer) and not array.shape:
        # A flag traced by a transform around this one (an outer jax.jit):
        # removing it from the static arguments here would only move the
        # error into the function. The fix is where it was traced.
        advice = (
            f'`{label}` is a traced scalar: a transform around this call,'
            ' such as `jax.jit`, traced it before it got here. Make it static'
            ' there too, e.g. `jax.jit(train_step, static_argnames='
            f"'{label}')` (or static_argnums), or pass a Python value"
            f' (`{label}=True`) instead of an argument of the traced function.'
        )
      elif not array.shape:
        advice = (
            f'Pass a Python value (`{label}=True`, not `jnp.array(True)`), or,'
            f' if `{label}` is data rather than a setting, remove it from'
            f' {origin.split()[0]}: arrays are traced.'
        )
      elif origin == 'static_argnames':
        advice = f'Remove `{label}` from static_argnames: arrays are traced.' + (
            f' If you meant `{meant}`: static_argnames={meant!r}.'
            if meant
            else ''
        )
      elif meant is None:
        advice = (
            f'Remove `{label}` from static_argnums, or name the argument you'
            " meant: static_argnames='...'."
        )
      else:
        index = self._index_of(meant)
        by_index = (
            f' In the numbering of {self.transform} that is'
            f' static_argnums={index}.'
            if index is not None
            else ''
        )
        advice = (
            f'Did you mean `{meant}`?{by_index} Naming it avoids counting:'
            f' static_argnames={meant!r}.'
        )
      raise ValueError(
          f'{self.transform}: {self._where(label)} is static ({origin}), but'
          f' it received {_describe_array(array)}. A static argument is a'
          ' Python value the function is specialized on, such as a flag or a'
          ' mode string; it cannot be an array.\n'
          + (self._numbering(mark=label) if origin != 'static_argnames' else '')
          + advice
      )
    try:
      hash(value)
    except TypeError:
      raise TypeError(
          f'{self.transform}: {self._where(label)} is static ({origin}), but'
          f' it received a value of type {type(value).__name__}, which is not'
          ' hashable. Static values must be hashable: pass a hashable'
          ' equivalent (a tuple instead of a list, a FrozenDict or frozen'
          ' dataclass instead of a dict), or leave the argument dynamic.'
      ) from None

  def _check_traceable(self, items):
    """Rejects strings in traced arguments before JAX does, naming them."""
    strings = [
        label
        for label, value in items
        if any(isinstance(x, str) for x in jax.tree_util.tree_leaves(value))
    ]
    if strings:
      raise TypeError(
          f'{self.transform}: {_or_list(strings)} of {self.display}'
          f' received a str, which JAX cannot trace. Make'
          f' {"it" if len(strings) == 1 else "them"} static:'
          f' {self._make_static(strings)}.'
      )

  def _items(self, args, kwargs):
    """(label, value) of each argument of a call, named where possible."""
    try:
      bound = self.signature.bind(*args, **kwargs)
    except TypeError:
      return [(f'argument {k + self.first_index}', v) for k, v in
              enumerate(args)] + list(kwargs.items())
    return self._arguments_items(bound.arguments)

  def _arguments_items(self, arguments):
    items = []
    for name, value in arguments.items():
      if name == self.var_positional:
        items += [(f'*{name}[{k}]', v) for k, v in enumerate(value)]
      elif name == self.var_keyword:
        items += list(value.items())
      else:
        items.append((name, value))
    return items

  def split(self, args, kwargs):
    """Separates the static values of a call from the traced ones.

    Returns:
      ``(static, dynamic_args, dynamic_kwargs)``: ``static`` is handed to
      :meth:`merge` (by closure), the dynamic parts to ``jax.checkpoint``.
    """
    if not self.any:
      leaves = jax.tree_util.tree_leaves((args, kwargs))
      if any(isinstance(x, str) for x in leaves):
        self._check_traceable(self._items(args, kwargs))
      return (), args, kwargs
    try:
      bound = self.signature.bind(*args, **kwargs)
    except TypeError as e:
      raise TypeError(f'{self.display}: {e}') from None
    received = dict(bound.arguments)
    arguments = dict(bound.arguments)
    names = dict(self.names)
    in_var_positional = {}
    n = len(self.positional)
    for j, i in self.positions.items():
      p = j if j >= 0 else len(args) + j
      if not 0 <= p < len(args):
        raise ValueError(
            f'{self.transform}: static_argnums index {i} is out of range for'
            f' this call of {self.display}, which passes {len(args)}'
            f' positional argument{"s" if len(args) != 1 else ""} (numbered'
            f' from {self.first_index}).\n'
            + self._numbering()
            + self._name_it_instead(received)
        )
      if p < n:
        names.setdefault(self.positional[p], f'static_argnums index {i}')
      else:
        in_var_positional[p - n] = f'static_argnums index {i}'
    static = []
    for name, param in self.signature.parameters.items():
      if name in names:
        value = arguments.pop(name) if name in arguments else param.default
        static.append((name, value, None, names[name]))
    if in_var_positional:
      rest = arguments.get(self.var_positional, ())
      for k in sorted(in_var_positional):
        label = f'*{self.var_positional}[{k}]'
        static.append((label, rest[k], k, in_var_positional[k]))
      arguments[self.var_positional] = tuple(
          v for k, v in enumerate(rest) if k not in in_var_positional
      )
    if self.keyword_names and self.var_keyword in arguments:
      extra = dict(arguments[self.var_keyword])
      for name, origin in self.keyword_names.items():
        if name in extra:
          static.append((name, extra.pop(name), self.var_keyword, origin))
      arguments[self.var_keyword] = extra
    for label, value, _, origin in static:
      self._check_static(label, value, origin, received)
    self._check_traceable(self._arguments_items(arguments))
    return tuple(static), (arguments,), {}

  def merge(self, static, dynamic_args, dynamic_kwargs):
    """Inverse of :meth:`split`: the ``(args, kwargs)`` to call ``fn`` with."""
    import inspect  # pylint: disable=g-import-not-at-top

    if not self.any:
      return dynamic_args, dynamic_kwargs
    (arguments,) = dynamic_args
    arguments = dict(arguments)
    rest = list(arguments.get(self.var_positional, ()))
    for label, value, where, _ in static:
      if where is None:
        arguments[label] = value
      elif isinstance(where, int):
        rest.insert(where, value)
      else:
        arguments[where] = {**arguments[where], label: value}
    if self.var_positional is not None and self.var_positional in arguments:
      arguments[self.var_positional] = tuple(rest)
    bound = inspect.BoundArguments(self.signature, arguments)
    return bound.args, bound.kwargs

  def explain_concretization_error(self, error, dynamic_args, dynamic_kwargs):
    """Adds to a JAX concretization error which arguments were traced.

    A Python bool, int or float passed to an argument that is not static is
    traced like an array, so ``if deterministic:`` in the function fails with
    ``TracerBoolConversionError``. The note names those arguments and the
    ``static_argnames`` that fixes it. The error keeps its type.
    """
    if self.any:
      items = self._arguments_items(dynamic_args[0])
    else:
      items = self._items(dynamic_args, dynamic_kwargs)
    scalars = [
        (label, value)
        for label, value in items
        if type(value) in (bool, int, float)
    ]
    if not scalars:
      return
    scalars.sort(key=lambda item: type(item[1]) is not bool)
    labels = [label for label, _ in scalars]
    got = ', '.join(f'{label}={value!r}' for label, value in scalars)
    one = len(labels) == 1
    note = (
        f'{self.transform}: {self.fn_name} was called with the Python'
        f' value{"" if one else "s"} {got}, but'
        f' {_or_list(labels)} {"is" if one else "are"} not static, so'
        f' {"it was" if one else "they were"} traced like an array. If'
        f' {self.fn_name} uses {"it" if one else "them"} in Python control'
        ' flow or as a shape, make'
        f' {"it" if one else "them"} static:'
        f' {self._make_static(labels)}.'
        + (
            ' A named argument is static however it is passed: positionally,'
            ' by keyword, or left to its default.'
            if any(not l.startswith('*') for l in labels)
            else ''
        )
    )
    by_index = [
        f'`{name}` ({origin})'
        for name, origin in self.names.items()
        if origin.startswith('static_argnums')
    ]
    if by_index:
      index = self._index_of(labels[0])
      note += (
          f' Currently static: {", ".join(by_index)}.'
          + (
              f' In the numbering of {self.transform}, `{labels[0]}` is'
              f' static_argnums={index}.'
              if index is not None
              else ''
          )
      )
    if hasattr(error, 'add_note'):
      if note not in getattr(error, '__notes__', ()):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):
      if note not in error.args[0]:
        error.args = (f'{error.args[0]}\n\n{note}',) + error.args[1:]


def _with_static_args(transform, fn, statics):
  """``transform(fn)``, with the static arguments of each call closed over.

  For a transform that passes every argument of ``fn`` on, such as
  ``nnx.remat``. Without static arguments this is ``transform(fn)``. With
  them, each call splits its static values off (``statics.split``) and calls
  ``transform`` on a new function closed over them, which the transform
  traces for those values, as ``checkpoint`` does.

  Args:
    transform: a function transform without static arguments of its own.
    fn: the function to transform.
    statics: the ``_StaticArgs`` of ``fn``.

  Returns:
    ``fn`` transformed, taking the arguments ``fn`` takes.
  """
  transformed = transform(fn)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    call = transformed
    if statics.any:
      static, args, kwargs = statics.split(args, kwargs)

      def static_bound(*dynamic_args, **dynamic_kwargs):
        args, kwargs = statics.merge(static, dynamic_args, dynamic_kwargs)
        return fn(*args, **kwargs)

      call = transform(static_bound)
    try:
      return call(*args, **kwargs)
    except jax.errors.ConcretizationTypeError as e:
      statics.explain_concretization_error(e, args, kwargs)
      raise

  return wrapper


def _raise_if_unresolved_everywhere(specs):
  """Raises for a static argument that none of the wrapped methods takes.

  Args:
    specs: the non-strict ``_StaticArgs`` of each method one transform wraps.
  """
  import difflib  # pylint: disable=g-import-not-at-top

  if not specs:
    return
  first = specs[0]
  for key, error in first.unresolved.items():
    if not all(key in spec.unresolved for spec in specs):
      continue
    kind, item = key
    unknown = kind == 'static_argnames' and not any(
        item == spec.leading or item in spec.signature.parameters
        for spec in specs
    )
    if not unknown or len(specs) == 1:
      raise error
    candidates = list(dict.fromkeys(n for s in specs for n in s._nameable()))
    close = difflib.get_close_matches(item, candidates, n=1)
    raise ValueError(
        f"{first.transform}: static_argnames contains '{item}', which is not"
        ' a parameter of any of the wrapped methods:\n'
        + ''.join(f'  {spec.display}\n' for spec in specs)
        + (f'Did you mean static_argnames={close[0]!r}?\n' if close else '')
        + 'The parameters that can be static are: '
        + ', '.join(candidates)
        + '.'
    )


def checkpoint(
    fn: Callable[..., Any] | None = None,
    variables: CollectionFilter = True,
    rngs: PRNGSequenceFilter = True,
    concrete: bool = False,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    policy: Callable[..., bool] | None = None,
    static_argnames: str | Iterable[str] = (),
) -> Callable[..., Any]:
  """Lifted version of ``jax.checkpoint``.

  Rematerialization (gradient checkpointing) trades memory for compute: the
  intermediate values of ``fn`` are not kept for the backward pass but
  recomputed from its inputs when gradients are taken.

  Arguments of ``fn`` are traced like arrays unless they are *static*. An
  argument the function branches on in Python (``if deterministic:``) or uses
  as a shape must be static. ``static_argnames`` names such arguments, and a
  named argument is static however it is passed: positionally, by keyword, or
  left out so that its default applies. ``static_argnums`` counts positions
  instead (the first argument after the scope is 0) and is resolved through
  the signature too, so an index also covers keyword and omitted calls.
  Static values are closed over, not traced: the rematerialized function is
  retraced for each new value, and they must be hashable.

  This function is aliased to ``lift.remat`` just like ``jax.remat``.

  Example::

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from flax.core import init, lift
    ...
    >>> def dense(scope, x, activation='relu'):
    ...   w = scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))
    ...   y = x @ w
    ...   return jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)
    ...
    >>> remat_dense = lift.checkpoint(dense, static_argnames='activation')
    >>> x = jnp.ones((1, 3))
    >>> y, variables = init(remat_dense)(jax.random.key(0), x, 'tanh')
    >>> y, variables = init(remat_dense)(jax.random.key(0), x)  # default
    >>> y
    Array([[3., 3.]], dtype=float32)

  Args:
    fn: scope function for which intermediate computations should be
      re-computed when computing gradients. If ``None``, returns a decorator
      that takes ``fn``.
    variables: The variable collections that are lifted. By default all
      collections are lifted.
    rngs: The PRNG sequences that are lifted. By default all PRNG sequences are
      lifted.
    concrete: Deprecated and unsupported by JAX; ``True`` raises
      ``NotImplementedError`` when called. Use ``static_argnames``.
    prevent_cse: Optional, boolean indicating whether to prevent common
      subexpression elimination (CSE) optimizations in the HLO generated from
      differentiation. This CSE prevention has costs because it can foil other
      optimizations, and because it can incur high overheads on some backends,
      especially GPU. The default is True because otherwise, under a ``jit`` or
      ``pmap``, CSE can defeat the purpose of this decorator. But in some
      settings, like when used inside a ``scan``, this CSE prevention mechanism
      is unnecessary, in which case ``prevent_cse`` can be set to False.
    static_argnums: Optional, int or sequence of ints: the positions of static
      arguments, counted from the first argument after the scope (0).
      Negative indices count from the end of the positional parameters.
    policy: Experimental checkpoint policy, see ``jax.checkpoint``.
    static_argnames: Optional, str or sequence of str: the names of static
      arguments, positional or keyword-only.

  Returns:
    A wrapped version of ``fn``. When computing gradients intermediate
    computations will be re-computed when computing gradients.

  Raises:
    ValueError: when ``static_argnames`` names no parameter of ``fn`` (the
      message lists them and the closest match), when an index in
      ``static_argnums`` is out of range (the message shows the numbering),
      or, when called, if a static argument receives an array.
    TypeError: when called, if a static argument receives an unhashable value
      or a traced one receives a ``str``. A JAX concretization error raised
      because a Python bool or number was traced gets a note naming those
      arguments.
  """
  if fn is None:
    return functools.partial(
        checkpoint,
        variables=variables,
        rngs=rngs,
        concrete=concrete,
        prevent_cse=prevent_cse,
        static_argnums=static_argnums,
        policy=policy,
        static_argnames=static_argnames,
    )
  return _checkpoint(
      fn,
      _StaticArgs(fn, static_argnums, static_argnames),
      variables=variables,
      rngs=rngs,
      concrete=concrete,
      prevent_cse=prevent_cse,
      policy=policy,
  )


def _checkpoint(
    fn: Callable[..., Any],
    statics: _StaticArgs,
    variables: CollectionFilter = True,
    rngs: PRNGSequenceFilter = True,
    concrete: bool = False,
    prevent_cse: bool = True,
    policy: Callable[..., bool] | None = None,
) -> Callable[..., Any]:
  """``checkpoint`` with its static arguments already resolved.

  The Module transforms call this directly: they resolve static arguments
  against the method they wrap, since the scope function they lift only takes
  ``*args, **kwargs``.
  """

  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
    # After JAX v0.3.16, concrete=False is a no-op and concrete=True raises
    # NotImplementedError. Starting in JAX v0.8.2, the concrete argument is
    # deprecated and will be removed in the future.
    if concrete:
      raise NotImplementedError(
          'The concrete argument is deprecated. Use static_argnums instead.'
          ' for more information, see'
          ' https://docs.jax.dev/en/latest/jep/11830-new-remat-checkpoint.html'
      )
    static, dynamic_args, dynamic_kwargs = statics.split(args, kwargs)

    @functools.partial(jax.checkpoint, prevent_cse=prevent_cse, policy=policy)
    @functools.wraps(fn)
    def rematted(variable_groups, rng_groups, *dynamic_args, **dynamic_kwargs):
      args, kwargs = statics.merge(static, dynamic_args, dynamic_kwargs)
      scope = scope_fn(variable_groups, rng_groups)
      y = fn(scope, *args, **kwargs)
      return y, repack_fn(scope)

    try:
      return rematted(
          variable_groups, rng_groups, *dynamic_args, **dynamic_kwargs
      )
    except jax.errors.ConcretizationTypeError as e:
      statics.explain_concretization_error(e, dynamic_args, dynamic_kwargs)
      raise

  return pack(
      inner,
      (variables,),
      (variables,),
      (rngs,),
      name='remat',
      enable_kwargs=True,
  )


remat = checkpoint

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------


def tie(
    fn: Callable[..., Any],
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
) -> Callable[..., Any]:
  """Ties variables of one path to those of another: one variable, two paths.

  A tree of variables duplicates what a graph would share. ``tie`` declares
  that the variables of a *target* path (a module and all its variables in the
  tied collections, recursively, or a single variable) *are* those of a
  *source* path. The target has no storage of its own: only the source is
  stored, in ``init`` and in ``apply(mutable=...)`` results. Every read of the
  target sees the source's current value, every write lands in the source in
  program order, and gradients with respect to the source sum over all uses:
  the two paths behave exactly as one module instance called at two places.

  The tie is state of the scope ``fn`` receives, so it is in force in every
  scope derived from it, the inner scopes of lifted transforms included: when
  ``checkpoint``/``remat``, ``jit``, ``map_variables``, ``cond``, ``switch`` or
  ``while_loop`` lift a scope that contains a tied target, the source's scope
  is lifted with it. Inside ``vmap`` and ``scan`` (and ``vjp``/``jvp``/
  ``custom_vjp``), a source outside the transform is a broadcast, read-only
  value. Each call site is traced once.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> from flax.core import init, apply, nn as core_nn
    >>> from flax.core import lift
    ...
    >>> def two_layers(scope, x):
    ...   x = scope.child(core_nn.dense, 'a')(x, 3)
    ...   return scope.child(core_nn.dense, 'b')(x, 3)
    ...
    >>> tied = lift.tie(two_layers, {'b': 'a'})
    >>> y, variables = init(tied)(jax.random.key(0), jnp.ones((1, 3)))
    >>> sorted(variables['params'])  # 'b' is not stored: it is 'a'
    ['a']
    >>> bool((apply(tied)(variables, jnp.ones((1, 3))) == y).all())
    True

  Args:
    fn: the scope function whose variables are tied. When ``fn`` receives
      several scopes (a Module with Modules passed in as attributes, as Flax's
      Module lifting does), the last one is the Module's own scope; the tie is
      declared there and the others pass through.
    ties: maps a target path to a source path, or to ``(source_path, view_fn)``
      where ``view_fn`` derives the target's read-only value from the source's
      (e.g. ``jnp.transpose`` for a language-model head tied to the
      embedding). Paths are ``/``-separated names relative to the scope of
      ``fn``; ``"."`` is that scope itself, and a leading ``/`` starts at the
      root. A path names a module or one variable (``"head/kernel"``). Chains
      (``a -> b``, ``b -> c``) resolve to the end of the chain.
    collections: the tied collections, a collection filter (``"params"``,
      ``"graph"``, ``["batch_stats", "cache"]``, ``True`` for all).

  Returns:
    ``fn`` with the ties in force.

  Raises:
    TieError: at declaration for a self-tie, a cycle, a tie between a module
      and its ancestor, or two sources for one target; at use for values
      given for a target, a source that is not stored, a write that cannot
      land or goes through a view; when the call of an ``init`` returns, for a
      target or source that does not exist (naming the nearest existing
      names) or a target that does not match its source.
  """
  def wrapper(scope_tree, *args, **kwargs):
    declaring = jax.tree_util.tree_leaves(
        scope_tree, is_leaf=lambda x: isinstance(x, Scope))[-1]
    declared = ties_lib.declare(
        declaring, tie_spec.normalize(ties, collections, declaring.path))
    y = fn(scope_tree, *args, **kwargs)
    ties_lib.check_init(declaring, declared)
    return y

  return wrapper
