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

"""``flax_tieext.nnx.tie`` in tree mode vs the graph-mode shared reference.

The models of :mod:`flax_tieext.examples.nnx_tree`, each as a jitted Adam
train step (a function of the split model and optimizer state):

* baseline, graph mode: the head reads the one embedding module
  (``SharedLM``), the rematted blocks hold one ``Mask`` object (``Encoder``
  with ``share=True``);
* candidate, tree mode (``graph=False``): ``TiedLM`` (head tied to the
  transposed embedding) and the encoder with every block's mask tied to one.

Both compute the same function of the same stored variables, so FLOPs, temp
and argument bytes must agree (target ratio ≤ 1.01; measured 1.000) and each
step is traced once; trace + compile time is reported.
"""

import pytest

from conftest import ratio, record
from flax_tieext import _compat

nnx = pytest.importorskip('flax.nnx')
import flax_tieext.nnx  # pylint: disable=g-import-not-at-top,wrong-import-position

if not flax_tieext.nnx._TREE_MODE:  # pylint: disable=protected-access
  pytest.skip(f'Flax {_compat.FLAX_VERSION} has no NNX tree mode (graph=False)',
              allow_module_level=True)

from flax_tieext.examples import nnx_tree  # pylint: disable=g-import-not-at-top,wrong-import-position

CONFIG = nnx_tree.Config()
MODELS = {
    'lm': (lambda: nnx_tree.SharedLM(CONFIG, rngs=nnx.Rngs(0)),
           lambda: nnx_tree.TiedLM(CONFIG, rngs=nnx.Rngs(0))),
    'encoder': (lambda: nnx_tree.Encoder(CONFIG, share=True, graph=True,
                                         rngs=nnx.Rngs(0)),
                lambda: nnx_tree.tied_encoder(CONFIG, rngs=nnx.Rngs(0))),
}
_section = {}


@pytest.mark.parametrize('name', list(MODELS))
def test_tree_mode_tie_costs_what_graph_mode_sharing_costs(name, interleaved):
  make_shared, make_tied = MODELS[name]
  tokens = nnx_tree.batch(CONFIG)
  base, base_traces, base_losses = nnx_tree.train_step_stats(
      make_shared(), tokens, graph=True)
  tied, tied_traces, tied_losses = nnx_tree.train_step_stats(
      make_tied(), tokens, graph=False)

  def compile_graph():
    nnx_tree.train_step_stats(make_shared(), tokens, graph=True, steps=0)

  def compile_tree():
    nnx_tree.train_step_stats(make_tied(), tokens, graph=False, steps=0)

  timer = interleaved({'graph': compile_graph, 'tree': compile_tree})
  row = {
      'model': name,
      'flops': [base.flops, tied.flops, ratio(tied.flops, base.flops)],
      'temp_bytes': [base.temp_bytes, tied.temp_bytes,
                     ratio(tied.temp_bytes, base.temp_bytes)],
      'argument_bytes': [base.argument_bytes, tied.argument_bytes,
                         ratio(tied.argument_bytes, base.argument_bytes)],
      'traces': [base_traces, tied_traces, ratio(tied_traces, base_traces)],
      'compile_seconds': [timer.median('graph'), timer.median('tree'),
                          ratio(timer.median('tree'), timer.median('graph'))],
      'loss_difference': max(abs(a - b) for a, b in zip(base_losses, tied_losses)),
  }
  _section[name] = row
  record('nnx_tree_tie', dict(_section))

  for key in ('flops', 'temp_bytes', 'argument_bytes'):
    assert row[key][2] <= 1.01, (key, row[key])
  assert base_traces == tied_traces == 1
  assert row['loss_difference'] < 1e-5
