"""Runs the generated tie differential at scale, in many processes.

``tests/test_tie_generated.py`` draws tied programs from a seed and checks
each against the same program written with one shared module instance. The
test run draws a few (more under ``--end-to-end``); this runs as many as
asked, on every core, with the interpreter it is started with (a release's
nox environment), and writes what it checked as JSON:

  $ .nox/matrix-0-12-12/bin/python tools/generated_ties.py --programs 2000 \
      --json generated-0.12.12.json

Each worker is a fresh interpreter (no fork after JAX starts) that checks
``--chunk`` programs per seed, seeds counted from ``--first-seed`` (apart from
the test's own seeds). XLA's backend optimizations are off, as in the test
run (tests/conftest.py). A difference stops nothing: every failing program is
written out (seed, program, error and both sources) and the exit status is 1.
"""

import argparse
import collections
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEEDS_PER_WORKER = 4  # then a fresh interpreter


def _work(seed: int, count: int):
  """Checks ``count`` programs from ``seed``: (seed, drawn, CPU-s, families, failure)."""
  sys.path.insert(0, str(ROOT / 'tests'))
  import test_tie_generated as generated  # pylint: disable=g-import-not-at-top
  try:
    drawn, seconds, families = generated.run(seed, count)
  except AssertionError as e:
    return seed, None, None, {}, str(e)
  return seed, drawn, seconds, dict(families), None


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--programs', type=int, default=2000)
  parser.add_argument('--chunk', type=int, default=25, help='programs per seed')
  parser.add_argument('--first-seed', type=int, default=100_000)
  parser.add_argument('--processes', type=int, default=os.cpu_count())
  parser.add_argument('--json', type=pathlib.Path, required=True)
  args = parser.parse_args(argv)
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  os.environ['XLA_FLAGS'] = ' '.join(filter(None, (
      os.environ.get('XLA_FLAGS'), '--xla_backend_optimization_level=0')))
  seeds = range(args.first_seed, args.first_seed + -(-args.programs // args.chunk))
  start, cpu = time.time(), 0.0
  checked, drawn, families_seen = 0, 0, collections.Counter()
  failures = []
  import flax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  def record():  # written after each seed: a run cut short leaves its count
    return {
        'flax': flax.__version__, 'jax': jax.__version__,
        'python': platform.python_version(), 'processes': args.processes,
        'seeds': [seeds.start, seeds.stop - 1], 'programs_per_seed': args.chunk,
        'checked': checked, 'drawn': drawn,
        # a program counts in each family it belongs to (test_tie_generated)
        'families': dict(sorted(families_seen.items())),
        'checking_cpu_s': round(cpu, 1), 'wall_s': round(time.time() - start, 1),
        'seeds_with_a_difference': len(failures), 'failures': failures,
    }

  context = multiprocessing.get_context('spawn')
  # Fresh interpreters every few seeds: one that checked ~900 programs ran out
  # of mapped memory for compiled code (Flax 0.12.0 / JAX 0.8.1). A pool per
  # batch, since ProcessPoolExecutor's max_tasks_per_child hangs on Python
  # 3.11 once its first workers retire.
  batch = args.processes * SEEDS_PER_WORKER
  for first in range(0, len(seeds), batch):
    some = seeds[first:first + batch]
    with concurrent.futures.ProcessPoolExecutor(
        args.processes, mp_context=context) as pool:
      for seed, n, seconds, families, failure in pool.map(
          _work, some, [args.chunk] * len(some)):
        if failure is not None:
          failures.append({'seed': seed, 'failure': failure})
          print(f'seed {seed}: a difference\n{failure}', flush=True)
        else:
          checked, drawn, cpu = checked + args.chunk, drawn + n, cpu + seconds
          families_seen.update(families)
          print(f'seed {seed}: {args.chunk} checked of {n} drawn, {seconds:.1f}'
                f' CPU-s; {checked} so far, {time.time() - start:.0f} s',
                flush=True)
        args.json.write_text(json.dumps(record(), indent=1) + '\n')
  record = record()
  args.json.write_text(json.dumps(record, indent=1) + '\n')
  print(json.dumps({k: v for k, v in record.items() if k != 'failures'}))
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
