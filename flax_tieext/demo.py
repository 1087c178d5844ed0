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

"""The seed scenario end to end: ``python -m flax_tieext.demo`` (``flax-tieext``).

A T5-style encoder (:mod:`flax_tieext.examples.t5`) whose blocks are rematted
with ``nn.checkpoint(Block, static_argnames=('deterministic',))`` and whose
``graph`` collection (the attention mask every block reads) is tied across
blocks with ``nn.tie``, trained for a few hundred optax steps on synthetic
data. Then a table compares it with the untied reference (the same encoder
without ``nn.tie``, the mask copied into every block): variables stored,
compiled temp memory with and without remat, step time, and the gradients.

Run ``python -m flax_tieext.demo --help`` for the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from flax import serialization
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

import flax_tieext
from flax_tieext.examples import launch
from flax_tieext.examples import measure
from flax_tieext.examples import t5
from flax_tieext.examples import task

PROG = 'flax-tieext'
BATCH_SIZE = 8
LEARNING_RATE = 3e-3
TIMING_ROUNDS = 30
PLOT_DEPTHS = (1, 2, 4, 8, 12, 16, 24)
MAX_PROCESSES = 4
# Seconds each --processes worker has to start and compile, plus 1 per step.
WORKER_TIMEOUT_S = 300
# Longest silence while the demo works: a line says what it is still doing.
HEARTBEAT_S = 8.0
# How a --processes worker marks a status line for the launcher to show.
WORKER_STATUS = '[status] '
BENCHMARKS = 'docs/benchmarks.md'


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected a positive integer, got {text!r}'
                                     ) from None
  if value < 1:
    raise argparse.ArgumentTypeError(f'expected a positive integer, got {value}')
  return value


def _process_count(text: str) -> int:
  value = _positive_int(text)
  if value > MAX_PROCESSES:
    raise argparse.ArgumentTypeError(
        f'at most {MAX_PROCESSES} processes on this machine, got {value}')
  return value


def build_parser() -> argparse.ArgumentParser:
  """The demo's command-line parser."""
  parser = argparse.ArgumentParser(
      prog=PROG,
      description=(
          'Train a T5-style encoder whose rematted blocks share one attention'
          ' mask (collection "graph") through nn.tie, then compare it with'
          ' the untied reference.'),
  )
  parser.add_argument('--layers', type=_positive_int, default=12,
                      help='number of encoder blocks (default: %(default)s)')
  parser.add_argument('--steps', type=_positive_int, default=300,
                      help='optax training steps (default: %(default)s)')
  parser.add_argument('--no-remat', action='store_true',
                      help='train the encoder without nn.checkpoint')
  parser.add_argument('--processes', type=_process_count, default=1,
                      metavar='N',
                      help='train across N local jax.distributed processes'
                      f' (1 to {MAX_PROCESSES}), one CPU device each, each'
                      f' with its own batch of {BATCH_SIZE} (default:'
                      ' %(default)s)')
  # Set by the launcher of --processes in the processes it starts.
  for flag, kind in (('--coordinator', str), ('--num-processes', int),
                     ('--process-id', int), ('--worker-output', str)):
    parser.add_argument(flag, type=kind, help=argparse.SUPPRESS)
  parser.add_argument('--plot', metavar='FILE.png',
                      help='also plot compiled memory against depth for no'
                      ' remat / remat / remat+tie (needs matplotlib: pip'
                      ' install "flax_tieext[plot]")')
  return parser


def _plot_path_problem(path: str) -> str | None:
  """Why the plot cannot be written to ``path``, or ``None`` if it can."""
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    return f'cannot write the plot to {path}: directory {directory} does not exist'
  if not os.access(directory, os.W_OK):
    return f'cannot write the plot to {path}: directory {directory} is not writable'
  if os.path.isdir(path):
    return f'cannot write the plot to {path}: it is a directory'
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return ('--plot needs matplotlib, which is not installed; install it with'
            ' pip install "flax_tieext[plot]"')
  return None


# ---------------------------------------------------------------------------
# Progress bar
# ---------------------------------------------------------------------------


class _Activity:
  """What the demo is doing, and when it last printed: for the heartbeat."""

  def __init__(self):
    self.start = time.perf_counter()
    self.lock = threading.Lock()
    self.what = 'starting'
    self.since = self.last_print = self.start

  def elapsed(self) -> str:
    return f'[{time.perf_counter() - self.start:6.1f} s]'

  def doing(self, what: str, printed: bool = True) -> None:
    with self.lock:
      now = time.perf_counter()
      if what != self.what:
        self.what, self.since = what, now
      if printed:
        self.last_print = now


_ACTIVITY = _Activity()


@contextlib.contextmanager
def _heartbeat(interval: float = HEARTBEAT_S) -> Iterator[None]:
  """Prints what the demo is still doing after ``interval`` s of silence.

  Compiling and starting ``jax.distributed`` workers print nothing for tens of
  seconds on a small machine; this says that the demo is alive, and since when
  it has been at the step it names.
  """
  stop = threading.Event()

  def beat():
    while not stop.wait(0.5):
      with _ACTIVITY.lock:
        now = time.perf_counter()
        if now - _ACTIVITY.last_print < interval:
          continue
        _ACTIVITY.last_print = now
        line = (f'{_ACTIVITY.elapsed()} ... still {_ACTIVITY.what}'
                f' ({now - _ACTIVITY.since:.0f} s so far)')
      print(line, file=sys.stderr, flush=True)

  thread = threading.Thread(target=beat, name='flax-tieext-heartbeat',
                            daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()


class ProgressBar:
  """A one-line progress bar on a terminal; a few plain lines elsewhere.

  The rate is computed from the steps' own times, from step 2 on: step 1
  compiles what the loop jits, and a rate over the moments between lines
  (which can arrive together from a worker) would be meaningless.
  """

  def __init__(self, total: int, stream: TextIO | None = None,
               width: int = 30):
    self.total = total
    self.stream = sys.stderr if stream is None else stream
    self.width = width
    self.tty = hasattr(self.stream, 'isatty') and self.stream.isatty()
    self.times: list[float] = []
    self._last_draw = 0.0
    self._last_tenth = -1

  def update(self, done: int, loss: float, seconds: float) -> None:
    """Shows that ``done`` of ``total`` steps ran, the last in ``seconds``."""
    self.times.append(seconds)
    now = time.perf_counter()
    drawn = False
    if self.tty:
      if done == self.total or now - self._last_draw >= 0.1:
        self._last_draw, drawn = now, True
        self.stream.write('\r' + self._line(done, loss))
        if done == self.total:
          self.stream.write('\n')
    else:
      tenth = done * 10 // self.total
      if tenth != self._last_tenth:
        self._last_tenth, drawn = tenth, True
        self.stream.write(f'{_ACTIVITY.elapsed()} {self._line(done, loss)}\n')
    if drawn:
      self.stream.flush()
    _ACTIVITY.doing(f'training, step {done}/{self.total} done', drawn)

  def _line(self, done: int, loss: float) -> str:
    filled = self.width * done // self.total
    bar = '#' * filled + '.' * (self.width - filled)
    later = self.times[1:]
    if later:
      speed = (f'{len(later) / sum(later):.1f} steps/s over steps'
               f' 2-{len(self.times)}')
    else:
      speed = f'step 1 took {self.times[0]:.2f} s (it compiles)'
    return (f'train [{bar}] {done:>{len(str(self.total))}}/{self.total}'
            f'  loss {loss:.3f}  {speed}')


# Set in a --processes worker, whose status lines the launcher shows.
_WORKER = threading.local()


def _status(message: str) -> None:
  """A line on stderr saying what the demo starts doing, and when."""
  if getattr(_WORKER, 'id', None) is not None:
    print(WORKER_STATUS + message, flush=True)
    return
  _ACTIVITY.doing(message)
  print(f'{_ACTIVITY.elapsed()} {message}', file=sys.stderr, flush=True)


def load_average() -> float | None:
  """The machine's load average over the last minute (None where unknown)."""
  try:
    return os.getloadavg()[0]
  except OSError:
    return None


def machine(load: float | None) -> str:
  """``2 CPUs, load average 5.3``: what a time measured here is relative to."""
  where = f'{os.cpu_count()} CPUs'
  return where if load is None else f'{where}, load average {load:.1f}'


def cpu_seconds() -> float:
  """User + system CPU seconds of this process and its finished children."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# ---------------------------------------------------------------------------
# Models and measurements
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Variant:
  """One encoder variant, compiled: loss and gradient of the parameters.

  Attributes:
    tied: the mask is tied across blocks (stored once).
    remat: the blocks are rematted.
    dropout: compiled for training (dropout on, a key per call) or not.
    variables: the stored variables (``graph`` is used as is).
    grad_fn: compiled ``(params, graph, tokens, targets, key) -> (loss,
      grads)``.
    stats: what XLA reports about ``grad_fn``.
  """

  tied: bool
  remat: bool
  dropout: bool
  variables: dict[str, Any]
  grad_fn: Any
  stats: measure.CompiledStats

  def value_and_grad(self, params, tokens, targets, key=None):
    graph = {'graph': self.variables['graph']}
    return self.grad_fn(params, graph, tokens, targets,
                        key if self.dropout else None)


def _compile_variant(config: t5.T5Config, variables: dict[str, Any], *,
                     tied: bool, remat: bool, dropout: bool, batch) -> Variant:
  _status(f'compiling loss + gradient: {"tied" if tied else "untied"},'
          f' {"remat" if remat else "no remat"},'
          f' {"dropout on" if dropout else "dropout off"}')
  model = t5.make_encoder(config, tied=tied, remat=remat)
  fn = jax.jit(jax.value_and_grad(functools.partial(t5.loss_fn, model)))
  tokens, targets = batch
  compiled, stats = measure.compile_stats(
      fn, variables['params'], {'graph': variables['graph']}, tokens, targets,
      jax.random.key(0) if dropout else None)
  return Variant(tied, remat, dropout, variables, compiled, stats)


def _tied_and_untied_variables(config: t5.T5Config, tokens):
  model = t5.make_encoder(config, tied=True, remat=False)
  tied = model.init(jax.random.key(0), tokens, deterministic=True)
  untied = flax_tieext.untie_variables(
      tied, t5.mask_ties(config.num_layers), collections='graph')
  return dict(tied), untied


def _batch_fn(config: t5.T5Config, mesh: Mesh | None = None):
  """``batch(step) -> (tokens, targets, dropout_key)``, jitted.

  On a ``mesh`` (one device per process) the batch is global, ``BATCH_SIZE``
  rows per device, split over ``'data'``.
  """
  size = BATCH_SIZE * (1 if mesh is None else mesh.size)

  def batch(step):
    key = jax.random.fold_in(jax.random.key(1), step)
    data_key, dropout_key = jax.random.split(key)
    return (*task.synthetic_batch(data_key, size, config.length,
                                 config.vocab_size), dropout_key)

  if mesh is None:
    return jax.jit(batch)
  rows, same = NamedSharding(mesh, P('data')), NamedSharding(mesh, P())
  return jax.jit(batch, out_shardings=(rows, rows, same))


def _train(variant: Variant, config: t5.T5Config, steps: int,
           mesh: Mesh | None = None, on_step=None):
  """Trains ``variant``'s parameters; returns them, the losses, step times."""
  tx = optax.adamw(LEARNING_RATE)
  params = variant.variables['params']
  opt_state = tx.init(params)
  if mesh is not None:
    # On the mesh from the start, as the update returns it: AdamW's step
    # count, made on one device, would otherwise make step 2 compile the
    # update once more, for the sharding step 1 gave it (seconds in a
    # --processes run, which the step times then showed).
    opt_state = jax.jit(lambda s: s, out_shardings=NamedSharding(mesh, P()))(
        opt_state)

  @jax.jit
  def update(grads, opt_state, params):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  batch = _batch_fn(config, mesh)
  on_step = on_step or ProgressBar(steps).update
  losses, times = [], []
  _status('training; step 1 also compiles the batch and the optimizer update')
  for step in range(steps):
    t0 = time.perf_counter()
    tokens, targets, dropout_key = batch(step)
    loss, grads = variant.value_and_grad(params, tokens, targets, dropout_key)
    params, opt_state = update(grads, opt_state, params)
    losses.append(float(loss))  # waits for the step
    times.append(time.perf_counter() - t0)
    on_step(step + 1, losses[-1], times[-1])
  return params, losses, times


# ---------------------------------------------------------------------------
# --processes N: the same training as a jax.distributed job
# ---------------------------------------------------------------------------


def _worker(args: argparse.Namespace) -> int:
  """One process of ``--processes N``: data-parallel training on a mesh.

  Every process holds the whole (replicated) tied encoder and trains on its
  own rows of the global batch; gloo all-reduces the gradients. Process 0
  prints ``step i/n loss x`` for the launcher's progress bar and writes the
  trained parameters, losses and step times to ``--worker-output``.
  """
  _WORKER.id = args.process_id
  _status(f'joining jax.distributed as process {args.process_id} of'
          f' {args.num_processes}')
  launch.initialize(args.coordinator, args.num_processes, args.process_id)
  _status('joined; initializing the tied encoder')
  mesh = Mesh(np.array(jax.devices()), ('data',))
  config = t5.T5Config(num_layers=args.layers)
  probe = _batch_fn(config)(0)[:2]
  tied_vars, _ = _tied_and_untied_variables(config, probe[0])
  variables = jax.jit(lambda v: v, out_shardings=NamedSharding(mesh, P()))(
      tied_vars)
  training = _compile_variant(config, variables, tied=True,
                              remat=not args.no_remat, dropout=True,
                              batch=_batch_fn(config, mesh)(0)[:2])

  def on_step(step, loss, seconds):
    if jax.process_index() == 0:
      print(f'step {step}/{args.steps} loss {loss:.6f} time {seconds:.6f}',
            flush=True)

  params, losses, times = _train(training, config, args.steps, mesh, on_step)
  if jax.process_index() == 0:
    local = jax.tree_util.tree_map(lambda x: np.asarray(x.addressable_data(0)),
                                   params)
    with open(args.worker_output, 'wb') as f:
      f.write(serialization.msgpack_serialize(
          {'params': local, 'losses': np.asarray(losses),
           'times': np.asarray(times)}))
  return 0


def _train_across_processes(args: argparse.Namespace):
  """Runs ``--processes N`` workers; returns what process 0 trained."""
  bars = []  # drawn from the first step on, as in one process

  def on_line(process_id, line, _):
    if line.startswith(WORKER_STATUS):
      _status(f'worker {process_id}: {line[len(WORKER_STATUS):]}')
    elif process_id == 0 and line.startswith('step '):
      done, _, loss, _, seconds = line.split()[1:6]
      if not bars:
        bars.append(ProgressBar(args.steps))
      bars[0].update(int(done.split('/')[0]), float(loss), float(seconds))

  flags = [flag for flag in os.environ.get('XLA_FLAGS', '').split()
           if not flag.startswith('--xla_force_host_platform_device_count')]
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=' '.join(
      [*flags, '--xla_force_host_platform_device_count=1']))
  with tempfile.TemporaryDirectory() as tmp:
    output = os.path.join(tmp, 'trained.msgpack')
    _status(f'starting {args.processes} worker processes (each imports JAX,'
            ' joins jax.distributed and compiles the training step)')
    launch.launch(
        ['-m', 'flax_tieext.demo', '--layers', str(args.layers), '--steps',
         str(args.steps), *(['--no-remat'] if args.no_remat else []),
         '--worker-output', output],
        args.processes, timeout=WORKER_TIMEOUT_S + args.steps, env=env,
        on_line=on_line)
    with open(output, 'rb') as f:
      trained = serialization.msgpack_restore(f.read())
  return trained['params'], list(trained['losses']), list(trained['times'])


def _max_abs_difference(a, b) -> float:
  diffs = jax.tree_util.tree_map(
      lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)
  return max(jax.tree_util.tree_leaves(diffs), default=0.0)


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _count_bytes(tree) -> str:
  count, nbytes = measure.tree_size(tree)
  return f'{count} ({measure.format_bytes(nbytes)})'


def _blocks(n: int) -> str:
  return f'{n} block' if n == 1 else f'{n} blocks'


def _ratio(a: float, b: float) -> str:
  return f'{a / b:.3f}' if b else 'n/a'


def _table(*sections: list[tuple[str, ...]]) -> str:
  """Sections of one table: each its header row, underlined, over its rows."""
  rows = [row for section in sections for row in section]
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = []
  for section in sections:
    if lines:
      lines.append('')
    for n, row in enumerate(section):
      cells = [row[0].ljust(widths[0])] + [
          c.rjust(w) for c, w in zip(row[1:], widths[1:])]
      lines.append('  '.join(cells).rstrip())
      if n == 0:
        lines.append('  '.join('-' * w for w in widths))
  return '\n'.join(lines)


@dataclasses.dataclass
class Results:
  """Everything the demo measured.

  Attributes:
    config: the encoder's sizes.
    trained: which variant was trained, e.g. ``'tied, remat'``.
    losses: the training loss of each step.
    step_times: the wall time of each training step, in seconds.
    tied_vars: the variables the tied encoder stores.
    untied_vars: the same with the mask copied into every block.
    variants: ``{(tied, remat): Variant}``.
    step_medians: ``{(tied, remat): seconds}`` per loss-and-gradient call.
    step_spreads: ``{(tied, remat): (fastest, slowest)}`` of those calls.
    step_ratios: ``{remat: (median, q1, q3)}`` of tied / untied, per round.
    remat_ratios: ``{tied: (median, q1, q3)}`` of remat / no remat, per round.
    rounds: how many interleaved rounds were timed.
    loss_difference: ``|loss tied - loss untied|``.
    grad_difference: ``max |grad tied - grad untied|`` over all parameters.
    barriers_kept: whether :func:`measure.keep_remat_on_cpu` took effect.
    load_training: the load average when training ended (None: unknown).
    load_timing: the load average when the timed rounds ended.
  """

  config: t5.T5Config
  trained: str
  losses: list[float]
  step_times: list[float]
  tied_vars: dict[str, Any]
  untied_vars: dict[str, Any]
  variants: dict[tuple[bool, bool], Variant]
  step_medians: dict[tuple[bool, bool], float]
  step_spreads: dict[tuple[bool, bool], tuple[float, float]]
  step_ratios: dict[bool, tuple[float, float, float]]
  remat_ratios: dict[bool, tuple[float, float, float]]
  rounds: int
  loss_difference: float
  grad_difference: float
  barriers_kept: bool
  load_training: float | None = None
  load_timing: float | None = None


def report(r: Results) -> str:
  """The demo's printed summary."""
  config, tied_vars, untied_vars = r.config, r.tied_vars, r.untied_vars
  variants, step_medians = r.variants, r.step_medians
  mib = measure.format_bytes
  t_r, t_n = variants[True, True], variants[True, False]
  u_r, u_n = variants[False, True], variants[False, False]
  def ms(key):
    low, high = r.step_spreads[key]
    return (f'{step_medians[key] * 1e3:.1f} ms'
            f' ({low * 1e3:.1f}-{high * 1e3:.1f})')

  def noisy_ratio(ratio):
    median, q1, q3 = ratio
    return f'{median:.3f} ({q1:.2f}-{q3:.2f})'

  columns = ('tied (nn.tie)', 'untied reference', 'tied/untied')
  stored = [
      ('stored variables', *columns),
      ("in collection 'graph' (count, bytes)",
       _count_bytes(tied_vars['graph']), _count_bytes(untied_vars['graph']),
       _ratio(measure.tree_size(tied_vars['graph'])[1],
              measure.tree_size(untied_vars['graph'])[1])),
      ('in all collections (count, bytes)',
       _count_bytes(tied_vars), _count_bytes(untied_vars),
       _ratio(measure.tree_size(tied_vars)[1],
              measure.tree_size(untied_vars)[1])),
  ]
  compiled = [
      ('loss + gradient, dropout off', *columns),
      ('compiled temp memory, remat', mib(t_r.stats.temp_bytes),
       mib(u_r.stats.temp_bytes),
       _ratio(t_r.stats.temp_bytes, u_r.stats.temp_bytes)),
      ('compiled temp memory, no remat', mib(t_n.stats.temp_bytes),
       mib(u_n.stats.temp_bytes),
       _ratio(t_n.stats.temp_bytes, u_n.stats.temp_bytes)),
      ('temp memory remat / no remat',
       _ratio(t_r.stats.temp_bytes, t_n.stats.temp_bytes),
       _ratio(u_r.stats.temp_bytes, u_n.stats.temp_bytes), ''),
      ('time, remat [1]', ms((True, True)),
       ms((False, True)), noisy_ratio(r.step_ratios[True]) + ' [2]'),
      ('time, no remat [1]', ms((True, False)),
       ms((False, False)), noisy_ratio(r.step_ratios[False]) + ' [2]'),
      ('time remat / no remat [2]', noisy_ratio(r.remat_ratios[True]),
       noisy_ratio(r.remat_ratios[False]), ''),
  ]
  timed = r.step_times[1:] or r.step_times
  train_ms = [1e3 * t for t in timed]
  which = ('steps 2-' + str(len(r.step_times)) + ', step 1 (it compiles)'
           ' left out' if len(r.step_times) > 1 else 'its only step')
  all_reduce = ', the gradient all-reduce' if 'processes' in r.trained else ''
  lines = [
      f'T5-style encoder: {_blocks(config.num_layers)},'
      f' d_model {config.d_model},'
      f' {config.num_heads} heads, length {config.length}, batch {BATCH_SIZE};'
      f" one {config.length}x{config.length} attention mask in collection"
      " 'graph', tied across blocks with nn.tie",
      f'trained {r.trained} for {len(r.losses)} optax steps: loss'
      f' {r.losses[0]:.3f} -> {r.losses[-1]:.3f}',
      f'training step (batch, loss + gradient with dropout{all_reduce},'
      f' AdamW update): median {statistics.median(train_ms):.1f} ms,'
      f' {min(train_ms):.1f}-{max(train_ms):.1f} ms over {which}'
      f' ({machine(r.load_training)})',
      '',
      _table(stored, compiled),
      '',
      f'[1] median (fastest-slowest) of {r.rounds} rounds, each timing the'
      ' four variants back to back, in ms. Loss + gradient alone, dropout'
      ' off, one process: shorter than the training step above, which also'
      ' draws the batch, applies dropout and runs the optimizer. Timed on'
      f' {machine(r.load_timing)}: on a loaded machine the times grow and'
      ' spread, the ratios stay near 1.',
      f'[2] median (middle half) of the {r.rounds} per-round ratios; on a'
      ' shared CPU the spread is the noise of the machine. Tied and untied'
      ' compile to the same computation, the tie only stores the mask once.'
      ' For the'
      f' numbers that do not depend on load see {BENCHMARKS} ("Tie + remat vs'
      ' a shared module on upstream Flax": the same FLOPs, temp and argument'
      ' bytes as a hand-shared module, ratio 1.000).',
      '',
      f'gradient check ({r.trained}, trained parameters, dropout off):'
      f' max |grad tied - grad untied| = {r.grad_difference:.2e},'
      f' |loss tied - loss untied| = {r.loss_difference:.2e}',
  ]
  if not r.barriers_kept:
    lines.append(
        'note: XLA:CPU was initialized before the demo could keep remat\'s'
        ' optimization barriers (see flax_tieext.examples.measure), so the'
        ' remat temp memory above is what plain XLA:CPU reports.')
  return '\n'.join(lines)


# ---------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------


def memory_by_depth(depths: Sequence[int], base: t5.T5Config):
  """Per depth, for no remat / remat / remat + tie: compiled temp bytes, the
  bytes of all stored variables, and those stored in ``graph`` (the masks)."""
  kinds = {'no remat': (False, False), 'remat': (False, True),
           'remat + tie': (True, True)}
  out = {kind: [] for kind in kinds}
  for depth in depths:
    config = dataclasses.replace(base, num_layers=depth)
    tokens = jax.ShapeDtypeStruct((BATCH_SIZE, config.length), jnp.int32)
    for kind, (tied, remat) in kinds.items():
      _status(f'compiling for the plot: {_blocks(depth)}, {kind}')
      model = t5.make_encoder(config, tied=tied, remat=remat)
      shapes = jax.eval_shape(
          functools.partial(model.init, deterministic=True),
          jax.random.key(0), tokens)
      fn = jax.jit(jax.value_and_grad(functools.partial(t5.loss_fn, model)))
      _, stats = measure.compile_stats(
          fn, shapes['params'], {'graph': shapes['graph']}, tokens, tokens,
          None)  # dropout off, as in the table
      out[kind].append((stats.temp_bytes, measure.tree_size(shapes)[1],
                        measure.tree_size(shapes['graph'])[1]))
  return out


def save_plot(path: str, depths: Sequence[int], memory) -> None:
  """Writes the memory-vs-depth figure to ``path`` (PNG).

  Left: compiled temp memory, which remat cuts and the tie leaves alone.
  Right: the masks stored in ``graph``, which the tie stores once; its title
  states all the stored variables, where the difference is small. Sizes are
  written as the table writes them (``measure.format_bytes``). The PNG's
  ``Description`` holds what it shows (:func:`figure_data`).
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import text as mtext  # pylint: disable=g-import-not-at-top

  size = measure.format_bytes
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
  mib = lambda kind, i: [v[i] / 2**20 for v in memory[kind]]  # pylint: disable=unnecessary-lambda-assignment
  deepest = depths[-1]

  # Remat + tie lies on remat: drawn thinner, on top, and the legend says so.
  left.plot(depths, mib('no remat', 0), 'o-', color='tab:red', lw=2,
            label='no remat (untied)')
  left.plot(depths, mib('remat', 0), 's-', color='tab:blue', lw=6, alpha=0.4,
            ms=10, label='remat, untied')
  left.plot(depths, mib('remat + tie', 0), 'D:', color='black', lw=1.5, ms=4,
            label='remat + tie (the same as remat, untied)')
  for kind, color, above in (('no remat', 'tab:red', 0),
                             ('remat', 'tab:blue', 10)):
    left.annotate(size(memory[kind][-1][0]), (deepest, mib(kind, 0)[-1]),
                  color=color, textcoords='offset points',
                  xytext=(-10, above), ha='right', va='center')
  left.set_title('compiled temp memory (activations):\nremat cuts it, the'
                 ' tie leaves it as it is')

  untied, tied = ([v[2] for v in memory[k]] for k in ('remat', 'remat + tie'))
  right.plot(depths, [b / 2**10 for b in untied], 's-', color='tab:blue',
             label='untied: one mask per block (with or without remat)')
  right.plot(depths, [b / 2**10 for b in tied], 'D-', color='black',
             label='remat + tie: one mask, shared')
  right.annotate(size(untied[-1]), (deepest, untied[-1] / 2**10),
                 color='tab:blue', textcoords='offset points', xytext=(-8, 0),
                 ha='right', va='center')
  right.annotate(size(tied[-1]), (deepest, tied[-1] / 2**10),
                 textcoords='offset points', xytext=(-8, 6), ha='right')
  right.set_title(
      "stored attention masks (collection 'graph'):\nall variables stored at"
      f" {_blocks(deepest)}: {size(memory['remat'][-1][1])} untied,"
      f" {size(memory['remat + tie'][-1][1])} tied")
  right.set_ylabel('KiB')
  left.set_ylabel('MiB')
  for ax in (left, right):
    ax.set_xlabel('encoder blocks')
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc='upper left', fontsize='small')
  fig.suptitle('T5-style encoder, loss + gradient with dropout off'
               ' (XLA memory_analysis)')
  fig.tight_layout()
  texts = [t.get_text() for t in fig.findobj(mtext.Text) if t.get_text()]
  try:
    fig.savefig(path, format='png', dpi=120, metadata={
        'Description': json.dumps(figure_data(depths, memory, texts))})
  finally:
    plt.close(fig)


def figure_data(depths: Sequence[int], memory, texts: Sequence[str]):
  """What the figure shows: its depths, its numbers (bytes) and its texts.

  Two figures with the same data look the same, whatever matplotlib drew
  their pixels with: ``docs/demo_figure.py`` compares them.
  """
  return {'depths': list(depths),
          'bytes': {kind: [list(v) for v in values]
                    for kind, values in memory.items()},
          'texts': sorted(texts)}


def shown_figure_data(path: str):
  """:func:`figure_data` as the PNG at ``path`` holds it (None if it does not)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    with Image.open(path) as image:
      return json.loads(image.text.get('Description', 'null'))
  except (OSError, ValueError):
    return None


def plot_depths(layers: int) -> list[int]:
  """The depths the plot compiles: the usual ones up to ``layers``, and it."""
  return sorted({d for d in PLOT_DEPTHS if d <= max(layers, 2)} | {layers})


def write_plot(path: str, layers: int) -> bool:
  """Measures and plots memory against depth; ``False`` if writing failed."""
  depths = plot_depths(layers)
  memory = memory_by_depth(depths, t5.T5Config())
  _status('drawing the plot with matplotlib')
  try:
    save_plot(path, depths, memory)
  except OSError as e:
    print(f'{PROG}: error: cannot write the plot to {path}: {e}',
          file=sys.stderr)
    return False
  print(f'plot: {path}')
  return True


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _patch_installed() -> Iterator[None]:
  """``nn.tie`` and ``static_argnames`` in Flax while the demo runs.

  Under ``FLAX_TIEEXT_AUTOPATCH=0`` the patch is installed for the demo only.
  """
  if flax_tieext.is_installed():
    yield
    return
  _status('flax_tieext: installing nn.tie and static_argnames into Flax for'
          ' the demo (FLAX_TIEEXT_AUTOPATCH=0 is set)')
  flax_tieext.install()
  try:
    yield
  finally:
    flax_tieext.uninstall()


def run(args: argparse.Namespace) -> Results:
  """Trains and measures."""
  barriers_kept = measure.keep_remat_on_cpu()
  config = t5.T5Config(num_layers=args.layers)
  _status(f'initializing the {args.layers}-block tied encoder and its untied'
          ' copy')
  probe = task.synthetic_batch(jax.random.key(0), BATCH_SIZE, config.length,
                               config.vocab_size)
  tied_vars, untied_vars = _tied_and_untied_variables(config, probe[0])
  remat = not args.no_remat
  trained = 'tied, ' + ('remat' if remat else 'no remat')
  if args.processes > 1:
    _status(f'training across {args.processes} jax.distributed processes,'
            f' {BATCH_SIZE} rows each')
    params, losses, step_times = _train_across_processes(args)
    trained += f', {args.processes} processes x batch {BATCH_SIZE}'
  else:
    training = _compile_variant(config, tied_vars, tied=True, remat=remat,
                                dropout=True, batch=probe)
    params, losses, step_times = _train(training, config, args.steps)
  load_training = load_average()

  # The comparison: loss and gradient with dropout off (cheaper to compile).
  variants = {
      (tied, rm): _compile_variant(
          config, tied_vars if tied else untied_vars, tied=tied, remat=rm,
          dropout=False, batch=probe)
      for tied in (True, False) for rm in (True, False)}
  _status(f'timing loss + gradient: {TIMING_ROUNDS} rounds of the four variants')
  timer = measure.Interleaved({
      k: functools.partial(v.value_and_grad, params, *probe)
      for k, v in variants.items()}).run(TIMING_ROUNDS)
  load_timing = load_average()
  step_medians = {k: timer.median(k) for k in variants}
  step_spreads = {k: timer.spread(k) for k in variants}
  step_ratios = {rm: timer.ratio((True, rm), (False, rm))
                 for rm in (True, False)}
  remat_ratios = {tied: timer.ratio((tied, True), (tied, False))
                  for tied in (True, False)}
  tied_loss, tied_grads = variants[True, remat].value_and_grad(params, *probe)
  untied_loss, untied_grads = variants[False, remat].value_and_grad(
      params, *probe)
  return Results(
      config=config, trained=trained, losses=losses, step_times=step_times,
      tied_vars=tied_vars, untied_vars=untied_vars, variants=variants,
      step_medians=step_medians, step_spreads=step_spreads,
      step_ratios=step_ratios, remat_ratios=remat_ratios, rounds=TIMING_ROUNDS,
      loss_difference=abs(float(tied_loss) - float(untied_loss)),
      grad_difference=_max_abs_difference(tied_grads, untied_grads),
      barriers_kept=barriers_kept, load_training=load_training,
      load_timing=load_timing)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the demo; returns the process exit code.

  Args:
    argv: the command-line arguments (default: ``sys.argv[1:]``).

  Returns:
    0 on success, 1 if the plot could not be written or a ``--processes``
    worker failed. Bad flags exit with argparse's usage error (code 2).
  """
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.coordinator is not None:
    with _patch_installed():
      return _worker(args)
  with _heartbeat():
    return _main(parser, args)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
  if args.plot is not None:
    problem = _plot_path_problem(args.plot)
    if problem:
      parser.error(problem)
  start, cpu_start = time.perf_counter(), cpu_seconds()
  with _patch_installed():
    try:
      results = run(args)
    except launch.ProcessFailed as e:
      print(f'{PROG}: error: training across {args.processes} processes'
            f' failed: {e}', file=sys.stderr)
      return 1
    print(report(results), flush=True)
    if args.plot is not None and not write_plot(args.plot, args.layers):
      return 1
  print(f'wall time: {time.perf_counter() - start:.1f} s, CPU time:'
        f' {cpu_seconds() - cpu_start:.1f} s (user + system, the demo and its'
        f' worker processes; {machine(load_average())})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
