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

"""The ties FLIP's reproducers print on this Flax the table the FLIP shows.

``patches/flip/run.py`` runs every reproducer of ``patches/flip/ties-in-linen.md``
in a fresh interpreter (the ``tie.py`` cases once plain and once with
``flax_tieext`` imported) and prints one row per run: ``works`` or
``fails: <what>``. The FLIP's table was measured on Flax 0.12.8
(``measured-flax-0.12.8.txt``); the newest release prints the same rows, and
this test holds both to it, row by row. Older releases print other errors
for the same problems (their messages differ), which the FLIP does not claim.
"""

import pathlib
import subprocess
import sys

import pytest

from flax_tieext import _compat

pytestmark = [pytest.mark.own_patch_mode, pytest.mark.end_to_end]

FLIP = pathlib.Path(__file__).resolve().parents[1] / 'patches' / 'flip'
MEASURED_ON = (0, 12, 8)


def _rows(text):
  """The table: every line but the first (which names the interpreter)."""
  return [line.rstrip() for line in text.strip().splitlines()[1:]]


def test_reproducers_print_the_flips_table():
  if tuple(int(n) for n in _compat.FLAX_VERSION.split('.')[:3]) < MEASURED_ON:
    pytest.skip(f'the FLIP table was measured on Flax 0.12.8; this is Flax {_compat.FLAX_VERSION}')
  done = subprocess.run([sys.executable, str(FLIP / 'run.py'), '--python', sys.executable,
                         '--jobs', '2'], capture_output=True, text=True, timeout=1200)
  assert done.returncode == 0, done.stdout + done.stderr
  measured = _rows((FLIP / 'measured-flax-0.12.8.txt').read_text())
  assert _rows(done.stdout) == measured
  # The rows the FLIP argues from, so that a changed measurement file cannot
  # quietly turn them around.
  table = dict(line.split(' -> ', 1) for line in measured if ' -> ' in line)
  table = {name.strip(): result for name, result in table.items()}
  assert table['remat_sibling_mask.py'].startswith('fails:')
  assert table['remat_sibling_mask.py --no-remat'] == 'works'
  assert table['map_variables_lost_write.py'].startswith('fails:')
