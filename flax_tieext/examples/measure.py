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

"""What the demo and the benchmarks measure, and how.

* Stored variables: :func:`tree_size` counts arrays and bytes.
* Compiled cost and memory: :func:`compile_stats` lowers and compiles a jitted
  function and reads XLA's ``cost_analysis()`` (FLOPs) and
  ``memory_analysis()`` (temp, argument and output bytes).
* Time: :class:`Interleaved` runs functions round by round and takes
  medians, the statistic least disturbed by a shared machine.

XLA:CPU and remat: XLA's CPU pipeline expands the optimization barriers that
``jax.checkpoint`` (``nn.remat``) places around the recomputation before
common-subexpression elimination runs, so CSE merges the recomputation back
into the forward pass and an unrolled, rematted model uses as much memory as
an unrematted one. GPU and TPU keep the barriers. :func:`keep_remat_on_cpu`
disables that one pass (``cse_barrier_expander``) so that the CPU numbers show
what remat does on an accelerator.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

KEEP_REMAT_XLA_FLAG = '--xla_disable_hlo_passes=cse_barrier_expander'


def keep_remat_on_cpu() -> bool:
  """Keeps remat's optimization barriers in XLA:CPU (see the module doc).

  Adds :data:`KEEP_REMAT_XLA_FLAG` to ``XLA_FLAGS``. XLA reads the variable
  once, when JAX first initializes a backend, so this must run before any
  computation.

  Returns:
    ``True`` if the flag is in force: it was set now, or earlier, before the
    backends were initialized.
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if 'cse_barrier_expander' in flags:
    return True
  if _backends_initialized():
    return False
  os.environ['XLA_FLAGS'] = f'{flags} {KEEP_REMAT_XLA_FLAG}'.strip()
  return True


def _backends_initialized() -> bool:
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):
    return True  # cannot tell: assume the flag would come too late


def tree_size(tree: Any) -> tuple[int, int]:
  """The number of arrays in ``tree`` and their total size in bytes."""
  leaves = jax.tree_util.tree_leaves(tree)
  return len(leaves), sum(int(np.prod(x.shape)) * x.dtype.itemsize
                          for x in leaves)


@dataclasses.dataclass(frozen=True)
class CompiledStats:
  """What XLA reports about one compiled function.

  Attributes:
    flops: floating-point operations, from ``cost_analysis()``.
    temp_bytes: scratch memory (activations, residuals), from
      ``memory_analysis()``.
    argument_bytes: memory of the arguments (here: the stored variables and
      the batch).
    output_bytes: memory of the outputs (loss and gradients).
    lower_seconds: time to trace and lower to StableHLO.
    compile_seconds: time for XLA to compile.
  """

  flops: float
  temp_bytes: int
  argument_bytes: int
  output_bytes: int
  lower_seconds: float
  compile_seconds: float


def compile_stats(jitted: Any, *args: Any) -> tuple[Any, CompiledStats]:
  """Lowers and compiles ``jitted`` for ``args``; returns it and its stats.

  Args:
    jitted: a ``jax.jit``-wrapped function.
    *args: arrays or ``jax.ShapeDtypeStruct`` s to compile for.

  Returns:
    ``(compiled, stats)``.
  """
  t0 = time.perf_counter()
  lowered = jitted.lower(*args)
  return compile_lowered(lowered, time.perf_counter() - t0)


def compile_lowered(lowered: Any, lower_seconds: float = 0.0
                    ) -> tuple[Any, CompiledStats]:
  """Compiles ``jitted.lower(...)``'s result; returns it and its stats.

  XLA releases the GIL while it compiles, so several lowered functions can
  compile at once in threads (tracing, which Flax does, stays in one).
  """
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
    cost = cost[0] if cost else {}
  memory = compiled.memory_analysis()
  return compiled, CompiledStats(
      flops=float((cost or {}).get('flops', float('nan'))),
      temp_bytes=int(memory.temp_size_in_bytes),
      argument_bytes=int(memory.argument_size_in_bytes),
      output_bytes=int(memory.output_size_in_bytes),
      lower_seconds=lower_seconds,
      compile_seconds=t2 - t1,
  )


class Interleaved:
  """Times several functions round by round (a, b, a, b, ...).

  A change in the machine's load during the measurement then hits every
  function alike, so the ratio of their medians stays meaningful. Results are
  waited for (``jax.block_until_ready``).

  Args:
    fns: ``{name: function of no arguments}``.
  """

  def __init__(self, fns: dict[str, Callable[[], Any]]):
    self.fns = fns
    self.samples: dict[str, list[float]] = {name: [] for name in fns}

  def one_round(self) -> None:
    """Runs every function once, recording its wall time."""
    for name, fn in self.fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      self.samples[name].append(time.perf_counter() - t0)

  def run(self, rounds: int, warmup: int = 1) -> Interleaved:
    """``warmup`` unrecorded rounds, then ``rounds`` recorded ones."""
    for _ in range(warmup):
      for fn in self.fns.values():
        jax.block_until_ready(fn())
    for _ in range(rounds):
      self.one_round()
    return self

  def median(self, name: str) -> float:
    """The median wall time of ``name``, in seconds."""
    return statistics.median(self.samples[name])

  def spread(self, name: str) -> tuple[float, float]:
    """The fastest and slowest wall time of ``name``, in seconds."""
    return min(self.samples[name]), max(self.samples[name])

  def ratio(self, a: str, b: str) -> tuple[float, float, float]:
    """``a``'s time over ``b``'s, round by round: median and middle half.

    Each round times ``a`` and ``b`` back to back, so a round's ratio is
    hit by the machine's load at the same moment; the spread of the ratios
    is the noise of the comparison.

    Returns:
      ``(median, first quartile, third quartile)`` of the per-round ratios.
    """
    ratios = [x / y for x, y in zip(self.samples[a], self.samples[b])]
    if len(ratios) < 2:
      return (ratios[0],) * 3 if ratios else (float('nan'),) * 3
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), q1, q3


def format_bytes(n: float) -> str:
  """``1536`` -> ``'1.5 KiB'``."""
  for unit in ('B', 'KiB', 'MiB', 'GiB'):
    if abs(n) < 1024 or unit == 'GiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
    n /= 1024
  raise AssertionError('unreachable')
