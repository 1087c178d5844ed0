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

"""Static arguments of the rematerializing transforms, resolved by signature.

Private: ``lift.checkpoint``, ``nn.checkpoint``, ``nn.partitioning.remat``
and ``nnx.remat`` resolve ``static_argnums`` and ``static_argnames`` here, so
that an argument is static however it is passed.
"""

# pylint: disable=g-importing-member,unused-import
import difflib
import functools
import inspect

import jax
# pylint: enable=g-importing-member,unused-import


class StaticArgs:
  """The static arguments of ``fn``, resolved through its signature.

  An index or a name becomes a parameter, so the argument is static whether it
  is passed by position, by keyword or left to its default. With ``*args``,
  indices past the named parameters (and negative ones) count the arguments of
  each call. As in ``jax.checkpoint``, nothing is checked until the first
  call. :meth:`split` takes a call apart, :meth:`merge` puts it back. Its
  errors are short and state what is wrong (:func:`_error`).

  Without ``static_argnames``, only non-negative Python ints at or past
  ``first_index`` are resolved. Any other ``static_argnums`` (negative, a
  NumPy integer, a bool, a set...) keeps the meaning the transform gives it
  without this resolver: ``as_flax`` says so, ``plain`` holds it as the
  transform hands it on, and the transform passes it to ``jax.checkpoint``
  itself (or, where it closes over static values, ``split`` picks the
  positions as it did).

  Args:
    fn: the wrapped function.
    static_argnums: int or ints; the first argument the caller passes is
      ``first_index``.
    static_argnames: str or strs.
    transform: the transform's name, for errors.
    first_index: the index of the first argument the caller passes.
    supplies_first: whether the transform passes the first parameter of ``fn``
      (a scope, ``self``) itself; an index of it cannot be static.
    group: the methods wrapped with the same arguments (this one included): a
      name need be a parameter of one of them.
    closes_over: whether the transform closes over the static arguments of
      each call (``nn.partitioning.remat``), ignoring an index that matches no
      argument, rather than handing ``static_argnums`` to ``jax.checkpoint``.
    rebuilds: whether the transform, without this resolver, passes its
      arguments through NNX graph mode's split, which makes every pytree
      container anew at each call (see :class:`Static`).
  """

  def __init__(self, fn, static_argnums=(), static_argnames=(), *,
               transform='checkpoint', first_index=0, supplies_first=True,
               group=(), closes_over=False, rebuilds=False):
    self.fn, self.transform, self.first_index = fn, transform, first_index
    self.supplies_first, self.group = supplies_first, group or (self,)
    self.closes_over, self.rebuilds = closes_over, rebuilds
    self.given = {'static_argnums': static_argnums,
                  'static_argnames': static_argnames}
    self.static_argnums = _once(static_argnums, int)
    self.static_argnames = _once(static_argnames, str)
    self.as_flax = self.static_argnames == () and not _resolvable(
        static_argnums, first_index, closes_over)
    self.plain = static_argnums
    if self.as_flax:
      # As the transform hands it on; nn.checkpoint, which counts `self`,
      # shifts it here, where Flax does (a set raises TypeError here too).
      if first_index and not closes_over:
        self.plain = jax.tree_util.tree_map(lambda i: i - first_index,
                                            static_argnums)
    self._resolved = None  # None: not bound; False: bound; True: checked

  def _check(self):
    """Binds, then raises for an index or name no spec of the group binds."""
    if self._resolved:
      return
    self._bind()
    for key in self.unresolved:
      for spec in self.group:
        spec._bind()  # pylint: disable=protected-access
      if all(key in spec.unresolved for spec in self.group):
        # A new error each call: one kept would keep each failed call's
        # frames alive through its traceback.
        raise _error(ValueError, self.group[0].unresolved[key],
                     'unresolved', key)
    self._resolved = True

  def _bind(self):
    """Maps each index and name to a parameter; the rest to ``unresolved``."""
    if self._resolved is not None:
      return
    for what, value, one in (('static_argnums', self.static_argnums, int),
                             ('static_argnames', self.static_argnames, str)):
      if not isinstance(value, tuple) or not all(
          isinstance(x, one) and not isinstance(x, bool) for x in value):
        raise _error(TypeError, self._type_error(what, self.given[what]),
                     'type', what)
    try:
      signature = inspect.signature(self.fn)
    except (TypeError, ValueError):  # a builtin: any arguments
      signature = inspect.signature(lambda *args, **kwargs: None)
    params, kind = list(signature.parameters.values()), inspect.Parameter
    self.leading = None
    if (self.supplies_first and params
        and params[0].kind <= kind.POSITIONAL_OR_KEYWORD):
      self.leading = params.pop(0).name
    name = getattr(self.fn, '__qualname__', None) or type(self.fn).__name__
    self.display = f'{name.split("<locals>.")[-1]}{signature}'
    self.signature = signature.replace(parameters=params)
    self.positional = [
        p.name for p in params if p.kind <= kind.POSITIONAL_OR_KEYWORD]
    self.var_positional, self.var_keyword = (
        next((p.name for p in params if p.kind is k), None)
        for k in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD))
    # name -> how it was made static; with *args, a position in each call
    # (negative: from its end) -> the index given.
    self.names, self.positions, self.unresolved = {}, {}, {}
    for what, add, items in (('static_argnums', self._add_index,
                              self.static_argnums),
                             ('static_argnames', self._add_name,
                              self.static_argnames)):
      for item in items:
        try:
          add(item)
        except ValueError as e:
          self.unresolved[what, item] = str(e)
    self._resolved = False

  def _add_index(self, i):
    n = len(self.positional)
    j = n + i if i < 0 else i - self.first_index
    if i < 0 and self.var_positional or j >= n and self.var_positional:
      self.positions[i if i < 0 else j] = i
    elif 0 <= j < n:
      self.names.setdefault(self.positional[j], f'static_argnums index {i}')
    elif not self._ignores_unmatched():
      raise ValueError(self._index_error(i))

  def _ignores_unmatched(self):
    """Whether an index that matches no argument is ignored, as Flax does.

    ``nn.partitioning.remat`` ignores it where Flax accepts the call: without
    names, given a tuple or a list.
    """
    return (self.closes_over and self.static_argnames == ()
            and type(self.given['static_argnums']) in (tuple, list))  # pylint: disable=unidiomatic-typecheck

  def _add_name(self, name):
    param = self.signature.parameters.get(name)
    if (param is None and not (self.var_keyword and name.isidentifier()
                               and name != self.leading)
        or param is not None and param.kind in (param.VAR_POSITIONAL,
                                                param.VAR_KEYWORD)):
      raise ValueError(self._name_error(name))
    self.names[name] = 'static_argnames'

  def _type_error(self, what, value):
    one = 'an int or a sequence of ints' if what == 'static_argnums' else (
        'a str or a sequence of str')
    return f'{self.transform}: {what} must be {one}, got {value!r}.'

  def _index_error(self, i):
    j = len(self.positional) + i if i < 0 else i - self.first_index
    if j == -1 and self.leading is not None:
      return (f'{self.transform}: static_argnums index {i} is'
              f' `{self.leading}` of {self.display}, which the transform'
              ' passes on by itself: it cannot be static.')
    return (f'{self.transform}: static_argnums index {i} is out of range for'
            f' {self.display}.')

  def _name_error(self, name):
    close = difflib.get_close_matches(name, [
        p.name for p in self.signature.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)], 1)
    return (f'{self.transform}: static_argnames contains {name!r}, which is'
            f' not a parameter of {self.display} that can be static.'
            + (f'\nDid you mean static_argnames={close[0]!r}?' if close else ''))

  def _call_index_error(self, i, args):
    return (f'{self.transform}: static_argnums index {i} is out of range for'
            f' this call of {self.display}, with {len(args)} positional'
            ' argument(s).')

  def keywords(self):
    """The parameters a keyword makes static, if ``static_argnames`` was given.

    ``None`` otherwise (a program written for plain Flax, whose transforms
    around this one keep plain Flax's meaning), and where the arguments do
    not bind (the first call reports that, as it does without a caller).
    """
    if self.static_argnames == ():
      return None
    try:
      self._bind()
    except TypeError:
      return None
    return frozenset(self.names)

  def split(self, args, kwargs):
    """``(static, args, kwargs)``: a call's static and traced arguments."""
    if self.as_flax:
      if not self.closes_over:  # jax.checkpoint reads static_argnums itself
        return _NO_STATIC, args, kwargs
      # As nn.partitioning's core_remat_static picks them.
      plain = tuple(sorted(self.plain))
      at = {i for i in range(len(args)) if i in plain}
      names = {}
    elif self.static_argnums == () and self.static_argnames == ():
      return _NO_STATIC, args, kwargs
    else:
      self._check()
      names = self.names
      at = {i for i, name in enumerate(self.positional[:len(args)])
            if name in names}
      for j, i in self.positions.items():
        if -len(args) <= j < len(args):
          at.add(j % len(args))
        elif not self._ignores_unmatched():
          raise _error(ValueError, self._call_index_error(i, args), 'call', i)
    rebuilds = self.rebuilds
    static = (tuple((i, Static(args[i], rebuilds)) for i in sorted(at)),
              tuple((k, Static(v, rebuilds)) for k, v in kwargs.items()
                    if k in names))
    args = tuple(a for i, a in enumerate(args) if i not in at)
    kwargs = {k: v for k, v in kwargs.items() if k not in names}
    return static, args, kwargs

  def apply(self, f, args, kwargs):
    """``f(static, args, kwargs)`` for the call ``fn(*args, **kwargs)``."""
    return f(*self.split(args, kwargs))

  def merge(self, static, args, kwargs):
    """The inverse of :meth:`split`: the ``(args, kwargs)`` of the call."""
    if static is _NO_STATIC:
      return args, kwargs
    args = list(args)
    for i, value in static[0]:
      args.insert(i, value.value)
    return tuple(args), {**kwargs, **{k: v.value for k, v in static[1]}}


_NO_STATIC = ((), ())


class Static:
  """A static value, keyed as the transform keys it without this resolver.

  By value where it is hashable. An unhashable value is keyed as
  ``jax.checkpoint`` keys it, by identity: the same NumPy array passed at each
  call is the same key, and is traced once. Where the transform passes its
  arguments through NNX graph mode's split (``rebuilt``), an unhashable
  container (a list, a dict, a tuple holding one) reaches ``jax.checkpoint``
  as a new object at each call, so it is traced anew at each call, and reads
  what the container holds then: such a value equals no other. Hashed only
  when a key is needed (Linen closes static values over and never asks).
  """

  __slots__ = ('value', 'rebuilt', '_key')

  def __init__(self, value, rebuilt=False):
    self.value, self.rebuilt, self._key = value, rebuilt, None

  def key(self):
    """``(hashable, hash, fresh)`` of the value, computed once."""
    if self._key is None:
      try:
        self._key = (True, hash(self.value), None)
      except TypeError:
        fresh = self.rebuilt and not jax.tree_util.treedef_is_leaf(
            jax.tree_util.tree_structure(self.value))
        self._key = (False, id(self if fresh else self.value), fresh)
    return self._key

  def _identity(self):
    return self if self.key()[2] else self.value

  def __hash__(self):
    return self.key()[1]

  def __eq__(self, other):
    if not isinstance(other, Static):
      return NotImplemented
    if self.key()[0] and other.key()[0]:
      return self.value == other.value
    return self._identity() is other._identity()  # pylint: disable=protected-access


def _resolvable(static_argnums, first_index, closes_over):
  """Whether ``static_argnums`` means here what it means without names.

  Non-negative Python ints at or past ``first_index`` name parameters: an int,
  a tuple of them, or a list where the transform closes over static values
  (``nn.partitioning.remat``, which sorts it; ``jax.checkpoint`` refuses
  one). A bare int there is ours: Flax's ``sorted`` refuses it.
  """
  if type(static_argnums) is int:  # pylint: disable=unidiomatic-typecheck
    static_argnums = (static_argnums,)
  return type(static_argnums) in ((tuple, list) if closes_over else (tuple,)) and all(  # pylint: disable=unidiomatic-typecheck
      type(i) is int and i >= first_index for i in static_argnums)  # pylint: disable=unidiomatic-typecheck


def call_signature(fn):
  """``fn``'s signature for ``bind_call``; None for a builtin or a partial."""
  if isinstance(fn, functools.partial):
    return None
  try:
    return inspect.signature(fn)
  except (TypeError, ValueError):
    return None


def bind_call(signature, args, kwargs, omit_str=True):
  """The call with keywords at their positions and defaults filled in.

  As ``nnx``'s ``resolve_kwargs`` binds a call; a keyword-only argument stays
  a keyword, and with ``omit_str`` a default holding a ``str`` (which JAX
  cannot trace) stays omitted (without, it is filled in and traced, as Flax
  traces it). ``signature`` is ``call_signature(fn)``.
  """
  if signature is None:
    return args, kwargs
  bound = signature.bind(*args, **kwargs)
  given = set(bound.arguments)
  bound.apply_defaults()
  for name in (set(bound.arguments) - given) if omit_str else ():
    if holds_str(bound.arguments[name]):
      del bound.arguments[name]
  return bound.args, bound.kwargs


def holds_str(value) -> bool:
  """Whether ``value`` is a str, or a tuple, list or dict holding one."""
  if isinstance(value, dict):
    value = list(value.values())
  if isinstance(value, (tuple, list)):
    return any(holds_str(v) for v in value)
  return isinstance(value, str)


def _once(x, one):
  """``x`` as a tuple, read once; kept as given if it is not a sequence."""
  if isinstance(x, one):
    return (x,)
  try:
    return tuple(x)
  except TypeError:
    return x


def _error(cls, message, *static_arg):
  """``cls(message)``, stating what is wrong as ``static_arg``, a pair.

  ``('type', what)``, ``('unresolved', key)`` (a key of ``unresolved``) or
  ``('call', index)``: what the plugin's diagnostics explain further.
  """
  error = cls(message)
  error.static_arg = static_arg
  return error
