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
import os
import sys
import tempfile
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


class ProgressBar:
  """A one-line progress bar on a terminal; a few plain lines elsewhere."""

  def __init__(self, total: int, stream: TextIO | None = None,
               width: int = 30):
    self.total = total
    self.stream = sys.stderr if stream is None else stream
    self.width = width
    self.tty = hasattr(self.stream, 'isatty') and self.stream.isatty()
    self.start = time.perf_counter()
    self._last_draw = 0.0
    self._last_tenth = -1

  def update(self, done: int, loss: float) -> None:
    """Shows that ``done`` of ``total`` steps ran; ``loss`` is the latest."""
    now = time.perf_counter()
    if self.tty:
      if done < self.total and now - self._last_draw < 0.1:
        return
      self._last_draw = now
      self.stream.write('\r' + self._line(done, loss, now))
      if done == self.total:
        self.stream.write('\n')
    else:
      tenth = done * 10 // self.total
      if tenth == self._last_tenth:
        return
      self._last_tenth = tenth
      self.stream.write(self._line(done, loss, now) + '\n')
    self.stream.flush()

  def _line(self, done: int, loss: float, now: float) -> str:
    filled = self.width * done // self.total
    bar = '#' * filled + '.' * (self.width - filled)
    rate = done / max(now - self.start, 1e-9)
    return (f'train [{bar}] {done:>{len(str(self.total))}}/{self.total}'
            f'  loss {loss:.3f}  {rate:.1f} steps/s')


def _status(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


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

  @jax.jit
  def update(grads, opt_state, params):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  batch = _batch_fn(config, mesh)
  on_step = on_step or ProgressBar(steps).update
  losses, times = [], []
  for step in range(steps):
    t0 = time.perf_counter()
    tokens, targets, dropout_key = batch(step)
    loss, grads = variant.value_and_grad(params, tokens, targets, dropout_key)
    params, opt_state = update(grads, opt_state, params)
    losses.append(float(loss))  # waits for the step
    times.append(time.perf_counter() - t0)
    on_step(step + 1, losses[-1])
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
  launch.initialize(args.coordinator, args.num_processes, args.process_id)
  mesh = Mesh(np.array(jax.devices()), ('data',))
  config = t5.T5Config(num_layers=args.layers)
  probe = _batch_fn(config)(0)[:2]
  tied_vars, _ = _tied_and_untied_variables(config, probe[0])
  variables = jax.jit(lambda v: v, out_shardings=NamedSharding(mesh, P()))(
      tied_vars)
  training = _compile_variant(config, variables, tied=True,
                              remat=not args.no_remat, dropout=True,
                              batch=_batch_fn(config, mesh)(0)[:2])

  def on_step(step, loss):
    if jax.process_index() == 0:
      print(f'step {step}/{args.steps} loss {loss:.6f}', flush=True)

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
    if process_id == 0 and line.startswith('step '):
      done, _, loss = line.split()[1:4]
      if not bars:
        bars.append(ProgressBar(args.steps))
      bars[0].update(int(done.split('/')[0]), float(loss))

  flags = [flag for flag in os.environ.get('XLA_FLAGS', '').split()
           if not flag.startswith('--xla_force_host_platform_device_count')]
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=' '.join(
      [*flags, '--xla_force_host_platform_device_count=1']))
  with tempfile.TemporaryDirectory() as tmp:
    output = os.path.join(tmp, 'trained.msgpack')
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


def _ratio(a: float, b: float) -> str:
  return f'{a / b:.3f}' if b else 'n/a'


def _table(rows: list[tuple[str, ...]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = []
  for n, row in enumerate(rows):
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
    loss_difference: ``|loss tied - loss untied|``.
    grad_difference: ``max |grad tied - grad untied|`` over all parameters.
    barriers_kept: whether :func:`measure.keep_remat_on_cpu` took effect.
  """

  config: t5.T5Config
  trained: str
  losses: list[float]
  step_times: list[float]
  tied_vars: dict[str, Any]
  untied_vars: dict[str, Any]
  variants: dict[tuple[bool, bool], Variant]
  step_medians: dict[tuple[bool, bool], float]
  loss_difference: float
  grad_difference: float
  barriers_kept: bool


def report(r: Results) -> str:
  """The demo's printed summary."""
  config, tied_vars, untied_vars = r.config, r.tied_vars, r.untied_vars
  variants, step_medians = r.variants, r.step_medians
  mib = measure.format_bytes
  t_r, t_n = variants[True, True], variants[True, False]
  u_r, u_n = variants[False, True], variants[False, False]
  rows = [
      ('loss + gradient, dropout off', 'tied (nn.tie)', 'untied reference',
       'tied/untied'),
      ("variables stored in 'graph' (count, bytes)",
       _count_bytes(tied_vars['graph']), _count_bytes(untied_vars['graph']),
       _ratio(measure.tree_size(tied_vars['graph'])[1],
              measure.tree_size(untied_vars['graph'])[1])),
      ('all variables stored (count, bytes)',
       _count_bytes(tied_vars), _count_bytes(untied_vars),
       _ratio(measure.tree_size(tied_vars)[1],
              measure.tree_size(untied_vars)[1])),
      ('compiled temp memory, remat', mib(t_r.stats.temp_bytes),
       mib(u_r.stats.temp_bytes),
       _ratio(t_r.stats.temp_bytes, u_r.stats.temp_bytes)),
      ('compiled temp memory, no remat', mib(t_n.stats.temp_bytes),
       mib(u_n.stats.temp_bytes),
       _ratio(t_n.stats.temp_bytes, u_n.stats.temp_bytes)),
      ('temp memory remat / no remat',
       _ratio(t_r.stats.temp_bytes, t_n.stats.temp_bytes),
       _ratio(u_r.stats.temp_bytes, u_n.stats.temp_bytes), ''),
      ('step time, remat (median)', f'{step_medians[True, True] * 1e3:.1f} ms',
       f'{step_medians[False, True] * 1e3:.1f} ms',
       _ratio(step_medians[True, True], step_medians[False, True])),
      ('step time, no remat (median)',
       f'{step_medians[True, False] * 1e3:.1f} ms',
       f'{step_medians[False, False] * 1e3:.1f} ms',
       _ratio(step_medians[True, False], step_medians[False, False])),
      ('step time remat / no remat',
       _ratio(step_medians[True, True], step_medians[True, False]),
       _ratio(step_medians[False, True], step_medians[False, False]), ''),
  ]
  train_ms = 1e3 * float(np.median(r.step_times[1:] or r.step_times))
  lines = [
      f'T5-style encoder: {config.num_layers} blocks, d_model {config.d_model},'
      f' {config.num_heads} heads, length {config.length}, batch {BATCH_SIZE};'
      f" one {config.length}x{config.length} attention mask in collection"
      " 'graph', tied across blocks with nn.tie",
      f'trained {r.trained} for {len(r.losses)} optax steps: loss'
      f' {r.losses[0]:.3f} -> {r.losses[-1]:.3f} (median step'
      f' {train_ms:.1f} ms)',
      '',
      _table(rows),
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
  """Compiled temp and argument bytes per depth for none/remat/remat+tie."""
  kinds = {'no remat': (False, False), 'remat': (False, True),
           'remat + tie': (True, True)}
  out = {kind: [] for kind in kinds}
  for depth in depths:
    config = dataclasses.replace(base, num_layers=depth)
    tokens = jax.ShapeDtypeStruct((BATCH_SIZE, config.length), jnp.int32)
    for kind, (tied, remat) in kinds.items():
      _status(f'compiling for the plot: {depth} blocks, {kind}')
      model = t5.make_encoder(config, tied=tied, remat=remat)
      shapes = jax.eval_shape(
          functools.partial(model.init, deterministic=True),
          jax.random.key(0), tokens)
      fn = jax.jit(jax.value_and_grad(functools.partial(t5.loss_fn, model)))
      _, stats = measure.compile_stats(
          fn, shapes['params'], {'graph': shapes['graph']}, tokens, tokens,
          None)  # dropout off, as in the table
      out[kind].append((stats.temp_bytes, stats.argument_bytes))
  return out


def save_plot(path: str, depths: Sequence[int], memory) -> None:
  """Writes the memory-vs-depth figure to ``path`` (PNG)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  titles = ('compiled temp memory (activations)',
            'argument memory (stored variables + batch)')
  # Series can coincide (the tie leaves the activations alone, remat the
  # stored variables): each is drawn thinner than the one before, so that it
  # shows on top of it, and its legend entry says which it lies on.
  styles = ({'linewidth': 6, 'markersize': 12, 'marker': 'o', 'alpha': 0.45},
            {'linewidth': 3, 'markersize': 8, 'marker': 's', 'linestyle': '--'},
            {'linewidth': 1.5, 'markersize': 4, 'marker': 'D', 'linestyle': ':'})
  for index, (ax, title) in enumerate(zip(axes, titles)):
    drawn = {}
    for (kind, values), style in zip(memory.items(), styles):
      mib = [v[index] / 2**20 for v in values]
      same = [k for k, other in drawn.items()
              if all(abs(a - b) <= 0.01 * max(abs(b), 1e-9)
                     for a, b in zip(mib, other))]
      label = f'{kind} (on {same[0]})' if same else kind
      ax.plot(depths, mib, label=label, **style)
      drawn[kind] = mib
    ax.set_title(title)
    ax.set_xlabel('encoder blocks')
    ax.set_ylabel('MiB')
    ax.grid(True, alpha=0.3)
    ax.legend()
  fig.suptitle('T5-style encoder, loss + gradient with dropout off'
               ' (XLA memory_analysis)')
  fig.tight_layout()
  try:
    fig.savefig(path, format='png', dpi=120)
  finally:
    plt.close(fig)


def plot_depths(layers: int) -> list[int]:
  """The depths the plot compiles: the usual ones up to ``layers``, and it."""
  return sorted({d for d in PLOT_DEPTHS if d <= max(layers, 2)} | {layers})


def write_plot(path: str, layers: int) -> bool:
  """Measures and plots memory against depth; ``False`` if writing failed."""
  depths = plot_depths(layers)
  memory = memory_by_depth(depths, t5.T5Config())
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

  # The comparison: loss and gradient with dropout off (cheaper to compile).
  variants = {
      (tied, rm): _compile_variant(
          config, tied_vars if tied else untied_vars, tied=tied, remat=rm,
          dropout=False, batch=probe)
      for tied in (True, False) for rm in (True, False)}
  timer = measure.Interleaved({
      k: functools.partial(v.value_and_grad, params, *probe)
      for k, v in variants.items()}).run(TIMING_ROUNDS)
  step_medians = {k: timer.median(k) for k in variants}
  tied_loss, tied_grads = variants[True, remat].value_and_grad(params, *probe)
  untied_loss, untied_grads = variants[False, remat].value_and_grad(
      params, *probe)
  return Results(
      config=config, trained=trained, losses=losses, step_times=step_times,
      tied_vars=tied_vars, untied_vars=untied_vars, variants=variants,
      step_medians=step_medians,
      loss_difference=abs(float(tied_loss) - float(untied_loss)),
      grad_difference=_max_abs_difference(tied_grads, untied_grads),
      barriers_kept=barriers_kept)


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
  if args.plot is not None:
    problem = _plot_path_problem(args.plot)
    if problem:
      parser.error(problem)
  start = time.perf_counter()
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
  print(f'wall time: {time.perf_counter() - start:.1f} s')
  return 0


if __name__ == '__main__':
  sys.exit(main())
