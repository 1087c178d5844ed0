"""``flax-tieext --processes 2``: the demo trained by a 2-process job.

Run by ``nox -s distributed`` (the default run keeps one 2-process test,
``tests/distributed/test_two_processes.py``).
"""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.needs_patch  # the demo uses nn.tie


def test_demo_trains_across_processes_and_prints_the_table():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('FLAX_TIEEXT_AUTOPATCH', None)
  result = subprocess.run(
      [sys.executable, '-m', 'flax_tieext.demo', '--layers', '2', '--steps',
       '3', '--processes', '2'],
      capture_output=True, text=True, timeout=600, check=False, env=env)
  assert result.returncode == 0, result.stderr
  assert 'trained tied, remat, 2 processes x batch 8 for 3 optax steps' in (
      result.stdout), result.stdout
  assert re.search(r"in collection 'graph' \(count, bytes\)\s+1 \(4\.0 KiB\)"
                   r"\s+2 \(8\.0 KiB\)\s+0\.500", result.stdout), result.stdout
  match = re.search(r'max \|grad tied - grad untied\| = (\S+),', result.stdout)
  assert match and float(match.group(1)) < 1e-5, result.stdout
  assert re.search(r'train \[#+\] 3/3', result.stderr), result.stderr
  # The workers say what they are doing while they start and compile.
  for worker in (0, 1):
    assert f'worker {worker}: joining jax.distributed' in result.stderr
  assert 'worker 0: compiling loss + gradient' in result.stderr
