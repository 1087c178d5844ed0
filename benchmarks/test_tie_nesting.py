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

"""Init traces against tie nesting depth: ``nn.tie`` vs a ``map_variables`` tie.

The hand-made tie, ``nn.map_variables(Module, 'params', trans_in_fn=copy the
source into the target, trans_out_fn=drop the target, init=True,
mutable=True)``, runs the wrapped module twice while initializing (once to
create the variables, once with the mapped ones). Nested ``d`` times, that
doubling compounds. ``nn.tie`` traces every call site once. Two shapes of
nesting (see ``models.nested_ties``):

* ``pair``: every level calls two copies of the level below, ``b`` tied to
  ``a`` (``2**d`` call sites): ``nn.tie`` traces ``2**d``, ``map_variables``
  ``4**d``;
* ``chain``: every level calls one leaf and the level below (``d + 1`` call
  sites): ``nn.tie`` traces ``d + 1`` (linear), ``map_variables``
  ``3 * 2**d - 2``.

Traces are counted while ``init`` is traced abstractly (``jax.eval_shape``).
"""

import time

import jax
import jax.numpy as jnp
import pytest

from conftest import record
from flax_tieext.examples import attention
from models import call_sites, nested_ties, patched_flax

DEPTHS = range(1, 7)
INPUT = jax.ShapeDtypeStruct((1, 4, 8), jnp.float32)
_section = {}


def _traces_and_seconds(shape, depth, kind):
  model = nested_ties(shape, depth, kind)
  t0 = time.perf_counter()
  with attention.count_calls() as calls:
    variables = jax.eval_shape(model.init, jax.random.key(0), INPUT)
  seconds = time.perf_counter() - t0
  return calls.count, seconds, len(jax.tree_util.tree_leaves(variables))


@pytest.mark.parametrize('shape', ['pair', 'chain'])
def test_init_traces_against_tie_nesting_depth(shape, benchmark):
  rows = []
  with patched_flax():
    for depth in DEPTHS:
      tie = _traces_and_seconds(shape, depth, 'tie')
      mapped = _traces_and_seconds(shape, depth, 'map_variables')
      rows.append({
          'depth': depth,
          'call_sites': call_sites(shape, depth),
          'tie_traces': tie[0],
          'map_variables_traces': mapped[0],
          'tie_init_seconds': tie[1],
          'map_variables_init_seconds': mapped[1],
          'stored_arrays': [tie[2], mapped[2]],
      })
    # pytest-benchmark's own timing: nn.tie init at the deepest level, a new
    # model each round (jax.eval_shape caches by function).
    def fresh_model():
      model = nested_ties(shape, DEPTHS[-1], 'tie')
      return (model.init, jax.random.key(0), INPUT), {}

    benchmark.pedantic(jax.eval_shape, setup=fresh_model, rounds=3)
  _section[shape] = rows
  record('tie_nesting', dict(_section))

  hand_made = {'pair': lambda d: 4**d, 'chain': lambda d: 3 * 2**d - 2}[shape]
  for row in rows:
    assert row['tie_traces'] == row['call_sites']
    assert row['map_variables_traces'] == hand_made(row['depth'])
    assert row['stored_arrays'][0] == row['stored_arrays'][1]
