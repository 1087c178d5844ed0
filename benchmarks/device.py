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

"""Accelerator benchmarks: train-step time and memory of tied models.

Usage::

  python benchmarks/device.py [--tiny] [--only GROUP ...] [--rounds 10]
                              [--out benchmarks/device_results.json]

(``nox -s bench -- --device [ARGS]`` runs it and then ``render.py``.) Runs on
whatever device JAX picks first (a TPU, a GPU, else the CPU); the code is
device-agnostic. Every comparison is a candidate against a baseline in the
same process: one jitted Adam train step (loss, gradient, update, state
donated) of a transformer encoder with bf16 activations and fp32 parameters:

* ``albert``: 12 rematted blocks sharing one attention, ``nn.tie`` against
  the hand-shared module (one ``Attention`` passed into every block).
* ``equinox``: the same model in Equinox, ``eqx.nn.Shared``, against
  ``nn.tie`` (skipped, saying why, where Equinox cannot be imported).
* ``nnx``: NNX tree mode (``flax_tieext.nnx.tie``) against graph mode (one
  attention module shared by reference); the two optimized HLO programs are
  compared op by op (:func:`hlo_summary`).
* ``scan``: ``nn.scan(nn.remat(Layer))``: one attention tied into the stack,
  Flax's ``variable_broadcast`` idiom, and the tied weights broadcast to a
  stack of 12 before the scan and scanned like untied weights, against the
  untied stack.
* ``prevent_cse``: ``nn.remat(..., prevent_cse=False)`` inside the scan
  against the default ``True``, tied and untied.

Measured per variant: XLA's ``cost_analysis()`` FLOPs and
``memory_analysis()`` temp / argument / output bytes of the compiled step;
the device's peak memory after two steps (``memory_stats()``:
``peak_bytes_reserved`` where the device reports it, as TPUs do, whose
temporaries it counts, else ``peak_bytes_in_use``); and the step time,
median of ``--rounds`` interleaved rounds (baseline, candidate, baseline,
...) after ``--warmup`` rounds. The peak counter cannot be reset, so the
variants run their steps one at a time, in increasing order of their
compiled footprint (arguments + temp + outputs - aliased), each one's state
freed before the next: a variant whose steps did not raise the peak is
marked (its peak is at most the value shown).

``--tiny`` sizes everything down for a CPU smoke run (``tests/`` runs it).
``--flax-layers`` builds the Linen models from Flax's own layers
(``nn.DenseGeneral``, ``nn.Dense``, ``nn.LayerNorm``) instead of the einsums
every framework's model shares here. ``--only`` picks groups; each process
reads the peak counter of its own groups, so run groups that should not
share it as separate processes writing to one ``--out`` (results of the same
device, sizes and layers are merged).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import gc
import json
import os
import pathlib
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

# pylint: disable=g-import-not-at-top,wrong-import-position
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import flax_tieext
from flax_tieext.examples import measure

RESULTS = ROOT / 'benchmarks' / 'device_results.json'
DTYPE = jnp.bfloat16  # activations; parameters are float32
# --flax-layers: the Linen models' layers are Flax's own (nn.DenseGeneral,
# nn.Dense with biases, nn.LayerNorm, all dtype=bf16) instead of the shared
# einsums; the variable_broadcast attention keeps the einsums.
FLAX_LAYERS = {'on': False}


@dataclasses.dataclass(frozen=True)
class Size:
  """Sizes of the encoder and its batch."""

  vocab: int = 32768
  d_model: int = 1024
  heads: int = 16
  d_ff: int = 4096
  layers: int = 12
  length: int = 1024
  batch: int = 16


FULL = Size()
TINY = Size(vocab=64, d_model=32, heads=4, d_ff=64, layers=3, length=16, batch=2)


# ---------------------------------------------------------------------------
# The computation, written once: every framework's model calls these.
# ---------------------------------------------------------------------------


def _layer_norm(x, scale, bias):
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  return ((x32 - mean) * jax.lax.rsqrt(var + 1e-6) * scale + bias).astype(DTYPE)


def _attention(x, wqkv, wout):
  """Self-attention; ``wqkv``: (d, 3, heads, head_dim), ``wout``: (heads, head_dim, d)."""
  qkv = jnp.einsum('bld,dthk->btlhk', x, wqkv.astype(DTYPE))
  q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
  logits = jnp.einsum('bqhk,bshk->bhqs', q, k) / jnp.sqrt(q.shape[-1]).astype(DTYPE)
  weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(DTYPE)
  y = jnp.einsum('bhqs,bshk->bqhk', weights, v)
  return jnp.einsum('bqhk,hkd->bqd', y, wout.astype(DTYPE))


def _mlp(x, wi, wo):
  return jax.nn.gelu(x @ wi.astype(DTYPE)) @ wo.astype(DTYPE)


def _block(x, attn, ln1, ln2, wi, wo):
  """A pre-norm block; ``attn`` is ``(wqkv, wout)``, ``ln*`` ``(scale, bias)``."""
  x = x + _attention(_layer_norm(x, *ln1), *attn)
  return x + _mlp(_layer_norm(x, *ln2), wi, wo)


def _shapes(size: Size) -> dict[str, tuple[int, ...]]:
  head_dim = size.d_model // size.heads
  return {'wqkv': (size.d_model, 3, size.heads, head_dim),
          'wout': (size.heads, head_dim, size.d_model),
          'wi': (size.d_model, size.d_ff), 'wo': (size.d_ff, size.d_model)}


def _normal(key, shape):
  fan_in = shape[0] if len(shape) != 3 else shape[0] * shape[1]
  return jax.random.normal(key, shape, jnp.float32) * fan_in ** -0.5


def _loss(logits, targets):
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), targets).mean()


def _optimizer():
  return optax.adam(1e-4)


# ---------------------------------------------------------------------------
# Linen
# ---------------------------------------------------------------------------


class Attention(nn.Module):
  """The attention's two kernels, in ``collection`` (``'params'`` or another)."""

  size: Size
  collection: str = 'params'

  def _weight(self, name):
    shape = _shapes(self.size)[name]
    if self.collection == 'params':
      return self.param(name, _normal, shape)
    # Not the 'params' rng, which the scan splits per layer: a broadcast
    # variable must not depend on the layer.
    return self.variable(self.collection, name,
                         lambda: _normal(self.make_rng(self.collection), shape)).value

  @nn.compact
  def __call__(self, x):
    if FLAX_LAYERS['on'] and self.collection == 'params':
      shapes = _shapes(self.size)
      qkv = nn.DenseGeneral(shapes['wqkv'][1:], use_bias=False, dtype=DTYPE,
                            name='qkv')(x)
      q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
      logits = jnp.einsum('bqhk,bshk->bhqs', q, k) / jnp.sqrt(q.shape[-1]).astype(DTYPE)
      weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(DTYPE)
      y = jnp.einsum('bhqs,bshk->bqhk', weights, v)
      return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=False, dtype=DTYPE,
                             name='out')(y)
    return _attention(x, self._weight('wqkv'), self._weight('wout'))


class LayerNorm(nn.Module):

  @nn.compact
  def __call__(self, x):
    if FLAX_LAYERS['on']:
      return nn.LayerNorm(dtype=DTYPE, name='ln')(x)
    d = x.shape[-1]
    return _layer_norm(x, self.param('scale', nn.initializers.ones, (d,)),
                       self.param('bias', nn.initializers.zeros, (d,)))


class Block(nn.Module):
  """A block; its attention is ``attention`` if given, else its own ``attn``."""

  size: Size
  attention: nn.Module | None = None
  attn_collection: str = 'params'

  @nn.compact
  def __call__(self, x):
    attention = self.attention
    if attention is None:
      attention = Attention(self.size, self.attn_collection, name='attn')
    x = x + attention(LayerNorm(name='ln1')(x))
    if FLAX_LAYERS['on']:
      y = nn.Dense(self.size.d_ff, dtype=DTYPE, name='wi')(LayerNorm(name='ln2')(x))
      return x + nn.Dense(self.size.d_model, dtype=DTYPE, name='wo')(jax.nn.gelu(y))
    shapes = _shapes(self.size)
    wi = self.param('wi', _normal, shapes['wi'])
    wo = self.param('wo', _normal, shapes['wo'])
    return x + _mlp(LayerNorm(name='ln2')(x), wi, wo)


class ScanLayer(Block):
  """:class:`Block` as a scan body: ``(carry, x) -> (carry, None)``."""

  def __call__(self, x, _):  # pylint: disable=arguments-differ
    return super().__call__(x), None


def _embed(module, tokens, size):
  table = module.param('embed', _normal, (size.vocab, size.d_model))
  return table[tokens].astype(DTYPE)


def _logits(module, x, size):
  x = LayerNorm(name='final_ln')(x)
  return x @ module.param('head', _normal, (size.d_model, size.vocab)).astype(DTYPE)


class Unrolled(nn.Module):
  """``size.layers`` rematted blocks; ``share_module``: one attention passed in."""

  size: Size
  share_module: bool = False

  @nn.compact
  def __call__(self, tokens):
    shared = Attention(self.size, name='attn') if self.share_module else None
    x = _embed(self, tokens, self.size)
    for i in range(self.size.layers):
      x = nn.remat(Block)(self.size, attention=shared, name=f'block_{i}')(x)
    return _logits(self, x, self.size)


class Scanned(nn.Module):
  """``nn.scan(nn.remat(ScanLayer))`` over ``size.layers`` layers.

  ``mode``: ``'untied'`` (every layer its own attention, stacked),
  ``'tie'`` (an ``attn`` at the encoder, the source of ``layers/attn`` under
  ``nn.tie``), ``'variable_broadcast'`` (the layers' attention in the
  collection ``'shared'``, which the scan broadcasts: one copy, closed over).
  """

  size: Size
  mode: str = 'untied'
  prevent_cse: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = _embed(self, tokens, self.size)
    if self.mode == 'tie' and self.is_initializing():
      Attention(self.size, name='attn')(x[:, :1])  # creates the tie's source
    broadcast = self.mode == 'variable_broadcast'
    layer = nn.remat(ScanLayer, prevent_cse=self.prevent_cse)
    stack = nn.scan(layer,
                    variable_axes={'params': 0},
                    variable_broadcast='shared' if broadcast else False,
                    split_rngs={'params': True, 'shared': False},
                    length=self.size.layers)
    x, _ = stack(self.size, attn_collection='shared' if broadcast else 'params',
                 name='layers')(x, None)
    return _logits(self, x, self.size)


SCAN_TIES = {'layers/attn': 'attn'}
VMAP_TIES = {'branches/attn': 'attn'}
BRANCHES = 4  # the vmapped stack's width


class Vmapped(nn.Module):
  """``BRANCHES`` rematted blocks side by side (``nn.vmap``), averaged.

  ``mode``: ``'untied'`` (every branch its own attention, stacked) or
  ``'tie'`` (an ``attn`` at the model, the source of ``branches/attn``).
  """

  size: Size
  mode: str = 'untied'

  @nn.compact
  def __call__(self, tokens):
    x = _embed(self, tokens, self.size)
    if self.mode == 'tie' and self.is_initializing():
      Attention(self.size, name='attn')(x[:, :1])  # creates the tie's source
    branches = nn.vmap(nn.remat(Block), variable_axes={'params': 0},
                       split_rngs={'params': True}, in_axes=None, out_axes=0,
                       axis_size=BRANCHES)
    x = branches(self.size, name='branches')(x).mean(axis=0)
    return _logits(self, x, self.size)


def broadcast_before_vmap(size: Size):
  """The tied layout, broadcast to the ``BRANCHES`` before the vmap."""
  untied = Vmapped(size, 'untied')
  tied = nn.tie(Vmapped, VMAP_TIES)(size, 'tie')

  def apply_fn(variables, tokens):
    params = dict(variables['params'])
    attn = params.pop('attn')
    params['branches'] = {**params['branches'], 'attn': jax.tree_util.tree_map(
        lambda w: jnp.broadcast_to(w, (BRANCHES, *w.shape)), attn)}
    return untied.apply({'params': params}, tokens)

  return _linen(tied, size, apply_fn)


def _albert_ties(size: Size) -> dict[str, str]:
  return {f'block_{i}/attn': 'block_0/attn' for i in range(1, size.layers)}


def _train_step(loss_fn):
  """``step(state, tokens, targets)`` of ``loss_fn(params, tokens, targets)``."""
  tx = _optimizer()

  def step(state, tokens, targets):
    loss, grads = jax.value_and_grad(loss_fn)(state['params'], tokens, targets)
    updates, opt = tx.update(grads, state['opt'], state['params'])
    return {'params': optax.apply_updates(state['params'], updates), 'opt': opt}, loss

  return step


def _linen(model: nn.Module, size: Size, apply_fn=None):
  """``(build_state, step)`` of a Linen model; every collection is trained."""
  apply_fn = apply_fn or model.apply

  def build_state():
    tokens = jnp.zeros((size.batch, size.length), jnp.int32)
    rngs = {'params': jax.random.key(0), 'shared': jax.random.key(1)}
    variables = model.init(rngs, tokens)
    return {'params': variables, 'opt': _optimizer().init(variables)}

  return build_state, _train_step(
      lambda variables, tokens, targets: _loss(apply_fn(variables, tokens), targets))


def broadcast_before_scan(size: Size, prevent_cse: bool = True):
  """The tied layout, broadcast to a stack of ``size.layers`` before the scan.

  The parameters are the tied model's (one ``attn`` at the encoder); the
  step broadcasts them to the untied stack's ``layers/attn`` and runs the
  untied model, so the scan slices them like untied weights. The gradient
  of ``attn`` is the broadcast's transpose: the sum over the layers.
  """
  untied = Scanned(size, 'untied', prevent_cse)
  tied = nn.tie(Scanned, SCAN_TIES)(size, 'tie', prevent_cse)

  def apply_fn(variables, tokens):
    params = dict(variables['params'])
    attn = params.pop('attn')
    params['layers'] = {**params['layers'], 'attn': jax.tree_util.tree_map(
        lambda w: jnp.broadcast_to(w, (size.layers, *w.shape)), attn)}
    return untied.apply({'params': params}, tokens)

  return _linen(tied, size, apply_fn)


# ---------------------------------------------------------------------------
# The layouts grid: one module tied into nn.scan, written as users write it
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a layer of the grid is written.

  Attributes:
    projection: the attention's q, k, v projection: ``'einsum4d'`` (one
      ``(d, 3, heads, head_dim)`` kernel in an einsum, the models above),
      ``'dense_general'`` (``nn.DenseGeneral`` with that 4-D kernel),
      ``'fused2d'`` (one ``(d, 3 d)`` ``nn.Dense`` kernel, split and reshaped
      to heads after the matmul, as GPT-2's ``c_attn`` ports write it),
      ``'separate'`` (three ``(d, d)`` ``nn.Dense``), or ``'mha'`` (Flax's
      ``nn.MultiHeadDotProductAttention``, which scales the query).
    logits: ``'bf16'``: the q·k logits scaled in bf16, then softmaxed in f32;
      ``'f32'``: cast to f32 before scaling.
    shared: the submodule tied into every layer: ``'attn'`` or ``'mlp'``.
  """

  projection: str
  logits: str = 'bf16'
  shared: str = 'attn'

  def describe(self) -> str:
    what = {'einsum4d': '4-D kernel, einsum', 'dense_general': '`nn.DenseGeneral` 4-D',
            'fused2d': '2-D fused qkv `nn.Dense`', 'separate': 'q, k, v `nn.Dense`',
            'mha': '`nn.MultiHeadDotProductAttention`'}[self.projection]
    if self.projection != 'mha':
      what += f', logits {self.logits}'
    return what if self.shared == 'attn' else f'shared MLP ({what} attention)'


LAYOUTS = {
    'einsum4d_bf16': Layout('einsum4d', 'bf16'),
    'einsum4d_f32': Layout('einsum4d', 'f32'),
    'dense_general_bf16': Layout('dense_general', 'bf16'),
    'dense_general_f32': Layout('dense_general', 'f32'),
    'fused2d_bf16': Layout('fused2d', 'bf16'),
    'fused2d_f32': Layout('fused2d', 'f32'),
    'separate_bf16': Layout('separate', 'bf16'),
    'separate_f32': Layout('separate', 'f32'),
    'mha': Layout('mha'),
    'shared_mlp': Layout('einsum4d', 'bf16', shared='mlp'),
}


class GridAttention(nn.Module):
  """Self-attention as :class:`Layout` writes it."""

  size: Size
  layout: Layout

  @nn.compact
  def __call__(self, x):
    kind = self.layout.projection
    b, l, d = x.shape
    h = self.size.heads
    hd = d // h
    if kind == 'mha':
      return nn.MultiHeadDotProductAttention(num_heads=h, dtype=DTYPE, name='mha')(x)
    dense = lambda n, name: nn.Dense(n, use_bias=False, dtype=DTYPE, name=name)
    if kind == 'einsum4d':
      wqkv = self.param('wqkv', _normal, (d, 3, h, hd))
      qkv = jnp.einsum('bld,dthk->btlhk', x, wqkv.astype(DTYPE))
      q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    elif kind == 'dense_general':
      qkv = nn.DenseGeneral((3, h, hd), use_bias=False, dtype=DTYPE, name='qkv')(x)
      q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
    elif kind == 'fused2d':
      qkv = dense(3 * d, 'c_attn')(x)
      q, k, v = (t.reshape(b, l, h, hd) for t in jnp.split(qkv, 3, axis=-1))
    elif kind == 'separate':
      q, k, v = (dense(d, n)(x).reshape(b, l, h, hd) for n in ('q', 'k', 'v'))
    else:
      raise ValueError(f'unknown projection {kind!r}')
    logits = jnp.einsum('bqhk,bshk->bhqs', q, k)
    if self.layout.logits == 'f32':
      logits = logits.astype(jnp.float32) / jnp.sqrt(hd).astype(jnp.float32)
    else:
      logits = logits / jnp.sqrt(hd).astype(DTYPE)
    weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(DTYPE)
    y = jnp.einsum('bhqs,bshk->bqhk', weights, v)
    if kind == 'einsum4d':
      return jnp.einsum('bqhk,hkd->bqd', y, self.param(
          'wout', _normal, (h, hd, d)).astype(DTYPE))
    if kind == 'dense_general':
      return nn.DenseGeneral(d, axis=(-2, -1), use_bias=False, dtype=DTYPE,
                             name='out')(y)
    return dense(d, 'c_proj')(y.reshape(b, l, d))


class GridMlp(nn.Module):

  size: Size

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.size.d_ff, dtype=DTYPE, name='wi')(x)
    return nn.Dense(self.size.d_model, dtype=DTYPE, name='wo')(jax.nn.gelu(y))


class GridLayer(nn.Module):
  """A pre-norm scan body, ``(carry, x) -> (carry, None)``."""

  size: Size
  layout: Layout

  @nn.compact
  def __call__(self, x, _):
    x = x + GridAttention(self.size, self.layout, name='attn')(LayerNorm(name='ln1')(x))
    return x + GridMlp(self.size, name='mlp')(LayerNorm(name='ln2')(x)), None


def _grid_source(module: nn.Module, x) -> None:
  """Creates a tied grid model's source (``module.layout.shared``) in ``init``."""
  if module.tied and module.is_initializing():
    if module.layout.shared == 'attn':
      GridAttention(module.size, module.layout, name='attn')(x[:, :1])
    else:
      GridMlp(module.size, name='mlp')(x[:, :1])


class GridScanned(nn.Module):
  """``nn.scan(nn.remat(GridLayer))``; ``tied``: the layout's shared module
  is created at the encoder too, the source of ``layers/<shared>``."""

  size: Size
  layout: Layout
  tied: bool = False

  @nn.compact
  def __call__(self, tokens):
    x = _embed(self, tokens, self.size)
    _grid_source(self, x)
    return _logits(self, self.layers(x), self.size)

  def layers(self, x):
    stack = nn.scan(nn.remat(GridLayer), variable_axes={'params': 0},
                    split_rngs={'params': True}, length=self.size.layers)
    return stack(self.size, self.layout, name='layers')(x, None)[0]


class GridVmapped(GridScanned):
  """``BRANCHES`` rematted :class:`GridLayer` s side by side (``nn.vmap``),
  averaged; ``tied`` as :class:`GridScanned`'s (source of ``branches/<shared>``)."""

  def layers(self, x):
    branches = nn.vmap(nn.remat(GridLayer), variable_axes={'params': 0},
                       split_rngs={'params': True}, in_axes=(None, None), out_axes=0,
                       axis_size=BRANCHES)
    return branches(self.size, self.layout, name='branches')(x, None)[0].mean(axis=0)


# The lowerings of a grid cell: the untied stack, and the tied model by
# in_scan (None: nn.tie's default, no in_scan given). ``nn.vmap`` has no
# in_scan: its cells compare the untied branches with the default tie.
LOWERINGS = {'untied': 'untied stack', 'broadcast': "`in_scan='broadcast'` (closed over)",
             'scanned': "`in_scan='scanned'`", 'default': 'default (no `in_scan`)'}
STACKS = {'scan': (GridScanned, 'layers'), 'vmap': (GridVmapped, 'branches')}


def grid_model(size: Size, layout: Layout, lowering: str, stack: str = 'scan') -> nn.Module:
  """The model of one grid cell's ``lowering`` (a key of :data:`LOWERINGS`)."""
  model, stacked = STACKS[stack]
  if lowering == 'untied':
    return model(size, layout)
  ties = {f'{stacked}/{layout.shared}': layout.shared}
  kwargs = {} if lowering == 'default' else {'in_scan': lowering}
  return nn.tie(model, ties, **kwargs)(size, layout, tied=True)


# ---------------------------------------------------------------------------
# Equinox and NNX
# ---------------------------------------------------------------------------


def equinox_shared(size: Size):
  """The unrolled model in Equinox: ``eqx.nn.Shared`` shares block 0's attention."""
  import equinox as eqx  # pylint: disable=import-outside-toplevel

  class EqxBlock(eqx.Module):
    attn: tuple
    ln1: tuple
    ln2: tuple
    wi: jax.Array
    wo: jax.Array

    def __call__(self, x):
      return _block(x, self.attn, self.ln1, self.ln2, self.wi, self.wo)

  class EqxModel(eqx.Module):
    embed: jax.Array
    blocks: eqx.nn.Shared
    final_ln: tuple
    head: jax.Array

    def __init__(self, key):
      keys = iter(jax.random.split(key, 4 * size.layers + 2))
      shapes = _shapes(size)
      ln = lambda: (jnp.ones((size.d_model,)), jnp.zeros((size.d_model,)))
      blocks = [EqxBlock((_normal(next(keys), shapes['wqkv']),
                          _normal(next(keys), shapes['wout'])),
                         ln(), ln(), _normal(next(keys), shapes['wi']),
                         _normal(next(keys), shapes['wo']))
                for _ in range(size.layers)]
      self.blocks = eqx.nn.Shared(
          blocks, lambda bs: [b.attn for b in bs[1:]],
          lambda bs: [bs[0].attn] * (len(bs) - 1))
      self.embed = _normal(next(keys), (size.vocab, size.d_model))
      self.final_ln = ln()
      self.head = _normal(next(keys), (size.d_model, size.vocab))

    def __call__(self, tokens):
      x = self.embed[tokens].astype(DTYPE)
      for block in self.blocks():
        x = jax.checkpoint(lambda b, y: b(y))(block, x)
      return _layer_norm(x, *self.final_ln) @ self.head.astype(DTYPE)

  static = {}

  def build_state():
    params, static['model'] = eqx.partition(EqxModel(jax.random.key(0)), eqx.is_array)
    return {'params': params, 'opt': _optimizer().init(params)}

  def loss_fn(params, tokens, targets):
    return _loss(eqx.combine(params, static['model'])(tokens), targets)

  return build_state, _train_step(loss_fn)


def nnx_model(size: Size, graph: bool):
  """The unrolled model in NNX; graph mode shares one attention by reference,
  tree mode ties every block's attention to block 0's (``flax_tieext.nnx.tie``)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  import flax_tieext.nnx  # pylint: disable=import-outside-toplevel,redefined-outer-name

  shapes = _shapes(size)

  def param(rngs, name):
    return nnx.Param(_normal(rngs.params(), shapes[name]))

  class Attn(nnx.Module):

    def __init__(self, rngs):
      self.wqkv, self.wout = param(rngs, 'wqkv'), param(rngs, 'wout')

  class Norm(nnx.Module):

    def __init__(self):
      self.scale = nnx.Param(jnp.ones((size.d_model,)))
      self.bias = nnx.Param(jnp.zeros((size.d_model,)))

  class NnxBlock(nnx.Module):

    def __init__(self, attn, rngs):
      self.attn = attn if attn is not None else Attn(rngs)
      self.ln1, self.ln2 = Norm(), Norm()
      self.wi, self.wo = param(rngs, 'wi'), param(rngs, 'wo')

    def __call__(self, x):
      return _block(x, (self.attn.wqkv[...], self.attn.wout[...]),
                    (self.ln1.scale[...], self.ln1.bias[...]),
                    (self.ln2.scale[...], self.ln2.bias[...]), self.wi[...], self.wo[...])

  class NnxModel(nnx.Module):

    def __init__(self, rngs):
      self.embed = nnx.Param(_normal(rngs.params(), (size.vocab, size.d_model)))
      shared = Attn(rngs) if graph else None
      self.blocks = nnx.List([NnxBlock(shared, rngs) for _ in range(size.layers)])
      self.final_ln = Norm()
      self.head = nnx.Param(_normal(rngs.params(), (size.d_model, size.vocab)))

    def __call__(self, tokens):
      forward = flax_tieext.nnx.remat(lambda block, x: block(x), graph=graph)
      x = self.embed[...][tokens].astype(DTYPE)
      for block in self.blocks:
        x = forward(block, x)
      x = _layer_norm(x, self.final_ln.scale[...], self.final_ln.bias[...])
      return x @ self.head[...].astype(DTYPE)

  cls = NnxModel
  if not graph:
    cls = flax_tieext.nnx.tie(NnxModel, {
        f'blocks.{i}.attn.{w}': f'blocks.0.attn.{w}'
        for i in range(1, size.layers) for w in ('wqkv', 'wout')})
  tx = _optimizer()
  graphdef = {}

  def build_state():
    model = cls(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param, graph=graph)
    graphdef['def'], state = nnx.split((model, optimizer), graph=graph)
    return state

  def step(state, tokens, targets):
    model, optimizer = nnx.merge(graphdef['def'], state)
    loss, grads = nnx.value_and_grad(lambda m: _loss(m(tokens), targets),
                                     graph=graph)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer), graph=graph), loss

  return build_state, step


# ---------------------------------------------------------------------------
# What is compared
# ---------------------------------------------------------------------------


def _variants(size: Size) -> dict[str, tuple[str, Callable[[], tuple]]]:
  """``{name: (label, () -> (build_state, step))}``."""
  tied_unrolled = lambda: _linen(nn.tie(Unrolled, _albert_ties(size))(size), size)
  return {
      'albert_module': ('hand-shared module (upstream idiom)',
                        lambda: _linen(Unrolled(size, share_module=True), size)),
      'albert_tie': ('`nn.tie`', tied_unrolled),
      'equinox_shared': ('Equinox `eqx.nn.Shared`', lambda: equinox_shared(size)),
      'nnx_graph': ('NNX graph mode, shared reference', lambda: nnx_model(size, True)),
      'nnx_tree': ('NNX tree mode, `flax_tieext.nnx.tie`', lambda: nnx_model(size, False)),
      'scan_untied': ('untied stack', lambda: _linen(Scanned(size, 'untied'), size)),
      # Closed over, explicitly: the default before issue 53, which these
      # groups' stored results measured (the grid measures the default).
      'scan_tie': ("one attention tied into the stack (`nn.tie`, `in_scan='broadcast'`)",
                   lambda: _linen(nn.tie(Scanned, SCAN_TIES, in_scan='broadcast')(
                       size, 'tie'), size)),
      'scan_variable_broadcast': ('`variable_broadcast` (closed over)', lambda: _linen(
          Scanned(size, 'variable_broadcast'), size)),
      'scan_broadcast_before': ('tied weights broadcast to a stack before the scan',
                                lambda: broadcast_before_scan(size)),
      'scan_tie_scanned': ("tied, `in_scan='scanned'`", lambda: _linen(
          nn.tie(Scanned, SCAN_TIES, in_scan='scanned')(size, 'tie'), size)),
      'vmap_untied': (f'untied, {BRANCHES} branches', lambda: _linen(
          Vmapped(size, 'untied'), size)),
      'vmap_tie': ('one attention tied into every branch (`nn.tie`)', lambda: _linen(
          nn.tie(Vmapped, VMAP_TIES)(size, 'tie'), size)),
      'vmap_broadcast_before': ('tied weights broadcast to the branches before the vmap',
                                lambda: broadcast_before_vmap(size)),
      'scan_tie_no_cse': ('tied, `prevent_cse=False`', lambda: _linen(
          nn.tie(Scanned, SCAN_TIES, in_scan='broadcast')(size, 'tie', prevent_cse=False),
          size)),
      'scan_untied_no_cse': ('untied, `prevent_cse=False`', lambda: _linen(
          Scanned(size, 'untied', prevent_cse=False), size)),
  }


# group -> (title, [(baseline, candidate), ...]); each pair is timed in
# rounds of its own.
GROUPS = {
    'albert': ('`nn.tie` vs the hand-shared module, 12 rematted blocks',
               [('albert_module', 'albert_tie')]),
    'equinox': ('Equinox `Shared` vs `nn.tie`', [('albert_tie', 'equinox_shared')]),
    'nnx': ('NNX tree mode `flax_tieext.nnx.tie` vs graph mode',
            [('nnx_graph', 'nnx_tree')]),
    'scan': ('`nn.scan(nn.remat(Layer))`: ways to put one attention in every layer',
             [('scan_untied', 'scan_tie'), ('scan_untied', 'scan_variable_broadcast'),
              ('scan_untied', 'scan_broadcast_before'),
              ('scan_untied', 'scan_tie_scanned')]),
    'vmap': (f'`nn.vmap(nn.remat(Block))`: one attention in each of {BRANCHES} branches',
             [('vmap_untied', 'vmap_tie'), ('vmap_untied', 'vmap_broadcast_before')]),
    'prevent_cse': ('`prevent_cse=False` on the checkpoint inside the scan',
                    [('scan_tie', 'scan_tie_no_cse'),
                     ('scan_untied', 'scan_untied_no_cse')]),
}


def _unavailable(group: str) -> str | None:
  """Why ``group`` cannot run here, or ``None``."""
  if group == 'equinox':
    try:
      import equinox  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
      return f'Equinox is not installed here ({e})'
  if group == 'nnx':
    try:
      import flax_tieext.nnx  # pylint: disable=import-outside-toplevel,redefined-outer-name
    except ImportError as e:
      return f'flax.nnx cannot be imported ({e})'
    if not flax_tieext.nnx._TREE_MODE:  # pylint: disable=protected-access
      return f'Flax {flax.__version__} has no NNX tree mode'
  return None


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def hlo_summary(text: str) -> dict[str, Any]:
  """Counts in an optimized HLO module's text: ops by opcode, fusions, the
  entry's parameters and the input/output aliasing (donation)."""
  ops = collections.Counter()
  for m in re.finditer(r'^\s*(?:ROOT )?%?[\w.\-]+ = (?:\([^=]*?\)|[\w\[\]{},:\s]+?)\s'
                       r'([a-z][\w\-]*)\(', text, re.M):
    ops[m.group(1)] += 1
  entry = re.search(r'^ENTRY .*?^}', text, re.M | re.S)
  entry_text = entry.group(0) if entry else ''
  params = re.findall(r'= (\S+?) parameter\((\d+)\)', entry_text)
  entry_ops = collections.Counter(
      m.group(1) for m in re.finditer(r' ([a-z][\w\-]*)\(', entry_text))
  header = text.split('\n', 1)[0]
  return {
      'ops': dict(sorted(ops.items())),
      'fusions': ops.get('fusion', 0),
      'computations': len(re.findall(r'^(?:ENTRY )?%?[\w.\-]+ .*\{\s*$', text, re.M)),
      'entry_parameters': len(params),
      'entry_parameter_shapes': collections.Counter(s for s, _ in params),
      'entry_ops': dict(sorted(entry_ops.items())),
      'aliased_outputs': len(re.findall(r'\{[\d, ]*\}:\s*\(\d+,', header)),
  }


def hlo_diff(a: dict, b: dict) -> dict[str, Any]:
  """What differs between two :func:`hlo_summary` s (``b - a``)."""

  def delta(x, y):
    return {k: y.get(k, 0) - x.get(k, 0) for k in sorted(set(x) | set(y))
            if y.get(k, 0) != x.get(k, 0)}

  return {
      'ops': delta(a['ops'], b['ops']),
      'entry_ops': delta(a['entry_ops'], b['entry_ops']),
      'entry_parameter_shapes': delta(a['entry_parameter_shapes'],
                                      b['entry_parameter_shapes']),
      **{k: b[k] - a[k] for k in ('fusions', 'computations', 'entry_parameters',
                                  'aliased_outputs')},
  }


def _peak(stats: dict | None) -> tuple[str | None, int | None]:
  if not stats:
    return None, None
  for key in ('peak_bytes_reserved', 'peak_bytes_in_use'):
    if key in stats:
      return key, int(stats[key])
  return None, None


# --compile-only TOPOLOGY: compile for a TPU topology that this machine need
# not have (jax.experimental.topologies, with libtpu installed): the compiled
# programs' memory and FLOPs, no steps.
COMPILE_ONLY: dict[str, Any] = {'sharding': None, 'topology': None}


def compile_only(topology: str) -> None:
  """Compiles every variant for ``topology`` (e.g. ``'v5e:1x1'``) from now on."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  devices = topologies.get_topology_desc(
      topology_name=topology, platform='tpu', chips_per_host_bounds=[1, 1, 1]).devices
  COMPILE_ONLY.update(sharding=jax.sharding.SingleDeviceSharding(devices[0]),
                      topology=topology, device_kind=devices[0].device_kind)


class Variant:
  """One model's train step: compiled, its state built on demand."""

  def __init__(self, name: str, label: str, make: Callable[[], tuple], size: Size,
               compile_now: bool = True):
    self.name, self.label = name, label
    build_state, step = make()
    self.build_state = jax.jit(build_state)
    self.step = jax.jit(step, donate_argnums=0)
    sharding = COMPILE_ONLY['sharding']  # None: the default device
    tokens = jax.ShapeDtypeStruct((size.batch, size.length), jnp.int32, sharding=sharding)
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        jax.eval_shape(build_state))
    t0 = time.perf_counter()
    self.lowered = self.step.lower(abstract, tokens, tokens)
    self.lower_seconds = time.perf_counter() - t0
    self.state = None
    self.peak: dict[str, Any] = {}
    if compile_now:
      self.compile()

  def compile(self) -> Variant:
    """Compiles the lowered step (threads may compile several at once)."""
    self.compiled, self.stats = measure.compile_lowered(self.lowered, self.lower_seconds)
    self.lowered = None
    memory = self.compiled.memory_analysis()
    self.alias_bytes = int(getattr(memory, 'alias_size_in_bytes', 0))
    self.footprint = (self.stats.argument_bytes + self.stats.temp_bytes
                      + self.stats.output_bytes - self.alias_bytes)
    return self

  def row(self) -> dict[str, Any]:
    s = self.stats
    return {'label': self.label, 'flops': s.flops, 'temp_bytes': s.temp_bytes,
            'argument_bytes': s.argument_bytes, 'output_bytes': s.output_bytes,
            'alias_bytes': self.alias_bytes, 'compile_seconds': s.compile_seconds,
            **self.peak}

  def run(self, tokens, targets):
    self.state, loss = self.compiled(self.state, tokens, targets)
    return self.state, loss


def _batch(size: Size):
  tokens = jax.random.randint(jax.random.key(1), (size.batch, size.length), 0, size.vocab)
  return tokens, jnp.roll(tokens, 1, axis=1)


def _log(message: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {message}', flush=True)


def measure_groups(groups: Sequence[str], size: Size, rounds: int, warmup: int,
                   hlo_dir: pathlib.Path | None = None) -> dict[str, Any]:
  """Compiles, steps and times ``groups``; their results and the variants'.

  Installs ``flax_tieext`` (``nn.tie``) for the run, also where
  ``FLAX_TIEEXT_AUTOPATCH=0``, and leaves it as it found it.
  """
  was_installed = flax_tieext.is_installed()
  flax_tieext.install()
  try:
    return _measure_groups(groups, size, rounds, warmup, hlo_dir)
  finally:
    if not was_installed:
      flax_tieext.uninstall()


def _measure_groups(groups, size, rounds, warmup, hlo_dir):
  makers = _variants(size)
  skipped = {g: why for g in groups if (why := _unavailable(g))}
  names = list(dict.fromkeys(
      n for g in groups if g not in skipped for pair in GROUPS[g][1] for n in pair))
  variants = {}
  for name in names:
    _log(f'compiling {name}')
    label, make = makers[name]
    variants[name] = Variant(name, label, make, size)
    _log(f'  {variants[name].stats.compile_seconds:.1f} s,'
         f' footprint {measure.format_bytes(variants[name].footprint)}')
  tokens, targets = _batch(size)
  device = jax.devices()[0]

  # Peak memory: one variant at a time, smallest compiled footprint first.
  before = _peak(device.memory_stats())[1]
  for v in sorted(variants.values(), key=lambda v: v.footprint):
    v.state = v.build_state()
    jax.block_until_ready(v.state)
    resident = (device.memory_stats() or {}).get('bytes_in_use')
    for _ in range(2):
      jax.block_until_ready(v.run(tokens, targets))
    stats = device.memory_stats()
    key, peak = _peak(stats)
    v.peak = {'peak_key': key, 'peak_bytes': peak, 'state_bytes_in_use': resident,
              'peak_bytes_in_use': (stats or {}).get('peak_bytes_in_use'),
              'peak_raised': None if peak is None else before is None or peak > before}
    before = peak
    v.state = None
    gc.collect()
    _log(f'{v.name}: peak {key}={peak}')

  results: dict[str, Any] = {}
  for group in groups:
    title, pairs = GROUPS[group]
    if group in skipped:
      results[group] = {'title': title, 'skipped': skipped[group]}
      continue
    rows = []
    for base_name, cand_name in pairs:
      base, cand = variants[base_name], variants[cand_name]
      base.state, cand.state = base.build_state(), cand.build_state()
      timer = measure.Interleaved({
          'base': lambda b=base: b.run(tokens, targets),
          'cand': lambda c=cand: c.run(tokens, targets)}).run(rounds, warmup)
      base.state = cand.state = None
      gc.collect()
      median, q1, q3 = timer.ratio('cand', 'base')
      rows.append({
          'baseline': base_name, 'candidate': cand_name,
          'baseline_step_seconds': timer.median('base'),
          'candidate_step_seconds': timer.median('cand'),
          'baseline_step_spread': timer.spread('base'),
          'candidate_step_spread': timer.spread('cand'),
          'step_ratio': timer.median('cand') / timer.median('base'),
          'round_ratio_median_iqr': [median, q1, q3],
      })
      _log(f'{group}: {cand_name} / {base_name} = {rows[-1]["step_ratio"]:.3f}'
           f' (IQR {q1:.3f}-{q3:.3f})')
    results[group] = {'title': title, 'pairs': rows}
    if group == 'nnx':
      texts = {n: variants[n].compiled.as_text() for n in ('nnx_graph', 'nnx_tree')}
      summaries = {n: hlo_summary(t) for n, t in texts.items()}
      results[group]['hlo'] = {
          'graph': {k: summaries['nnx_graph'][k] for k in (
              'fusions', 'computations', 'entry_parameters', 'aliased_outputs')},
          'tree': {k: summaries['nnx_tree'][k] for k in (
              'fusions', 'computations', 'entry_parameters', 'aliased_outputs')},
          'tree_minus_graph': hlo_diff(summaries['nnx_graph'], summaries['nnx_tree']),
      }
      if hlo_dir is not None:
        for n, t in texts.items():
          (hlo_dir / f'{n}.hlo.txt').write_text(t)
  return {'groups': results, 'variants': {n: v.row() for n, v in variants.items()}}


# ---------------------------------------------------------------------------
# Measuring the layouts grid
# ---------------------------------------------------------------------------


GRID_RESULTS = ROOT / 'benchmarks' / 'device_results_grid.json'


def program_text(compiled) -> str:
  """The optimized HLO without source locations: equal texts, one program."""
  text = re.sub(r', metadata=\{[^}]*\}', '', compiled.as_text())
  return '\n'.join(line for line in text.splitlines()
                   if line.startswith(('HloModule', 'ENTRY', '%', ' ', '}')))


def profile_ops(run: Callable[[], Any], steps: int = 3) -> dict[str, Any]:
  """Device time per HLO instruction over ``steps`` calls of ``run``.

  ``jax.profiler``'s trace, read back with ``jax.profiler.ProfileData``:
  ``{'<line>|<event>': [nanoseconds per step, events per step]}`` of the
  device planes (an instruction inside a loop counts once per iteration).
  Empty where the backend records no device plane (the CPU).
  """
  import tempfile  # pylint: disable=import-outside-toplevel
  jax.block_until_ready(run())
  with tempfile.TemporaryDirectory() as log_dir:
    jax.profiler.start_trace(log_dir)
    try:
      for _ in range(steps):
        jax.block_until_ready(run())
    finally:
      jax.profiler.stop_trace()
    paths = sorted(pathlib.Path(log_dir).rglob('*.xplane.pb'))
    data = jax.profiler.ProfileData.from_file(str(paths[-1])) if paths else None
  totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
  for plane in data.planes if data else ():
    if not plane.name.startswith('/device:'):
      continue
    for line in plane.lines:
      for event in line.events:
        total = totals[f'{line.name}|{event.name}']
        total[0] += event.duration_ns / steps
        total[1] += 1 / steps
  return dict(totals)


def measure_grid(layouts: Sequence[str], batches: Sequence[int],
                 lowerings: Sequence[str], rounds: int, warmup: int, base: Size = FULL,
                 hlo_dir: pathlib.Path | None = None, profile: Sequence[str] = (),
                 threads: int = 4, stack: str = 'scan') -> dict[str, Any]:
  """The grid's cells: each layout at each batch, every lowering against the
  untied stack (which ``lowerings`` must hold), in ``stack`` (a key of
  :data:`STACKS`). Installs the patch for the run, as :func:`measure_groups`
  does."""
  was_installed = flax_tieext.is_installed()
  flax_tieext.install()
  try:
    cells = {}
    for batch in sorted(batches):  # the peak counter only rises: small first
      cells.update(_measure_grid_batch(layouts, dataclasses.replace(base, batch=batch),
                                       lowerings, rounds, warmup, hlo_dir, profile, threads,
                                       stack))
    return cells
  finally:
    if not was_installed:
      flax_tieext.uninstall()


def _measure_grid_batch(layouts, size, lowerings, rounds, warmup, hlo_dir, profile,
                        threads, stack):
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  variants = {}
  for name in layouts:
    for lowering in lowerings:
      make = functools.partial(_linen, grid_model(size, LAYOUTS[name], lowering, stack),
                               size)
      variants[name, lowering] = Variant(f'{name}/{lowering}', LOWERINGS[lowering], make,
                                         size, compile_now=False)
  # The tied lowerings of a layout initialize the same variables: one init.
  inits = {}
  for (name, lowering), v in variants.items():
    v.build_state = inits.setdefault((name, lowering == 'untied'), v.build_state)
  if COMPILE_ONLY['sharding'] is not None:
    inits = {}  # no states: nothing runs
  _log(f'batch {size.batch}: lowered {len(variants)}, compiling ({threads} threads)')
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    init_jobs = {k: pool.submit(lambda f: f.lower().compile(), f) for k, f in inits.items()}
    jobs = [pool.submit(Variant.compile, v) for v in variants.values()]
    compiled_inits = {k: job.result() for k, job in init_jobs.items()}
    for job in jobs:
      job.result()
  for (name, lowering), v in variants.items():
    v.build_state = compiled_inits.get((name, lowering == 'untied'))
  _log(f'batch {size.batch}: compiled')
  texts = {key: program_text(v.compiled) for key, v in variants.items()}
  if COMPILE_ONLY['sharding'] is not None:
    return _compiled_cells(layouts, size, lowerings, variants, texts, hlo_dir, profile,
                           stack)
  tokens, targets = _batch(size)
  device = jax.devices()[0]

  # Peak memory: one variant at a time; TPUs' peak_bytes_reserved follows the
  # temporaries, so the smallest temporaries first.
  before = _peak(device.memory_stats())[1]
  for v in sorted(variants.values(), key=lambda v: (v.stats.temp_bytes, v.footprint)):
    v.state = v.build_state()
    for _ in range(2):
      jax.block_until_ready(v.run(tokens, targets))
    stats = device.memory_stats()
    key, peak = _peak(stats)
    v.peak = {'peak_key': key, 'peak_bytes': peak,
              'peak_raised': None if peak is None else before is None or peak > before}
    before = peak if peak is not None else before
    v.state = None
    gc.collect()

  cells = {}
  for name in layouts:
    mine = {lowering: variants[name, lowering] for lowering in lowerings}
    # A lowering that compiles to another's very program is that program.
    same = {l: next((o for o in lowerings[:i] if texts[name, o] == texts[name, l]), None)
            for i, l in enumerate(lowerings)}
    timed = [l for l in lowerings if same[l] is None]
    for l in timed:
      mine[l].state = mine[l].build_state()
    timer = measure.Interleaved({
        l: (lambda v=mine[l]: v.run(tokens, targets)) for l in timed}).run(rounds, warmup)
    ops = {}
    for l in timed if name in profile else ():
      try:
        ops[l] = profile_ops(lambda v=mine[l]: v.run(tokens, targets))
      except Exception as e:  # pylint: disable=broad-except
        ops[l] = {'error': repr(e)}  # the profiler is optional; the timing stands
    for l in timed:
      mine[l].state = None
    gc.collect()
    rows = {}
    for l in lowerings:
      t = same[l] or l
      median, q1, q3 = timer.ratio(t, 'untied')
      rows[l] = {**mine[l].row(), 'same_program_as': same[l],
                 'step_seconds': timer.median(t), 'step_spread': timer.spread(t),
                 'step_ratio': timer.median(t) / timer.median('untied'),
                 'round_ratio_median_iqr': [median, q1, q3]}
    cells[f'{stack}:{name}/{size.batch}'] = {
        'stack': stack, 'layout': name, 'describe': LAYOUTS[name].describe(),
        'batch': size.batch, 'lowerings': rows}
    _log(f'{name} batch {size.batch}: ' + ', '.join(
        f'{l} {rows[l]["step_ratio"]:.3f}' + (f' (= {same[l]})' if same[l] else '')
        for l in lowerings if l != 'untied'))
    if hlo_dir is not None and name in profile:
      hlo_dir.mkdir(parents=True, exist_ok=True)
      for l in timed:
        (hlo_dir / f'{stack}_{name}_{l}_b{size.batch}.hlo.txt').write_text(
            mine[l].compiled.as_text())
      (hlo_dir / f'{stack}_{name}_b{size.batch}.profile.json').write_text(json.dumps(ops))
  return cells


def _compiled_cells(layouts, size, lowerings, variants, texts, hlo_dir, hlo_layouts, stack):
  """The cells of a compile-only run: each program's memory and FLOPs."""
  cells = {}
  for name in layouts:
    same = {l: next((o for o in lowerings[:i] if texts[name, o] == texts[name, l]), None)
            for i, l in enumerate(lowerings)}
    cells[f'{stack}:{name}/{size.batch}'] = {
        'stack': stack, 'layout': name, 'describe': LAYOUTS[name].describe(),
        'batch': size.batch, 'compiled_only': True,
        'lowerings': {l: {**variants[name, l].row(), 'same_program_as': same[l]}
                      for l in lowerings}}
    if hlo_dir is not None and name in hlo_layouts:
      hlo_dir.mkdir(parents=True, exist_ok=True)
      for l in lowerings:
        if same[l] is None:
          (hlo_dir / f'{stack}_{name}_{l}_b{size.batch}.hlo.txt').write_text(
              variants[name, l].compiled.as_text())
    _log(f'{name} batch {size.batch}: temp ' + ', '.join(
        f'{l} {variants[name, l].stats.temp_bytes / 2**20:,.0f} MiB' for l in lowerings))
  return cells


def _meta(size: Size, rounds: int, warmup: int) -> dict[str, Any]:
  device = jax.devices()[0]
  return {
      'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
      'device': f'{device.platform}: {device.device_kind}',
      'device_count': jax.device_count(),
      'jax': jax.__version__, 'flax': flax.__version__,
      'python': platform.python_version(),
      'size': dataclasses.asdict(size), 'dtype': 'bf16 activations, fp32 params, Adam',
      'layers': ('Flax\'s own (nn.DenseGeneral, nn.Dense, nn.LayerNorm)'
                 if FLAX_LAYERS['on'] else 'einsums shared by every framework'),
      'rounds': rounds, 'warmup': warmup,
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
  }


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tiny', action='store_true', help='CPU smoke-test sizes')
  parser.add_argument('--only', nargs='+', choices=list(GROUPS), default=list(GROUPS))
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--batch', type=int, help='override the batch size')
  parser.add_argument('--out', type=pathlib.Path, default=RESULTS)
  parser.add_argument('--flax-layers', action='store_true',
                      help='Linen models: Flax\'s own Dense/DenseGeneral/LayerNorm layers')
  parser.add_argument('--hlo-dir', type=pathlib.Path,
                      help='write the NNX pair\'s optimized HLO here (--grid: the'
                      ' profiled layouts\' HLO and device time per instruction)')
  parser.add_argument('--grid', action='store_true',
                      help='the layouts grid instead of the groups (default --out:'
                      f' {GRID_RESULTS.relative_to(ROOT)})')
  parser.add_argument('--layouts', nargs='+', choices=list(LAYOUTS), default=list(LAYOUTS))
  parser.add_argument('--batches', nargs='+', type=int, default=[16, 4, 32])
  parser.add_argument('--lowerings', nargs='+', choices=list(LOWERINGS),
                      default=list(LOWERINGS))
  parser.add_argument('--profile', nargs='*', default=(), choices=list(LAYOUTS),
                      help='--grid: profile these layouts\' steps (with --hlo-dir)')
  parser.add_argument('--threads', type=int, default=4, help='--grid: parallel compiles')
  parser.add_argument('--stack', choices=list(STACKS), default='scan',
                      help='--grid: nn.scan(nn.remat(Layer)), or nn.vmap of'
                      f' {BRANCHES} rematted layers (untied vs the default tie)')
  parser.add_argument('--compile-only', metavar='TOPOLOGY',
                      help='--grid: compile for this TPU topology (e.g. v5e:1x1, needs'
                      ' libtpu, no chip): memory and FLOPs, no steps')
  args = parser.parse_args(argv)
  if args.tiny and not args.compile_only:  # (XLA:TPU needs the pass the flag drops)
    measure.keep_remat_on_cpu()  # (CPU only: see flax_tieext.examples.measure)
  if args.grid:
    return _main_grid(args)
  FLAX_LAYERS['on'] = args.flax_layers
  size = TINY if args.tiny else FULL
  if args.batch:
    size = dataclasses.replace(size, batch=args.batch)
  _log(f'{jax.devices()[0]}: {size}')
  measured = measure_groups(args.only, size, args.rounds, args.warmup, args.hlo_dir)
  previous = json.loads(args.out.read_text()) if args.out.exists() else {}
  meta = _meta(size, args.rounds, args.warmup)
  for group in measured['groups'].values():
    group['date'] = meta['date']
  if all(previous.get('meta', {}).get(k) == meta[k] for k in ('size', 'device', 'layers')):
    for group in previous['groups'].values():  # each group keeps its date
      group.setdefault('date', previous['meta']['date'])
    measured['groups'] = {**previous['groups'], **measured['groups']}
    measured['variants'] = {**previous['variants'], **measured['variants']}
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text(json.dumps({'meta': meta, **measured}, indent=2, sort_keys=True,
                                 default=dict) + '\n')
  _log(f'wrote {args.out}')
  return 0


def _main_grid(args) -> int:
  if 'untied' not in args.lowerings:
    raise SystemExit('--lowerings: the untied stack is every ratio\'s baseline')
  lowerings = ['untied', *(l for l in args.lowerings if l != 'untied')]
  if args.stack == 'vmap':  # in_scan concerns nn.scan only
    lowerings = ['untied', 'default']
  base = TINY if args.tiny else FULL
  out = GRID_RESULTS if args.out == RESULTS else args.out
  if args.compile_only:
    compile_only(args.compile_only)
  _log(f'{jax.devices()[0]}: grid of {len(args.layouts)} layouts, batches {args.batches}')
  cells = measure_grid(args.layouts, args.batches, lowerings, args.rounds, args.warmup,
                       base, args.hlo_dir, args.profile, args.threads, args.stack)
  meta = _meta(base, args.rounds, args.warmup)
  meta['size'].pop('batch')
  if args.compile_only:  # the programs of that device, compiled here
    meta.update(device=f'tpu: {COMPILE_ONLY["device_kind"]}', device_count=1,
                compiled_only=f'compiled for {args.compile_only} on a CPU, without the chip')
  meta['layers'] = 'the layouts of benchmarks/device.py LAYOUTS'
  try:  # the TPU compiler's version, where there is one
    import importlib.metadata  # pylint: disable=import-outside-toplevel
    meta['libtpu'] = importlib.metadata.version('libtpu')
  except Exception:  # pylint: disable=broad-except
    pass
  for cell in cells.values():
    cell['date'] = meta['date']
  previous = json.loads(out.read_text()) if out.exists() else {}
  if all(previous.get('meta', {}).get(k) == meta[k] for k in ('size', 'device')):
    cells = {**previous['cells'], **cells}
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({'meta': meta, 'cells': cells}, indent=2, sort_keys=True,
                            default=dict) + '\n')
  _log(f'wrote {out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
