"""A dead process stops the job instead of hanging it; a restart resumes it.

One process of a 2-process job is killed with SIGKILL after step 3. The other
must exit on its own with an error that says a peer died, well before its
deadline (``jax.distributed`` declares a peer dead after
``--heartbeat-timeout`` seconds without heartbeats). Restarting both
processes from the last Orbax checkpoint must then reproduce the uninterrupted
run. Run by ``nox -s distributed``.
"""

import re
import signal

import numpy as np
import pytest

from flax_tieext.examples import launch
from flax_tieext.examples import scaling

pytestmark = pytest.mark.needs_patch  # the model uses nn.tie

STEPS, EVERY = 8, 2  # as the job's (conftest.py)
KILL_AFTER = 3
HEARTBEAT_S = 5
# JAX's coordination service, or the worker's own message after a failed
# collective (scaling.main).
PEER_DIED = re.compile(r'another task died|another process of the job has'
                       r' probably died')


@pytest.fixture(scope='module')
def killed(tmp_path_factory):
  """``{victim: (ProcessFailed, checkpoint dir)}``, lazily."""
  runs = {}

  def run(victim):
    if victim not in runs:
      root = tmp_path_factory.mktemp(f'killed_{victim}')
      ckpt = str(root / 'checkpoints')

      def kill_after_step(process_id, line, popen):
        if process_id == victim and line.startswith(f'step {KILL_AFTER}/'):
          popen.send_signal(signal.SIGKILL)

      with pytest.raises(launch.ProcessFailed) as failed:
        scaling.run_local_job(
            str(root / 'out'), 2, *_flags(ckpt), '--checkpoint-every',
            str(EVERY), on_line=kill_after_step, stop_others_on_failure=False)
      runs[victim] = failed.value, ckpt
    return runs[victim]

  return run


def _flags(ckpt):
  return ('--steps', str(STEPS), '--checkpoint-dir', ckpt,
          '--heartbeat-timeout', str(HEARTBEAT_S))


@pytest.mark.parametrize('victim', [0, 1], ids=['coordinator', 'worker'])
def test_killed_process_fails_the_job_without_a_hang(killed, victim):
  failed, _ = killed(victim)
  assert failed.results[victim].returncode == -signal.SIGKILL
  assert f'process {victim} was killed by SIGKILL' in str(failed)
  survivor = failed.results[1 - victim]
  # It ended by itself (the launcher stopped nobody), with an error that says
  # a peer died.
  assert not survivor.stopped, failed
  assert survivor.returncode != 0, survivor.output
  assert PEER_DIED.search(survivor.output), survivor.output


def test_restart_from_the_last_checkpoint_reproduces_the_run(
    killed, job, tmp_path):
  _, ckpt = killed(1)
  last = scaling.checkpoint_manager(ckpt).latest_step()
  assert last == KILL_AFTER // EVERY * EVERY
  resumed = scaling.run_local_job(str(tmp_path), 2, *_flags(ckpt), '--resume')
  assert f'resumed from step {last}' in resumed.results[0].output
  # The same program on the same mesh from the same state: the same numbers.
  uninterrupted, _ = job
  assert resumed.losses == uninterrupted.losses[last:]
  for name, value in uninterrupted.params.items():
    np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)
