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

"""Static arguments, resolved through the signature of the wrapped function.

Used by the rematerializing transforms of every layer (``lift.checkpoint``,
``nn.checkpoint``, ``nn.partitioning.remat``, ``nnx.remat``), so that a static
argument is static however it is passed: positionally, by keyword, or left to
its default (``jax.checkpoint(static_argnums=...)`` sees positions only).
"""

# pylint: disable=g-importing-member,unused-import
from collections.abc import Callable, Iterable
import functools
import inspect
from typing import Any
# pylint: enable=g-importing-member,unused-import


class StaticArgs:
  """The static arguments of ``fn``, resolved through its signature.

  Indices in ``static_argnums`` become parameter names where the signature
  has them. :meth:`apply` splits each call into its static arguments and the
  traced ones, and calls ``f(static, args, kwargs)``; :meth:`merge` joins
  them again. An omitted argument keeps its default.

  Nothing is resolved until the first call: as with ``jax.checkpoint``, a
  mistake in ``static_argnums`` or ``static_argnames`` raises when the
  function is called, never when it is wrapped, and a function without
  static arguments is never inspected.

  Example::

    >>> import jax, jax.numpy as jnp
    >>> def f(x, mode='tanh'):
    ...   return jnp.tanh(x) if mode == 'tanh' else jax.nn.relu(x)
    >>> statics = StaticArgs(f, static_argnames='mode', supplies_first=False)
    >>> def checkpointed(static, args, kwargs):
    ...   def merged(*args, **kwargs):  # the static values are closed over
    ...     args, kwargs = statics.merge(static, args, kwargs)
    ...     return f(*args, **kwargs)
    ...   return jax.checkpoint(merged)(*args, **kwargs)
    >>> statics.apply(checkpointed, (-jnp.ones(2),), {'mode': 'relu'})
    Array([0., 0.], dtype=float32)

  Args:
    fn: the wrapped function.
    static_argnums: int or ints, positions of static arguments (the first
      argument the caller passes is ``first_index``). A negative index counts
      from the last positional parameter, or with ``*args`` from the last
      argument of each call. An index of a parameter the transform passes
      itself (``self`` of ``nn.remat``, which counts it as 0) makes nothing
      static, as in Flax.
    static_argnames: str or strs, names of static arguments.
    transform: the transform's name, for error messages.
    first_index: the index of the first argument the caller passes.
    supplies_first: whether the transform passes the first parameter of
      ``fn`` itself (a scope, ``self`` of a Linen method).
    group: every method (this one included, in order) a transform of
      several methods wraps with the same arguments: an argument need be a
      parameter of one of them.
  """

  def __init__(
      self,
      fn: Callable[..., Any],
      static_argnums: int | Iterable[int] = (),
      static_argnames: str | Iterable[str] = (),
      *,
      transform: str = 'checkpoint',
      first_index: int = 0,
      supplies_first: bool = True,
      group: tuple = (),
  ):
    self.fn, self.transform, self.first_index = fn, transform, first_index
    self.supplies_first, self.group = supplies_first, group or (self,)
    # Read once: a generator given here is not consumed twice.
    self.static_argnums = _once(static_argnums, int)
    self.static_argnames = _once(static_argnames, str)
    self.given = {'static_argnums': static_argnums,
                  'static_argnames': static_argnames}
    self._resolved = None  # None: not bound; False: bound; True: checked
    self._signature = None  # for bound_call()
    # The method as the transform returns it (for a decorator), which
    # another decorator may mark (the diagnostics' note on @nn.compact).
    self.decorated = None

  def _resolve(self):
    """Binds the signature of ``fn`` and maps each argument to a parameter.

    Raises the first mistake (a type, an index out of range, a name that is
    not a parameter) as a ``TypeError`` or ``ValueError``, at each call.
    """
    if self._resolved:
      return
    self._bind()
    for key in self.unresolved:
      for spec in self.group:
        spec._bind()  # pylint: disable=protected-access
      if all(key in spec.unresolved for spec in self.group):
        raise self._nowhere(self.group, key)
    self._resolved = True

  def _bind(self):
    """Maps each argument to a parameter; what it cannot, to ``unresolved``."""
    if self._resolved is not None:
      return
    self._check_types()
    kind = inspect.Parameter
    try:
      signature = inspect.signature(self.fn)
    except (TypeError, ValueError):  # a builtin: any arguments
      signature = inspect.signature(lambda *args, **kwargs: None)
    params = list(signature.parameters.values())
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
    # name -> how it was made static; with *args, positions in each call
    # (negative: from its end) -> the index given.
    self.names, self.positions, self.unresolved = {}, {}, {}
    for what, add, items in (
        ('static_argnums', self._add_index, self.static_argnums),
        ('static_argnames', self._add_name, self.static_argnames),
    ):
      for item in items:
        try:
          add(item)
        except ValueError as e:
          self.unresolved[what, item] = e
    self._resolved = False  # bound; checked against the group by _resolve

  def _check_types(self):
    for name, value, one in (
        ('static_argnums', self.static_argnums, int),
        ('static_argnames', self.static_argnames, str),
    ):
      if not isinstance(value, tuple) or not all(
          isinstance(x, one) for x in value):
        raise TypeError(self._type_error(name, self.given[name]))

  def _type_error(self, name, value):
    what = 'an int or a sequence of ints' if name == 'static_argnums' else (
        'a str or a sequence of str')
    return f'{self.transform}: {name} must be {what}, got {value!r}.'

  @staticmethod
  def _nowhere(specs, key):
    """The error for ``key``, which none of ``specs`` could resolve."""
    return specs[0].unresolved[key]

  def _add_index(self, i):
    if i < 0 and self.var_positional:
      self.positions[i] = i
      return
    n = len(self.positional)
    j = n + i if i < 0 else i - self.first_index
    if 0 <= j < n:
      self.names.setdefault(self.positional[j], f'static_argnums index {i}')
    elif j >= n and self.var_positional:
      self.positions[j] = i
    elif not (j == -1 and self.leading is not None):  # `self`: passed anyway
      raise ValueError(self._index_error(i))

  def _add_name(self, name):
    param = self.signature.parameters.get(name)
    if param is None and self.var_keyword and name != self.leading and (
        name.isidentifier()):
      self.names[name] = 'static_argnames'  # for **kwargs
    elif param is None or param.kind in (
        param.VAR_POSITIONAL, param.VAR_KEYWORD):
      raise ValueError(self._name_error(name))
    else:
      self.names[name] = 'static_argnames'

  def _index_error(self, i):
    return (f'{self.transform}: static_argnums index {i} is out of range for'
            f' {self.display}.')

  def _name_error(self, name):
    return (f'{self.transform}: static_argnames contains {name!r}, which is'
            f' not a parameter of {self.display} that can be static.')

  def _call_index_error(self, i, args):
    return (f'{self.transform}: static_argnums index {i} is out of range for'
            f' this call of {self.display}, with {len(args)} positional'
            ' argument(s).')

  def split(self, args, kwargs):
    """``(static, args, kwargs)``: a call's static and traced arguments."""
    if self.static_argnums == () and self.static_argnames == ():
      return _NO_STATIC, args, kwargs
    self._resolve()
    at = {i for i, name in enumerate(self.positional[:len(args)])
          if name in self.names}
    for j, i in self.positions.items():
      p = j if j >= 0 else len(args) + j
      if not 0 <= p < len(args):
        raise ValueError(self._call_index_error(i, args))
      at.add(p)
    static = (
        tuple((i, args[i]) for i in sorted(at)),
        tuple((k, v) for k, v in kwargs.items() if k in self.names),
    )
    args = tuple(a for i, a in enumerate(args) if i not in at)
    kwargs = {k: v for k, v in kwargs.items() if k not in self.names}
    return static, args, kwargs

  def bound_call(self, args, kwargs):
    """The call with its keyword arguments at their positions, defaults filled.

    As ``nnx``'s ``resolve_kwargs`` binds a call, so that ``g(x, m=lin)`` and
    ``g(x, lin)`` are one call to trace; a keyword-only argument stays a
    keyword, and a default holding a ``str`` (which JAX could not trace)
    stays omitted.
    """
    if self._signature is None:
      try:
        self._signature = inspect.signature(self.fn)
      except (TypeError, ValueError):  # a builtin: keep the call as it is
        self._signature = False
    if not self._signature or isinstance(self.fn, functools.partial):
      return args, kwargs
    bound = self._signature.bind(*args, **kwargs)
    given = set(bound.arguments)
    bound.apply_defaults()
    for name in list(bound.arguments):
      if name not in given and holds_str(bound.arguments[name]):
        del bound.arguments[name]
    return bound.args, bound.kwargs

  def apply(self, f, args, kwargs):
    """``f(static, args, kwargs)`` for the call ``fn(*args, **kwargs)``."""
    return f(*self.split(args, kwargs))

  def merge(self, static, args, kwargs):
    """The inverse of :meth:`split`: the ``(args, kwargs)`` of the call."""
    if static is _NO_STATIC:
      return args, kwargs
    positional, keyword = static
    args = list(args)
    for i, value in positional:
      args.insert(i, value)
    return tuple(args), {**kwargs, **dict(keyword)}


_NO_STATIC = ((), ())


def holds_str(value) -> bool:
  """Whether ``value`` is a str, or a tuple, list or dict holding one."""
  if isinstance(value, str):
    return True
  if isinstance(value, dict):
    value = value.values()
  elif not isinstance(value, (tuple, list)):
    return False
  return any(holds_str(v) for v in value)


def _once(x, one):
  """``x`` as a tuple (a single ``one`` is a 1-tuple), read once.

  What cannot be read as a sequence is kept as given, for the type error at
  the first call.
  """
  if isinstance(x, one):
    return (x,)
  try:
    return tuple(x)
  except TypeError:
    return x


# The plugin explains static-argument mistakes everywhere: its transforms
# build the resolver above, under this name, with the diagnostics layer on
# top. Upstream that layer is a PR of its own (patches/series.toml), which
# Flax can take or leave; being an import, this line stays in the plugin.
from flax_tieext.static_args_diagnostics import DiagnosedStaticArgs as StaticArgs  # pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order
