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

"""Checks ``patches/flax/`` as Flax's review and CI would (``nox -s upstream``).

On the sdist of Flax ``BUILD_ON`` (whose files the PRs touch are those of
Flax main 18f8f311; each PR applies to both):

1. each PR applies (``git apply``) on top of the ones before it, within its
   size (``LIMITS``: lines added);
2. in the files it touches, pyflakes and ruff (Flax's ``pyproject.toml``) find
   nothing the tree before it lacks, ``pyupgrade --py310-plus`` changes
   nothing, no added line is over 80 columns and ``git diff --check`` is clean;
3. its text is a person's: a ``From:`` and a ``Date:`` from the sender's git,
   no word of this project (``HYGIENE``);
4. the leak regression test of PR 1 fails without PR 1 and passes with it;
5. Flax's ``tests/core`` and ``tests/linen`` (less ``LAYER_TESTS``) pass
   after each PR wherever they pass before the series, new tests included;
6. ``tests/upstream_compat_test.py`` (``COMPAT_TEST``): the programs that run
   before the series give the same results after each PR, and what the PR
   adds holds;
7. the docs PR (``patches/docs/``): every code block of its page runs on the
   installed Flax (``tests/test_upstream_docs.py``).

Exits non-zero, listing every problem, if any check fails.
"""

from __future__ import annotations

import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / '.ci'))
import harness  # pylint: disable=g-import-not-at-top,wrong-import-position

PATCHES = ROOT / 'patches' / 'flax'
BUILD_ON = '0.12.8'
SUITES = ('tests/core', 'tests/linen')
# The layers' arithmetic (Dense, Conv, Embed, attention), a quarter of the
# suites' time, which nothing in the series reaches.
LAYER_TESTS = ('tests/linen/linen_linear_test.py', 'tests/linen/linen_attention_test.py')
# PR number -> (the part of the tree counted, most lines added there).
# Flax's yardsticks: 9522bc0b (static_argnums for nn.checkpoint) +15/-2,
# cf7311da (keyword arguments for nn.jit) +80/-59.
LIMITS = {'0001': ('flax/', 110)}
LEAK_TEST = ('tests/linen/linen_transforms_test.py::TransformTest::'
             'test_remat_static_argnums_leaks_no_tracer')
COMPAT_TEST = ROOT / 'tests' / 'upstream_compat_test.py'
HYGIENE = re.compile(r'flax[_-]tieext|patches/|edition|plugin|monkeypatch', re.I)


def _run(cmd, cwd=None, **kw):
  print('+', ' '.join(map(str, cmd)), flush=True)
  return subprocess.run(list(map(str, cmd)), cwd=cwd, check=False, **kw)


def touched(patch: pathlib.Path) -> list[str]:
  return [l.split()[2][2:] for l in patch.read_text().splitlines()
          if l.startswith('diff --git')]


def added(patch: pathlib.Path, under: str = '') -> list[str]:
  """The lines ``patch`` adds to files whose path starts with ``under``."""
  lines, current = [], None
  for line in patch.read_text().splitlines():
    if line.startswith('diff --git'):
      current = line.split()[2][2:]
    elif line.startswith('+') and not line.startswith('+++'):
      if current is not None and current.startswith(under):
        lines.append(line[1:])
  return lines


def text_problems(patch: pathlib.Path) -> list[str]:
  """What in ``patch``'s headers and message is not a person's text."""
  head = patch.read_text().split('\ndiff --git')[0]
  problems = [f'{patch.name}: no {field.strip()} header'
              for field in ('From: ', 'Date: ') if f'\n{field}' not in head]
  problems += [f'{patch.name}: names this project ({m.group(0)!r})'
               for m in HYGIENE.finditer(patch.read_text())]
  return problems


def _findings(cmd, tree: pathlib.Path, files: list[str]) -> collections.Counter:
  out = _run([*cmd, *files], cwd=tree, capture_output=True, text=True).stdout
  return collections.Counter(re.sub(r':\d+:\d+:? ', ': ', l, count=1)
                             for l in out.splitlines() if l.startswith(tuple(files)))


def lint(before: pathlib.Path, after: pathlib.Path, patch: pathlib.Path) -> list[str]:
  """What PR ``patch`` brings into the files it touches, by Flax's lint."""
  py = [f for f in touched(patch) if f.endswith('.py')]
  problems = []
  for name, cmd in (('pyflakes', [sys.executable, '-m', 'pyflakes']),
                    ('ruff', ['ruff', 'check', '--config', 'pyproject.toml'])):
    new = _findings(cmd, after, py) - _findings(cmd, before, py)
    problems += [f'{patch.name}: {name}: {f}' for f in sorted(new.elements())]
  copy = pathlib.Path(tempfile.mkdtemp())
  for f in py:
    (copy / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(after / f, copy / f)
  if _run(['pyupgrade', '--py310-plus', *py], cwd=copy).returncode:
    problems.append(f'{patch.name}: pyupgrade --py310-plus rewrites its files')
  problems += [f'{patch.name}: over 80 columns: {l.strip()[:60]}'
               for l in added(patch) if len(l) > 80]
  if _run(['git', 'diff', '--check'], cwd=after).returncode:
    problems.append(f'{patch.name}: whitespace errors (git diff --check)')
  return problems


def pytest(tree: pathlib.Path, xml: pathlib.Path, *tests) -> tuple[set, set]:
  """(passed, failed) junit ids of ``tests`` run on ``tree``'s own flax."""
  # Only pytest's last line is printed: the leak test is run to fail, and a
  # log reader (CI's included) should not take its FAILED line for a failure.
  run = _run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--tb=no',
              *(['-n', '2'] if not tests else []), f'--junitxml={xml}',
              *(tests or [*SUITES, *(f'--ignore={t}' for t in LAYER_TESTS)])],
             cwd=tree, env={**os.environ, 'PYTHONPATH': str(tree)},
             capture_output=True, text=True)
  print(f'  pytest: {(run.stdout.strip().splitlines() or ["no output"])[-1]}', flush=True)
  passed, failed = set(), set()
  for case in ET.parse(xml).iter('testcase'):
    kinds = {child.tag for child in case}
    name = f"{case.get('classname')}::{case.get('name')}"
    if kinds & {'failure', 'error'}:
      failed.add(name)
    elif 'skipped' not in kinds:
      passed.add(name)
  return passed, failed


def _node(junit_id: str) -> str:
  """``tests.core.x_test.C::t`` -> ``tests/core/x_test.py::C::t``."""
  dotted, name = junit_id.split('::')
  module, cls = dotted.rsplit('.', 1)
  return f"{module.replace('.', '/')}.py::{cls}::{name}"


def compat(base: pathlib.Path, tree: pathlib.Path, patch: pathlib.Path) -> list[str]:
  """``COMPAT_TEST``'s programs on ``base`` and on ``tree``; problems."""
  # Its own pytest configuration only (-c): the project's conftest installs
  # the plugin, which this session does not have.
  run = _run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--noconftest',
              '-c', os.devnull, '--rootdir', str(ROOT), '-n', '2', '--tb=short', COMPAT_TEST],
             env={**os.environ, 'UPSTREAM_FLAX_BEFORE': str(base), 'UPSTREAM_FLAX_AFTER': str(tree)},
             capture_output=True, text=True)
  print(f'  {COMPAT_TEST.name}: {(run.stdout.strip().splitlines() or ["no output"])[-1]}',
        flush=True)
  if run.returncode:
    return [f'{patch.name}: {COMPAT_TEST.name} fails:\n{run.stdout[-4000:]}']
  return []


def tree_after(base: pathlib.Path, patches, dest: pathlib.Path, include=None) -> list[str]:
  """Copies ``base`` to ``dest`` and applies ``patches``; problems."""
  shutil.copytree(base, dest, symlinks=True)
  problems = []
  for patch in patches:
    only = [f'--include={include}'] if include else []
    if _run(['git', 'apply', *only, patch], cwd=dest).returncode:
      problems.append(f'{patch.name} does not apply after the PRs before it')
  return problems


def verify() -> list[str]:
  patches = sorted(PATCHES.glob('*.patch'))
  if not patches:
    return [f'no patch in {PATCHES}']
  work = pathlib.Path(tempfile.mkdtemp(prefix='upstream-'))
  base = harness.extract(harness.flax_sdist(BUILD_ON), work / 'base')
  _run(['git', 'init', '-q'], cwd=base)
  _run(['git', 'add', '-A'], cwd=base)
  problems = []
  for patch in patches:
    problems += text_problems(patch)
    under, most = LIMITS.get(patch.name[:4], ('', 0))
    n = len(added(patch, under))
    print(f'{patch.name}: +{n} lines under {under or "the tree"} (at most {most})')
    if n > most:
      problems.append(f'{patch.name}: adds {n} lines under {under or "the tree"},'
                      f' more than {most}')

  # 4. The leak test, before PR 1 (its tests only) and, below, with it.
  problems += tree_after(base, patches[:1], work / 'leak', include='tests/*')
  passed, failed = pytest(work / 'leak', work / 'leak.xml', LEAK_TEST)
  if passed or not failed:
    problems.append(f'{LEAK_TEST} does not fail without {patches[0].name}')
  else:
    print(f'the leak test fails without {patches[0].name}, as it should', flush=True)

  # 1, 2, 5. PR by PR on top of the ones before.
  previous = base
  for i, patch in enumerate(patches, 1):
    tree = work / f'after-{i}'
    problems += tree_after(base, patches[:i], tree)
    problems += lint(previous, tree, patch)
    problems += compat(base, tree, patch)
    passed, failed = pytest(tree, work / f'after-{i}.xml')
    if failed:  # those that fail before the series too are not the PR's
      failed -= pytest(base, work / f'base-{i}.xml', *map(_node, sorted(failed)))[1]
    problems += [f'{patch.name}: fails {t}' for t in sorted(failed)]
    if i == 1 and not any(t.endswith(LEAK_TEST.rsplit('::', 1)[1]) for t in passed):
      problems.append(f'{LEAK_TEST} does not pass with {patch.name}')
    print(f'{patch.name}: {len(passed)} passed, {len(failed)} failed', flush=True)
    previous = tree
  return problems


DOCS_TEST = ROOT / 'tests' / 'test_upstream_docs.py'


def verify_docs() -> list[str]:
  """patches/docs/: every code block of the docs PR's page runs on this Flax."""
  run = _run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-c',
              os.devnull, '--rootdir', str(ROOT), DOCS_TEST], capture_output=True, text=True)
  print(f'  {DOCS_TEST.name}: {(run.stdout.strip().splitlines() or ["no output"])[-1]}',
        flush=True)
  return [] if run.returncode == 0 else [f'{DOCS_TEST.name} fails:\n{run.stdout[-4000:]}']


def main() -> int:
  problems = verify() + verify_docs()
  for problem in problems:
    print('PROBLEM:', problem)
  print('upstream: ' + ('ok' if not problems else f'{len(problems)} problem(s)'))
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(main())
