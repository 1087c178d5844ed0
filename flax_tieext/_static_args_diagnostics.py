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

``install()`` binds :func:`explained_init` and :func:`explained_apply` over
``StaticArgs.__init__`` and ``StaticArgs.apply`` of
``flax_tieext.core._static_args``, whose errors are short and state their
facts (``static_arg``). Where such an error leaves ``apply``, it gets a
message that teaches: a name that is not a parameter gets the nearest one, an
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
import functools
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


_BY_NAME = ' To make arguments static by name, use static_argnames.'


def explained_init(init):
  """``StaticArgs.__init__``: Flax's own TypeError gets a note of ours."""

  @functools.wraps(init)
  def diagnosed_init(self, *args, **kwargs):
    try:
      init(self, *args, **kwargs)
    except TypeError as e:  # nn.checkpoint shifts static_argnums, as Flax
      _add_note(e, _flax_type_note(self))
      raise

  return diagnosed_init


def explained_apply(apply):
  """``StaticArgs.apply``: its errors name the parameter, the fix and why.

  Example::

    >>> from flax_tieext.core._static_args import StaticArgs
    >>> def dense(scope, x, train=False):
    ...   return x
    ...
    >>> statics = StaticArgs(dense, static_argnames='trian')
    >>> statics.apply(lambda *call: None, (1.0,), {})  # resolved at a call
    Traceback (most recent call last):
      ...
    ValueError: checkpoint: static_argnames contains 'trian', which is not a parameter of dense(scope, x, train=False).
    Did you mean static_argnames='train'?
    The parameters that can be static are: x, train.
  """

  @functools.wraps(apply)
  def diagnosed_apply(self, f, args, kwargs):
    try:
      return apply(self, f, args, kwargs)
    except Exception as e:  # pylint: disable=broad-except
      _explain(self, e, args, kwargs)
      raise

  return diagnosed_apply


def _explain(spec, error, args, kwargs):
  """Explains ``error``, raised by ``spec.apply(f, args, kwargs)``, in place.

  The resolver's own error (its facts in ``static_arg``) gets our message,
  once: an ``apply`` around this one finds it explained. Any other error gets
  a note: nothing here refuses a call that Flax accepts.
  """
  facts = getattr(error, 'static_arg', None)
  if facts is not None:
    del error.static_arg
    kind, fact = facts
    if kind == 'type':
      message = error.args[0] + (_BY_NAME if fact == 'static_argnums' else '')
    elif kind == 'call':
      message = _call_index_error(spec, fact, args)
    else:
      message = _unresolved(spec.group, fact)
    error.args = (message,)
  elif spec.as_flax:  # Flax's own static_argnums: nothing resolved to explain
    if isinstance(error, _TRACED):
      scalars = _flax_traced_scalars(spec, args, kwargs)
      _add_note(error, _flax_meaning_note(spec, scalars, args, kwargs))
      _add_note(error, _traced_scalars_note(spec, scalars))
    elif isinstance(error, TypeError):
      _add_note(error, _flax_type_note(spec))
  elif isinstance(error, _TRACED):
    _explain_concretization_error(spec, error, args, kwargs)
  elif isinstance(error, TypeError):
    _add_note(error, _str_note(spec, args, kwargs))
  elif isinstance(error, ValueError):
    # An array in a static slot used in Python control flow.
    if 'truth value of an array' in str(error):
      _note_static_arrays(spec, error, args, kwargs)
  elif isinstance(error, flax_errors.AssignSubModuleError):
    _add_note(error, _compact_note(spec))


# A traced flag in `if` (ConcretizationTypeError), a traced count in
# `range(n)` (TracerIntegerConversionError).
_TRACED = (jax.errors.ConcretizationTypeError,
           jax.errors.TracerIntegerConversionError)


def _flax_meaning_note(spec, scalars, args, kwargs):
  """Why an index of Flax's own meaning may have missed the flag meant.

  The argument to name instead is the Python scalar the call traced, else
  the parameter that looks like a flag.
  """
  named = [label for label, _ in scalars if not label.startswith('*')]
  return (
      f'{spec.transform}: static_argnums={spec.given["static_argnums"]!r}'
      ' names no parameter here (it is negative, not a Python int, or'
      ' the slot of the argument the transform passes itself), so it keeps'
      " Flax's own meaning: "
      + ('Flax ignores an index that matches no argument of the call (a'
         ' negative one never does), so it may make nothing static.'
         if spec.closes_over else
         'jax.checkpoint counts it over the arguments Flax passes it, which'
         ' start with the variables.')
      + ' ' + (_name_it_instead(spec, _received(spec, args, kwargs))
               if not named else
               'Name the argument instead of counting, which also covers'
               ' keyword and omitted calls:'
               f' static_argnames={_static_argnames_code(named)}.')
  )


def _flax_type_note(spec):
  """Our word on Flax's own TypeError for a ``static_argnums`` not of ints."""
  value = spec.given['static_argnums']
  ints = (value,) if isinstance(value, int) else value
  try:
    if all(isinstance(i, int) for i in ints):
      return None
  except TypeError:  # not iterable
    pass
  # pylint: disable-next=protected-access
  return spec._type_error('static_argnums', value) + _BY_NAME


# -- the arguments given --------------------------------------------------


def _name_error(spec, name):
  param = spec.signature.parameters.get(name)
  if not name.isidentifier():
    # Such as '*args[0]', the label an earlier message of ours gave an
    # extra positional argument: **kwargs would accept it and never use it.
    by_position = (
        f' An extra positional argument that *{spec.var_positional}'
        ' collects has no name: make it static by position with'
        f' static_argnums={_var_positional_index(spec, name)}.\n'
        + _numbering(spec)
        if spec.var_positional and name.startswith('*')
        else ' The parameters that can be static are: '
        + ', '.join(_nameable(spec)) + '.'
    )
    return (
        f'{spec.transform}: static_argnames contains {name!r}, which is not'
        f' a parameter name of {spec.display}.' + by_position
    )
  if param is not None:
    star = param.kind is param.VAR_POSITIONAL
    return (
        f"{spec.transform}: static_argnames contains '{name}', the"
        f' {"*" if star else "**"}{name} parameter of {spec.display}. It'
        ' collects several arguments and cannot be static as a whole: name'
        ' the individual keyword arguments instead'
        + (', or use static_argnums for extra positional arguments.'
           if star else '.')
    )
  if name == spec.leading:
    return (
        f"{spec.transform}: static_argnames contains '{name}', the first"
        f' parameter of {spec.display}. The transform passes it on by'
        ' itself; it cannot be static. Remove it from static_argnames.'
    )
  candidates = _nameable(spec)
  close = difflib.get_close_matches(name, candidates, n=1)
  return (
      f"{spec.transform}: static_argnames contains '{name}', which is not"
      f' a parameter of {spec.display}.\n'
      + (f'Did you mean static_argnames={close[0]!r}?\n' if close else '')
      + ('The parameters that can be static are: '
         + ', '.join(candidates) + '.' if candidates else
         f'{spec.display.split("(")[0]} takes no arguments that could be'
         ' static.')
  )


def _unresolved(specs, key):
  """The message for ``key``, which resolves in none of ``specs``."""
  kind, item = key
  spec = specs[0]
  if kind == 'static_argnums':
    return (spec.unresolved[key] + '\n' + _numbering(spec)
            + _name_it_instead(spec))
  if len(specs) == 1 or any(
      item == s.leading or item in s.signature.parameters for s in specs):
    return _name_error(spec, item)
  candidates = list(dict.fromkeys(n for s in specs for n in _nameable(s)))
  close = difflib.get_close_matches(item, candidates, n=1)
  return (
      f"{spec.transform}: static_argnames contains '{item}', which is"
      ' not a parameter of any of the wrapped methods:\n'
      + ''.join(f'  {s.display}\n' for s in specs)
      + (f'Did you mean static_argnames={close[0]!r}?\n' if close else '')
      + 'The parameters that can be static are: '
      + ', '.join(candidates) + '.'
  )


def _nameable(spec):
  return [
      p.name for p in spec.signature.parameters.values()
      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
  ]


def _var_positional_index(spec, label):
  """``static_argnums`` index of ``'*args[k]'`` (k = 0 for any other label)."""
  match = re.search(r'\[(\d+)\]', label)
  k = int(match.group(1)) if match else 0
  return len(spec.positional) + spec.first_index + k


def _make_static(spec, labels):
  """The argument that makes ``labels`` static: names, or indices into *args."""
  names = [l for l in labels if not l.startswith('*')]
  nums = [_var_positional_index(spec, l) for l in labels if l.startswith('*')]
  parts = []
  if names:
    parts.append(f'static_argnames={_static_argnames_code(names)}')
  if nums:
    parts.append(
        'static_argnums='
        + (str(nums[0]) if len(nums) == 1 else repr(tuple(nums)))
    )
  return ' and '.join(parts)


def _numbering(spec, mark=None):
  """The signature, one parameter a line, in this transform's numbering."""
  fn_name = spec.display.split('(')[0]
  if spec.leading is None:
    head = f'{spec.transform} numbers the arguments of {fn_name} so:'
  elif spec.first_index == 1:
    head = f'{spec.transform} counts `{spec.leading}` as 0 in static_argnums:'
  else:
    head = (
        f'{spec.transform} does not count `{spec.leading}` in'
        ' static_argnums; the first argument after it is 0:'
    )
  n = len(spec.positional)
  rows = []
  if spec.leading is not None:
    index = '0' if spec.first_index == 1 else '-'
    rows.append((index, '', spec.leading, 'cannot be static'))
  for param in spec.signature.parameters.values():
    note = 'static' if param.name in spec.names else ''
    if param.name == mark:
      note = '<- ' + spec.names.get(mark, 'static')
    if param.kind <= param.POSITIONAL_OR_KEYWORD:
      k = spec.positional.index(param.name)
      # A negative index names a parameter in nnx.remat's numbering, and
      # with static_argnames: elsewhere it keeps Flax's meaning, counted
      # over jax.checkpoint's arguments (the variables first).
      neg = '' if spec.var_positional or (
          spec.supplies_first and not spec.static_argnames) else str(k - n)
      rows.append((str(k + spec.first_index), neg, str(param), note))
    elif param.kind is param.VAR_POSITIONAL:
      rows.append((f'{n + spec.first_index}+', '', str(param), note))
    else:
      rows.append(('-', '', str(param), note or 'by name only'))
  lines = [head]
  for index, neg, text, note in rows:
    numbers = f'{index:>4} | {neg:<3}' if neg else f'{index:>4}      '
    lines.append(f'  {numbers} {text}' + (f'    ({note})' if note else ''))
  return '\n'.join(lines) + '\n'


def _name_it_instead(spec, received=None):
  candidate = _probable_flag(spec, None, received or {})
  example = repr(candidate) if candidate else "'<name>'"
  return (
      'Name the argument instead of counting, which also covers keyword'
      f' and omitted calls: static_argnames={example}.'
  )


# -- call time --------------------------------------------------------------


def _received(spec, args, kwargs):
  """The call's arguments by parameter name ({} where they cannot bind).

  A spec of Flax's meaning (``as_flax``) is bound here first: its calls never
  need the signature, and one of a type the resolver refuses (a str) has none.
  """
  try:
    spec._bind()  # pylint: disable=protected-access
    return dict(spec.signature.bind_partial(*args, **kwargs).arguments)
  except (TypeError, ValueError):
    return {}


def _call_index_error(spec, i, args):
  n = len(args)
  return (
      f'{spec.transform}: static_argnums index {i} is out of range for'
      f' this call of {spec.display}, which passes {n} positional'
      f' argument{"s" if n != 1 else ""} (numbered from {spec.first_index}).\n'
      + _numbering(spec) + _name_it_instead(spec, _received(spec, args, {}))
  )


def _probable_flag(spec, hit, received):
  """A non-static parameter near ``hit`` that looks like a flag or mode.

  None where ``spec`` could not be bound (``static_argnums`` of a type the
  resolver refuses, such as a str, which Flax's own meaning still takes).
  """
  if getattr(spec, 'signature', None) is None:
    return None
  order = list(spec.signature.parameters)
  at = order.index(hit) if hit in order else 0
  best = None
  for position, param in enumerate(spec.signature.parameters.values()):
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
      continue
    if param.name == hit or param.name in spec.names:
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


def _index_of(spec, name):
  if name in spec.positional:
    return spec.positional.index(name) + spec.first_index
  return None


def _label(spec, i):
  """The name of the ``i``-th positional argument of a call."""
  if i < len(spec.positional):
    return spec.positional[i]
  if spec.var_positional:
    return f'*{spec.var_positional}[{i - len(spec.positional)}]'
  return f'argument {i + spec.first_index}'


def _items(spec, args, kwargs):
  """``(label, value, origin)`` of the arguments of a call: static or not."""
  # pylint: disable-next=protected-access
  spec._check()  # bound, where nothing is static too
  positions = {p for p, _ in spec.split(args, kwargs)[0][0]}
  by_position = {
      (j if j >= 0 else len(args) + j): i for j, i in spec.positions.items()
  }
  items = []
  for p, value in enumerate(args):
    label = _label(spec, p)
    origin = None
    if p in positions:
      origin = spec.names.get(label) or (
          f'static_argnums index {by_position[p]}')
    items.append((label, value, origin))
  items += [(k, v, spec.names.get(k)) for k, v in kwargs.items()]
  return items


def _static_array_advice(spec, label, value, origin, received):
  """Why an array in a static slot is the likely mistake, or None.

  An array is a valid static value (it is closed over, as in Flax); it is
  named only in a note on an error that happens anyway.
  """
  array = next(
      (x for x in jax.tree_util.tree_leaves(value) if _is_array(x)), None)
  if array is None:
    return None
  meant = _probable_flag(spec, label, received)
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
    index = _index_of(spec, meant)
    by_index = (
        f' In the numbering of {spec.transform} that is'
        f' static_argnums={index}.' if index is not None else ''
    )
    advice = (
        f'Did you mean `{meant}`?{by_index} Naming it avoids counting:'
        f' static_argnames={meant!r}.'
    )
  return (
      f'{spec.transform}: `{label}` of {spec.display} is static ({origin}),'
      f' but it received {_describe_array(array)}. A static argument is'
      ' usually a Python value the function is specialized on, such as a'
      ' flag or a mode string.\n'
      + (_numbering(spec, mark=label) if origin != 'static_argnames' else '')
      + advice
  )


# -- notes on errors that happen anyway ---------------------------------------


def _note_static_arrays(spec, error, args, kwargs):
  """Notes each static argument that received an array; the call's items."""
  items = _items(spec, args, kwargs)  # binds spec first
  received = _received(spec, args, kwargs)
  for label, value, origin in items:
    if origin is not None:
      _add_note(error, _static_array_advice(
          spec, label, value, origin, received))
  return items


def _str_note(spec, args, kwargs):
  """Names the traced arguments that hold a str (JAX cannot trace one)."""
  strings = [
      label for label, value, origin in _items(spec, args, kwargs)
      if origin is None and static_args.holds_str(value)
  ]
  if not strings:
    return None
  return (
      f'{spec.transform}: {_or_list(strings)} of {spec.display}'
      f' received a str, which JAX cannot trace. Make'
      f' {"it" if len(strings) == 1 else "them"} static:'
      f' {_make_static(spec, strings)}.'
  )


def _compact_note(spec):
  """``@nn.compact`` above the transform marks the transform's wrapper."""
  decorated = getattr(spec, 'decorated', None)
  if not getattr(decorated, 'compact', False) or getattr(
      spec.fn, 'compact', False):
    return None
  name = spec.transform.split()[0]
  return (
      f'{spec.transform}: {getattr(spec.fn, "__qualname__", "the method")}'
      f' is decorated with @nn.compact above @{name}(...). A lifted'
      ' transform wraps the compact method: swap the two decorators,\n'
      f'  @{name}(...)\n  @nn.compact\n  def __call__(self, ...): ...'
  )


def _explain_concretization_error(spec, error, args, kwargs):
  """Adds to a JAX concretization error which arguments were traced.

  A Python bool, int or float passed to an argument that is not static is
  traced like an array, so ``if deterministic:`` in the function fails with
  ``TracerBoolConversionError``. The note names those arguments and the
  ``static_argnames`` that fixes it. The error keeps its type.

  Args:
    spec: the ``StaticArgs`` of the call.
    error: the error JAX raised.
    args: the positional arguments of the call.
    kwargs: the keyword arguments of the call.
  """
  _add_note(error, _traced_scalars_note(
      spec, _traced_scalars(spec, error, args, kwargs)))


def _traced_scalars(spec, error, args, kwargs):
  """``(label, value)`` of the Python scalars a call traced, flags first.

  Notes on ``error`` each static argument that received an array.
  """
  scalars = [
      (label, value)
      for label, value, origin in _note_static_arrays(spec, error, args, kwargs)
      if origin is None and type(value) in (bool, int, float)
  ]
  scalars.sort(key=lambda item: type(item[1]) is not bool)
  return scalars


def _flax_traced_scalars(spec, args, kwargs):
  """:func:`_traced_scalars` where ``static_argnums`` keeps Flax's meaning.

  The spec resolved nothing (its own indices may name no parameter), so the
  arguments are labelled by the signature alone; static are only those that
  Flax itself picks (``nn.partitioning.remat`` closes over them).
  """
  try:
    spec._bind()  # pylint: disable=protected-access
    flax_static = {p for p, _ in spec.split(args, kwargs)[0][0]}
  except (TypeError, ValueError):
    return []
  items = [(_label(spec, p), value) for p, value in enumerate(args)
           if p not in flax_static]
  scalars = [(label, value) for label, value in [*items, *kwargs.items()]
             if type(value) in (bool, int, float)]
  scalars.sort(key=lambda item: type(item[1]) is not bool)
  return scalars


def _traced_scalars_note(spec, scalars):
  """Which Python scalars were traced, and the argument that makes them static."""
  if not scalars:
    return None
  labels = [label for label, _ in scalars]
  got = ', '.join(f'{label}={value!r}' for label, value in scalars)
  one = len(labels) == 1
  fn_name = spec.display.split('(')[0]
  note = (
      f'{spec.transform}: {fn_name} was called with the Python'
      f' value{"" if one else "s"} {got}, but'
      f' {_or_list(labels)} {"is" if one else "are"} not static, so'
      f' {"it was" if one else "they were"} traced like an array. If'
      f' {fn_name} uses {"it" if one else "them"} in Python control'
      ' flow or as a shape, make'
      f' {"it" if one else "them"} static:'
      f' {_make_static(spec, labels)}.'
      + (
          ' A named argument is static however it is passed: positionally,'
          ' by keyword, or left to its default.'
          if any(not l.startswith('*') for l in labels) else ''
      )
  )
  by_index = [] if spec.as_flax else [  # then spec.names are not in force
      f'`{name}` ({origin})' for name, origin in spec.names.items()
      if origin.startswith('static_argnums')
  ]
  if by_index:
    index = _index_of(spec, labels[0])
    note += f' Currently static: {", ".join(by_index)}.' + (
        f' In the numbering of {spec.transform}, `{labels[0]}` is'
        f' static_argnums={index}.' if index is not None else ''
    )
  return note


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

