"""A tied, sharded model trained by two processes computes what one does.

Two ``jax.distributed`` processes with 4 CPU devices each train the tied
ALBERT-style encoder of :mod:`flax_tieext.examples.scaling` on one 8-device
``('data', 'model')`` mesh, parameters split over ``'model'`` across the two
processes; the reference is the same code in this process on one device.
The rest of the distributed suite (Orbax, faults) is in ``long/``, run by
``nox -s distributed``.
"""

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from flax_tieext.examples import albert
from flax_tieext.examples import scaling

pytestmark = [pytest.mark.needs_patch,  # the worker uses nn.tie
              pytest.mark.end_to_end]

STEPS = 4


def _spec(names):
  """A partition spec as a list without trailing ``None`` (the same spec)."""
  names = list(names)
  while names and names[-1] is None:
    names.pop()
  return names


def test_two_processes_train_like_one(tmp_path):
  job = scaling.run_local_job(str(tmp_path), 2, '--steps', str(STEPS))

  mesh = scaling.make_mesh(jax.devices()[:1])
  state, losses = scaling.train(scaling.init_state(mesh), STEPS, mesh)
  expected = scaling.flatten(jax.device_get(state['params']))

  # Equal up to float32 sums taken in another order (8 shards, gloo).
  for process in job.processes:
    np.testing.assert_allclose(process['losses'], losses, rtol=1e-6)
  assert sorted(job.params) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(job.params[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)

  # The tie holds across processes: block_0/attn is stored once, no other
  # block stores an attention.
  assert 'block_0/attn/qkv/kernel' in job.params
  assert not [k for k in job.params if '/attn/' in k and
              not k.startswith('block_0/')]

  # Every process holds every parameter sharded as its logical axes say.
  tokens = jax.ShapeDtypeStruct((2, scaling.CONFIG.length), np.int32)
  boxed = jax.eval_shape(scaling.make_model().init, jax.random.key(0),
                         tokens)['params']
  specs = scaling.flatten(nn.logical_to_mesh(
      nn.get_partition_spec(boxed), albert.LOGICAL_AXIS_RULES))
  assert specs['block_0/attn/qkv/kernel'] == P(None, None, 'model', None)
  for process in job.processes:
    assert {k: _spec(v['spec']) for k, v in process['placement'].items()} == {
        k: _spec(v) for k, v in specs.items()}

  # 'model' spans the processes: each holds half of the tied attention's heads.
  heads = [{tuple(s[2]) for s in p['placement']['block_0/attn/qkv/kernel']
            ['local_slices']} for p in job.processes]
  assert heads == [{(0, 1), (1, 2)}, {(2, 3), (3, 4)}]
