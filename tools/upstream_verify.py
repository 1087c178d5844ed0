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

"""Checks the Flax PRs of ``patches/`` as Flax's review and CI would (``nox -s upstream``).

The tree they are checked on is Flax main ``MAIN``: a checkout of it named by
``$UPSTREAM_FLAX_MAIN``, or else the sdist of Flax ``BUILD_ON`` (CI reaches
PyPI only), whose ``flax/``, ``tests/`` and ``docs/`` are checked to be
main's, file by file, but for ``NOT_MAIN`` (``MAIN_DIGEST``). Then:

1. each PR's text is a person's: a ``From:`` and a ``Date:``, no word of this
   project (``HYGIENE``); its lines added under ``flax/`` within ``LIMITS``;
2. the Flax PRs (``patches/flax/``) apply as a sequence, and each applies to
   main alone; at each step (the sequence so far, and each PR alone):
   a. in the files it touches, pyflakes and ruff (Flax's ``pyproject.toml``)
      find nothing the tree before it lacks, ``pyupgrade --py310-plus``
      changes nothing, no added line of Python is over 80 columns and
      ``git diff --check`` is clean;
   b. Flax's test files that the PRs so far touch, and those that call what
      they change (``consumers``; a PR alone: its own test files), pass
      wherever they pass on main;
   c. ``tests/upstream_compat_test.py``: every program runs as on main, but
      for the behaviour changes the applied PRs state, and what they add
      holds;
   d. ``tools/upstream_forms.py``: ``FORMS`` generated call forms run on main
      and on the tree; none that runs on main differs, every other change is
      of a class an applied PR's text states, and no validation error is one
      ``jax.jit`` does not raise for the same signature and spec (the class
      counts are printed);
3. each test of ``FAILS_BEFORE`` fails on main with only its PR's tests
   applied (it tests what the PR changes), and passes with the PR;
4. the docs PR (``patches/docs/``) applies to main; its notebook and its
   MyST twin hold the same cells (as ``jupytext --sync`` leaves them, where
   jupytext is installed), and every code cell runs on the installed Flax
   (``tests/test_upstream_docs.py``).

Exits non-zero, listing every problem, if any check fails.
"""

from __future__ import annotations

import hashlib
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
DOCS_PATCHES = ROOT / 'patches' / 'docs'
MAIN = '18f8f311c275d57f46d95e41b15aa97b454754c0'
BUILD_ON = '0.12.8'
# The sdist of BUILD_ON holds main's flax/, tests/ and docs/ but for these
# (its release fixed a doctest's printed numbers), which no PR may touch.
NOT_MAIN = ('flax/linen/module.py',)
# sha256 of the sorted "<path> <git blob id>" lines of main's files under
# flax/, tests/ and docs/, less NOT_MAIN (`main_digest`).
MAIN_DIGEST = '284531305cb94215a6bbc266da89cc52a71df060a63d95b5a6f106f27cd5dca6'
# PR number -> (the part of the tree counted, most lines added there).
# Flax's yardsticks: 9522bc0b (static_argnums for nn.checkpoint) +15/-2,
# cf7311da (keyword arguments for nn.jit) +80/-59.
LIMITS = {'0001': ('flax/', 40), '0002': ('flax/', 103)}
# PR number -> the tests it adds that fail on main (what it fixes or adds).
FAILS_BEFORE = {
    '0001': ('tests/core/core_lift_test.py::LiftTest::'
             'test_checkpoint_static_argnums_keeps_nothing_alive',
             'tests/core/core_lift_test.py::LiftTest::'
             'test_checkpoint_static_argnums_leaks_no_tracer'),
    '0002': ('tests/linen/linen_transforms_test.py::TransformTest::test_remat_kwargs',
             'tests/linen/linen_transforms_test.py::TransformTest::'
             'test_remat_static_args_are_checked',
             'tests/linen/linen_transforms_test.py::TransformTest::'
             'test_remat_decorator_static_argnames'),
}
# A Flax test file that calls one of these reaches what the PRs change.
CONSUMER = re.compile(r'\bnn\.(remat|checkpoint)\b|\blift\.(checkpoint|remat)\b'
                      r'|\bpartitioning\.remat\b')
COMPAT_TEST = ROOT / 'tests' / 'upstream_compat_test.py'
FORMS_TOOL = ROOT / 'tools' / 'upstream_forms.py'
# The generated call forms each step runs (seed, how many): a few CPU-minutes.
FORMS = (0, 300)
DOCS_TEST = ROOT / 'tests' / 'test_upstream_docs.py'
HYGIENE = re.compile(r'flax[_-]tieext|patches/|edition|plugin|monkeypatch', re.I)


def _run(cmd, cwd=None, **kw):
  print('+', ' '.join(map(str, cmd)), flush=True)
  return subprocess.run(list(map(str, cmd)), cwd=cwd, check=False, **kw)


def touched(patch: pathlib.Path) -> list[str]:
  return [l.split()[2][2:] for l in patch.read_text().splitlines()
          if l.startswith('diff --git')]


def added(patch: pathlib.Path, under: str = '') -> list[str]:
  """The lines ``patch`` adds to files whose path starts with ``under``."""
  return _changed(patch, '+', under)


def removed(patch: pathlib.Path, under: str = '') -> list[str]:
  """The lines ``patch`` removes from files whose path starts with ``under``."""
  return _changed(patch, '-', under)


def _changed(patch, sign, under):
  lines, current = [], None
  for line in patch.read_text().splitlines():
    if line.startswith('diff --git'):
      current = line.split()[2][2:]
    elif line.startswith(sign) and not line.startswith(sign * 3):
      if current is not None and current.startswith(under):
        lines.append(line[1:])
  return lines


def message(patch: pathlib.Path) -> str:
  """The commit message of ``patch``: its subject and body."""
  head = patch.read_text().split('\n---\n', 1)[0]
  subject = re.search(r'^Subject: (?:\[PATCH[^\]]*\] )?(.*)$', head, re.M).group(1)
  return subject + '\n' + head.split('\n\n', 1)[1]


def text_problems(patch: pathlib.Path) -> list[str]:
  """What in ``patch``'s headers and message is not a person's text."""
  head = patch.read_text().split('\ndiff --git')[0]
  problems = [f'{patch.name}: no {field.strip()} header'
              for field in ('From: ', 'Date: ') if f'\n{field}' not in head]
  problems += [f'{patch.name}: names this project ({m.group(0)!r})'
               for m in HYGIENE.finditer(patch.read_text())]
  return problems


def main_digest(tree: pathlib.Path) -> str:
  """``MAIN_DIGEST`` computed over ``tree``."""
  rows = []
  for top in ('flax', 'tests', 'docs'):
    for f in (tree / top).rglob('*'):
      rel = f.relative_to(tree).as_posix()
      if f.is_file() and not f.is_symlink() and rel not in NOT_MAIN:
        data = f.read_bytes()
        blob = hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()
        rows.append(f'{rel} {blob}')
  return hashlib.sha256('\n'.join(sorted(rows)).encode()).hexdigest()


def main_tree(dest: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
  """Flax main ``MAIN`` at ``dest`` (a git repository), and any problem."""
  checkout = os.environ.get('UPSTREAM_FLAX_MAIN')
  if checkout:
    head = _run(['git', '-C', checkout, 'rev-parse', 'HEAD'], capture_output=True,
                text=True).stdout.strip()
    shutil.copytree(checkout, dest, symlinks=True, ignore=shutil.ignore_patterns('.git'))
    problems = [] if head == MAIN else [f'$UPSTREAM_FLAX_MAIN is at {head}, not {MAIN}']
    print(f'Flax main {MAIN[:8]}: the checkout {checkout}', flush=True)
  else:
    harness.extract(harness.flax_sdist(BUILD_ON), dest)
    problems = [] if main_digest(dest) == MAIN_DIGEST else [
        f'the Flax {BUILD_ON} sdist is not Flax main {MAIN[:8]} but for {NOT_MAIN}']
    print(f'Flax main {MAIN[:8]}: the Flax {BUILD_ON} sdist, whose flax/, tests/ and'
          f' docs/ are main\'s but for {", ".join(NOT_MAIN)}', flush=True)
  for patch in [*sorted(PATCHES.glob('*.patch')), *sorted(DOCS_PATCHES.glob('*.patch'))]:
    problems += [f'{patch.name} touches {f}, which the tree has from {BUILD_ON}, not main'
                 for f in touched(patch) if f in NOT_MAIN and not checkout]
  for cmd in (['init', '-q'], ['add', '-A'],
              ['-c', 'user.name=main', '-c', 'user.email=main@localhost', 'commit', '-q',
               '-m', MAIN]):
    _run(['git', *cmd], cwd=dest, capture_output=True)
  return dest, problems


def _findings(cmd, tree: pathlib.Path, files: list[str]) -> dict[str, int]:
  out = _run([*cmd, *files], cwd=tree, capture_output=True, text=True).stdout
  found = {}
  for l in out.splitlines():
    if l.startswith(tuple(files)):
      key = re.sub(r':\d+:\d+:? ', ': ', l, count=1)
      found[key] = found.get(key, 0) + 1
  return found


def lint(before: pathlib.Path, after: pathlib.Path, patch: pathlib.Path) -> list[str]:
  """What PR ``patch`` brings into the files it touches, by Flax's lint."""
  py = [f for f in touched(patch) if f.endswith('.py')]
  problems = []
  for name, cmd in (('pyflakes', [sys.executable, '-m', 'pyflakes']),
                    ('ruff', ['ruff', 'check', '--config', 'pyproject.toml'])):
    old = _findings(cmd, before, py)
    for finding, n in _findings(cmd, after, py).items():
      if n > old.get(finding, 0):
        problems.append(f'{patch.name}: {name}: {finding}')
  copy = pathlib.Path(tempfile.mkdtemp())
  for f in py:
    (copy / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(after / f, copy / f)
  if _run(['pyupgrade', '--py310-plus', *py], cwd=copy).returncode:
    problems.append(f'{patch.name}: pyupgrade --py310-plus rewrites its files')
  problems += [f'{patch.name}: over 80 columns: {l.strip()[:60]}'
               for f in py for l in added(patch, f) if len(l) > 80]
  if _run(['git', 'diff', '--check'], cwd=after).returncode:
    problems.append(f'{patch.name}: whitespace errors (git diff --check)')
  return problems


def pytest(tree: pathlib.Path, xml: pathlib.Path, tests) -> tuple[set, set]:
  """(passed, failed) pytest ids of ``tests`` run on ``tree``'s own flax."""
  # Only pytest's last line is printed: FAILS_BEFORE run to fail, and a log
  # reader (CI's included) should not take their FAILED lines for failures.
  run = _run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--tb=no',
              *(['-n', '2'] if len(tests) > 3 else []), f'--junitxml={xml}', *tests],
             cwd=tree, env={**os.environ, 'PYTHONPATH': str(tree)},
             capture_output=True, text=True)
  print(f'  pytest: {(run.stdout.strip().splitlines() or ["no output"])[-1]}', flush=True)
  passed, failed = set(), set()
  for case in ET.parse(xml).iter('testcase'):
    kinds = {child.tag for child in case}
    dotted, name = case.get('classname'), case.get('name')
    module, cls = dotted.rsplit('.', 1)
    node = f"{module.replace('.', '/')}.py::{cls}::{name}"
    if kinds & {'failure', 'error'}:
      failed.add(node)
    elif 'skipped' not in kinds:
      passed.add(node)
  return passed, failed


def consumers(tree: pathlib.Path) -> list[str]:
  """Flax's Linen and core test files that call what the PRs change."""
  return sorted(f.relative_to(tree).as_posix() for f in (tree / 'tests').rglob('*_test.py')
                if 'nnx' not in f.parts and CONSUMER.search(f.read_text()))


def compat(base: pathlib.Path, tree: pathlib.Path, applied, cache: pathlib.Path) -> list[str]:
  """``COMPAT_TEST``'s programs on ``base`` and on ``tree``; problems."""
  # Its own pytest configuration only (-c): the project's conftest installs
  # the plugin, which this session does not have.
  run = _run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--noconftest',
              '-c', os.devnull, '--rootdir', str(ROOT), '-n', '2', '--tb=short', COMPAT_TEST],
             env={**os.environ, 'UPSTREAM_FLAX_BEFORE': str(base),
                  'UPSTREAM_FLAX_AFTER': str(tree), 'UPSTREAM_PATCHES': ','.join(applied),
                  'UPSTREAM_COMPAT_CACHE': str(cache)},
             capture_output=True, text=True)
  print(f'  {COMPAT_TEST.name}: {(run.stdout.strip().splitlines() or ["no output"])[-1]}',
        flush=True)
  if run.returncode:
    return [f'{"+".join(applied)}: {COMPAT_TEST.name} fails:\n{run.stdout[-4000:]}']
  return []


def tree_after(base: pathlib.Path, patches, dest: pathlib.Path, include=None) -> list[str]:
  """Copies ``base`` to ``dest`` and applies ``patches``; problems."""
  shutil.copytree(base, dest, symlinks=True)
  problems = []
  for patch in patches:
    only = [f'--include={include}'] if include else []
    if _run(['git', 'apply', *only, patch], cwd=dest).returncode:
      problems.append(f'{patch.name} does not apply after {[p.name[:4] for p in patches]}')
  return problems


def step(base, work, patches, label, cache, alone=False) -> list[str]:
  """Lint, Flax's tests and the compat programs on main with ``patches``.

  ``alone``: a PR applied to main by itself, which the sequence's steps
  test with the consumers already: its own test files only.
  """
  tree = work / label
  problems = tree_after(base, patches, tree)
  if problems:
    return problems
  before = base if len(patches) == 1 else work / '+'.join(p.name[:4] for p in patches[:-1])
  problems += lint(before, tree, patches[-1])
  tests = sorted({f for p in patches for f in touched(p) if f.startswith('tests/')}
                 | set(() if alone else consumers(base)))
  passed, failed = pytest(tree, work / f'{label}.xml', tests)
  if failed:  # those that fail on main too are not the PRs'
    failed -= pytest(base, work / f'{label}-main.xml', sorted(failed))[1]
  problems += [f'{label}: fails {t}' for t in sorted(failed)]
  for patch in patches:
    problems += [f'{label}: {t} does not pass'
                 for t in FAILS_BEFORE.get(patch.name[:4], ()) if t not in passed]
  print(f'{label}: {len(passed)} passed, {len(failed)} failed', flush=True)
  applied = [p.name[:4] for p in patches]
  return problems + compat(base, tree, applied, cache) + forms(base, tree, applied, cache)


def forms(base: pathlib.Path, tree: pathlib.Path, applied, cache: pathlib.Path) -> list[str]:
  """``FORMS_TOOL``'s generated forms on ``base`` and on ``tree``; problems."""
  seed, n = FORMS
  run = _run([sys.executable, FORMS_TOOL, base, tree, '--applied', ','.join(applied),
              '-n', n, '--seed', seed, '--cache', cache], capture_output=True, text=True)
  print(run.stdout.split('PROBLEM:')[0].rstrip(), flush=True)
  return [] if run.returncode == 0 else [
      f'{"+".join(applied)}: {FORMS_TOOL.name} fails:\n{run.stdout[-4000:]}{run.stderr[-2000:]}']


def verify() -> list[str]:
  patches = sorted(PATCHES.glob('*.patch'))
  docs = sorted(DOCS_PATCHES.glob('*.patch'))
  if not patches:
    return [f'no patch in {PATCHES}']
  work = pathlib.Path(tempfile.mkdtemp(prefix='upstream-'))
  base, problems = main_tree(work / 'main')
  for patch in patches + docs:
    problems += text_problems(patch)
  for patch in patches:
    under, most = LIMITS.get(patch.name[:4], ('', 0))
    n = len(added(patch, under))
    print(f'{patch.name}: +{n} lines under {under or "the tree"} (at most {most})')
    if n > most:
      problems.append(f'{patch.name}: adds {n} lines under {under or "the tree"},'
                      f' more than {most}')

  # 3. What each PR fixes or adds fails on main (its tests only applied).
  for patch in patches:
    label = f'tests-of-{patch.name[:4]}'
    problems += tree_after(base, [patch], work / label, include='tests/*')
    tests = FAILS_BEFORE.get(patch.name[:4], ())
    if not tests:
      problems.append(f'{patch.name}: FAILS_BEFORE names no test of it')
      continue
    passed, _ = pytest(work / label, work / f'{label}.xml', list(tests))
    problems += [f'{t} does not fail without {patch.name}' for t in sorted(passed)]

  # 2. The sequence, step by step, and each PR after the first alone.
  cache = work / 'compat-main'
  for i in range(1, len(patches) + 1):
    problems += step(base, work, patches[:i], '+'.join(p.name[:4] for p in patches[:i]), cache)
  for patch in patches[1:]:
    problems += step(base, work, [patch], f'{patch.name[:4]}-alone', cache, alone=True)

  # 4. The docs PR applies to main.
  for patch in docs:
    problems += tree_after(base, [patch], work / f'docs-{patch.name[:4]}')
  return problems


def verify_docs() -> list[str]:
  """patches/docs/: the notebook pair in sync, every code cell runs on this Flax."""
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
