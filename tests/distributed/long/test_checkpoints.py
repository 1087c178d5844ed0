"""Orbax checkpoints of the tied, sharded train state, restored on other meshes.

A 2-process job (:mod:`flax_tieext.examples.scaling`, 4 CPU devices per
process) saves its whole train state every 2 steps, each process writing the
shards it holds. This process restores it on 1 device and on 8 devices and
continues training. Run by ``nox -s distributed``.
"""

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from flax_tieext.examples import scaling

pytestmark = pytest.mark.needs_patch  # the model uses nn.tie

STEPS, SAVED = 8, 4  # the job's (conftest.py), a step it saved


def test_checkpoint_stores_the_tied_attention_once(job):
  _, checkpoints = job
  assert list(checkpoints.all_steps()) == [2, 4, 6, 8]
  params = checkpoints.item_metadata(STEPS)['params']
  assert [b for b in params if b.startswith('block_') and 'attn' in params[b]
          ] == ['block_0']
  # Saved with the sharding it was trained with (8 devices, 2 processes).
  kernel = params['block_0']['attn']['qkv']['kernel']
  assert tuple(kernel.sharding.partition_spec) == (None, None, 'model', None)
  assert list(kernel.sharding.shape) == [2, 4]


@pytest.mark.parametrize('devices', [1, 8])
def test_restore_on_another_mesh_and_continue(job, devices):
  out, checkpoints = job
  mesh = scaling.make_mesh(jax.devices()[:devices])

  final = scaling.restore(checkpoints, mesh)
  assert int(final['step']) == STEPS
  kernel = final['params']['block_0']['attn']['qkv']['kernel']
  assert kernel.sharding.mesh.devices.size == devices
  assert kernel.sharding.spec == P(None, None, 'model', None)
  restored = scaling.flatten(jax.device_get(final['params']))
  assert sorted(restored) == sorted(out.params)
  for name, value in out.params.items():
    np.testing.assert_array_equal(restored[name], value, err_msg=name)

  # From step 4, the same steps as the job: the same losses and params, up to
  # float32 sums taken in another order on another mesh.
  state = scaling.restore(checkpoints, mesh, step=SAVED)
  assert int(state['step']) == SAVED
  state, losses = scaling.train(state, STEPS, mesh)
  np.testing.assert_allclose(losses, out.losses[SAVED:], rtol=1e-6)
  continued = scaling.flatten(jax.device_get(state['params']))
  for name, value in out.params.items():
    np.testing.assert_allclose(continued[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)
