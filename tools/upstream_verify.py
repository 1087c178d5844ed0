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
2. Each PR adds at most ``MAX_ADDED`` lines under ``flax/``, and at least
   half as many of tests.
3. PR by PR on the pristine ``upstream.BUILD_ON`` sdist: each applies
   (``git apply --3way``) on top of the ones before it; in the files it
   touches pyflakes finds nothing the unpatched files lack (Flax's own
   findings stay; an ``__init__.py`` re-export is not "unused") and no
   module imports a name twice; and the test classes the series has added so
   far pass in the test files it touches.
4. Flax's lint on the patched tree: ruff with Flax's ``pyproject.toml``,
   ``pyupgrade --py310-plus``, no whitespace errors, on the touched files.
5. Flax's ``tests/core`` and ``tests/linen`` (but ``LAYER_TESTS``), and,
   once the series touches NNX, NNX's tests of ``nnx.remat``
   (``harness.NNX_REMAT_TESTS``), on the patched tree
   (``UPSTREAM_ALL_SUITES=1`` adds the layer tests and the rest of NNX's
   transforms): every test the unpatched tree passes passes (the unpatched
   tree runs the few that do not pass patched), and every test the series
   adds passes.
6. The series applies to every release in ``upstream.RELEASES`` and
   byte-compiles there; the files it changes that a release's sdist lacks are
   named. (The test classes run on each release under the plugin, in the
   matrix sessions.)
7. ``git am`` onto ``upstream.BASE`` in a google/flax checkout with history,
   given as ``FLAX_MIRROR=/path/to/flax`` (skipped, saying so, without one).
"""

from __future__ import annotations

import ast
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET

import upstream
from upstream import harness

SUITES = ('tests/core', 'tests/linen')
# Left out of the whole-suite run in CI (a quarter of its time): the layers'
# arithmetic (Dense, Conv, Embed, attention), whose only contact with what the
# series changes is Scope.param's and Scope.variable's untied path, which every
# other test runs too. UPSTREAM_ALL_SUITES=1 runs them.
LAYER_TESTS = ('tests/linen/linen_linear_test.py', 'tests/linen/linen_attention_test.py')
# A PR a maintainer can review in one sitting (docs/upstream_patches.md).
MAX_ADDED = 500


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


def _patches() -> list[pathlib.Path]:
  return sorted(upstream.SERIES.glob('*.patch'))


def _touched(patch: pathlib.Path) -> list[str]:
  return [l.split()[2][2:] for l in open(patch) if l.startswith('diff --git')]


def _classes(patch: pathlib.Path) -> dict[str, set[str]]:
  """Test file -> the test classes ``patch`` adds to it."""
  found, current = {}, None
  for l in open(patch):
    if l.startswith('diff --git'):
      current = l.split()[2][2:]
    elif l.startswith('+class ') and current.startswith('tests/'):
      found.setdefault(current, set()).add(l.split()[1].split('(')[0])
  return found


def added_lines(patch: pathlib.Path) -> dict[str, int]:
  """Lines ``patch`` adds under ``flax/`` and ``tests/``."""
  found, current = {'flax': 0, 'tests': 0}, ''
  for l in open(patch):
    if l.startswith('diff --git'):
      current = l.split()[2][2:].split('/')[0]
    elif l.startswith('+') and not l.startswith('+++') and current in found:
      found[current] += 1
  return found


# PRs over that budget, each with who brings it back within it
# (series.toml [budget_waived]): warned, not failed; a waiver a PR no longer
# needs is a problem, so that none outlives its reason.
BUDGET_WAIVED = upstream.SPEC.get('budget_waived', {})


def reviewable(patch: pathlib.Path) -> list[str]:
  """A PR adds at most MAX_ADDED lines under flax/, and tests of at least half as many."""
  n = added_lines(patch)
  problems = [f'{patch.name} adds {n["flax"]} lines under flax/ (at most {MAX_ADDED})']
  problems += [f'{patch.name} adds {n["tests"]} lines of tests for {n["flax"]} of code'
               ' (at least half)']
  problems = [p for p, bad in zip(problems, (n['flax'] > MAX_ADDED,
                                             n['tests'] * 2 < n['flax'])) if bad]
  slug = next((s for s in BUDGET_WAIVED if s[:2] == patch.name[2:4]), None)
  if slug is None:
    return problems
  if not problems:
    return [f'{patch.name} is within the budget: remove its [budget_waived] entry']
  for p in problems:
    print(f'warning: {p}: waived until {BUDGET_WAIVED[slug]}', flush=True)
  return []


def apply(dest: pathlib.Path, version: str) -> None:
  """Flax ``version``'s pristine sdist in ``dest``, with the series applied."""
  upstream.pristine(dest, version)
  upstream.git(dest, 'apply', '--3way', '--whitespace=error-all',
               *map(str, _patches()))


def step_by_step(dest: pathlib.Path, out: pathlib.Path, suites, base: pathlib.Path) -> list[str]:
  """Applies the PRs one by one; after each, pyflakes and the tests added so far.

  After the last PR the tree is the whole series, whose run of ``suites``
  (``compare``) runs those tests again: the last step is left to it where
  they all lie in ``suites``.
  """
  upstream.pristine(dest, upstream.BUILD_ON)
  problems, added = [], {}
  patches = _patches()
  for patch in patches:
    try:
      upstream.git(dest, 'apply', '--3way', '--whitespace=error-all', str(patch))
    except subprocess.CalledProcessError:
      return problems + [f'{patch.name} does not apply on the PRs before it']
    problems += [f'{patch.name}: {p}' for p in pyflakes(dest, _touched(patch), base)]
    for file, classes in _classes(patch).items():
      added.setdefault(file, set()).update(classes)
    ids = [f'{f}::{c}' for f in _touched(patch) if f in added for c in sorted(added[f])]
    if not ids:
      print(f'{patch.name}: no test file touched', flush=True)
      continue
    if patch == patches[-1] and all(
        any(i.split('::')[0] == s or i.startswith(f'{s}/') for s in suites)
        for i in ids):
      print(f'{patch.name}: its {len(ids)} test classes run in the whole suites below',
            flush=True)
      continue
    passed, failed = pytest(sys.executable, dest, out / f'step-{patch.name}.xml', ids)
    print(f'{patch.name}: {len(passed)} passed, {len(failed)} failed in'
          f' {len(ids)} test classes', flush=True)
    problems += [f'{patch.name}: fails {t}' for t in sorted(failed)]
    if not passed:
      problems.append(f'{patch.name}: no test of {", ".join(ids)} passed')
  return problems


def lacking(version: str) -> list[str]:
  """The files of Flax the series changes that ``version``'s sdist lacks."""
  with tarfile.open(harness.flax_sdist(version)) as tar:
    names = {n.split('/', 1)[1] for n in tar.getnames() if '/' in n}
  touched, created = set(), set()
  for patch in _patches():
    lines = open(patch).read().split('\n')
    for l, nxt in zip(lines, lines[1:]):
      if l.startswith('diff --git'):
        touched.add(l.split()[2][2:])
        if nxt.startswith('new file'):
          created.add(l.split()[2][2:])
  return sorted(touched - created - names)


def am_on_base(dest: pathlib.Path, mirror: pathlib.Path) -> None:
  """``git am`` of the series onto BASE, in a clone of the google/flax mirror.

  The snapshot may lack large files, so only the files the series touches are
  checked out; ``git am`` works on the index.
  """
  shutil.rmtree(dest, ignore_errors=True)
  upstream.git(dest.parent, 'clone', '-q', '--shared', '--no-checkout', str(mirror), str(dest))
  upstream.git(dest, 'update-ref', 'HEAD', upstream.BASE)
  upstream.git(dest, 'read-tree', 'HEAD')
  patches = list(map(str, _patches()))
  touched = {f for p in _patches() for f in _touched(p)}
  files = upstream.git(dest, 'ls-tree', '-r', '--name-only', 'HEAD', '--', *touched, capture=True)
  upstream.git(dest, 'checkout-index', '-f', '--', *files.split())
  upstream.git(dest, 'am', '-q', '--whitespace=error-all', *patches)


def pytest(python, tree: pathlib.Path, xml: pathlib.Path, suites=SUITES):
  """Flax's core and linen suites on ``tree`` (its flax imported from the tree).

  Test classes (``file::Class`` ids, the PR-by-PR steps, which run the
  series' classes again and again) run in one process with JAX's persistent
  compilation cache next to ``xml``; whole suites, whose programs run once,
  on two workers without it (writing every program to the cache costs more
  than it saves).
  """
  whole = all('::' not in s for s in suites)
  env = {} if whole else harness.compilation_cache(xml.parent / 'jax-cache')
  workers = ['-n', '2'] if whole and _run(
      [python, '-c', 'import xdist'], capture_output=True).returncode == 0 else []
  if workers:  # python -m puts the tree first on sys.path: its flax is imported
    _run([python, '-c', 'import flax; print("flax from", flax.__file__)'], cwd=tree)
  _run([python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *workers, '--tb=line',
        f'--junitxml={xml}', *suites], cwd=tree, env={**os.environ, **env})
  return _passed(xml)


def _junit_id(nodeid: str) -> str:
  """``tests/core/x_test.py::C::t[p]`` -> ``tests.core.x_test.C::t[p]``, as junit names it."""
  path, *rest = nodeid.split('::')
  return '.'.join([path.removesuffix('.py').replace('/', '.'), *rest[:-1]]) + '::' + rest[-1]


def collect(python, tree: pathlib.Path, suites) -> list[str]:
  """The node ids pytest collects from ``suites`` in ``tree``, none run."""
  found = _run([python, '-m', 'pytest', '-q', '--collect-only', '-p', 'no:cacheprovider',
                *suites], cwd=tree, capture_output=True, text=True)
  return [l for l in found.stdout.splitlines() if '::' in l]


def compare(python, base: pathlib.Path, patched: pathlib.Path, added: set[str], out, suites,
            run=''):
  """Problems, comparing the suites' outcomes on ``base`` and ``patched``.

  Every test of the unpatched tree runs on the patched one. Only those that do
  not pass there run on the unpatched tree too: one that passes there is a
  problem, one that does not (a skip) passes in neither. ``run`` names the
  reports of one of several comparisons.
  """
  after, failed = pytest(python, patched, out / f'{patched.name}{run}.xml', suites)
  ids = {_junit_id(n): n for n in collect(python, base, suites)}
  rerun = sorted(n for j, n in ids.items() if j not in after)
  before = set(ids) - {_junit_id(n) for n in rerun}
  if rerun:
    before |= pytest(python, base, out / f'{base.name}{run}.xml', rerun)[0]
  new = {t for t in after | failed if t.rsplit('::', 1)[0].rsplit('.', 1)[-1] in added}
  problems = [f'{patched.name}: fails {t}' for t in sorted(failed)]
  problems += [f'{patched.name}: passed unpatched, not patched: {t}' for t in sorted(before - after)]
  problems += [f'{patched.name}: new test did not pass: {t}' for t in sorted(new - after)]
  if not ids:
    problems.append(f'{base.name}: pytest collected no test')
  if not new:
    problems.append(f'{patched.name}: none of the series\' test classes ran')
  print(f'{patched.name}{run}: {len(before)} passed unpatched (of {len(ids)}; {len(rerun)} run'
        f' there); {len(after)} patched, of which {len(new & after)} new; {len(failed)}'
        ' failed', flush=True)
  return problems


def _pyflakes(tree: pathlib.Path, py: list[str]) -> collections.Counter:
  """pyflakes' findings on ``py`` in ``tree``, without line numbers."""
  found = _run([sys.executable, '-m', 'pyflakes', *[f for f in py if (tree / f).exists()]],
               cwd=tree, capture_output=True, text=True).stdout
  return collections.Counter(
      re.sub(r':\d+:\d+:? ', ': ', l, count=1) for l in found.splitlines()
      if not (l.split(':')[0].endswith('__init__.py') and l.endswith('imported but unused')))


def imported_twice(tree: pathlib.Path, path: str) -> list[str]:
  """The names ``path``'s top-level imports bind more than once."""
  if not (tree / path).exists():
    return []
  bound = collections.Counter(
      (a.asname or a.name).split('.')[0] for n in ast.parse((tree / path).read_text()).body
      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names)
  return sorted(name for name, n in bound.items() if n > 1)


def pyflakes(tree: pathlib.Path, files: list[str], base: pathlib.Path) -> list[str]:
  """What pyflakes finds in ``files`` that the unpatched ``base`` lacks; names imported twice."""
  py = [f for f in files if f.endswith('.py')]
  new = _pyflakes(tree, py) - _pyflakes(base, py)
  problems = [f'pyflakes: {finding}' for finding in sorted(new.elements())]
  for f in py:
    twice = sorted(set(imported_twice(tree, f)) - set(imported_twice(base, f)))
    problems += [f'{f} imports {", ".join(twice)} twice'] if twice else []
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


def verify() -> int:
  start, problems = time.time(), []
  work = pathlib.Path(tempfile.mkdtemp(prefix='upstream-'))
  blocked = upstream.build(work / 'series', work / 'built')
  stale = [p.name for p in sorted((work / 'series').glob('*.patch'))
           if not (upstream.SERIES / p.name).exists()
           or (upstream.SERIES / p.name).read_bytes() != p.read_bytes()]
  stale += [p.name for p in _patches() if not (work / 'series' / p.name).exists()]
  if stale:
    problems.append(f'patches/main is stale ({", ".join(stale)}):'
                    ' run python tools/upstream.py build')
  for patch in _patches():
    problems += reviewable(patch)
  files = sorted({f for p in _patches() for f in _touched(p)})
  added = {c for p in _patches() for cs in _classes(p).values() for c in cs}

  everything = os.environ.get('UPSTREAM_ALL_SUITES')
  suites = SUITES + (() if everything else tuple(f'--ignore={t}' for t in LAYER_TESTS))
  nnx = (harness.NNX_REMAT_TESTS[:1] if everything else harness.NNX_REMAT_TESTS) if any(
      f.startswith('flax/nnx/') for f in files) else ()
  patched = work / f'flax-{upstream.BUILD_ON}-patched'
  base = upstream.pristine(work / f'flax-{upstream.BUILD_ON}', upstream.BUILD_ON)
  problems += step_by_step(patched, work, suites + nnx[:1], base)
  problems += lint(patched, files)
  problems += compare(sys.executable, base, patched, added, work, suites)
  if nnx:
    problems += compare(sys.executable, base, patched, added, work, nnx, run='-nnx')

  for version in upstream.RELEASES:
    missing = lacking(version)
    print(f'flax {version} sdist lacks, of the files the series changes:'
          f' {", ".join(missing) or "none"}', flush=True)
    if version == upstream.BUILD_ON:
      continue
    tree = work / f'flax-{version}-patched'
    try:
      apply(tree, version)
    except subprocess.CalledProcessError:
      problems.append(f'the series does not apply to flax {version}')
      continue
    py = [f for f in files if f.endswith('.py') and (tree / f).exists()]
    if _run([sys.executable, '-m', 'compileall', '-q', *py], cwd=tree,
            capture_output=True).returncode:
      problems.append(f'flax {version} patched does not byte-compile')
    else:
      print(f'flax {version}: the series applies and byte-compiles (its tests run'
            f' under the plugin in `nox -s "matrix({version})"`)', flush=True)

  mirror = os.environ.get('FLAX_MIRROR')
  if mirror:
    try:
      am_on_base(work / 'flax-main', pathlib.Path(mirror))
      print(f'git am onto google/flax@{upstream.BASE[:12]}: applies', flush=True)
    except subprocess.CalledProcessError:
      problems.append(f'git am onto {upstream.BASE} fails')
  else:
    print(f'SKIPPED git am onto google/flax@{upstream.BASE[:12]}: set FLAX_MIRROR to a'
          ' google/flax clone with that commit', flush=True)
  return _report(start, _patches(), blocked, problems)


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
