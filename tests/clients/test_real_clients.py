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


"""Real clients train identically with and without ``import flax_tieext``.

Small random-initialised FlaxBert, FlaxRoberta, FlaxT5, FlaxWhisper (HF
transformers 4.57.6) and a recurrentgemma Griffin, all with gradient
checkpointing on, are built twice by ``_models.py``: in an interpreter that
never imports flax_tieext, and in one that imports it before the libraries
(which bind ``nn.remat`` / ``nn.partitioning.remat`` at import or setup time).
Loss and every gradient leaf must be bitwise equal.

Needs transformers, recurrentgemma and their dependencies, so the default
``pytest`` run ignores this directory (``--ignore=tests/clients`` in
setup.cfg); ``nox -s clients`` installs them and runs it.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

MODELS = ('bert', 'roberta', 't5', 'whisper', 'griffin')
_SCRIPT = pathlib.Path(__file__).with_name('_models.py')
_TIMEOUT_S = 900


@pytest.fixture(scope='module')
def outputs(tmp_path_factory):
  """Runs both modes side by side (one core each); returns their output dirs."""
  env = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
  env.pop('FLAX_TIEEXT_AUTOPATCH', None)
  dirs, procs = {}, {}
  for mode in ('reference', 'patched'):
    dirs[mode] = tmp_path_factory.mktemp(mode)
    procs[mode] = subprocess.Popen(
        [sys.executable, str(_SCRIPT), mode, str(dirs[mode])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
  logs = {mode: p.communicate(timeout=_TIMEOUT_S)[0] for mode, p in procs.items()}
  for mode, p in procs.items():
    assert p.returncode == 0, f'{mode} run exited {p.returncode}:\n{logs[mode]}'
  return dirs


def _load(directory, model):
  error = directory / f'{model}.error'
  if error.exists():
    pytest.fail(f'{model} failed in {directory.name} mode:\n{error.read_text()}')
  with np.load(directory / f'{model}.npz') as data:
    return {k: data[k] for k in data.files}


@pytest.mark.parametrize('model', MODELS)
def test_loss_and_gradients_are_identical_with_the_patch(outputs, model):
  reference = _load(outputs['reference'], model)
  patched = _load(outputs['patched'], model)
  assert sorted(patched) == sorted(reference), 'gradient trees differ'
  assert len(reference) > 1
  for name, expected in reference.items():
    np.testing.assert_array_equal(patched[name], expected, err_msg=f'{model}: {name}')
