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

"""The invariants of ties, checked where a tie cannot hold.

A tie promises that its target *is* its source. :func:`check_init` checks that
promise on the variables ``init`` produced, once, when the module that
declares the tie returns, under every transform: the tied collections exist,
every source exists and is of the kind its target is (module or variable), a
target's copy holds no variable its source lacks, and shapes and dtypes agree.
It then drops the copies (see ``flax.core.ties``). :func:`check_apply` refuses
at ``apply`` what would be silently ignored: values given for a target, and a
tied collection that is neither given nor mutable. Each violation is a
``TieError`` naming target, source, collection and declaring module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax

from flax.core import meta
from flax_tieext.core.tie_spec import (
    Tie,
    apply_view,
    check_like,
    did_you_mean,
    flatten,
    named_collections,
    nearest,
    text,
    tie_error,
    walk,
)
from flax_tieext.core.ties import (
    locate,
    refuse_stale,
    stored,
    visible_collections,
)


def check_apply(scope, ties: tuple[Tie, ...]):
  """At apply, given values for a target or a missing collection are errors."""
  if scope.get_flag('initializing', False):
    return
  given = scope.root._variables  # pylint: disable=protected-access
  for tie in ties:
    for col in [c for c in given if tie.applies_to(c)]:
      node = walk(given[col], tie.target[len(scope.root.path):])
      if node is not None and node != {}:
        raise tie_error(
            f'Values were given for {text(tie.target)} in collection {col!r},'
            f' but it is the target of the {tie.describe()}: only the source'
            f' {text(tie.source)} is stored, so they would be ignored.',
            'Convert variables saved from an untied model with'
            ' tie_variables(variables, ties), which checks that'
            ' each target equals its source and removes it.')
    if scope.root._tie_lift is not None:  # pylint: disable=protected-access
      continue  # inside a transform, only the lifted collections are here
    for col in named_collections(tie.collections):
      if col not in given and not scope.is_mutable_collection(col):
        raise tie_error(
            f'The {tie.describe()} ties collection {col!r}, but the variables'
            f' have no collection {col!r} and it is not mutable (collections'
            f' given: {", ".join(map(repr, given)) or "none"}).'
            + did_you_mean(col, given),
            f'Pass it to apply: variables={{..., {col!r}: ...}}.',
            f'Make it mutable: apply(..., mutable=[{col!r}]).')


def check_init(scope, ties: tuple[Tie, ...]):
  """Checks each tie on the variables ``init`` produced; drops target copies.

  Raises a TieError naming target, source, collection and declaring module
  when a tied collection or the source does not exist, the source is of
  another kind than the target (module or variable), or the target's copy
  holds a variable its source lacks or one of another shape or dtype.
  """
  if not scope.get_flag('initializing', False):
    return
  present = visible_collections(scope)
  for tie in ties:
    names = named_collections(tie.collections)
    for col in names:
      if col not in present and (len(names) == 1 or did_you_mean(col, present)):
        raise tie_error(
            f'The {tie.describe()} ties collection {col!r}, but init created'
            f' no collection {col!r} (it created'
            f' {", ".join(map(repr, sorted(present))) or "none"}).'
            + did_you_mean(col, present),
            'Fix the collection name in collections=.')
    found = False
    for col in sorted(c for c in present if tie.applies_to(c)):
      copy = stored(scope, tie.target, col)
      found = found or copy is not None or col in tie.used
      if copy is None:
        continue
      base, rest, crossed = locate(scope, tie.source, col)
      refuse_stale(scope, tie, col, crossed)
      source = walk(stored(base, base.path, col), rest) if base else None
      if source is None:
        raise tie_error(
            f'The source {text(tie.source)} of the {tie.describe(col)} does'
            f' not exist: nothing was stored there while initializing.'
            + nearest(stored(scope, (), col) or {}, tie.source),
            'Fix the source path (paths are relative to the module that'
            ' declares the tie; a leading "/" starts at the root module).')
      _check_copy(tie, col, copy, source)
      for end in range(len(tie.target), len(scope.root.path), -1):
        if end < len(tie.target) and stored(scope, tie.target[:end], col):
          break  # the copy is dropped, then its parents if left empty
        del stored(scope, tie.target[:end - 1], col)[tie.target[end - 1]]
    if found:
      continue
    if any(stored(scope, tie.target, c) is not None for c in present):
      cols = ', '.join(repr(c) for c in sorted(present) if tie.applies_to(c))
      raise tie_error(
          f'The {tie.describe()} ties nothing: neither {text(tie.target)} nor'
          f' {text(tie.source)} holds any variable in {cols or "those"}'
          ' collections while initializing.',
          'Tie the collections the two modules hold (collections=...).',
          'Tie the modules that hold the collection.')
    else:
      raise tie_error(
          f'The target {text(tie.target)} of the {tie.describe()} does not'
          ' exist: no module or variable was created there while'
          ' initializing.'
          + nearest({c: stored(scope, (), c) for c in present}
                     .get('params') or {}, tie.target),
          'Fix the target path (paths are relative to the module that'
          ' declares the tie; a leading "/" starts at the root module).')


def _check_copy(tie: Tie, col: str, copy, source):
  """Raises unless ``copy`` could be read from ``source`` (through the view)."""
  if isinstance(copy, Mapping) != isinstance(source, Mapping):
    kind = lambda x: 'a module' if isinstance(x, Mapping) else 'a variable'
    raise tie_error(
        f'In the {tie.describe(col)}, the target is {kind(copy)} but the'
        f' source is {kind(source)}.',
        'Tie a module to a module, or a variable to a variable (e.g.'
        f' "{text(tie.target[1:])}/kernel": "{text(tie.source[1:])}/kernel").')
  viewed = source if tie.view is None else jax.eval_shape(
      lambda s: apply_view(tie, s), meta.unbox(source))
  flat_source = dict(flatten(viewed))
  for path, leaf in flatten(copy):
    if path not in flat_source:
      raise tie_error(
          f'The target {text(tie.target + path)} of the {tie.describe(col)}'
          f' has no counterpart in the source: {text(tie.source + path)} is'
          ' not stored.' + nearest(source if isinstance(source, Mapping)
                                    else {}, path, tie.source),
          'Fix the source path: a target may only use variables its source'
          ' has.',
          'Tie modules of the same structure.')
    check_like(dataclasses.replace(tie, target=tie.target + path,
                                   source=tie.source + path),
               col, flat_source[path], leaf)
