"""Two processes convert arrays that neither holds whole, in place.

Two ``jax.distributed`` processes (4 CPU devices each, gloo) hold a tied
source split over one 8-device mesh, so no process can read it (it is not
fully addressable). Each runs this file as a script: ``untie_variables`` and
``tie_variables`` (equal copies, a differing copy refused, ``merge='mean'``)
must give every output leaf the sharding of the leaf it comes from, without
gathering anything, and each process checks its own shards against values it
computes from the global arrays it built them from. The test reads what each
process wrote.
"""

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import flax_tieext
from flax_tieext.examples import launch

pytestmark = pytest.mark.end_to_end

LAYERS = 3


def test_two_processes_convert_arrays_neither_holds_whole(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=4')
  launch.launch([__file__, '--out', str(tmp_path)], 2, timeout=240, env=env)
  for i in range(2):
    with open(tmp_path / f'process_{i}.json') as f:
      seen = json.load(f)
    assert seen['process'] == [i, 2]
    assert not any(seen['fully_addressable'].values()), seen
    assert seen['specs'] == {
        'a': ['model', None], 'b': ['model', None], 'c': [None, 'model'],
        'stack/t': [None, 'model', None], 'tied_a': ['model', None],
        'merged_a': ['model', None]}, seen
    assert seen['same_objects'] == {'b': True, 'tied_a': True}
    assert seen['refused'].startswith(
        "Cannot tie /b to /a in collection 'params': /b/w differs from its"
        ' source /a/w (max abs difference 1.0)'), seen['refused']
    # Each process's shards of the mean equal the mean computed by hand.
    assert seen['shards_checked'] == 4 and seen['max_error'] < 1e-6, seen


def main():
  parser = argparse.ArgumentParser()
  for flag in ('--out', '--coordinator'):
    parser.add_argument(flag)
  parser.add_argument('--num-processes', type=int)
  parser.add_argument('--process-id', type=int)
  args = parser.parse_args()

  launch.initialize(args.coordinator, args.num_processes, args.process_id)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('model',))

  def global_array(value, spec):
    return jax.make_array_from_callback(
        value.shape, NamedSharding(mesh, spec), lambda index: value[index])

  a_host = np.arange(64.0, dtype=np.float32).reshape(8, 8)
  a = global_array(a_host, P('model'))
  own = global_array(np.zeros((LAYERS, 8), np.float32), P(None, 'model'))
  ties = {'b': 'a', 'c': ('a', jnp.transpose), 'stack/t': 'a'}
  stacks = {'stack': LAYERS}
  out = flax_tieext.untie_variables(
      {'params': {'a': {'w': a}, 'stack': {'own': own}}}, ties, stacks=stacks)
  params = out['params']
  leaves = {'a': a, 'b': params['b']['w'], 'c': params['c']['w'],
            'stack/t': params['stack']['t']['w']}

  tied = flax_tieext.tie_variables(out, ties, stacks=stacks)
  leaves['tied_a'] = tied['params']['a']['w']

  # A copy that differs by 1 in one element, made on the devices.
  plain = {'b': 'a', 'stack/t': 'a'}
  del params['c']
  params['b']['w'] = params['b']['w'].at[0, 0].add(1.0)
  try:
    flax_tieext.tie_variables(out, plain, stacks=stacks)
    refused = ''
  except flax_tieext.TieError as e:
    refused = str(e)
  merged = flax_tieext.tie_variables(out, plain, stacks=stacks, merge='mean')
  leaves['merged_a'] = merged['params']['a']['w']

  # The mean of the source, b and the stack's 3 layers, computed by hand.
  b_host = a_host.copy()
  b_host[0, 0] += 1.0
  expected = (a_host * (1 + LAYERS) + b_host) / (2 + LAYERS)
  errors = [float(np.max(np.abs(np.asarray(shard.data) - expected[shard.index])))
            for shard in leaves['merged_a'].addressable_shards]

  def spec(x):
    return [*x.sharding.spec] + [None] * (x.ndim - len(x.sharding.spec))

  seen = {
      'process': [jax.process_index(), jax.process_count()],
      'fully_addressable': {k: v.is_fully_addressable for k, v in leaves.items()},
      'specs': {k: spec(v) for k, v in leaves.items()},
      'same_objects': {'b': leaves['b'] is a, 'tied_a': leaves['tied_a'] is a},
      'refused': refused,
      'shards_checked': len(errors),
      'max_error': max(errors),
  }
  with open(os.path.join(args.out, f'process_{args.process_id}.json'), 'w') as f:
    json.dump(seen, f)
  return 0


if __name__ == '__main__':
  sys.exit(main())
