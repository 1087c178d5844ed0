"""The uninterrupted 2-process job the long tests compare against."""

import pytest

from flax_tieext.examples import scaling

STEPS, EVERY = 8, 2


@pytest.fixture(scope='session')
def job(tmp_path_factory):
  """``(output, checkpoints)`` of 8 steps in 2 processes, saved every 2."""
  root = tmp_path_factory.mktemp('job')
  ckpt = str(root / 'checkpoints')
  out = scaling.run_local_job(
      str(root / 'out'), 2, '--steps', str(STEPS), '--checkpoint-dir', ckpt,
      '--checkpoint-every', str(EVERY))
  return out, scaling.checkpoint_manager(ckpt)
