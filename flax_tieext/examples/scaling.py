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

"""The tied ALBERT-style encoder trained on a mesh that spans processes.

One copy of this program runs on every host (process) of a
``jax.distributed`` job::

  python -m flax_tieext.examples.scaling --steps 8 \\
      --checkpoint-dir /tmp/ckpt --out /tmp/run \\
      --coordinator HOST0:PORT --num-processes 2 --process-id I

Every block's attention is tied to ``block_0/attn`` with ``nn.tie``, every
block is rematted with ``static_argnames=('deterministic',)``, and every
parameter carries logical axis names (``nn.with_logical_partitioning``) that
:data:`albert.LOGICAL_AXIS_RULES` maps onto one ``('data', 'model')`` mesh
over all devices of all processes: attention heads, feed-forward width and
vocabulary are split over ``'model'``, which spans the processes; the batch is
split over ``'data'``. Without ``--coordinator`` the same code trains in one
process on its local devices (the reference the tests compare against).

Each step's loss goes to stdout (``step 3/8 loss 4.1588``); Orbax checkpoints
of the whole train state (step, parameters, optimizer state) go to
``--checkpoint-dir`` every ``--checkpoint-every`` steps, and ``--resume``
continues from the latest one. With ``--out``, every process writes what it
holds to ``process_<i>.json`` and process 0 the gathered parameters to
``params.npz``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import orbax.checkpoint as ocp

import flax_tieext  # noqa: F401  (installs nn.tie and static_argnames)
from flax_tieext.examples import albert
from flax_tieext.examples import launch
from flax_tieext.examples import task

CONFIG = albert.AlbertConfig(num_layers=4, d_model=32, num_heads=4, d_ff=64,
                             length=16)
BATCH_SIZE = 8
LEARNING_RATE = 0.1
MESH_AXES = ('data', 'model')

State = dict[str, Any]  # {'step': int32[], 'params': ..., 'opt_state': ...}


# ---------------------------------------------------------------------------
# The job: one mesh over every process's devices
# ---------------------------------------------------------------------------


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``('data', 'model')`` mesh, ``'model'`` spanning the processes.

  ``jax.devices()`` lists each process's devices together; taking them two at
  a time as the ``'data'`` pairs puts every process on the ``'model'`` axis,
  so each parameter's shards live in several processes (8 devices in 2
  processes: ``data`` 2 x ``model`` 4, each process holding 2 of the 4 model
  shards). One device gives a 1 x 1 mesh.
  """
  devices = np.array(jax.devices() if devices is None else devices)
  data = 2 if devices.size % 2 == 0 else 1
  return Mesh(devices.reshape(-1, data).T, MESH_AXES)


def make_model() -> nn.Module:
  """The tied, rematted, annotated encoder."""
  return albert.make_encoder(CONFIG, sharing='tie', logical_axes=True)


def optimizer() -> optax.GradientTransformation:
  """SGD with momentum.

  Its update is linear in the gradient, so runs that sum in another order
  (other meshes, other process counts) stay within float32 rounding of each
  other; Adam's division by the gradients' RMS would amplify that rounding
  where a gradient is near zero.
  """
  return optax.sgd(LEARNING_RATE, momentum=0.9)


def batch(step: int) -> tuple[jax.Array, jax.Array]:
  """The global batch of ``step``: the same on every process, any mesh."""
  key = jax.random.fold_in(jax.random.key(1), step)
  return task.synthetic_batch(key, BATCH_SIZE, CONFIG.length,
                              CONFIG.vocab_size)


def _init_state(key: jax.Array) -> State:
  """The train state with the params' ``LogicallyPartitioned`` boxes."""
  tokens = jnp.zeros((BATCH_SIZE, CONFIG.length), jnp.int32)
  params = make_model().init(key, tokens)['params']
  return {'step': jnp.zeros((), jnp.int32), 'params': params,
          'opt_state': optimizer().init(params)}


def state_shardings(mesh: Mesh) -> State:
  """Where every leaf of the train state lives on ``mesh``.

  The logical axes of each parameter (and of its momentum, which keeps the
  params' boxes) map through :data:`albert.LOGICAL_AXIS_RULES`; what has no
  axes (the step, the counts) is replicated.
  """
  abstract = jax.eval_shape(_init_state, jax.random.key(0))
  specs = nn.get_partition_spec(abstract)
  return nn.logical_to_mesh_sharding(specs, mesh, albert.LOGICAL_AXIS_RULES)


def init_state(mesh: Mesh) -> State:
  """The initial train state, created sharded (no process holds it all).

  With partitionable threefry (JAX's default since 0.5) the random init is
  the same on every mesh; older JAX would draw other numbers per sharding.
  """
  init = jax.jit(lambda key: nn.meta.unbox(_init_state(key)),
                 out_shardings=state_shardings(mesh))
  with jax.threefry_partitionable(True):
    return init(jax.random.key(0))


def make_train_step(mesh: Mesh) -> Callable[..., tuple[State, jax.Array]]:
  """``train_step(state, tokens, targets) -> (state, loss)``, sharded."""
  model, tx = make_model(), optimizer()
  shardings = state_shardings(mesh)
  data = NamedSharding(mesh, P('data', None))

  def train_step(state, tokens, targets):
    loss, grads = jax.value_and_grad(albert.loss_fn, argnums=1)(
        model, state['params'], tokens, targets)
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    return {'step': state['step'] + 1,
            'params': optax.apply_updates(state['params'], updates),
            'opt_state': opt_state}, loss

  return jax.jit(train_step, in_shardings=(shardings, data, data),
                 out_shardings=(shardings, NamedSharding(mesh, P())),
                 donate_argnums=0)


def global_batch(step: int, mesh: Mesh) -> tuple[jax.Array, jax.Array]:
  """:func:`batch` as global arrays over ``'data'``; each process fills its
  own shards."""
  sharding = NamedSharding(mesh, P('data', None))
  return tuple(
      jax.make_array_from_callback(x.shape, sharding, lambda index, x=x: x[index])
      for x in map(np.asarray, batch(step)))


def train(state: State, steps: int, mesh: Mesh, *,
          checkpoints: ocp.CheckpointManager | None = None,
          checkpoint_every: int = 1,
          on_step: Callable[[int, float], None] | None = None
          ) -> tuple[State, list[float]]:
  """Trains until ``state['step'] == steps``.

  Saves the state to ``checkpoints`` after every ``checkpoint_every``-th step.

  Returns:
    The trained state and the loss of each step.
  """
  train_step = make_train_step(mesh)
  losses = []
  for step in range(int(state['step']), steps):
    state, loss = train_step(state, *global_batch(step, mesh))
    losses.append(float(loss))
    if checkpoints is not None and (step + 1) % checkpoint_every == 0:
      checkpoints.save(step + 1, args=ocp.args.StandardSave(state))
    if on_step is not None:
      on_step(step + 1, losses[-1])
  return state, losses


# ---------------------------------------------------------------------------
# Checkpoints (Orbax)
# ---------------------------------------------------------------------------


def checkpoint_manager(directory: str) -> ocp.CheckpointManager:
  """Synchronous saves (a step's save is done when it returns); all kept."""
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False),
      item_handlers=ocp.StandardCheckpointHandler())


def restore(checkpoints: ocp.CheckpointManager, mesh: Mesh,
            step: int | None = None) -> State:
  """The train state saved at ``step`` (default: the latest), on ``mesh``.

  The mesh need not be the one it was saved from: Orbax reads each shard
  where the new sharding puts it.
  """
  step = checkpoints.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(
        f'no checkpoint in {checkpoints.directory}; train without --resume'
        ' first')
  target = jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      nn.meta.unbox(jax.eval_shape(_init_state, jax.random.key(0))),
      state_shardings(mesh))
  return checkpoints.restore(step, args=ocp.args.StandardRestore(target))


# ---------------------------------------------------------------------------
# What each process holds (for the tests and the demo)
# ---------------------------------------------------------------------------


def _path_text(path) -> str:
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def flatten(tree) -> dict[str, Any]:
  """``{'block_0/attn/qkv/kernel': leaf, ...}``; a ``PartitionSpec`` is a leaf."""
  return {_path_text(path): x for path, x in
          jax.tree_util.tree_leaves_with_path(
              tree, is_leaf=lambda x: isinstance(x, P))}


def placement(params) -> dict[str, Any]:
  """Per parameter: its spec and the slices of it this process holds."""
  out = {}
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    out[_path_text(path)] = {
        'shape': list(x.shape),
        'spec': list(x.sharding.spec),
        'local_slices': sorted(
            [[s.start or 0, s.stop if s.stop is not None else n]
             for s, n in zip(shard.index, x.shape)]
            for shard in x.addressable_shards),
    }
  return out


@dataclasses.dataclass
class JobOutput:
  """What a finished :func:`run_local_job` left in its ``--out`` directory.

  Attributes:
    processes: each process's ``process_<i>.json``: its ``losses``, and the
      ``placement`` of every parameter (spec, and the slices it holds).
    params: the trained parameters, gathered (``params.npz``).
    results: how each process ended (:class:`launch.ProcessResult`).
  """

  processes: list[dict[str, Any]]
  params: dict[str, np.ndarray]
  results: list[launch.ProcessResult]

  @property
  def losses(self) -> list[float]:
    return self.processes[0]['losses']


def run_local_job(out: str, num_processes: int, *args: str,
                  devices_per_process: int = 4, timeout: float = 300,
                  **launch_kwargs) -> JobOutput:
  """Runs this program as ``num_processes`` local processes (CPU, gloo).

  Args:
    out: the ``--out`` directory.
    num_processes: how many processes.
    *args: more flags of this program, e.g. ``'--steps', '4'``.
    devices_per_process: CPU devices each process gets
      (``XLA_FLAGS=--xla_force_host_platform_device_count``).
    timeout: seconds every process has to finish.
    **launch_kwargs: passed to :func:`launch.launch`.

  Returns:
    What the job wrote.

  Raises:
    launch.ProcessFailed: a process failed or timed out.
  """
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=(
      f'--xla_force_host_platform_device_count={devices_per_process}'))
  env.pop('FLAX_TIEEXT_AUTOPATCH', None)  # the model needs nn.tie
  results = launch.launch(
      ['-m', 'flax_tieext.examples.scaling', '--out', out, *args], num_processes, timeout=timeout,
      env=env, **launch_kwargs)
  processes = []
  for i in range(num_processes):
    with open(os.path.join(out, f'process_{i}.json')) as f:
      processes.append(json.load(f))
  with np.load(os.path.join(out, 'params.npz')) as data:
    params = {k: data[k] for k in data.files}
  return JobOutput(processes, params, results)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m flax_tieext.examples.scaling',
      description=('Train the tied ALBERT-style encoder on a ("data",'
                   ' "model") mesh over every process of a jax.distributed'
                   ' job.'))
  parser.add_argument('--steps', type=int, default=8,
                      help='train until this step (default: %(default)s)')
  parser.add_argument('--checkpoint-dir',
                      help='save Orbax checkpoints here')
  parser.add_argument('--checkpoint-every', type=int, default=1,
                      help='steps between checkpoints (default: %(default)s)')
  parser.add_argument('--resume', action='store_true',
                      help='continue from the latest checkpoint')
  parser.add_argument('--out', help='write what each process holds here')
  parser.add_argument('--coordinator',
                      help='HOST:PORT of process 0 (omit for one process)')
  parser.add_argument('--num-processes', type=int, default=1)
  parser.add_argument('--process-id', type=int, default=0)
  parser.add_argument('--heartbeat-timeout', type=int, default=10,
                      help='seconds before a silent peer counts as dead'
                      ' (default: %(default)s)')
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  if args.coordinator:
    launch.initialize(args.coordinator, args.num_processes, args.process_id,
                      heartbeat_timeout=args.heartbeat_timeout)
  me = f'process {jax.process_index()}/{jax.process_count()}'
  mesh = make_mesh()
  print(f'{me}: mesh {dict(mesh.shape)} over {jax.device_count()} devices,'
        f' {jax.local_device_count()} local', flush=True)
  checkpoints = (checkpoint_manager(args.checkpoint_dir)
                 if args.checkpoint_dir else None)
  if args.resume:
    state = restore(checkpoints, mesh)
    print(f'{me}: resumed from step {int(state["step"])}', flush=True)
  else:
    state = init_state(mesh)

  done = [int(state['step'])]

  def on_step(step, loss):
    done[0] = step
    print(f'step {step}/{args.steps} loss {loss:.6f}', flush=True)

  start = time.perf_counter()
  try:
    state, losses = train(state, args.steps, mesh, checkpoints=checkpoints,
                          checkpoint_every=args.checkpoint_every,
                          on_step=on_step)
  except Exception as e:  # pylint: disable=broad-except
    last = checkpoints.latest_step() if checkpoints else None
    print(f'{me}: training failed at step {done[0] + 1}:'
          f' {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}\n'
          f'{me}: another process of the job has probably died. Restart all'
          ' processes with --resume to continue from the last checkpoint'
          f' (step {last}).', file=sys.stderr, flush=True)
    os._exit(1)  # pylint: disable=protected-access  # no shutdown barrier
  seconds = time.perf_counter() - start
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    gathered = multihost_utils.process_allgather(state['params'], tiled=True)
    report = {'process_index': jax.process_index(),
              'process_count': jax.process_count(),
              'losses': losses, 'seconds': seconds,
              'placement': placement(state['params'])}
    with open(os.path.join(args.out, f'process_{args.process_id}.json'),
              'w') as f:
      json.dump(report, f)
    if jax.process_index() == 0:
      np.savez(os.path.join(args.out, 'params.npz'), **flatten(gathered))
  if checkpoints is not None:
    checkpoints.close()
  return 0


if __name__ == '__main__':
  sys.exit(main())
