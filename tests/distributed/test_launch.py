"""The launcher of local multi-process jobs: deadlines and failures.

The processes here are tiny Python programs (no JAX); the launcher appends
``--coordinator``, ``--num-processes`` and ``--process-id``, which they read
from ``sys.argv``.
"""

import time

import pytest

from flax_tieext.examples import launch

# Process 1 fails after a moment; process 0 would run for a minute.
ONE_FAILS = '''
import sys, time
me = int(sys.argv[sys.argv.index('--process-id') + 1])
print(f'process {me} up', flush=True)
if me == 1:
  time.sleep(0.5)
  sys.exit('process 1: the data file is missing')
time.sleep(60)
'''


def test_all_succeed_and_see_the_job_flags():
  code = ('import sys; a = sys.argv; i = a.index("--process-id");'
          ' print(a[a.index("--num-processes") + 1], a[i + 1],'
          ' a[a.index("--coordinator") + 1].split(":")[0])')
  results = launch.launch(['-c', code], 3, timeout=60)
  assert [r.returncode for r in results] == [0, 0, 0]
  assert [r.output.split() for r in results] == [
      ['3', str(i), '127.0.0.1'] for i in range(3)]


def test_a_failure_stops_the_others_and_names_the_process():
  lines = []
  start = time.monotonic()
  with pytest.raises(launch.ProcessFailed) as failed:
    launch.launch(['-c', ONE_FAILS], 2, timeout=60,
                  on_line=lambda i, line, _: lines.append((i, line)))
  assert time.monotonic() - start < 30  # process 0 was not waited for
  error = failed.value
  assert error.failed.process_id == 1
  assert error.failed.returncode == 1
  message = str(error)
  assert message.startswith('process 1 exited with code 1 after')
  assert 'process 0 was stopped by the launcher' in message
  assert 'process 1: the data file is missing' in message  # its output
  assert error.results[0].stopped and error.results[0].returncode < 0
  assert sorted(lines) == [(0, 'process 0 up'), (1, 'process 1 up'),
                           (1, 'process 1: the data file is missing')]


def test_the_deadline_stops_every_process():
  with pytest.raises(launch.ProcessFailed) as failed:
    launch.launch(['-c', 'import time; time.sleep(60)'], 2, timeout=1)
  assert str(failed.value).startswith(
      'timed out after 1 s: process 0, process 1 still running.')
  assert all(r.stopped for r in failed.value.results)


def test_without_stopping_others_a_survivor_runs_on():
  with pytest.raises(launch.ProcessFailed) as failed:
    launch.launch(['-c', ONE_FAILS.replace('time.sleep(60)', 'time.sleep(2)')],
                  2, timeout=60, stop_others_on_failure=False)
  survivor = failed.value.results[0]
  assert not survivor.stopped and survivor.returncode == 0
  assert survivor.seconds >= 2
  assert failed.value.failed.process_id == 1
