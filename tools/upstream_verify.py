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

"""Checks the series ``patches/main/`` as Flax's CI would (``nox -s upstream``).

1. ``patches/main`` is what ``tools/upstream.py build`` makes from the source.
2. It applies (``git apply --3way``) to each release in ``upstream.RELEASES``.
3. Flax's lint on the patched 0.12.8: ruff with Flax's ``pyproject.toml``,
   ``pyupgrade --py310-plus``, no whitespace errors, on the touched files.
4. Flax's full ``tests/core`` and ``tests/linen`` on the unpatched and patched
   0.12.8: the same tests pass, and every test the series adds passes.
5. ``git am`` onto ``upstream.BASE`` where the google/flax mirror exists.
6. The newest release (it needs Python >= 3.12): byte-compiled here; the test
   files the series touches run on its unpatched and patched trees with a
   Python >= 3.12 if one is found, else they are reported as skipped, with why.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import upstream

SUITES = ('tests/core', 'tests/linen')
# A checkout of google/flax with history (the `fetch` tool's snapshot), if any.
MIRROR = pathlib.Path(os.environ.get('FLAX_MIRROR', '/work/.mirror/google+flax/repo'))


def _run(cmd, cwd=None, **kw):
  print('+', ' '.join(map(str, cmd)), flush=True)
  return subprocess.run(list(map(str, cmd)), cwd=cwd, **kw)


def _passed(xml: pathlib.Path) -> tuple[set[str], set[str]]:
  """(passed, failed or errored) test ids of a junit report."""
  passed, failed = set(), set()
  for case in ET.parse(xml).iter('testcase'):
    name = f"{case.get('classname')}::{case.get('name')}"
    kinds = {child.tag for child in case}
    (failed if kinds & {'failure', 'error'} else
     set() if 'skipped' in kinds else passed).add(name)
  return passed, failed


def apply(dest: pathlib.Path, version: str) -> None:
  """Flax ``version``'s pristine sdist in ``dest``, with the series applied."""
  upstream.pristine(dest, version)
  upstream.git(dest, 'apply', '--3way', '--whitespace=error-all',
      *sorted(map(str, upstream.SERIES.glob('*.patch'))))


def am_on_base(dest: pathlib.Path) -> None:
  """``git am`` of the series onto BASE, in a clone of the google/flax mirror.

  The snapshot may lack large files, so only the files the series touches are
  checked out; ``git am`` works on the index.
  """
  shutil.rmtree(dest, ignore_errors=True)
  upstream.git(dest.parent, 'clone', '-q', '--shared', '--no-checkout', str(MIRROR), str(dest))
  upstream.git(dest, 'update-ref', 'HEAD', upstream.BASE)
  upstream.git(dest, 'read-tree', 'HEAD')
  patches = sorted(map(str, upstream.SERIES.glob('*.patch')))
  touched = {l.split()[2][2:] for p in patches for l in open(p) if l.startswith('diff --git')}
  files = upstream.git(dest, 'ls-tree', '-r', '--name-only', 'HEAD', '--', *touched, capture=True)
  upstream.git(dest, 'checkout-index', '-f', '--', *files.split())
  upstream.git(dest, 'am', '-q', '--whitespace=error-all', *patches)


def pytest(python, tree: pathlib.Path, xml: pathlib.Path, suites=SUITES):
  """Flax's core and linen suites on ``tree`` (its flax imported from the tree)."""
  workers = ['-n', '2'] if _run([python, '-c', 'import xdist'], capture_output=True).returncode == 0 else []
  _run([python, '-c', 'import flax; print("flax from", flax.__file__)'], cwd=tree)
  _run([python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *workers, '--tb=line',
        f'--junitxml={xml}', *suites], cwd=tree)
  return _passed(xml)


def compare(python, base: pathlib.Path, patched: pathlib.Path, added: set[str], out, suites):
  """Problems, comparing the suites' outcomes on ``base`` and ``patched``."""
  before, _ = pytest(python, base, out / f'{base.name}.xml', suites)
  after, failed = pytest(python, patched, out / f'{patched.name}.xml', suites)
  new = {t for t in after | failed if t.rsplit('::', 1)[0].rsplit('.', 1)[-1] in added}
  problems = [f'{patched.name}: fails {t}' for t in sorted(failed)]
  problems += [f'{patched.name}: passed unpatched, not patched: {t}' for t in sorted(before - after)]
  problems += [f'{patched.name}: new test did not pass: {t}' for t in sorted(new - after)]
  if not new:
    problems.append(f'{patched.name}: none of the series\' test classes ran')
  print(f'{patched.name}: {len(before)} passed unpatched; {len(after)} patched, of which'
        f' {len(new & after)} new; {len(failed)} failed', flush=True)
  return problems


def lint(tree: pathlib.Path, files: list[str]) -> list[str]:
  problems = []
  py = [f for f in files if f.endswith('.py')]
  if _run(['ruff', 'check', '--force-exclude', '--config', tree / 'pyproject.toml', *py],
          cwd=tree).returncode:
    problems.append('ruff (Flax pyproject.toml) fails on the patched files')
  copy = pathlib.Path(tempfile.mkdtemp())
  for f in py:
    (copy / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(tree / f, copy / f)
  if _run(['pyupgrade', '--py310-plus', *py], cwd=copy).returncode:
    problems.append('pyupgrade --py310-plus would rewrite the patched files')
  if _run(['git', 'diff', '--check', 'HEAD'], cwd=tree).returncode:
    problems.append('whitespace errors (git diff --check)')
  return problems


def newer_python() -> str | None:
  names = [shutil.which(f'python3.{minor}') for minor in range(20, 11, -1)]
  names += sorted(glob.glob(os.path.expanduser('~/.pyenv/versions/3.1[2-9]*/bin/python')),
                  reverse=True)
  for name in filter(None, names):
    if _run([name, '-c', 'import sys, venv; assert sys.version_info >= (3, 12)'],
            capture_output=True).returncode == 0:
      return name
  return None


def verify() -> int:
  start, problems = time.time(), []
  work = pathlib.Path(tempfile.mkdtemp(prefix='upstream-'))
  blocked = upstream.build(work / 'series', work / 'built')
  stale = [p.name for p in sorted((work / 'series').glob('*.patch'))
           if not (upstream.SERIES / p.name).exists()
           or (upstream.SERIES / p.name).read_bytes() != p.read_bytes()]
  stale += [p.name for p in upstream.SERIES.glob('*.patch')
            if not (work / 'series' / p.name).exists()]
  if stale:
    problems.append(f'patches/main is stale ({", ".join(stale)}):'
                    ' run python tools/upstream.py build')
  patches = sorted(upstream.SERIES.glob('*.patch'))
  files = sorted({l.split()[2][2:] for p in patches for l in open(p)
                  if l.startswith('diff --git')})
  added = {l.split()[1].split('(')[0] for p in patches for l in open(p)
           if l.startswith('+class ')}
  trees = {}
  for version in upstream.RELEASES:
    try:
      apply(work / f'flax-{version}-patched', version)
      trees[version] = work / f'flax-{version}-patched'
    except subprocess.CalledProcessError:
      problems.append(f'the series does not apply to flax {version}')
  newest = max(upstream.RELEASES, key=lambda v: tuple(map(int, v.split('.'))))
  py = [f for f in files if f.endswith('.py')]
  if newest in trees and _run([sys.executable, '-m', 'compileall', '-q', *py],
                              cwd=trees[newest], capture_output=True).returncode:
    problems.append(f'flax {newest} patched does not byte-compile')
  if upstream.BUILD_ON not in trees:
    return _report(start, patches, blocked, problems)
  problems += lint(trees[upstream.BUILD_ON], files)
  base = upstream.pristine(work / f'flax-{upstream.BUILD_ON}', upstream.BUILD_ON)
  # NNX's transforms tests too, once the series touches NNX.
  suites = SUITES + (('tests/nnx/transforms_test.py',) if any(
      f.startswith('flax/nnx/') for f in files) else ())
  problems += compare(sys.executable, base, trees[upstream.BUILD_ON], added, work, suites)
  if (MIRROR / 'objects').exists():
    try:
      am_on_base(work / 'flax-main')
      print(f'git am onto google/flax@{upstream.BASE[:12]}: applies', flush=True)
    except subprocess.CalledProcessError:
      problems.append(f'git am onto {upstream.BASE} fails')
  else:
    print(f'git am onto {upstream.BASE[:12]}: skipped, no google/flax mirror here')
  python = newer_python()
  if python is None:
    print(f'SKIPPED flax {newest} tests: no Python >= 3.12 found (the series applies'
          ' and byte-compiles)', flush=True)
  elif newest in trees:
    env = work / 'py312'
    if _run([python, '-m', 'venv', env]).returncode or _run(
        [env / 'bin/pip', 'install', '-q', f'flax=={newest}', 'optax', 'cloudpickle',
         'pytest', 'pytest-xdist']).returncode:
      problems.append(f'flax {newest}: could not install it with {python}')
    else:  # the test files the series touches, to stay within CI's budget
      old = upstream.pristine(work / f'flax-{newest}', newest)
      problems += compare(env / 'bin/python', old, trees[newest], added, work,
                          [f for f in files if f.startswith('tests/')])
  return _report(start, patches, blocked, problems)


def _report(start, patches, blocked, problems) -> int:
  for line in blocked:
    print(f'NOT IN THE SERIES YET: {line.splitlines()[0]}')
  print(f'upstream: {len(patches)} PRs, {len(problems)} problems,'
        f' {time.time() - start:.0f}s', flush=True)
  for p in problems:
    print(f'PROBLEM: {p}')
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(verify())
