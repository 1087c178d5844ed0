"""The uninterrupted 2-process job the long tests compare against.

This process restores checkpoints on 8 CPU devices too; XLA reads the flag
when JAX starts its backend, after collection.
"""

import os

import pytest

if '--xla_force_host_platform_device_count' not in os.environ.get(
    'XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8')

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
