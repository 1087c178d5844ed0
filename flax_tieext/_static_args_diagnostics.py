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

"""Static-argument mistakes explained in the terms of the user's signature.

:class:`DiagnosedStaticArgs` is ``flax_tieext.core._static_args.StaticArgs`` with
errors that teach: a name that is not a parameter gets the nearest one, an
index out of range gets the signature numbered as the transform counts. Those
raise at the first call, as ``jax.checkpoint``'s own do. Everything else is a
note on an error that happens anyway, which keeps its type: a JAX
concretization error raised because a Python flag was traced names it (and an
array in a static slot, the flag that was probably meant), a ``str`` in a
traced argument names the fix, ``@nn.compact`` above the transform says to
swap them. Nothing else changes: the same arguments are static and every call
Flax accepts works.
"""

# pylint: disable=g-importing-member,unused-import
import difflib
import re

import jax

from flax import errors as flax_errors
from flax_tieext.core import _static_args as static_args
# pylint: enable=g-importing-member,unused-import


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


class DiagnosedStaticArgs(static_args.StaticArgs):
  """:class:`StaticArgs` whose errors name the parameter, the fix and why.

  Example::

    >>> def dense(scope, x, train=False):
    ...   return x
    ...
    >>> statics = DiagnosedStaticArgs(dense, static_argnames='trian')
    >>> statics.split((1.0,), {})  # the first call resolves the arguments
    Traceback (most recent call last):
      ...
    ValueError: checkpoint: static_argnames contains 'trian', which is not a parameter of dense(scope, x, train=False).
    Did you mean static_argnames='train'?
    The parameters that can be static are: x, train.

  Args:
    fn: as for :class:`StaticArgs`.
    static_argnums: as for :class:`StaticArgs`.
    static_argnames: as for :class:`StaticArgs`.
    **kwargs: as for :class:`StaticArgs`.
  """

  def __init__(self, *args, **kwargs):
    try:
      super().__init__(*args, **kwargs)
    except TypeError as e:  # nn.checkpoint shifts static_argnums, as Flax
      _add_note(e, self._flax_type_note())
      raise

  def _type_error(self, name, value):
    return super()._type_error(name, value) + (
        ' To make arguments static by name, use static_argnames.'
        if name == 'static_argnums' else '')

  def _flax_meaning_note(self):
    """Why an index of Flax's own meaning may have missed the flag meant."""
    return (
        f'{self.transform}: static_argnums={self.given["static_argnums"]!r}'
        ' names no parameter here (it is negative, not a Python int, or'
        ' the slot of the argument the transform passes itself), so it keeps'
        " Flax's own meaning: "
        + ('Flax ignores an index that matches no argument of the call (a'
           ' negative one never does), so it may make nothing static.'
           if self.closes_over else
           'jax.checkpoint counts it over the arguments Flax passes it, which'
           ' start with the variables.')
        + ' Name the argument instead, which also covers keyword and omitted'
        " calls: static_argnames='<name>'."
    )

  def _flax_type_note(self):
    """Our word on Flax's own TypeError for a ``static_argnums`` not of ints."""
    value = self.given['static_argnums']
    ints = (value,) if isinstance(value, int) else value
    try:
      if all(isinstance(i, int) for i in ints):
        return None
    except TypeError:  # not iterable
      pass
    return self._type_error('static_argnums', value)

  # -- the arguments given --------------------------------------------------

  def _index_error(self, i):
    return super()._index_error(i) + '\n' + self._numbering() + (
        self._name_it_instead())

  def _name_error(self, name):
    param = self.signature.parameters.get(name)
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
          + ', '.join(self._nameable()) + '.'
      )
      return (
          f'{self.transform}: static_argnames contains {name!r}, which is not'
          f' a parameter name of {self.display}.' + by_position
      )
    if param is not None:
      star = param.kind is param.VAR_POSITIONAL
      return (
          f"{self.transform}: static_argnames contains '{name}', the"
          f' {"*" if star else "**"}{name} parameter of {self.display}. It'
          ' collects several arguments and cannot be static as a whole: name'
          ' the individual keyword arguments instead'
          + (', or use static_argnums for extra positional arguments.'
             if star else '.')
      )
    if name == self.leading:
      return (
          f"{self.transform}: static_argnames contains '{name}', the first"
          f' parameter of {self.display}. The transform passes it on by'
          ' itself; it cannot be static. Remove it from static_argnames.'
      )
    candidates = self._nameable()
    close = difflib.get_close_matches(name, candidates, n=1)
    return (
        f"{self.transform}: static_argnames contains '{name}', which is not"
        f' a parameter of {self.display}.\n'
        + (f'Did you mean static_argnames={close[0]!r}?\n' if close else '')
        + ('The parameters that can be static are: '
           + ', '.join(candidates) + '.' if candidates else
           f'{self.display.split("(")[0]} takes no arguments that could be'
           ' static.')
    )

  @staticmethod
  def _nowhere(specs, key):
    kind, item = key
    unknown = kind == 'static_argnames' and not any(
        item == spec.leading or item in spec.signature.parameters
        for spec in specs
    )
    if not unknown or len(specs) == 1:
      return specs[0].unresolved[key]
    candidates = list(dict.fromkeys(n for s in specs for n in s._nameable()))  # pylint: disable=protected-access
    close = difflib.get_close_matches(item, candidates, n=1)
    return (
        f"{specs[0].transform}: static_argnames contains '{item}', which is"
        ' not a parameter of any of the wrapped methods:\n'
        + ''.join(f'  {spec.display}\n' for spec in specs)
        + (f'Did you mean static_argnames={close[0]!r}?\n' if close else '')
        + 'The parameters that can be static are: '
        + ', '.join(candidates) + '.'
    )

  def _nameable(self):
    return [
        p.name for p in self.signature.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]

  def _var_positional_index(self, label):
    """``static_argnums`` index of ``'*args[k]'`` (k = 0 for any other label)."""
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
    fn_name = self.display.split('(')[0]
    if self.leading is None:
      head = f'{self.transform} numbers the arguments of {fn_name} so:'
    elif self.first_index == 1:
      head = f'{self.transform} counts `{self.leading}` as 0 in static_argnums:'
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
      if param.kind <= param.POSITIONAL_OR_KEYWORD:
        k = self.positional.index(param.name)
        # A negative index names a parameter in nnx.remat's numbering, and
        # with static_argnames: elsewhere it keeps Flax's meaning, counted
        # over jax.checkpoint's arguments (the variables first).
        neg = '' if self.var_positional or (
            self.supplies_first and not self.static_argnames) else str(k - n)
        rows.append((str(k + self.first_index), neg, str(param), note))
      elif param.kind is param.VAR_POSITIONAL:
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

  def _received(self, args, kwargs):
    try:
      return dict(self.signature.bind_partial(*args, **kwargs).arguments)
    except TypeError:
      return {}

  def _call_index_error(self, i, args):
    n = len(args)
    return (
        f'{self.transform}: static_argnums index {i} is out of range for'
        f' this call of {self.display}, which passes {n} positional'
        f' argument{"s" if n != 1 else ""} (numbered from {self.first_index}).\n'
        + self._numbering() + self._name_it_instead(self._received(args, {}))
    )

  def _probable_flag(self, hit, received):
    """A non-static parameter near ``hit`` that looks like a flag or mode."""
    order = list(self.signature.parameters)
    at = order.index(hit) if hit in order else 0
    best = None
    for position, param in enumerate(self.signature.parameters.values()):
      if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
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

  def _label(self, i):
    """The name of the ``i``-th positional argument of a call."""
    if i < len(self.positional):
      return self.positional[i]
    if self.var_positional:
      return f'*{self.var_positional}[{i - len(self.positional)}]'
    return f'argument {i + self.first_index}'

  def _items(self, args, kwargs, static):
    """``(label, value, origin)`` of the arguments of a call: static or not."""
    positions = {p for p, _ in static[0]}
    by_position = {
        (j if j >= 0 else len(args) + j): i for j, i in self.positions.items()
    }
    items = []
    for p, value in enumerate(args):
      label = self._label(p)
      origin = None
      if p in positions:
        origin = self.names.get(label) or (
            f'static_argnums index {by_position[p]}')
      items.append((label, value, origin))
    items += [(k, v, self.names.get(k)) for k, v in kwargs.items()]
    return items

  def _static_array_advice(self, label, value, origin, received):
    """Why an array in a static slot is the likely mistake, or None.

    An array is a valid static value (it is closed over, as in Flax); it is
    named only in a note on an error that happens anyway.
    """
    array = next(
        (x for x in jax.tree_util.tree_leaves(value) if _is_array(x)), None)
    if array is None:
      return None
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
          if meant else ''
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
          f' static_argnums={index}.' if index is not None else ''
      )
      advice = (
          f'Did you mean `{meant}`?{by_index} Naming it avoids counting:'
          f' static_argnames={meant!r}.'
      )
    return (
        f'{self.transform}: `{label}` of {self.display} is static ({origin}),'
        f' but it received {_describe_array(array)}. A static argument is'
        ' usually a Python value the function is specialized on, such as a'
        ' flag or a mode string.\n'
        + (self._numbering(mark=label) if origin != 'static_argnames' else '')
        + advice
    )

  # -- notes on errors that happen anyway ---------------------------------------
  # Nothing here refuses a call that Flax accepts: each handler adds a note to
  # an error JAX or Flax raised, which keeps its type.

  def apply(self, f, args, kwargs):
    if self.as_flax:  # Flax's own static_argnums: nothing resolved to explain
      try:
        return super().apply(f, args, kwargs)
      except (jax.errors.ConcretizationTypeError,
              jax.errors.TracerIntegerConversionError) as e:
        _add_note(e, self._flax_meaning_note())
        raise
      except TypeError as e:
        _add_note(e, self._flax_type_note())
        raise
    static, dynamic_args, dynamic_kwargs = self.split(args, kwargs)
    try:
      return f(static, dynamic_args, dynamic_kwargs)
    except (jax.errors.ConcretizationTypeError,
            jax.errors.TracerIntegerConversionError) as e:
      # A traced flag in `if` (ConcretizationTypeError), a traced count in
      # `range(n)` (TracerIntegerConversionError).
      self._explain_concretization_error(e, args, kwargs)
      raise
    except TypeError as e:
      _add_note(e, self._str_note(args, kwargs))
      raise
    except ValueError as e:
      # An array in a static slot used in Python control flow.
      if 'truth value of an array' in str(e):
        self._note_static_arrays(e, args, kwargs)
      raise
    except flax_errors.AssignSubModuleError as e:
      _add_note(e, self._compact_note())
      raise

  def _note_static_arrays(self, error, args, kwargs):
    """Notes each static argument that received an array; the call's statics."""
    self._check()
    static = super().split(args, kwargs)[0]
    received = self._received(args, kwargs)
    for label, value, origin in self._items(args, kwargs, static):
      if origin is not None:
        _add_note(error, self._static_array_advice(
            label, value, origin, received))
    return static

  def _str_note(self, args, kwargs):
    """Names the traced arguments that hold a str (JAX cannot trace one)."""
    self._check()
    static = super().split(args, kwargs)[0]
    strings = [
        label for label, value, origin in self._items(args, kwargs, static)
        if origin is None and static_args.holds_str(value)
    ]
    if not strings:
      return None
    return (
        f'{self.transform}: {_or_list(strings)} of {self.display}'
        f' received a str, which JAX cannot trace. Make'
        f' {"it" if len(strings) == 1 else "them"} static:'
        f' {self._make_static(strings)}.'
    )

  def _compact_note(self):
    """``@nn.compact`` above the transform marks the transform's wrapper."""
    decorated = getattr(self, 'decorated', None)
    if not getattr(decorated, 'compact', False) or getattr(
        self.fn, 'compact', False):
      return None
    name = self.transform.split()[0]
    return (
        f'{self.transform}: {getattr(self.fn, "__qualname__", "the method")}'
        f' is decorated with @nn.compact above @{name}(...). A lifted'
        ' transform wraps the compact method: swap the two decorators,\n'
        f'  @{name}(...)\n  @nn.compact\n  def __call__(self, ...): ...'
    )

  def _explain_concretization_error(self, error, args, kwargs):
    """Adds to a JAX concretization error which arguments were traced.

    A Python bool, int or float passed to an argument that is not static is
    traced like an array, so ``if deterministic:`` in the function fails with
    ``TracerBoolConversionError``. The note names those arguments and the
    ``static_argnames`` that fixes it. The error keeps its type.

    Args:
      error: the error JAX raised.
      args: the positional arguments of the call.
      kwargs: the keyword arguments of the call.
    """
    static = self._note_static_arrays(error, args, kwargs)
    scalars = [
        (label, value) for label, value, origin in self._items(
            args, kwargs, static)
        if origin is None and type(value) in (bool, int, float)
    ]
    if not scalars:
      return
    scalars.sort(key=lambda item: type(item[1]) is not bool)
    labels = [label for label, _ in scalars]
    got = ', '.join(f'{label}={value!r}' for label, value in scalars)
    one = len(labels) == 1
    fn_name = self.display.split('(')[0]
    note = (
        f'{self.transform}: {fn_name} was called with the Python'
        f' value{"" if one else "s"} {got}, but'
        f' {_or_list(labels)} {"is" if one else "are"} not static, so'
        f' {"it was" if one else "they were"} traced like an array. If'
        f' {fn_name} uses {"it" if one else "them"} in Python control'
        ' flow or as a shape, make'
        f' {"it" if one else "them"} static:'
        f' {self._make_static(labels)}.'
        + (
            ' A named argument is static however it is passed: positionally,'
            ' by keyword, or left to its default.'
            if any(not l.startswith('*') for l in labels) else ''
        )
    )
    by_index = [
        f'`{name}` ({origin})' for name, origin in self.names.items()
        if origin.startswith('static_argnums')
    ]
    if by_index:
      index = self._index_of(labels[0])
      note += f' Currently static: {", ".join(by_index)}.' + (
          f' In the numbering of {self.transform}, `{labels[0]}` is'
          f' static_argnums={index}.' if index is not None else ''
      )
    _add_note(error, note)


def _add_note(error, note):
  """Adds ``note`` to ``error`` once (into its message before Python 3.11)."""
  if note is None:
    return
  if hasattr(error, 'add_note'):
    if note not in getattr(error, '__notes__', ()):
      error.add_note(note)
  elif error.args and isinstance(error.args[0], str):
    if note not in error.args[0]:
      error.args = (f'{error.args[0]}\n\n{note}',) + error.args[1:]


# The transforms build this class (``_static_args.resolver``).
static_args.resolver = DiagnosedStaticArgs
