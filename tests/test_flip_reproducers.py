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

"""The ties FLIP's reproducer prints on this Flax what the FLIP shows.

``patches/flip/run.py`` runs ``patches/flip/sharing_in_linen.py`` (the one
file the FLIP names, attached when it is filed) in a fresh interpreter and prints what it prints: the
versions, then what each case measured. The FLIP's output block is
``measured-flax-0.12.8.txt``, that output on Flax 0.12.8; the newest release
prints the same measurements, and this test holds both to it, and the FLIP to
showing the script and the output as they are. The script uses Flax alone.
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
  """The measurements: every line but the first (which names the versions)."""
  return [line.rstrip() for line in text.strip().splitlines()[1:]]


def test_flip_shows_its_reproducer_and_output_as_they_are():
  text = (FLIP / 'ties-in-linen.md').read_text()
  # The script is attached when the issue is filed, not pasted (199 lines):
  # the issue names it and shows its output and a table of what it measured.
  assert '```python' not in text and '`sharing_in_linen.py`' in text
  assert f"```\n{(FLIP / 'measured-flax-0.12.8.txt').read_text()}```" in text
  script = (FLIP / 'sharing_in_linen.py').read_text()
  for internal in ('scope.root', '.scope', '._v', 'jax._src', 'tie', 'flax_tieext'):
    assert internal not in script, internal
  # Each row of the FLIP's table is measured by a line of the output.
  rows = {line.split()[0] for line in _rows((FLIP / 'measured-flax-0.12.8.txt').read_text())}
  table = {line.split('|')[1].strip().replace(', ', '-') for line in text.splitlines()
           if line.startswith('| ') and line.split('|')[1].strip()[:1].isdigit()}
  assert rows == table


def test_reproducer_prints_the_flips_output():
  if tuple(int(n) for n in _compat.FLAX_VERSION.split('.')[:3]) < MEASURED_ON:
    pytest.skip(f'the FLIP was measured on Flax 0.12.8; this is Flax {_compat.FLAX_VERSION}')
  done = subprocess.run([sys.executable, str(FLIP / 'run.py'), '--python', sys.executable],
                        capture_output=True, text=True, timeout=1200, check=False)
  assert done.returncode == 0, done.stdout + done.stderr
  measured = _rows((FLIP / 'measured-flax-0.12.8.txt').read_text())
  assert _rows(done.stdout) == measured
  # The rows the FLIP argues from, so that a changed measurement file cannot
  # quietly turn them around.
  for row in ('4 variable_carry: count after 1 + 3 calls: 15.0',
              '5 map_variables write-back under nn.remat: count after 2 calls: 7.0',
              "7 nn.remat blocks, read block_0: graph stored: {'block_0': {'attn': {'mask': "
              "(4, 4)}}}",
              '9 nn.Embed.attend: embedding rows with a gradient (input uses 3): 16 of 16'):
    assert row in measured
