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

"""Runs one program as N ``jax.distributed`` processes on this machine.

What a cluster scheduler does for a multi-host job, for local tests and the
demo: start every process with its ``--process-id``, a shared
``--coordinator 127.0.0.1:<free port>`` and ``--num-processes``, give each one
a deadline, and when one fails kill the others and say which failed and why::

  results = launch(['-m', 'flax_tieext.examples.scaling', '--steps', '4'],
                   num_processes=2, timeout=120)

Each process's stdout and stderr go to one log; ``on_line`` sees its lines as
they come (the demo draws its progress bar from process 0's). In each process,
:func:`initialize` joins the job with those flags.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

import jax

# How much of a failed process's log an error shows.
_TAIL_LINES = 25


@dataclasses.dataclass
class ProcessResult:
  """How one process ended.

  Attributes:
    process_id: its ``--process-id``.
    returncode: its exit code; negative for a signal (``-9``: SIGKILL).
    seconds: wall time from the launch to its end.
    output: its stdout and stderr, interleaved.
    stopped: the launcher killed it (another process failed, or the
      deadline passed).
  """

  process_id: int
  returncode: int
  seconds: float
  output: str
  stopped: bool = False

  def describe(self) -> str:
    """``'process 1 was killed by SIGKILL after 3.2 s'`` and the like."""
    if self.stopped:
      how = 'was stopped by the launcher'
    elif self.returncode < 0:
      how = f'was killed by {signal.Signals(-self.returncode).name}'
    else:
      how = f'exited with code {self.returncode}'
    return f'process {self.process_id} {how} after {self.seconds:.1f} s'


class ProcessFailed(RuntimeError):
  """A launched process failed or timed out; the others were stopped.

  Attributes:
    failed: the process whose failure ended the run.
    results: how every process ended.
  """

  def __init__(self, message: str, failed: ProcessResult,
               results: Sequence[ProcessResult]):
    super().__init__(message)
    self.failed = failed
    self.results = list(results)


def initialize(coordinator: str, num_processes: int, process_id: int, *,
               heartbeat_timeout: int = 10, shutdown_timeout: int = 10):
  """Joins the ``jax.distributed`` job, with gloo collectives on CPU.

  A peer that stops sending heartbeats for ``heartbeat_timeout`` seconds is
  declared dead, and the coordination service stops the job; the survivors
  then fail instead of waiting forever in a collective. (JAX before 0.5 has
  neither timeout as an argument and keeps its defaults.)
  """
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  timeouts = {'heartbeat_timeout_seconds': heartbeat_timeout,
              'shutdown_timeout_seconds': shutdown_timeout}
  accepted = inspect.signature(jax.distributed.initialize).parameters
  jax.distributed.initialize(
      coordinator_address=coordinator, num_processes=num_processes,
      process_id=process_id, initialization_timeout=60,
      **{k: v for k, v in timeouts.items() if k in accepted})


def free_port() -> int:
  """A TCP port on 127.0.0.1 that is free right now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _tail(text: str) -> str:
  lines = text.rstrip().splitlines()[-_TAIL_LINES:]
  return '\n'.join('    ' + line for line in lines) or '    (no output)'


def launch(
    args: Sequence[str],
    num_processes: int,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[int, str, subprocess.Popen], None] | None = None,
    stop_others_on_failure: bool = True,
) -> list[ProcessResult]:
  """Runs ``python <args> --process-id i ...`` for ``i < num_processes``.

  Args:
    args: the program and its arguments, after ``python`` (e.g. ``['-m',
      'pkg.mod', '--steps', '4']``). The launcher appends ``--coordinator
      127.0.0.1:<free port> --num-processes N --process-id i``.
    num_processes: how many processes.
    timeout: seconds every process has to finish.
    env: the environment of every process (default: this one).
    on_line: called as ``on_line(process_id, line, popen)`` for each line a
      process writes.
    stop_others_on_failure: when a process fails, kill the others at once
      (what a scheduler does). If ``False``, the others run on until they end
      or the deadline, e.g. to see how a survivor reacts to a dead peer.

  Returns:
    How each process ended, in process order, if all exited with code 0.

  Raises:
    ProcessFailed: a process exited non-zero or was killed, or the deadline
      passed; the message names the process, how it ended, and the end of its
      output.
  """
  coordinator = f'127.0.0.1:{free_port()}'
  start = time.monotonic()
  procs, logs, offsets, partial = [], [], [], []
  ended = {}  # process id -> (returncode, seconds)
  stopped = set()  # killed by the launcher
  failure, timed_out = None, False
  with tempfile.TemporaryDirectory(prefix='flax_tieext_launch_') as tmp:

    def read_lines(i):
      logs[i].seek(offsets[i])
      chunk = logs[i].read()
      offsets[i] += len(chunk)
      partial[i] += chunk.decode(errors='replace')
      *lines, partial[i] = partial[i].split('\n')
      for line in lines if on_line is not None else ():
        on_line(i, line, procs[i])

    try:
      for i in range(num_processes):
        log = open(os.path.join(tmp, f'{i}.log'), 'w+b')  # pylint: disable=consider-using-with
        logs.append(log)
        offsets.append(0)
        partial.append('')
        procs.append(subprocess.Popen(
            [sys.executable, '-u', *args, '--coordinator', coordinator,
             '--num-processes', str(num_processes), '--process-id', str(i)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env)))
      while len(ended) < num_processes:
        for i, proc in enumerate(procs):
          read_lines(i)
          if i not in ended and proc.poll() is not None:
            read_lines(i)
            ended[i] = proc.returncode, time.monotonic() - start
            if proc.returncode != 0 and failure is None:
              failure = i
        if failure is not None and stop_others_on_failure:
          break
        if time.monotonic() - start > timeout:
          timed_out = True
          break
        time.sleep(0.05)
    finally:
      for i, proc in enumerate(procs):
        if proc.poll() is None:
          proc.kill()
          stopped.add(i)
        proc.wait()
        ended.setdefault(i, (proc.returncode, time.monotonic() - start))
    results = []
    for i, log in enumerate(logs):
      log.seek(0)
      results.append(ProcessResult(
          i, *ended[i], output=log.read().decode(errors='replace'),
          stopped=i in stopped))
      log.close()

  if failure is None and timed_out:
    failure = min(stopped)
    message = (f'timed out after {timeout:.0f} s: '
               + ', '.join(f'process {i}' for i in sorted(stopped))
               + ' still running.')
  elif failure is not None:
    message = f'{results[failure].describe()}.'
  else:
    return results
  others = [r.describe() for r in results if r.process_id != failure]
  message += f' Others: {"; ".join(others)}.' if others else ''
  message += (f'\n  output of process {failure}:\n'
              f'{_tail(results[failure].output)}')
  raise ProcessFailed(message, results[failure], results)
