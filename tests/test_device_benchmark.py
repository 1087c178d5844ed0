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

"""The accelerator benchmarks' code path, at ``--tiny`` size on the CPU.

``benchmarks/device.py`` measures on a TPU or GPU, which CI does not have:
this runs every comparison it makes (compile, peak-memory pass, interleaved
timing, the NNX HLO comparison, the JSON it writes) and renders the
Accelerator section from its results. It checks what was measured is there
and well formed, never a time.
"""

import importlib.util
import json
import pathlib
import sys

import pytest

from flax_tieext import _compat

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _tree_mode() -> bool:
  try:
    import flax_tieext.nnx  # pylint: disable=g-import-not-at-top,redefined-outer-name
  except ImportError:
    return False
  return flax_tieext.nnx._TREE_MODE  # pylint: disable=protected-access


pytestmark = [
    pytest.mark.end_to_end, pytest.mark.needs_patch,
    # What the benchmarks measure (NNX tree mode, JAX's current APIs) is the
    # newest releases'; older ones have no accelerator numbers to keep.
    pytest.mark.skipif(not _tree_mode(), reason=(
        f'Flax {_compat.FLAX_VERSION} has no NNX tree mode: the accelerator'
        ' benchmarks run on the releases that have it')),
]


def _load(name):
  spec = importlib.util.spec_from_file_location(
      f'_bench_{name}', ROOT / 'benchmarks' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # (dataclasses look their module up)
  spec.loader.exec_module(module)
  return module


def test_tiny_device_benchmarks_run_and_render(tmp_path):
  device, render = _load('device'), _load('render')
  out = tmp_path / 'device_results.json'
  assert device.main(['--tiny', '--rounds', '2', '--warmup', '1', '--out', str(out),
                      '--hlo-dir', str(tmp_path)]) == 0
  data = json.loads(out.read_text())

  assert set(data['groups']) == set(device.GROUPS)
  for name, group in data['groups'].items():
    if 'skipped' in group:  # Equinox where it is not installed, NNX on old Flax
      assert name in ('equinox', 'nnx'), group
      continue
    assert len(group['pairs']) == len(device.GROUPS[name][1])
    for pair in group['pairs']:
      assert pair['baseline_step_seconds'] > 0 and pair['candidate_step_seconds'] > 0
      assert len(pair['round_ratio_median_iqr']) == 3
  for name, row in data['variants'].items():
    assert row['flops'] > 0 and row['argument_bytes'] > 0, (name, row)
    assert row['temp_bytes'] >= 0, (name, row)
  # One stored attention instead of one per layer: fewer argument bytes.
  variants = data['variants']
  assert variants['scan_tie']['argument_bytes'] < variants['scan_untied']['argument_bytes']
  assert (variants['scan_broadcast_before']['argument_bytes']
          == variants['scan_tie']['argument_bytes'])
  if 'hlo' in data['groups']['nnx']:
    assert (tmp_path / 'nnx_tree.hlo.txt').exists()
    assert data['groups']['nnx']['hlo']['graph']['fusions'] >= 0

  lines = render.accelerator(data)
  text = '\n'.join(lines)
  assert lines[0] == '## Accelerator'
  for group in data['groups'].values():
    assert group['title'] in text


def test_tiny_layouts_grid_runs_and_renders(tmp_path):
  """``device.py --grid``: every lowering of a layout against the untied stack.

  The default compiles to ``in_scan='scanned'``'s very program (the grid
  reports it as that program); the closed-over one is another.
  """
  device, render = _load('device'), _load('render')
  out = tmp_path / 'grid.json'
  for stack in ('scan', 'vmap'):
    assert device.main(['--tiny', '--grid', '--stack', stack, '--layouts', 'fused2d_f32',
                        '--batches', '2', '--rounds', '2', '--warmup', '1',
                        '--out', str(out)]) == 0
  data = json.loads(out.read_text())
  assert set(data['cells']) == {'scan:fused2d_f32/2', 'vmap:fused2d_f32/2'}
  scan = data['cells']['scan:fused2d_f32/2']['lowerings']
  assert set(scan) == {'untied', 'broadcast', 'scanned', 'default'}
  assert scan['default']['same_program_as'] == 'scanned'
  assert scan['broadcast']['same_program_as'] is None
  for row in scan.values():
    assert row['step_seconds'] > 0 and len(row['round_ratio_median_iqr']) == 3
    assert row['flops'] > 0 and row['argument_bytes'] > 0
  assert scan['default']['argument_bytes'] < scan['untied']['argument_bytes']
  assert set(data['cells']['vmap:fused2d_f32/2']['lowerings']) == {'untied', 'default'}
  text = '\n'.join(render.grid(data))
  assert '`nn.scan`, batch 2' in text and '`nn.vmap`, batch 2' in text
  assert '= scanned' in text
