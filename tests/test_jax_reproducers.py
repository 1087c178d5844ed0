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

"""The JAX bug reproducers in patches/jax/ stay small; run.py judges them.

Each ``patches/jax/<name>.py`` has at most ``MAX_LINES`` lines,
its report ``<name>.md`` shows it verbatim, and it prints what a reporter
saw (values, error types), never a verdict; ``run.py``'s ``JUDGES`` turn
that output into one of ``run.WORDS`` (``reproduces``, ``fixed``,
``not-applicable``). Which word is not asserted on the installed JAX: a fixed
bug is news, not a failure; ``nox -s upstream`` reports each word on each JAX
release of the matrix. The judges are checked here on the outputs each
verdict stands for.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDER = ROOT / 'patches' / 'jax'
MAX_LINES = 22


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
  lines = source.splitlines()  # blank ones too: what a reader scrolls
  assert len(lines) <= MAX_LINES, f'{script.name}: {len(lines)} lines'
  report = script.with_suffix('.md')
  assert report.exists(), f'{script.name} has no report {report.name}'
  assert f'```python\n{source}```' in report.read_text(), (
      f'{report.name} does not show {script.name} as it is')


def test_no_reproducer_prints_a_verdict_word():
  for script in REPRODUCERS:
    assert not any(word in script.read_text() for word in RUN.WORDS), script.name


LEAK = '''jax 0.10.2
static_argnums=(): eager, 30 steps: 0 arrays still alive
static_argnums=(): jit under checking_leaks: ok
static_argnums=(1,): eager, 30 steps: {alive} arrays still alive
static_argnums=(1,): jit under checking_leaks: {jit}
'''
NAMES = '''jax 0.12.1
static_argnums=(1,), f(x, True): grad: 3.0
static_argnums=(1,), f(x, True): jit(grad): 3.0
static_argnames=('flag',), f(x, flag=True): grad: {seen}
static_argnames=('flag',), f(x, flag=True): jit(grad): {seen}
static_argnames=('flag',), f(x, True): grad: {seen}
static_argnames=('flag',), f(x, True): jit(grad): {seen}
'''

BROADCAST = '''jax 0.10.2 cpu
closed_over: temp 344 MiB, bf16[12,1024,1024] values: []
scanned: temp 432 MiB, bf16[12,1024,1024] values: {stack}
'''


@pytest.mark.parametrize('name, out, word', [
    ('checkpoint_static_argnums_leak',
     LEAK.format(alive=30, jit='Leaked trace DynamicJaxprTrace. Leaked tracer(s):'),
     'reproduces'),
    ('checkpoint_static_argnums_leak', LEAK.format(alive=30, jit='ok'), 'reproduces'),
    ('checkpoint_static_argnums_leak', LEAK.format(alive=0, jit='ok'), 'fixed'),
    ('checkpoint_static_argnums_leak', LEAK.format(alive=3, jit='ok'), None),
    ('checkpoint_static_argnums_leak', 'jax 0.10.2\n', None),
    ('checkpoint_static_argnames_ignored', NAMES.format(seen='TracerBoolConversionError'),
     'reproduces'),
    ('checkpoint_static_argnames_ignored', NAMES.format(seen='3.0'), 'fixed'),
    ('checkpoint_static_argnames_ignored', NAMES.format(seen='TypeError'), 'not-applicable'),
    ('checkpoint_static_argnames_ignored', NAMES.format(seen='ValueError'), None),
    ('checkpoint_static_argnames_ignored',
     NAMES.format(seen='3.0').replace('f(x, True): grad: 3.0', 'f(x, True): grad: 1.0', 1),
     None),
    ('scan_over_broadcast_materialized', BROADCAST.format(
        stack="['broadcast', 'convert', 'fusion']"), 'reproduces'),
    ('scan_over_broadcast_materialized', BROADCAST.format(stack='[]'), 'fixed'),
    ('scan_over_broadcast_materialized', BROADCAST.format(stack='[]').replace(
        'closed_over: temp 344 MiB, bf16[12,1024,1024] values: []',
        "closed_over: temp 344 MiB, bf16[12,1024,1024] values: ['fusion']"), None),
    ('scan_over_broadcast_materialized', 'jax 0.10.2 cpu\n', None),
    ('a_report_with_no_judge', 'anything\n', None),
], ids=lambda v: v if isinstance(v, str) and '\n' not in v else None)
def test_judge_names_what_the_output_shows(name, out, word):
  assert RUN.verdict(name, out) == word


# Pure JAX, so the patch mode is moot: no [opted-out] copy (own_patch_mode).
@pytest.mark.end_to_end
@pytest.mark.own_patch_mode
@pytest.mark.parametrize('script', REPRODUCERS, ids=lambda p: p.stem)
def test_reproducer_runs_and_its_judge_reads_it(script):
  env = dict(os.environ, JAX_REMAT3='0', JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=FOLDER, timeout=RUN.TIMEOUT_S, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert RUN.verdict(script.stem, result.stdout) in RUN.WORDS, (
      result.stdout + result.stderr[-3000:])


def test_runner_fails_only_on_a_crash_no_judge_or_an_unknown_output(tmp_path):
  (tmp_path / 'run.py').write_text((FOLDER / 'run.py').read_text())
  leak = LEAK.format(alive=0, jit='ok')
  (tmp_path / 'checkpoint_static_argnums_leak.py').write_text(f'print({leak!r})\n')
  (tmp_path / 'checkpoint_static_argnames_ignored.py').write_text("print('maybe')\n")
  (tmp_path / 'c_crash.py').write_text("raise ValueError('boom')\n")
  (tmp_path / 'd_no_judge.py').write_text("print('some output')\n")
  result = subprocess.run([sys.executable, str(tmp_path / 'run.py')], capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 1, result.stdout + result.stderr
  lines = [line for line in result.stdout.splitlines() if line.startswith('jax ')
           and ': ' in line[4:] and line.split(': ', 1)[1].split(':')[0] in (
               'c_crash', 'd_no_judge', 'checkpoint_static_argnums_leak',
               'checkpoint_static_argnames_ignored')]
  assert [line.split(': ', 1)[1] for line in lines] == [
      'c_crash: FAILED (exit 1)',
      'checkpoint_static_argnames_ignored: FAILED (printed what its judge does not recognise)',
      'checkpoint_static_argnums_leak: fixed',
      'd_no_judge: FAILED (no judge in run.py)',
  ], result.stdout
  assert 'ValueError: boom' in result.stderr, result.stderr
  assert 'static_argnums=(1,): eager, 30 steps: 0 arrays still alive' in result.stdout

  for name in ('checkpoint_static_argnames_ignored', 'c_crash', 'd_no_judge'):
    (tmp_path / f'{name}.py').unlink()
  result = subprocess.run([sys.executable, str(tmp_path / 'run.py')], capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
