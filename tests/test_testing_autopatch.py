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


"""``pytest -p flax_tieext.testing.autopatch`` runs a suite on patched Flax."""

import os
import subprocess
import sys
import textwrap

import pytest

# Each test runs pytest in a fresh interpreter with FLAX_TIEEXT_AUTOPATCH=0.
pytestmark = [pytest.mark.own_patch_mode, pytest.mark.end_to_end]


def _pytest(tmp_path, *args):
  env = dict(os.environ, FLAX_TIEEXT_AUTOPATCH='0', PYTHONPATH=str(tmp_path))
  return subprocess.run(
      [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', *args],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
  )


def test_plugin_installs_the_patch_before_collection_even_when_opted_out(tmp_path):
  (tmp_path / 'test_probe.py').write_text(textwrap.dedent("""\
      import flax_tieext

      # Evaluated at collection: the patch is already in place.
      INSTALLED_AT_IMPORT = flax_tieext.is_installed()

      def test_probe():
        assert INSTALLED_AT_IMPORT
        assert flax_tieext.is_installed()
      """))
  result = _pytest(tmp_path, '-p', 'flax_tieext.testing.autopatch', 'test_probe.py')
  assert result.returncode == 0, result.stdout + result.stderr
  assert 'flax_tieext' in result.stdout and 'patch installed into flax' in result.stdout


def test_plugin_fails_the_run_when_flax_cannot_be_patched(tmp_path):
  # An earlier plugin removes something the patch needs from Flax.
  (tmp_path / 'break_flax.py').write_text(
      'import flax.core.lift\ndel flax.core.lift._partial_pack\n'
  )
  (tmp_path / 'test_probe.py').write_text('def test_probe():\n  pass\n')
  result = _pytest(
      tmp_path, '-p', 'break_flax', '-p', 'flax_tieext.testing.autopatch', 'test_probe.py'
  )
  assert result.returncode != 0
  output = result.stdout + result.stderr
  assert 'PatchError' in output and '_partial_pack' in output, output


def test_plugin_is_not_loaded_unless_asked_for(tmp_path):
  # Installing flax_tieext must not change other projects' test runs.
  (tmp_path / 'test_probe.py').write_text(textwrap.dedent("""\
      import flax_tieext

      def test_probe():
        assert not flax_tieext.is_installed()
      """))
  result = _pytest(tmp_path, 'test_probe.py')
  assert result.returncode == 0, result.stdout + result.stderr
