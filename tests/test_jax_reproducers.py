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

"""The JAX bug reproducers in patches/jax/ stay small and say one word.

Each ``patches/jax/<name>.py`` has at most 15 non-blank lines, its report
``<name>.md`` shows it verbatim, and run in a fresh interpreter on the
installed JAX it exits 0 with a last line that is one of ``run.WORDS``
(``reproduces``, ``fixed``, ``not-applicable``). Which word is not asserted:
a fixed bug is news, not a failure; ``nox -s upstream`` reports each word on
each JAX release of the matrix.

Seen on jax 0.10.2 (Flax 0.12.8's pin), CPU: both reproduce.
``checkpoint_static_argnums_leak`` leaves 30 arrays alive after 30 steps (0
without ``static_argnums``); ``checkpoint_static_argnames_ignored`` raises
``TracerBoolConversionError``. On jax 0.4.35 and 0.8.1 the second prints
``not-applicable``: their ``jax.checkpoint`` has no ``static_argnames``.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDER = ROOT / 'patches' / 'jax'
MAX_LINES = 15


def _runner():
  spec = importlib.util.spec_from_file_location('jax_reproducers_run', FOLDER / 'run.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


RUN = _runner()
REPRODUCERS = RUN.reproducers()


def test_there_are_reproducers():
  assert {p.stem for p in REPRODUCERS} >= {'checkpoint_static_argnums_leak',
                                           'checkpoint_static_argnames_ignored'}


@pytest.mark.parametrize('script', REPRODUCERS, ids=lambda p: p.stem)
def test_reproducer_is_short_and_its_report_shows_it(script):
  source = script.read_text()
  lines = [line for line in source.splitlines() if line.strip()]
  assert len(lines) <= MAX_LINES, f'{script.name}: {len(lines)} non-blank lines'
  report = script.with_suffix('.md')
  assert report.exists(), f'{script.name} has no report {report.name}'
  assert f'```python\n{source}```' in report.read_text(), (
      f'{report.name} does not show {script.name} as it is')


# Pure JAX, so the patch mode is moot: no [opted-out] copy (own_patch_mode).
@pytest.mark.end_to_end
@pytest.mark.own_patch_mode
@pytest.mark.parametrize('script', REPRODUCERS, ids=lambda p: p.stem)
def test_reproducer_exits_0_saying_one_word(script):
  env = {k: v for k, v in os.environ.items() if k != 'JAX_REMAT3'}
  env['JAX_PLATFORMS'] = 'cpu'
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=FOLDER, timeout=RUN.TIMEOUT_S, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert lines and lines[-1] in RUN.WORDS, result.stdout + result.stderr[-3000:]


def test_runner_fails_only_on_a_crash_or_another_word(tmp_path):
  (tmp_path / 'run.py').write_text((FOLDER / 'run.py').read_text())
  (tmp_path / 'a_fixed.py').write_text("print('fixed')\n")
  (tmp_path / 'b_other.py').write_text("print('reproduces')\nprint('maybe')\n")
  (tmp_path / 'c_crash.py').write_text("raise ValueError('boom')\n")
  (tmp_path / 'd_news.py').write_text("print('some output')\nprint('not-applicable')\n")
  result = subprocess.run([sys.executable, str(tmp_path / 'run.py')], capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 1, result.stdout + result.stderr
  lines = result.stdout.splitlines()
  assert [line.split(': ', 1)[1] for line in lines] == [
      'a_fixed: fixed',
      "b_other: FAILED (printed 'maybe', not one of reproduces, fixed, not-applicable)",
      'c_crash: FAILED (exit 1)',
      'd_news: not-applicable',
  ], result.stdout
  assert all(line.startswith('jax ') for line in lines), result.stdout
  assert 'ValueError: boom' in result.stderr, result.stderr

  (tmp_path / 'b_other.py').unlink()
  (tmp_path / 'c_crash.py').unlink()
  result = subprocess.run([sys.executable, str(tmp_path / 'run.py')], capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
