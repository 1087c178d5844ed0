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

"""The messages of :class:`~flax_tieext.TieError`, built apart from the checks.

Each function returns the error for one broken rule; the code that decides
(``tie_spec`` for declarations, ``ties`` for routing a use of a target,
``tie_convert`` for conversions) only chooses which one to raise.
A message says what happened, where (target, source, collection and the
declaring module), what exists nearby, and the options that fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from flax_tieext.errors import TieError

Path = tuple[str, ...]

FIX_PATH = ('Fix the {} path (paths are relative to the module that declares'
            ' the tie; a leading "/" starts at the root module).')


def text(path, sep: str = '/') -> str:
  """``path`` as the user writes it: ``/a/b`` in Linen, ``'a.b'`` in NNX."""
  if sep == '/':
    return '/' + '/'.join(path)
  return repr(sep.join(path)) if path else 'the module'


def _declared(sep: str, *places: Path) -> str:
  """Where ties are declared; NNX ties are declared on the tied class."""
  return ' declared at ' + ' and '.join(map(text, places)) if sep == '/' else ''


def tie_error(what: str, *options: str) -> TieError:
  """A TieError: what happened, then numbered options (only those that apply)."""
  options = [o for o in options if o]
  if len(options) == 1:
    return TieError(f'{what}\n\nOption: {options[0]}')
  listed = ''.join(f'\n  {i}. {o}' for i, o in enumerate(options, 1))
  return TieError(f'{what}\n\nOptions:{listed}' if options else what)


def nearest(tree: Mapping[str, Any], path: Path, base: Path = (),
            sep: str = '/') -> str:
  """Names that exist where ``path`` stops matching ``tree``, nearest first."""
  node, depth = tree, 0
  for name in path:
    if not isinstance(node, Mapping) or name not in node:
      break
    node, depth = node[name], depth + 1
  if depth == len(path):
    return ''
  names = sorted(node) if isinstance(node, Mapping) else []
  near = difflib.get_close_matches(path[depth], names, n=3, cutoff=0.5)
  where = text(base + path[:depth], sep)
  dotted = path[depth].split('.' if sep == '/' else '/')
  if len(dotted) > 1 and all(dotted):
    return (f' Paths are "{sep}"-separated: for {path[depth]!r} write'
            f' {sep.join(dotted)!r}.')
  if near:
    return f' Nearest existing names under {where}: {", ".join(near)}.'
  return f' Names that exist under {where}: {", ".join(names) or "none"}.'


def did_you_mean(name, names) -> str:
  near = difflib.get_close_matches(name, list(names), n=1)
  return f' Did you mean {near[0]!r}?' if near else ''


def _in(col) -> str:
  """The collection of a message (NNX's ties have none: col is None)."""
  return '' if col is None else f' in collection {col!r}'


def _listed(names) -> str:
  return ', '.join(map(repr, sorted(names))) or 'none'


# ---------------------------------------------------------------------------
# Declaration: the normal form of the ties in force
# ---------------------------------------------------------------------------


def not_a_mapping(ties, api: str = 'lift.tie') -> TieError:
  """``ties`` is not a mapping: say what was given and what to pass."""
  kind = type(ties).__name__
  if isinstance(ties, (list, tuple)) and all(
      isinstance(p, tuple) and len(p) == 2 for p in ties):
    fix = (f'Pass a dict: {api}(..., dict(pairs)), e.g.'
           " {'block_1': 'block_0'}.")
  elif isinstance(ties, (set, frozenset)):
    fix = ("A set names targets without their sources: map each target to"
           " its source, e.g. {'block_1': 'block_0'}.")
  elif ties is None:
    fix = 'Pass a mapping; {} ties nothing.'
  else:
    fix = "Pass a mapping, e.g. {'block_1': 'block_0'}."
  return TieError(
      f'{api}(..., ties): ties must be a mapping from target path to source'
      f' path (or to (source path, view_fn)), got {kind} {ties!r}. {fix}')


class TieTypeError(TieError, TypeError):
  """A TieError for an argument of the wrong kind (``except TypeError`` too)."""


def not_tieable(api: str, name: str, value, expected: str,
                example: str) -> TieError:
  """``api``'s first argument, ``name``, is not what it ties."""
  cls = type(value)
  got = (f'an instance of {cls.__name__}: pass its class, {cls.__name__}'
         if cls.__module__ != 'builtins' and not callable(value) or hasattr(
             cls, 'init_with_output') or hasattr(cls, 'graphdef')  # Linen, NNX
         else f'{cls.__name__} {value!r}')
  return TieTypeError(
      f'{api}({name}, ties): {name} must be {expected}; got {got}. Pass'
      f' one, e.g. {example}.')


def bad_argument(api: str, name: str, value, expected: str) -> TieError:
  """An argument of ``api`` of a kind it does not take."""
  return TieError(f'{api}(..., {name}={value!r}): {name} must be {expected};'
                  f' got {type(value).__name__} {value!r}.')


def bad_source_spec(target, spec, declared_at: Path = (),
                    api: str = '') -> TieError:
  """A source no path, nor a pair; given to ``api``: a view not callable."""
  view = (f': its view_fn, {type(spec[1]).__name__} {spec[1]!r}, is not'
          ' callable. Pass a function of the source value, e.g.'
          ' {"head/kernel": ("embed/embedding", jnp.transpose)}, or the source'
          ' path alone for an unviewed tie' if api else '')
  where = (f'given to {api}(..., ties)' if api else
           f'(declared at {text(declared_at)})')
  return TieError(f'The source of tie {target!r} {where} must be a path, or a'
                  f' (path, view_fn) pair, got {spec!r}{view}.')


def path_not_a_str(what: str, declared_at: Path, path,
                   sep: str = '/') -> TieError:
  return TieError(
      f'The {what} path of a tie{_declared(sep, declared_at)} must be a'
      f' str{"" if sep == "/" else " or a tuple of keys"}, got'
      f' {type(path).__name__} {path!r}. '
      + ('Write paths as "/"-separated module names, e.g. "block_1/attn",'
         ' "head/kernel", "." or "/encoder/embed".' if sep == '/' else
         "Write NNX attribute paths from the tied module, e.g. 'head.kernel'"
         " or ('layers', 0, 'kernel')."))


def above_root(what: str, path: str, declared_at: Path,
               sep: str = '/') -> TieError:
  return TieError(f'The {what} path {path!r} of a tie'
                  f'{_declared(sep, declared_at)} goes above the root module.')


def spelled_twice(first_text: str, second_text: str, declared_at: Path,
                  target: Path, first, second, sep: str = '/') -> TieError:
  """One mapping names a target twice (two spellings), differently."""
  differ = (f'different sources ({text(first[0], sep)} and'
            f' {text(second[0], sep)})' if first[0] != second[0] else
            f'the source {text(second[0], sep)} with different views')
  return TieError(
      f'Ties {first_text!r} and {second_text!r}{_declared(sep, declared_at)}'
      f' both name {text(target, sep)}, with {differ}. A target has one'
      ' source: keep one of them.')


def self_tie(target_text: str, spec: str, declared_at: Path,
             target: Path, sep: str = '/') -> TieError:
  return TieError(
      f'Tie {target_text!r} -> {spec!r}{_declared(sep, declared_at)} ties'
      f' {text(target, sep)} to itself. A tie needs two distinct paths: remove'
      ' it, or name the module whose variables should be shared.')


def _declarations(ties) -> str:
  """The mappings ``ties`` come from, where they are more than one."""
  found = {t.declared_in: None for t in ties if t.declared_in}
  if len(found) < 2:
    return ''
  return (' The ties come from declarations in force together, checked as'
          ' their union: '
          + ' and '.join(repr(dict(d)) for d in found) + '.')


def cycle(ties, paths: Sequence[Path]) -> TieError:
  """The chain of ties from a target comes back to a path it passed."""
  places = sorted({t.declared_at for t in ties})
  return TieError(
      f'The ties{_declared(ties[0].sep, *places)} form a cycle: '
      + ' -> '.join(ties[0].text(p) for p in paths)
      + '. Every chain of ties must end at a stored path: pick one of them as'
      ' the source and tie the others to it.' + _declarations(ties))


def two_sources(target: Path, first, second) -> TieError:
  """A target given two sources: ``first``/``second`` are ``(source, tie)``."""
  def how(source, tie):
    if tie.target == target:
      return f'{tie.text(source)} (the {tie.describe()})'
    return (f'{tie.text(source)} (through the {tie.describe()}, of its'
            f' ancestor {tie.text(tie.target)})')
  return tie_error(
      f'{first[1].text(target)} is given two sources: {how(*first)} and'
      f' {how(*second)}. A target has one source, whatever the order in which'
      ' the ties are written or declared.'
      + _declarations([first[1], second[1]]),
      'Keep one of the two ties.',
      'Tie the sources to each other first, so that both chains end at one'
      ' stored path.')


def two_in_scans(first, second) -> TieError:
  """One tie declared twice, with two ways into an ``nn.scan``."""
  given = lambda t: f'in_scan={t.in_scan!r}' + (' (the default)' if t.in_scan is None else '')
  return tie_error(
      f'The {first.describe()} is declared twice, with {given(first)} and'
      f' {given(second)}. A tie enters an nn.scan around its target one way.'
      + _declarations([first, second]),
      'Pass the same in_scan to both declarations.',
      'Keep one of the two declarations.')


def bad_in_scan(in_scan, api: str, allowed) -> TieError:
  return TieError(
      f'{api}(..., in_scan={in_scan!r}): in_scan says how a tie source'
      ' outside an nn.scan enters it, None (the default) or one of '
      + ' or '.join(map(repr, allowed)) + ": 'broadcast' reads it as a loop"
      ' invariant, as variable_broadcast does; \'scanned\' broadcasts it to'
      ' the stack before the loop and scans over it, as variable_axes does;'
      " None takes 'scanned' where the scan scans the tied collection and the"
      " call cannot write it, else 'broadcast' (docs/scaling.md).")


def scan_not_recorded(tie, where: str) -> TieError:
  return tie_error(
      f'The {tie.describe()} asks in_scan=\'scanned\', and its target is'
      f' inside the scan at {where}, but that scan was made by a'
      ' flax.core.lift.scan that flax_tieext did not install: it cannot learn'
      ' the length to broadcast the source to. (Made before'
      ' `import flax_tieext`, e.g. nn.scan applied at import time of your'
      ' model\'s module?)',
      'Import flax_tieext before the module that builds the scan.',
      "Use in_scan='broadcast' or leave in_scan out (which reads the source"
      ' as a loop invariant where a scan is not recorded): the same values'
      ' and gradients.')


def ancestor(tie, inner: Path, outer: Path) -> TieError:
  return TieError(
      f'The {tie.describe()}: {tie.text(inner)} lies inside'
      f' {tie.text(outer)}. A module cannot share the variables of its own'
      ' ancestor or descendant; tie two sibling paths instead.')


# ---------------------------------------------------------------------------
# Resolution: what a target sees
# ---------------------------------------------------------------------------


def given_for_target(tie, col: str) -> TieError:
  """Values given at ``apply`` for a target would be ignored."""
  return tie_error(
      f'Values were given for {text(tie.target)} in collection {col!r},'
      f' but it is the target of the {tie.describe()}: only the source'
      f' {text(tie.source)} is stored, so they would be ignored.',
      'Convert variables saved from an untied model with'
      ' tie_variables(variables, ties), which checks that each target'
      ' equals its source and removes it.')


def unreachable(tie, col: str, where: str) -> TieError:
  return tie_error(f'Cannot reach the source of the {tie.describe(col)} from'
                   f' {where}.',
                   'Declare the tie at a module that contains both paths.')


def kinds_differ(tie, col: str, target_is_module: bool) -> TieError:
  """A module tied to a variable, or a variable to a module."""
  kinds = ('a module', 'a variable')[::1 if target_is_module else -1]
  target, source = ((tie.target + tie.source[-1:], tie.source)
                    if target_is_module else
                    (tie.target, tie.source + tie.target[-1:]))
  rel = lambda path: '/'.join(path[len(tie.declared_at):])
  return tie_error(
      f'In the {tie.describe(col)}, the target is {kinds[0]} but the source'
      f' is {kinds[1]}.',
      'Tie a module to a module, or a variable to a variable (e.g.'
      f' "{rel(target)}": "{rel(source)}").')


def source_not_stored(tie, col: str, where: str, hint: str) -> TieError:
  return tie_error(
      f'The source {text(tie.source)} of the {tie.describe(col)} is not'
      f' stored (looked up from {where}).' + hint,
      FIX_PATH.format('source'),
      "Pass the source's variables to apply (init them with a method that"
      ' runs the source).')


def declared_inside(tie, col: str, where: str, transform: str) -> TieError:
  """A tie declared inside a lifted transform, whose source lies outside it."""
  return tie_error(
      f'The {tie.describe(col)} is used inside nn.{transform} at {where}, and'
      f' its source {text(tie.source)} lies outside that {transform}, but the'
      f' tie is declared inside the {transform}: the {transform} did not make'
      ' its outer scopes reachable from inside, so the source cannot be read'
      ' there.',
      'Declare the tie at a module that contains both paths (their common'
      f' ancestor), outside the {transform}.')


def cannot_land(tie, col: str, where: str, transforms: Sequence[str],
                write: bool, near: str, declared_inside: bool) -> TieError:
  """A write, or an initialization, of a source that is a closed-over value."""
  first = transforms[0]
  return tie_error(
      f'{"A write to" if write else "Initializing"} {text(tie.target)} in'
      f' collection {col!r} cannot land in its source {text(tie.source)}: the'
      f' {tie.describe(col)} is used inside'
      f' {" and ".join(f"nn.{name}" for name in transforms)} at {where}, and'
      ' the source lies outside it, where it is a read-only (broadcast)'
      ' value.' + (near or ''),
      f'Write to the source outside the {first}.' if write else
      f'Run the source {text(tie.source)} before the {first}, so that it'
      ' exists when the target reads it.',
      'Fix the source path.' if near else '',
      'Declare the tie at the common ancestor of both paths, outside the'
      f' {first}.' if declared_inside else '')


def read_only(tie, col: str, where: str) -> TieError:
  return tie_error(
      f'Cannot write to {text(tie.target)} in collection {col!r} at {where}:'
      f' the {tie.describe(col)} gives a derived, read-only view of the'
      ' source.',
      f'Write to the source {text(tie.source)} instead.',
      'Tie without a view_fn.')


def collection_missing(tie, col: str, where: str, given) -> TieError:
  """A tied collection is used, but neither given nor mutable."""
  return tie_error(
      f'The {tie.describe()} ties collection {col!r}, which {where} uses, but'
      f' the variables have no collection {col!r} and it is not mutable'
      f' (collections given: {_listed(given)}).' + did_you_mean(col, given),
      f'Pass it to apply: variables={{..., {col!r}: ...}}.',
      f'Make it mutable: apply(..., mutable=[{col!r}]).')


def collection_unknown(tie, col: str, names, hint: str,
                       at_init: bool = False) -> TieError:
  """A tied collection not in ``names``: those given (apply) or made (init)."""
  found = (f'init created no collection {col!r} (it created' if at_init else
           f'the variables have no collection {col!r} and no module under the'
           ' tie uses it (collections given:')
  return tie_error(
      f'The {tie.describe()} ties collection {col!r}, but {found}'
      f' {_listed(names)}).' + (hint or did_you_mean(col, names)),
      'Fix the collection name in collections=.')


def unlike(tie, col: str, existing: list, value: list) -> TieError:
  same = len(existing) == len(value)  # (shape, dtype) of each array held
  shapes = lambda specs: ', '.join(f'{s}:{d}' for s, d in specs)
  return tie_error(
      f'{"Shape or dtype" if same else "Array count"} mismatch in the'
      f' {tie.describe(col)}: the source {tie.text(tie.source)} has'
      f' {shapes(existing)}, but {tie.text(tie.target)} has {shapes(value)}.'
      ' Tied paths must hold variables of the same shape and dtype.',
      'Tie paths that hold variables of the same shape and dtype.',
      'Use a view_fn (e.g. jnp.transpose) for a derived shape.' if same else '')


def stack_tied_to_layer(tie, col: str, source: Path, shape, axis: int,
                        length) -> TieError:
  """A stack tied whole to what is not a stack of its length."""
  return tie_error(
      f'The {tie.describe(col)} ties the stack {text(tie.target)} whole, to'
      ' what is no stack of as many layers: the scan slices each of its'
      f' variables along axis {axis} into its {length} layers, and the source'
      f' {text(source)} has shape {shape}.',
      "Tie what is inside the stack: a source outside it is read by every"
      f" layer (e.g. {{'{text(tie.target + source[len(tie.source):][:1])}'"
      f": '{text(source[:len(tie.source) + 1])}'}}).",
      f'Tie the stack to a stack of {length} layers.')


def view_loses_axis(tie, name: str, path) -> TieError:
  return tie_error(
      f'The view of the {tie.describe()} moves the partitioned axis {name!r}'
      f' of {text(path)} in a way whose axis names cannot be followed.',
      'Use a view that permutes axes (e.g. jnp.transpose).',
      'Unbox the variables first (flax.linen.unbox).')


def unsupported_transform(tie, name: str, where: str) -> TieError:
  return tie_error(
      f'The target of the {tie.describe()} is inside the lifted transform'
      f' {name!r} at {where}, and its source lies outside it, but {name!r}'
      ' does not declare what it does with a tie source outside it.',
      'Declare the tie inside the transform, with both paths inside it.')


# ---------------------------------------------------------------------------
# The end of init: each tie checked on what init stored
# ---------------------------------------------------------------------------


def held_in(path: Path, holders) -> str:
  """Names a collection that holds ``path``, if any."""
  return holders and (
      f' {text(path)} is stored in collection {holders[0]!r}: tie that'
      f' collection (collections={holders[0]!r}).') or ''


def source_missing_at_init(tie, col: str, hint: str) -> TieError:
  return tie_error(
      f'The source {text(tie.source)} of the {tie.describe(col)} does not'
      ' exist: init ran the target, but nothing was stored at the source path'
      ' (a misspelt path, or a source that this init does not call).' + hint,
      FIX_PATH.format('source'),
      'Initialize with a method that also runs the source.')


def written_before_source(tie, col: str, path: Path) -> TieError:
  return tie_error(
      f'{text(tie.target + path)} is written while initializing, before its'
      f' source {text(tie.source + path)} exists (the {tie.describe(col)}).'
      ' The tie makes them one variable, but a use that runs before its'
      ' source holds a copy that init drops, so the write could not land;'
      ' one module called at both places would keep it.',
      f'Run the source {text(tie.source)} before the target while'
      ' initializing.',
      'Write only after init (`if not self.is_initializing(): ...`), as'
      " Flax's own modules do.")


def ties_nothing(tie, cols: str, hint: str) -> TieError:
  return tie_error(
      f'The {tie.describe()} ties nothing: neither {text(tie.target)} nor'
      f' {text(tie.source)} holds any variable in {cols or "those"}'
      ' collections while initializing.' + hint,
      'Tie the collections the two modules hold (collections=...).',
      'Tie the modules that hold the collection.')


def target_missing(tie, hint: str) -> TieError:
  return tie_error(
      f'The target {text(tie.target)} of the {tie.describe()} does not exist:'
      ' no module or variable was created there while initializing in the'
      ' tied collections.' + hint,
      FIX_PATH.format('target'),
      'Initialize with a method that runs the target.')


def target_misspelled(tie, used: Path, near: Path) -> TieError:
  """At apply, a parameter is missing beside a tie's target: a misspelling."""
  return tie_error(
      f'{text(used)} is used and not stored, and no tie gives it: the'
      f' {tie.describe()} targets {text(tie.target)}, which is near it. Did'
      f' you mean the target {text(near)}?',
      FIX_PATH.format('target'))


def no_counterpart(tie, col: str, path: Path, hint: str) -> TieError:
  return tie_error(
      f'The target {text(tie.target + path)} of the {tie.describe(col)} has no'
      f' counterpart in the source: {text(tie.source + path)} is not stored.'
      + hint,
      'Fix the source path: a target may only use variables its source has.',
      'Tie modules of the same structure.')


# ---------------------------------------------------------------------------
# Conversions between the untied and the tied layout
# ---------------------------------------------------------------------------


def stack_count_differs(verb: str, tie, col: str, stack: Path, layers: int,
                        leaf: Path, shape, axis: int = 0) -> TieError:
  """``stacks`` names a count that the stack's other variables do not have."""
  n = shape[axis] if len(shape) > axis else None
  found = 'no leading axis' if n is None else f'a leading axis of {n}'
  return tie_error(
      f'Cannot {verb} {tie.text(tie.target)}{_in(col)}: stacks gives'
      f' {tie.text(stack)} {layers} layers, but {tie.text(leaf)}, stored'
      f' beside the target in that stack, has {found} (axis {axis} of shape'
      f' {tuple(shape)}).'
      ' A target inside a stack has one copy of its source per layer, as'
      ' many as its siblings, after the axes of the stacks named around it.',
      f'Name only stacks in stacks= ({tie.text(stack)} is not one).' if n is
      None else 'Give the stack its number of layers:'
      f' stacks={{{tie.sep.join(stack)!r}: {n}}}.',
      'If it lies in a stack, name that one too (its layers come first).'
      if layers in shape[axis + 1:] else '')


def convert_source_missing(verb: str, tie, col: str | None,
                           near: str) -> TieError:
  held = 'variables' if tie.collections is not None else 'state'
  return TieError(
      f'Cannot {verb} the {tie.describe(col)}: its source'
      f' {tie.text(tie.source)} is missing from the {held}.{near} Fix the'
      ' source path in the ties.')


def convert_target_present(tie, col: str | None) -> TieError:
  held = ('variables, which are' if tie.collections is not None else
          'state, which is')
  return TieError(
      f'Cannot untie the {tie.describe(col)}: its target'
      f' {tie.text(tie.target)} is already in the {held} untied already, and'
      ' holds other values than its source gives it; writing the source over'
      ' it would drop them. Pass the tied model\'s variables, or keep these'
      ' as they are.')


def no_stack(api: str, path: str, layers, known) -> TieError:
  """A path of ``stacks`` that is no module: its stack would go unnamed."""
  return tie_error(
      f'{api}(..., stacks={{{path!r}: {layers!r}}}): {path!r} names no stack'
      f' (nothing is stored at /{path}, no tied target lies in it): the one it'
      f' means is left unnamed.{did_you_mean(path, known)}',
      'Give the path of each nn.scan / nn.vmap module from the root module,'
      " e.g. stacks={'encoder/layers': 12}.")


def unnamed_stack(tie, col: str, stack: Path, n: int) -> TieError:
  """A target below stacked variables would be written unstacked."""
  return tie_error(
      f'Cannot untie {tie.text(tie.target)}{_in(col)}: it lies inside'
      f' {tie.text(stack)}, whose every variable has a leading axis of {n}'
      f' that its source {tie.text(tie.source)} lacks, as in a stack of {n}'
      f' layers ({"nn.scan / nn.vmap" if tie.sep == "/" else "nnx.vmap"}).'
      ' Written unstacked, it would not load into the untied model.',
      f'Name the stack: stacks={{{tie.sep.join(stack)!r}: {n}}} (one copy of'
      ' the source per layer).',
      'If it is not a stack, say so: stacks={}.')


def not_equal(tie, col: str, how: str) -> TieError:
  """A stored target is not what its source gives it."""
  return TieError(f'Cannot tie {text(tie.target)} to {text(tie.source)} in'
                  f' collection {col!r}: {how}')


def bad_merge(merge, merges: Sequence[str]) -> TieError:
  return TieError(
      f'tie_variables(..., merge={merge!r}): merge must be None (refuse copies'
      ' that differ), '
      f'{", ".join(map(repr, merges))} or a function (source, copies) ->'
      f' source; got {merge!r}.'
      + (did_you_mean(merge, merges) if isinstance(merge, str) else ''))


def copies_differ(tie, col: str, leaf: Path, source: Path, gap: float,
                  layer: tuple[int, ...], stack, viewed) -> TieError:
  """A stored copy differs from its source, and no ``merge`` was chosen.

  ``layer`` is the one that differs in each stack of ``stack``. ``viewed`` is
  a viewed tie among the copies of that source leaf (then only
  ``merge='first'`` applies), or None.
  """
  where = ','.join(f' in layer {i} (axis {stack[2] + n}) of the stack'
                   f' {text(path)}' for n, (i, path) in enumerate(
                       zip(layer, stack[0])))
  why_not = '' if viewed is None else (
      f" merge='mean' or a function cannot merge them: {text(viewed.target)}"
      ' is a copy through the view of its tie, which tie_variables does not'
      " invert, so it cannot be brought into the source's layout exactly.")
  return tie_error(
      f'Cannot tie {text(tie.target)} to {text(tie.source)} in collection'
      f' {col!r}: {text(leaf)} differs from its source {text(source)}{where}'
      f' (max abs difference {gap}). Tying would silently drop the target\'s'
      ' values.' + why_not,
      "Keep the source's values: tie_variables(..., merge='first').",
      '' if viewed else 'Store the mean of the source and every copy:'
      " tie_variables(..., merge='mean').",
      '' if viewed else 'Merge them your way: tie_variables(...,'
      ' merge=fn), where fn(source, copies) returns the new source (copies:'
      ' one array per copy, each layer of a stack one copy).',
      'Keep the model untied, or make the copies equal first.')


def merge_through_view(viewed, col: str, leaf: Path, source: Path,
                       merge: str) -> TieError:
  """``merge`` needs every copy in the source's layout; a view's is not."""
  return tie_error(
      f'Cannot merge the copies of {text(source)} in collection {col!r} with'
      f' merge={merge}: they differ ({text(leaf)} first), and the'
      f' {viewed.describe()} holds one of them through its view, which'
      " tie_variables does not invert, so it cannot bring that copy into the"
      " source's layout exactly.",
      "Keep the source's values: merge='first'.",
      'Merge them yourself: store the merged value at the source and its'
      ' view at each viewed target, then tie (the copies are then equal).')


def merge_result_unlike(col: str, source: Path, merge: str, got,
                        wanted: str) -> TieError:
  return TieError(
      f'merge={merge} returned {got} for {text(source)} in collection'
      f' {col!r}, but the source is {wanted}: a merged source must keep the'
      " source's shape and dtype.")
