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

"""``nn.tie`` + remat vs the upstream idiom for sharing one module.

An ALBERT-style encoder whose blocks share one attention module
(:mod:`flax_tieext.examples.albert`), rematted:

* baseline, on upstream Flax (patch uninstalled): one ``SelfAttention``
  created in the encoder and passed into every ``nn.remat`` block as an
  attribute;
* candidate, patched: every block has its own ``attn`` path, tied to
  ``block_0/attn`` with ``nn.tie``.

Both compute the same function of the same stored parameters, so FLOPs, temp
and argument bytes and init traces must match exactly (ratio 1.000); compile
time should stay within 1.10x. Measured on a jitted loss-and-gradient step.
"""

import functools

import jax
import jax.numpy as jnp
import pytest

from conftest import ratio, record
from flax_tieext.examples import attention
from flax_tieext.examples import measure
from flax_tieext.examples import task
from models import albert, patched_flax, upstream_flax

BATCH_SIZE = 8
_section = {}


def _grad_fn(model):
  return jax.jit(jax.value_and_grad(functools.partial(albert.loss_fn, model)))


def _init(model, tokens):
  with attention.count_calls() as calls:
    variables = model.init(jax.random.key(0), tokens)
  return variables['params'], calls.count


def _to_tied_layout(params):
  """The shared module's params, moved from ``attn`` to ``block_0/attn``."""
  params = dict(params)
  params['block_0'] = {**params['block_0'], 'attn': params.pop('attn')}
  return params


def _max_abs_difference(a, b):
  return max(float(jnp.max(jnp.abs(x - y)))
             for x, y in zip(jax.tree_util.tree_leaves(a),
                             jax.tree_util.tree_leaves(b)))


@pytest.mark.parametrize('layers', [12, 24])
def test_tie_matches_a_shared_module_on_upstream_flax(layers, interleaved):
  config = albert.AlbertConfig(num_layers=layers)
  tokens, targets = task.synthetic_batch(
      jax.random.key(1), BATCH_SIZE, config.length, config.vocab_size)

  with upstream_flax():
    base_model = albert.make_encoder(config, sharing='module')
    base_params, base_traces = _init(base_model, tokens)
    base_fn, base = measure.compile_stats(
        _grad_fn(base_model), base_params, tokens, targets)
  with patched_flax():
    tied_model = albert.make_encoder(config, sharing='tie')
    _, tied_traces = _init(tied_model, tokens)
    params = _to_tied_layout(base_params)
    tied_fn, tied = measure.compile_stats(
        _grad_fn(tied_model), params, tokens, targets)

  base_loss, base_grads = base_fn(base_params, tokens, targets)
  tied_loss, tied_grads = tied_fn(params, tokens, targets)

  def compile_upstream():
    with upstream_flax():
      measure.compile_stats(_grad_fn(base_model), base_params, tokens, targets)

  def compile_tied():
    with patched_flax():
      measure.compile_stats(_grad_fn(tied_model), params, tokens, targets)

  timer = interleaved({'upstream': compile_upstream, 'tie': compile_tied})
  row = {
      'layers': layers,
      'flops': [base.flops, tied.flops, ratio(tied.flops, base.flops)],
      'temp_bytes': [base.temp_bytes, tied.temp_bytes,
                     ratio(tied.temp_bytes, base.temp_bytes)],
      'argument_bytes': [base.argument_bytes, tied.argument_bytes,
                         ratio(tied.argument_bytes, base.argument_bytes)],
      'init_traces': [base_traces, tied_traces,
                      ratio(tied_traces, base_traces)],
      'compile_seconds': [timer.median('upstream'), timer.median('tie'),
                          ratio(timer.median('tie'), timer.median('upstream'))],
      'loss_difference': abs(float(base_loss) - float(tied_loss)),
      'grad_difference': _max_abs_difference(
          _to_tied_layout(base_grads), tied_grads),
  }
  _section[str(layers)] = row
  record('shared_attention', dict(_section))

  assert row['flops'][2] == 1.0
  assert row['temp_bytes'][2] == 1.0
  assert row['argument_bytes'][2] == 1.0
  assert row['init_traces'][2] == 1.0
  assert row['grad_difference'] < 1e-5
