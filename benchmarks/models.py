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

"""The models the benchmarks measure.

The encoders are the ones the demo trains (:mod:`flax_tieext.examples`), so no
model is written twice. What is here is benchmark-only: two ways to nest ties
(``nn.tie`` and the hand-made ``nn.map_variables`` tie), and switching the
flax_tieext patch off to measure upstream Flax.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import flax.linen as nn
import jax

import flax_tieext
from flax_tieext.examples import albert
from flax_tieext.examples import t5
from flax_tieext.examples.attention import SelfAttention

__all__ = ['albert', 't5', 'upstream_flax', 'patched_flax', 'nested_ties']

TieKind = Literal['tie', 'map_variables']
Shape = Literal['pair', 'chain']


@contextlib.contextmanager
def upstream_flax() -> Iterator[None]:
  """Flax exactly as released: the flax_tieext patch uninstalled."""
  was_installed = flax_tieext.is_installed()
  flax_tieext.uninstall()
  try:
    yield
  finally:
    if was_installed:
      flax_tieext.install()


@contextlib.contextmanager
def patched_flax() -> Iterator[None]:
  """Flax with ``nn.tie`` and ``static_argnames`` installed."""
  was_installed = flax_tieext.is_installed()
  flax_tieext.install()
  try:
    yield
  finally:
    if not was_installed:
      flax_tieext.uninstall()


# ---------------------------------------------------------------------------
# Nested ties
# ---------------------------------------------------------------------------


class Leaf(nn.Module):
  """The module whose ``__call__`` runs are counted: one attention."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    return SelfAttention(num_heads=2, name='attn')(x)


def _map_variables_tie(module_cls, copy, drop):
  """The hand-made tie: copy the source into the target, store only the source.

  ``nn.map_variables(..., init=True, mutable=True)``: on the way in the
  source's params are copied to the target's path; on the way out the target
  is dropped.
  """

  def map_in(variables):
    return {**variables, 'params': copy(dict(variables.get('params', {})))}

  def map_out(variables):
    return {**variables, 'params': drop(dict(variables.get('params', {})))}

  return nn.map_variables(module_cls, 'params', trans_in_fn=map_in,
                          trans_out_fn=map_out, init=True, mutable=True)


def _pair(depth: int, kind: TieKind):
  """Level ``k`` calls two level ``k - 1`` modules, ``b`` tied to ``a``."""

  class Pair(nn.Module):

    @nn.compact
    def __call__(self, x):
      if depth == 0:
        return Leaf(name='leaf')(x)
      inner = _pair(depth - 1, kind)
      return inner(name='b')(inner(name='a')(x))

  if depth == 0:
    return Pair
  if kind == 'tie':
    return nn.tie(Pair, {'b': 'a'})

  def copy(params):
    if 'a' in params:
      params['b'] = params['a']
    return params

  def drop(params):
    params.pop('b', None)
    return params

  return _map_variables_tie(Pair, copy, drop)


def _chain(depth: int, kind: TieKind):
  """Level ``k`` calls ``src``, then level ``k - 1`` as ``inner``.

  Every level's ``inner/src`` is tied to the root's ``src``: with ``nn.tie``
  each level declares ``{'inner/src': '/src'}``.
  """

  class Chain(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = Leaf(name='src')(x)
      if depth == 0:
        return x
      return _chain(depth - 1, kind)(name='inner')(x)

  if depth == 0:
    return Chain
  if kind == 'tie':
    return nn.tie(Chain, {'inner/src': '/src'})

  def copy(params):
    if 'src' in params:
      params['inner'] = {**params.get('inner', {}), 'src': params['src']}
    return params

  def drop(params):
    if 'inner' in params:
      params['inner'] = {k: v for k, v in params['inner'].items() if k != 'src'}
    return params

  return _map_variables_tie(Chain, copy, drop)


def nested_ties(shape: Shape, depth: int, kind: TieKind) -> nn.Module:
  """A model whose ties are nested ``depth`` levels deep.

  Args:
    shape: ``'pair'``: every level calls two copies of the level below, the
      second tied to the first (``2**depth`` call sites of :class:`Leaf`, one
      stored); ``'chain'``: every level calls a :class:`Leaf` and the level
      below (``depth + 1`` call sites, one stored).
    depth: how many levels of ties (>= 1).
    kind: ``'tie'`` (``nn.tie``) or ``'map_variables'`` (the hand-made tie).

  Returns:
    The model.
  """
  build = {'pair': _pair, 'chain': _chain}[shape]
  return build(depth, kind)()


def call_sites(shape: Shape, depth: int) -> int:
  """How many times the model calls :class:`Leaf`: the fewest possible traces."""
  return 2 ** depth if shape == 'pair' else depth + 1
