"""Ties keep partitioning metadata, and sharded training is JAX's job.

An ALBERT-style encoder annotates its attention kernels with
``nn.with_partitioning`` (mesh axes) or ``nn.with_logical_partitioning``
(logical axes); blocks are rematted and every block's attention is tied to
block 0's. The source keeps its ``Partitioned`` box (the target has none: it is
not stored), and a jitted train step runs sharded on an 8-device CPU mesh
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, in an interpreter of
its own),
computing what the same step computes on one device.
"""

import functools
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import flax_tieext  # noqa: F401

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
# end_to_end: an 8-device mesh in an interpreter of its own, a train step compiled twice; the README's test run leaves it to --end-to-end.
pytestmark = [pytest.mark.needs_patch, pytest.mark.end_to_end]

D, N = 8, 3


def kernel_init(logical):
  init = nn.initializers.lecun_normal()
  if logical:
    return nn.with_logical_partitioning(init, ('embed', 'mlp'))
  return nn.with_partitioning(init, (None, 'model'))


class Attn(nn.Module):
  logical: bool

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(D, kernel_init=kernel_init(self.logical), name='qkv')(x)
    return x + jnp.tanh(h)


class Block(nn.Module):
  logical: bool

  @nn.compact
  def __call__(self, x):
    x = Attn(self.logical, name='attn')(x)
    return x + nn.Dense(D, name='ff')(x)


class Encoder(nn.Module):
  logical: bool

  @nn.compact
  def __call__(self, x):
    for i in range(N):
      x = nn.remat(Block)(self.logical, name=f'block_{i}')(x)
    return x


TIES = {f'block_{i}/attn': 'block_0/attn' for i in range(1, N)}
RULES = (('embed', None), ('mlp', 'model'), ('batch', 'data'))


EIGHT_DEVICES = '--xla_force_host_platform_device_count=8'


def passes_on_eight_devices(request):
  """Runs the calling test again in an interpreter with 8 CPU devices.

  XLA fixes the device count when JAX first computes, so the flag cannot be
  set for one test of a running suite; the rest of the suite keeps one device.
  """
  env = dict(os.environ)
  env['XLA_FLAGS'] = f"{env.get('XLA_FLAGS', '')} {EIGHT_DEVICES}".strip()
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-n', '0', request.node.nodeid,
       *(['--opted-out-too'] if request.config.getoption('opted_out_too') else [])],
      cwd=request.config.rootpath, env=env, capture_output=True, text=True,
      check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert '1 passed' in result.stdout, result.stdout


def make_mesh():
  return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ('data', 'model'))


@pytest.mark.parametrize('logical', [False, True], ids=['mesh', 'logical'])
def test_source_keeps_partitioning_metadata(logical):
  model = nn.tie(Encoder, TIES)(logical)
  abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((4, D)))
  box = abstract['params']['block_0']['attn']['qkv']['kernel']
  expected = nn.LogicallyPartitioned if logical else nn.Partitioned
  assert isinstance(box, expected)
  assert box.names == (('embed', 'mlp') if logical else (None, 'model'))
  for i in range(1, N):
    assert 'attn' not in abstract['params'][f'block_{i}']
  specs = nn.get_partition_spec(abstract)
  assert specs['params']['block_0']['attn']['qkv']['kernel'] == P(
      *box.names)


@pytest.mark.parametrize('logical', [False, True], ids=['mesh', 'logical'])
def test_sharded_train_step_matches_single_device(logical, request):
  if jax.device_count() < 8:
    passes_on_eight_devices(request)
    return
  mesh = make_mesh()
  model = nn.tie(Encoder, TIES)(logical)
  x = jax.random.normal(jax.random.key(1), (4, D))

  def loss(params, x):
    return jnp.mean(model.apply({'params': params}, x) ** 2)

  def step(params, x):
    grads = jax.grad(loss)(params, x)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

  boxed = model.init(jax.random.key(0), x)['params']
  params = nn.meta.unbox(boxed)
  expected = jax.jit(step)(params, x)  # one device, no shardings

  specs = nn.get_partition_spec(boxed)
  if logical:
    specs = nn.logical_to_mesh(specs, RULES)
  shardings = jax.tree_util.tree_map(
      lambda spec: NamedSharding(mesh, spec), specs,
      is_leaf=lambda s: isinstance(s, P))
  data_sharding = NamedSharding(mesh, P('data', None))
  sharded_params = jax.device_put(params, shardings)
  sharded_x = jax.device_put(x, data_sharding)
  sharded_step = jax.jit(step, in_shardings=(shardings, data_sharding),
                         out_shardings=shardings)
  new_params = sharded_step(sharded_params, sharded_x)

  kernel = new_params['block_0']['attn']['qkv']['kernel']
  assert kernel.sharding.spec == P(None, 'model')
  assert len(kernel.sharding.device_set) == 8
  jax.tree_util.tree_map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6),
      jax.device_get(new_params), jax.device_get(expected))
