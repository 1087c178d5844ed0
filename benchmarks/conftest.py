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

"""Benchmark session setup: XLA flags, interleaved timing, the results file.

Run with ``nox -s bench`` (or ``pytest benchmarks``). Every benchmark compares
a candidate with a baseline measured in the same run, round by round
(baseline, candidate, baseline, ...), so that a change in the machine's load
hits both; it reports medians and their ratio. Results are written to
``benchmarks/results.json`` at the end of the session (sections of benchmarks
that did not run are kept from the previous file); ``benchmarks/render.py``
turns them into ``docs/benchmarks.md``.
"""

import datetime
import json
import os
import pathlib
import platform
import sys
from collections.abc import Callable

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top,wrong-import-position
from flax_tieext.examples import measure

# Before any computation: keep remat's optimization barriers on XLA:CPU.
REMAT_BARRIERS_KEPT = measure.keep_remat_on_cpu()

import flax
import jax
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

RESULTS = pathlib.Path(__file__).parent / 'results.json'
ROUNDS = int(os.environ.get('BENCH_ROUNDS', '5'))

_results: dict = {}


def record(section: str, value) -> None:
  """Stores ``value`` (JSON-able) as ``section`` of ``results.json``."""
  _results[section] = value


def ratio(candidate: float, baseline: float) -> float:
  return candidate / baseline if baseline else float('nan')


@pytest.fixture
def interleaved(benchmark):
  """``run(fns, rounds)``: pytest-benchmark times the rounds, we the parts.

  Returns the ``measure.Interleaved`` with every function's samples.
  """

  def run(fns: dict[str, Callable[[], object]], rounds: int = ROUNDS):
    timer = measure.Interleaved(fns)
    benchmark.pedantic(timer.one_round, rounds=rounds, iterations=1)
    benchmark.extra_info.update(
        {f'median_{name}_s': timer.median(name) for name in fns})
    return timer

  return run


def _meta() -> dict:
  return {
      'date': datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%d %H:%M UTC'),
      'python': platform.python_version(),
      'flax': flax.__version__,
      'jax': jax.__version__,
      'backend': jax.default_backend(),
      'cpus': os.cpu_count(),
      'machine': platform.machine(),
      'rounds': ROUNDS,
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
      'remat_barriers_kept': REMAT_BARRIERS_KEPT,
  }


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if not _results:
    return
  previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
  merged = {**previous.get('results', {}), **_results}
  RESULTS.write_text(json.dumps({'meta': _meta(), 'results': merged},
                                indent=2, sort_keys=True) + '\n')
