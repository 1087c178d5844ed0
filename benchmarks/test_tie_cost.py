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

"""Python calls of ``init`` and of a grad trace: N tied blocks vs one shared.

``N`` rematted blocks, each tied to ``block_0`` with ``nn.tie``, against the
same model with one ``block_0`` called ``N`` times (see
``flax_tieext.examples.tie_cost``). Calls are counted with ``sys.setprofile``
(``'call'`` events) while each is traced abstractly, so the counts are
deterministic; the ratio tied / hand-shared must stay a constant factor as
``N`` grows (resolving a path looks up the ties of that path, not all of
them). pytest-benchmark times the tied ``init`` at the largest size.
"""

import jax

from conftest import record
from flax_tieext.examples import tie_cost
from models import patched_flax

BLOCKS = (8, 32, 128, 512)


def test_python_calls_of_tied_blocks_against_one_shared(benchmark):
  with patched_flax():
    rows = [tie_cost.ratios(n) for n in BLOCKS]

    def fresh_model():
      m = tie_cost.model(BLOCKS[-1], 'tied')
      return (m.init, jax.random.key(0), tie_cost.INPUT), {}

    benchmark.pedantic(jax.eval_shape, setup=fresh_model, rounds=1)
  record('tie_cost', rows)
  init = [row['init_ratio'] for row in rows]
  assert max(init) - min(init) < 0.02, init  # a constant factor
  assert max(init) <= 1.05, init  # issue 24: at every size
  assert all(row['grad_ratio'] < 1.05 for row in rows), rows
