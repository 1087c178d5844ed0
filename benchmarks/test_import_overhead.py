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

"""What ``import flax_tieext`` costs on top of ``import flax.linen``.

Measured in fresh interpreters (nothing cached in ``sys.modules``): each run
imports ``flax.linen``, then ``flax_tieext`` (which installs the patch), and
reports both durations. The median over several runs is reported; the
target is at most 50 ms.
"""

import json
import os
import statistics
import subprocess
import sys

from conftest import ROUNDS, record

RUNS = max(ROUNDS, 7)
SCRIPT = """
import json, time
t0 = time.perf_counter()
import flax.linen
t1 = time.perf_counter()
import flax_tieext
t2 = time.perf_counter()
assert flax_tieext.is_installed()
print(json.dumps({'flax_linen': t1 - t0, 'flax_tieext': t2 - t1}))
"""


def _one_run() -> dict:
  env = dict(os.environ, FLAX_TIEEXT_AUTOPATCH='1', JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True,
                       text=True, check=True, env=env)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_overhead(benchmark):
  runs = []

  def one_round():
    runs.append(_one_run())

  _one_run()  # warm-up: fills the OS file cache
  benchmark.pedantic(one_round, rounds=RUNS, iterations=1)
  flax_linen = statistics.median(r['flax_linen'] for r in runs)
  overhead = statistics.median(r['flax_tieext'] for r in runs)
  record('import_overhead', {
      'runs': len(runs),
      'flax_linen_seconds': flax_linen,
      'flax_tieext_seconds': overhead,
      'relative': overhead / flax_linen,
  })
