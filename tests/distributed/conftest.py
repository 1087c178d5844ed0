"""Runs :mod:`flax_tieext.examples.scaling` as a ``jax.distributed`` job.

Every process gets 4 CPU devices (``XLA_FLAGS``), so two processes make one
8-device mesh; :func:`flax_tieext.examples.launch.launch` gives each a
deadline and, when one fails, stops the others and names the one that failed.
"""

import json
import os
import pathlib

import numpy as np
from flax_tieext.examples import launch

WORKER = ('-m', 'flax_tieext.examples.scaling')
# Per process: start-up, compiling two programs, a few steps.
TIMEOUT_S = 120


def job_env():
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=4')
  env.pop('FLAX_TIEEXT_AUTOPATCH', None)  # the worker uses nn.tie
  return env


class Job:
  """What a finished job left in its ``--out`` directory."""

  def __init__(self, out: pathlib.Path, results):
    self.out = out
    self.results = results
    self.processes = [
        json.loads((out / f'process_{i}.json').read_text())
        for i in range(len(results))]
    with np.load(out / 'params.npz') as data:
      self.params = {k: data[k] for k in data.files}

  @property
  def losses(self):
    return self.processes[0]['losses']


def run_job(out: pathlib.Path, *args, num_processes=2, timeout=TIMEOUT_S,
            **kwargs) -> Job:
  """Runs the worker as ``num_processes`` processes writing to ``out``."""
  results = launch.launch([*WORKER, '--out', str(out), *args], num_processes,
                          timeout=timeout, env=job_env(), **kwargs)
  return Job(out, results)
