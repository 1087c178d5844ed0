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

"""Remat's memory saving is kept when the blocks are tied.

The T5-style encoder of the demo, loss and gradient with dropout off: the
compiled temp bytes (XLA ``memory_analysis``) of the tied encoder with its
blocks rematted, against the tied encoder without remat, and the same ratio
for the untied encoder. A tie that broke remat (e.g. by saving the lifted
source's activations, or by defeating the recomputation) would show up as a
tied ratio above the untied one.

XLA:CPU only keeps remat's recomputation apart from the forward pass with the
flag ``measure.keep_remat_on_cpu`` sets (the session's conftest sets it).
"""

import functools

import jax
import pytest

from conftest import ratio, record
from flax_tieext.examples import measure
from flax_tieext.examples import task
from models import patched_flax, t5

BATCH_SIZE = 8
_section = {}


def _stats(config, tied, remat):
  model = t5.make_encoder(config, tied=tied, remat=remat)
  tokens = jax.ShapeDtypeStruct((BATCH_SIZE, config.length), 'int32')
  shapes = jax.eval_shape(functools.partial(model.init, deterministic=True),
                          jax.random.key(0), tokens)
  fn = jax.jit(jax.value_and_grad(functools.partial(t5.loss_fn, model)))
  return measure.compile_stats(
      fn, shapes['params'], {'graph': shapes['graph']}, tokens, tokens)[1]


@pytest.mark.parametrize('layers', [12, 24])
def test_remat_saves_as_much_memory_when_tied(layers, benchmark):
  config = t5.T5Config(num_layers=layers)
  with patched_flax():
    stats = {(tied, remat): _stats(config, tied, remat)
             for tied in (True, False) for remat in (True, False)}
    # pytest-benchmark's own timing: compiling the tied, rematted encoder.
    benchmark.pedantic(_stats, (config, True, True), rounds=1, iterations=1)
  temp = {k: v.temp_bytes for k, v in stats.items()}
  row = {
      'layers': layers,
      'tied_temp_bytes': [temp[True, True], temp[True, False],
                          ratio(temp[True, True], temp[True, False])],
      'untied_temp_bytes': [temp[False, True], temp[False, False],
                            ratio(temp[False, True], temp[False, False])],
      'tied_argument_bytes': stats[True, True].argument_bytes,
      'untied_argument_bytes': stats[False, True].argument_bytes,
      'remat_barriers_kept': measure.keep_remat_on_cpu(),
  }
  _section[str(layers)] = row
  record('remat_memory', dict(_section))

  assert temp[True, True] == temp[False, True]
  assert temp[True, False] == temp[False, False]
  if row['remat_barriers_kept']:
    assert temp[True, True] < temp[True, False]
