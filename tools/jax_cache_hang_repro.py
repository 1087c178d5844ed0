# Copyright 2026 The flax-tieext Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""JAX 0.12.1: a two-process CPU job hangs once the persistent compilation cache holds its step.

Plain JAX, no Flax, no flax_tieext (docs/support_matrix.md, beside the pin).
Two local ``jax.distributed`` processes (gloo collectives) of four CPU devices
each run a jitted SGD step sharded over a (data 2, model 4) mesh. Run it twice
with the cache on (``patches/jax/persistent_cache_multiprocess_hang.md``
inlines this file below its header and shows what it printed)::

    export JAX_COMPILATION_CACHE_DIR=$(mktemp -d)
    export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
    export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
    export JAX_LOGGING_LEVEL=WARNING JAX_DEBUG_LOG_MODULES=jax._src.compiler,jax._src.cache_key
    python tools/jax_cache_hang_repro.py; python tools/jax_cache_hang_repro.py

The first run compiles in both processes and finishes; only process 0
writes the cache. In the second, process 0 loads the step from the cache and
process 1 misses it (their cache keys differ in the hash of
``accelerator_config``, the devices' topology) and compiles it; on JAX 0.12.1
the step's first collective then never completes, and the script kills the
job after its deadline (60 s; first argument) and exits 1. Each process's
cache log lines are printed (with the debug modules above). JAX 0.12.0.1
finishes both runs, and 0.12.1 finishes every run without the cache.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

# The children's log lines that say what the persistent cache did.
CACHE_LOG = re.compile(r'persistent compilation cache (hit|miss)|Writing .* to persistent'
                       r'|Not writing persistent|hash of serialized', re.I)


def child(coordinator, process_id):
  """One process of the job: four steps, each loss printed."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,g-importing-member

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=2,
                             process_id=process_id, initialization_timeout=60,
                             heartbeat_timeout_seconds=5, shutdown_timeout_seconds=10)
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ('data', 'model'))
  params_sharding = {'w1': NamedSharding(mesh, P(None, 'model')),
                     'w2': NamedSharding(mesh, P('model', None))}
  data_sharding = NamedSharding(mesh, P('data', None))
  rng = np.random.RandomState(0)
  host = {'w1': rng.randn(16, 32).astype(np.float32) * .1,
          'w2': rng.randn(32, 16).astype(np.float32) * .1}
  params = {k: jax.make_array_from_callback(v.shape, params_sharding[k], lambda i, v=v: v[i])
            for k, v in host.items()}

  def loss_fn(p, x, y):
    return jnp.mean((jnp.tanh(x @ p['w1']) @ p['w2'] - y) ** 2)

  def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

  step = jax.jit(step, in_shardings=(params_sharding, data_sharding, data_sharding),
                 out_shardings=(params_sharding, NamedSharding(mesh, P())), donate_argnums=0)
  for i in range(4):
    x, y = (jax.make_array_from_callback(a.shape, data_sharding, lambda idx, a=a: a[idx])
            for a in (rng.randn(8, 16).astype(np.float32) for _ in range(2)))
    params, loss = step(params, x, y)
    print(f'process {process_id}: step {i + 1} loss {float(loss):.5f}', flush=True)
  jax.distributed.shutdown()


def main(deadline):
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    coordinator = f'127.0.0.1:{s.getsockname()[1]}'
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=4')
  logs = [tempfile.TemporaryFile('w+') for _ in range(2)]
  procs = [subprocess.Popen([sys.executable, '-u', __file__, 'child', coordinator, str(i)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
           for i, log in enumerate(logs)]
  start, hung = time.monotonic(), None
  for i, proc in enumerate(procs):
    try:
      proc.wait(timeout=max(1, deadline - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
      hung = i
      break
  for proc in procs:
    proc.kill()
    proc.wait()
  for i, (proc, log) in enumerate(zip(procs, logs)):
    log.seek(0)
    lines = log.read().splitlines()
    for line in dict.fromkeys(l[l.find('jax._src'):] for l in lines if CACHE_LOG.search(l)):
      print(f'process {i}: {line}')
    steps = [line for line in lines if ': step ' in line]
    print(f'process {i}: exit {proc.returncode}, {len(steps)} steps')
  if hung is not None:
    print(f'HUNG: process {hung} still running after {deadline:.0f} s; killed the job')
    return 1
  return 0


if __name__ == '__main__':
  if sys.argv[1:2] == ['child']:
    child(sys.argv[2], int(sys.argv[3]))
  else:
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 60))
