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

"""One module tied into every layer of ``nn.scan(nn.remat(...))``.

A MaxText-style stack: the layers are one ``nn.scan`` over a rematted block
(``static_argnames='deterministic'``), and every layer adds a T5-style
relative-position bias. Tied, one bias module at the encoder is the source of
``layers/rel_bias`` in every layer; the baseline is the same stack untied,
where every layer has its own bias (stacked along the scan axis, as
``untie_variables(..., stacks=...)`` writes it). Upstream's idiom of sharing,
one module passed into the stack as an attribute, fails there: ``nn.scan``
slices a module passed in along the stack's ``variable_axes``, so the shared
bias's table is sliced like a stacked one (``ScopeParamShapeError``), and
``variable_broadcast='params'`` would broadcast the layers' own parameters
too.

Both compute the same function when the untied layers hold the same bias, so
FLOPs and temp bytes are compared as ratios; argument bytes shrink by the
bias copies the tie does not store. Measured on a jitted loss-and-gradient
step, with remat's barriers kept on XLA:CPU
(``--xla_disable_hlo_passes=cse_barrier_expander``, see conftest.py).
"""

import functools

import flax.linen as nn
import flax_tieext
import jax
import jax.numpy as jnp

from conftest import ratio, record
from flax_tieext.examples import measure
from models import patched_flax

LAYERS, LENGTH, WIDTH, HEADS = 8, 64, 64, 4
TIES = {'layers/rel_bias': 'rel_bias'}


class RelativeBias(nn.Module):
  """A learned bias per head and relative distance, T5-style."""

  @nn.compact
  def __call__(self, length):
    table = self.param('table', nn.initializers.normal(0.02),
                       (2 * length - 1, HEADS))
    pos = jnp.arange(length)
    return table[pos[:, None] - pos[None, :] + length - 1].transpose(2, 0, 1)


class Layer(nn.Module):
  """One step of the stack: attention with the bias, then a feed-forward."""

  @nn.compact
  def __call__(self, x, _, deterministic=True):
    q, k, v = (nn.DenseGeneral((HEADS, WIDTH // HEADS), name=n)(x)
               for n in 'qkv')
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k)
    logits = logits + RelativeBias(name='rel_bias')(x.shape[-2])
    y = jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(logits), v)
    y = nn.DenseGeneral(WIDTH, axis=(-2, -1), name='out')(y)
    y = nn.Dropout(0.1, deterministic=deterministic)(y)
    return x + nn.Dense(WIDTH, name='ff')(jax.nn.gelu(x + y)), None


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    RelativeBias(name='rel_bias')(x.shape[-2])
    stack = nn.scan(nn.remat(Layer, static_argnames=('deterministic',)),
                    variable_axes={'params': 0},
                    split_rngs={'params': True, 'dropout': True},
                    in_axes=(nn.broadcast, nn.broadcast), length=LAYERS)
    return stack(name='layers')(x, None, True)[0]


def _loss(model, params, x):
  return jnp.mean(model.apply({'params': params}, x) ** 2)


def test_tied_bias_costs_what_the_untied_stack_costs():
  x = jax.random.normal(jax.random.key(1), (2, LENGTH, WIDTH))
  with patched_flax():
    tied = nn.tie(Encoder, TIES)()
    params = tied.init(jax.random.key(0), x)['params']
    untied = Encoder()
    untied_params = flax_tieext.untie_variables(
        {'params': params}, TIES, stacks={'layers': LAYERS})['params']
    grad = lambda model: jax.jit(jax.value_and_grad(
        functools.partial(_loss, model)))
    base_fn, base = measure.compile_stats(grad(untied), untied_params, x)
    tied_fn, cand = measure.compile_stats(grad(tied), params, x)
    base_loss, _ = base_fn(untied_params, x)
    tied_loss, _ = tied_fn(params, x)

  row = {
      'layers': LAYERS,
      'flops': [base.flops, cand.flops, ratio(cand.flops, base.flops)],
      'temp_bytes': [base.temp_bytes, cand.temp_bytes,
                     ratio(cand.temp_bytes, base.temp_bytes)],
      'argument_bytes': [base.argument_bytes, cand.argument_bytes,
                         ratio(cand.argument_bytes, base.argument_bytes)],
      'loss_difference': abs(float(base_loss) - float(tied_loss)),
  }
  record('scan_over_layers', row)

  bias_bytes = params['rel_bias']['table'].nbytes
  # The tie stores one bias instead of one per layer, and nothing else moves.
  assert base.argument_bytes - cand.argument_bytes == (LAYERS - 1) * bias_bytes
  assert row['loss_difference'] < 1e-6
