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

"""Nox sessions: the support matrix, Flax's own suite under the patch, real clients.

``nox -l`` lists them; ``nox`` alone runs ``tests``; ``nox -s ci`` runs what
``.ci/run`` runs (``CI_SESSIONS``). Every pytest run writes a JUnit
report to ``.nox/_reports/<session>/<run>.xml``, which ``.ci/summary.py`` adds
up. Shared helpers (Python interpreters, Flax sdists, JUnit reports) live in
``.ci/harness.py``.
"""

import configparser
import importlib.metadata
import os
import pathlib
import shutil
import sys

import nox

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / '.ci'))
import harness  # pylint: disable=g-import-not-at-top,wrong-import-position

REPORTS = ROOT / '.nox' / '_reports'

# The support matrix, and the one place it is recorded: each supported Flax
# release -> the (jax, jaxlib, Python) it is tested with. Left alone, pip would
# pair every release with the newest jax, which only the newest Flax works
# with. Flax 0.12.9 and later need Python >= 3.12. Flax 0.7.5 is not
# supported: it needs jax 0.4.19 and numpy<2.
PINS = {
    '0.8.5': ('0.4.35', '0.4.35', '3.11'),
    '0.9.0': ('0.4.35', '0.4.35', '3.11'),
    '0.10.7': ('0.8.1', '0.8.1', '3.11'),
    '0.11.2': ('0.8.1', '0.8.1', '3.11'),
    '0.12.0': ('0.8.1', '0.8.1', '3.11'),
    '0.12.8': ('0.10.2', '0.10.2', '3.11'),
    '0.12.12': ('0.12.1', '0.12.1', '3.13'),
}
RELEASES = sorted(PINS, key=lambda v: tuple(int(p) for p in v.split('.')))
NEWEST = RELEASES[-1]
# Each session runs on its release's Python, found by harness.find_python
# (None where it is missing: the session then fails, saying which and how to
# get it). `nox -s tests` takes the newest release whose Python is here.
_FOUND = {python: harness.find_python(python) for *_, python in PINS.values()}
PYTHONS = {v: _FOUND[PINS[v][2]] for v in PINS}
TESTED = next((v for v in reversed(RELEASES) if PYTHONS[v]), NEWEST)

# Flax's own tests of what the patch replaces: lifted transforms (core and
# linen) and nn.partitioning, run from the release's sdist with its own pytest
# config (pyproject.toml: filterwarnings = error).
UPSTREAM_TESTS = (
    'tests/core/core_lift_test.py',
    'tests/linen/linen_transforms_test.py',
    'tests/linen/partitioning_test.py',
)
# ... and its NNX tests of nnx.remat (harness.NNX_REMAT_TESTS), on the
# releases where they pass plain on the pinned JAX: on 0.11.2 / 0.12.0 (jax
# 0.8.1) 7 of 112 fail plain on JAX deprecation warnings, and 0.10.7 cannot
# import flax.nnx there.
UPSTREAM_NNX_RELEASES = ('0.12.8', '0.12.12')

# Real clients of nn.remat / nn.partitioning.remat, on the newest Flax.
# transformers 4.57.6 is the last release with Flax models. recurrentgemma
# 1.0.1 pins absl-py<2 and numpy<2.4, which conflict with that Flax, so it is
# installed with --no-deps plus what its JAX code actually imports.
CLIENT_REQUIREMENTS = ('transformers==4.57.6', 'einops', 'jaxtyping', 'typeguard>=2,<3',
                       'sentencepiece')
CLIENT_NO_DEPS = ('recurrentgemma==1.0.1',)

# Tests of the docs and the demo, not of the library: they run pasted examples
# and the demo's training loop in fresh interpreters, and the docs describe
# the newest Flax, so the matrix runs them on the newest release only. (Like
# every test marked end_to_end, a plain `pytest` leaves them out; every
# session here runs them, with --end-to-end.)
NEWEST_ONLY = ('tests/test_docs_examples.py', 'tests/test_demo.py')
# The docs' blocks pasted into the REPL (tests/test_docs_paste.py): what it
# checks is the REPL of each supported Python (3.11's reads a paste line by
# line, 3.13's as a whole), so it runs on the newest release of each Python.
PASTED_ON = tuple({python: v for v, (*_, python) in PINS.items()}.values())
# The tie property test (tests/test_tie_properties.py) draws 8 examples; the
# newest release's matrix session draws this many.
NEWEST_PROPERTY_EXAMPLES = '20'
# The differential harness (tests/test_differential.py: programs run plain and
# patched in fresh interpreters) draws 2 examples; the newest release's matrix
# session draws this many, and in `nox -s ci` only it runs the harness: the
# newest Flax has every entry point the oldest has, and nnx.remat's tree mode
# besides (the other releases run the fast plain-versus-patched checks of
# tests/test_transparency*.py). Its static-argument programs (every entry point,
# failed calls retried, late import, uninstall(); four interpreters a batch,
# seeded) run one batch per entry point: about a minute and a half on two cores.
NEWEST_DIFFERENTIAL_EXAMPLES = '4'

# What `nox -s ci` (and so .ci/run) runs, in order. Add new CI sessions here.
CI_SESSIONS = [*(f'matrix({v})' for v in PINS), 'newest', 'clients', 'distributed', 'upstream',
               'docs', 'screenshots']

nox.options.sessions = ['tests']
# uv makes each session's environment in seconds (pip takes about a minute for
# the jax stack); nox falls back to virtualenv where uv is not installed.
nox.options.default_venv_backend = 'uv|virtualenv'
# uv itself: beside this interpreter (the README's venv installs nox[uv]) or on PATH.
UV = shutil.which('uv', path=os.pathsep.join([os.path.dirname(sys.executable),
                                              os.environ.get('PATH', '')]))


def _extra(name):
  """The requirements of the extra `name` in setup.cfg (never nox itself)."""
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / 'setup.cfg')
  return [r for r in cfg['options.extras_require'][name].split() if not r.startswith('nox')]


def _install(session, flax, *extra, no_deps=()):
  """Pinned flax/jax/jaxlib and `extra` in one resolve, then this package.

  Fails the session if the release's Python is missing: nox then gave it its
  own, on which it would test nothing it claims to.
  """
  jax, jaxlib, _ = PINS[flax]
  if not PYTHONS[flax]:
    session.error(_missing_python(flax))
  session.install(f'flax=={flax}', f'jax=={jax}', f'jaxlib=={jaxlib}', *extra, silent=True)
  if no_deps:
    session.install('--no-deps', *no_deps, silent=True)
  session.install('--no-deps', '-e', str(ROOT), silent=True)
  session.run('python', '-c', 'import flax, jax; print("flax", flax.__version__, "jax", jax.__version__)')


def _missing_python(flax):
  """Which Python Flax `flax` needs, where it was looked for, how to get it."""
  python = PINS[flax][2]
  return (f'Flax {flax} is tested on Python {python}, which is not here: neither'
          f' python{python} on PATH runs nor is there a'
          f' $PYENV_ROOT/versions/{python}.*/bin/python{python}. Install it'
          f' (`pyenv install {python}`, or your system\'s python{python} package)'
          ' and run nox again.')


# JAX's persistent compilation cache for every pytest run: the opted-out half
# of our suite, the patched run of a library's own suite and releases that
# share a JAX compile the same programs again.
COMPILATION_CACHE = harness.compilation_cache(ROOT / '.nox' / '_jax_cache')
# Two pytest workers that compile one program at once race on its cache
# entry: one reads the entry while the other writes it, and JAX warns and
# compiles the program itself (jax/_src/compiler.py, _cache_read). The suites'
# `filterwarnings = error` would fail the test on that warning, which says
# nothing about the code under test (seen once, in a fresh clone's first
# session of a JAX version). -W takes precedence over the ini filters.
CACHE_RACE = ('-W', 'ignore:Error reading persistent compilation cache entry:UserWarning')


def _pytest(session, run, *args, cwd=ROOT, env=None, **kwargs):
  """pytest in `cwd` writing `.nox/_reports/<session>/<run>.xml`; {test id: outcome}.

  Runs with JAX's compilation cache. Fails the session (after printing the
  run's counts) if pytest fails.
  """
  kwargs['env'] = {**COMPILATION_CACHE, **(env or {})}
  xml = REPORTS / session.name / f'{run}.xml'
  xml.parent.mkdir(parents=True, exist_ok=True)
  xml.unlink(missing_ok=True)
  found = {}
  try:
    with session.chdir(cwd):
      session.run('python', '-m', 'pytest', f'--junitxml={xml}', *CACHE_RACE, *args, **kwargs)
  finally:
    if xml.exists():
      found = harness.outcomes(xml)
      session.log(f'{run}: {harness.describe(harness.counts(found))}')
  return found


def _fresh_reports(session):
  shutil.rmtree(REPORTS / session.name, ignore_errors=True)


@nox.session(python=PYTHONS[TESTED])
def tests(session):
  """Our suite on the newest pinned Flax whose Python is here (arguments go to pytest)."""
  if TESTED != NEWEST:
    session.warn(f'{_missing_python(NEWEST)} Testing Flax {TESTED} instead; `nox -s'
                 f' "matrix({NEWEST})"` fails until then.')
  _install(session, TESTED, *_extra('test'))
  session.run('python', '-m', 'pytest', '--end-to-end', *session.posargs)


@nox.session
@nox.parametrize('python, flax', [(PYTHONS[v], v) for v in PINS], ids=list(PINS))
def matrix(session, flax):
  """A Flax release and its pinned JAX: our suite patched + opted out, Flax's tests plain = patched."""
  _fresh_reports(session)
  _install(session, flax, *_extra('test'), 'absl-py')
  # Every test patched, and each one not marked needs_patch again opted out.
  # tests/distributed runs once, on the newest Flax (nox -s distributed).
  ignored = ['tests/distributed', *(NEWEST_ONLY if flax != NEWEST else ()),
             *(() if flax in PASTED_ON else ('tests/test_docs_paste.py',))]
  env = {}
  if flax == NEWEST:
    env['DIFFERENTIAL_EXAMPLES'] = NEWEST_DIFFERENTIAL_EXAMPLES
    env['TIE_PROPERTY_EXAMPLES'] = NEWEST_PROPERTY_EXAMPLES
  # `nox -s ci` passes XLA_DEFAULTS first on the newest release: the suites of
  # `nox -s newest` (NEWEST_SESSION_TESTS) then run apart, with XLA's defaults,
  # so that `nox -s newest` need not run them again when the registry's newest
  # releases are these pins.
  posargs = list(session.posargs)
  xla_defaults = flax == NEWEST and posargs[:1] == [XLA_DEFAULTS]
  if posargs[:1] == [XLA_DEFAULTS]:
    del posargs[0]
  if xla_defaults:
    ignored += NEWEST_SESSION_TESTS
  # Work stealing keeps both workers busy to the end: setup.cfg's loadscope
  # keeps a module on one worker, for the demo's module fixture, which runs
  # here on the newest release only (each worker that gets a demo test runs
  # it once).
  _pytest(session, 'ours', '--opted-out-too', '--end-to-end',
          *(f'--ignore={p}' for p in ignored),
          '--tb=short', '--dist', 'worksteal', *posargs, env=env)
  if xla_defaults:
    _pytest(session, 'ours-xla-defaults', '--opted-out-too', '--end-to-end', '--tb=short',
            '--dist', 'worksteal', *posargs, *NEWEST_SESSION_TESTS,
            env={**env, 'TIEEXT_TEST_XLA_OPT': 'default'})
  # Flax's own tests: pyproject.toml and tests/ of the sdist, so that they
  # import the installed Flax.
  checkout = harness.SDISTS / f'flax-{flax}'
  if not checkout.is_dir():
    harness.extract(harness.flax_sdist(flax), checkout,
                    keep=lambda rel: rel == 'pyproject.toml' or rel.startswith('tests/'))
  _plain_and_patched(session, 'flax', *UPSTREAM_TESTS, cwd=checkout)
  if flax in UPSTREAM_NNX_RELEASES:
    _plain_and_patched(session, 'flax-nnx', *harness.NNX_REMAT_TESTS, cwd=checkout)


def _plain_and_patched(session, suite, *tests, cwd, options=(), root=None):
  """A library's own `tests` (pytest arguments, in `cwd`) patched; plain, those it does not pass.

  Fails unless every test that passes without the patch passes with it (and
  at least one does), with no failure. A test that passes patched needs no
  plain run, so only the tests the patched run does not pass (its skips: a
  failure fails the session) run plain, where none may pass either. This
  saves the second run of every test. `options` go to both runs; `root` is pytest's
  rootdir, which the reports' test ids are relative to (default: `cwd`).
  """
  options = ('-n', '2', '-p', 'no:cacheprovider', '-rfE', '--tb=short', *options)
  patched = _pytest(session, f'{suite}-patched', '-p', 'flax_tieext.testing.autopatch', *options,
                    *tests, cwd=cwd)
  passed = {t for t, o in patched.items() if o == 'passed'}
  if not passed:
    session.error(f'{suite}: no test passed with the patch')
  rest = sorted(t for t in patched if t not in passed)
  if rest:
    # A few tests (a skip or two) run faster on one process than on workers.
    few = ('-n', '0') if len(rest) < 10 else ()
    plain = _pytest(session, f'{suite}-plain', *options, *few,
                    *(_node_id(t, root or cwd) for t in rest), cwd=cwd)
    only_plain = sorted(t for t, o in plain.items() if o == 'passed')
    if only_plain:
      session.error(f'{suite}\'s tests pass differently under the patch: only plain:'
                    + ''.join(f'\n  {t}' for t in only_plain))
  session.log(f'{suite}: {len(passed)} pass patched'
              + (f'; the {len(rest)} others pass plain neither' if rest else ', all it has'))


def _node_id(junit_id, root):
  """The pytest node id, by absolute path, of a JUnit report's `module.Class::name` id."""
  classname, name = junit_id.split('::', 1)
  parts = classname.split('.')
  module = next((i for i in range(len(parts), 0, -1)
                 if pathlib.Path(root, *parts[:i]).with_suffix('.py').is_file()), None)
  if module is None:
    raise ValueError(f'{junit_id}: no test file for it under {root}')
  path = pathlib.Path(root, *parts[:module]).with_suffix('.py').resolve()
  return '::'.join([str(path), *parts[module:], name])


# What `nox -s newest` runs on the newest Flax and JAX the registry serves:
# the import under -W error, then the suites whose subject is the release.
NEWEST_SESSION_TESTS = ('tests/test_patch.py', 'tests/test_transparency.py',
                        'tests/test_transparency_static_argnums.py', 'tests/test_tie_lifting.py',
                        'tests/test_tie_inside_transform.py', 'tests/test_static_argnames.py',
                        'tests/test_static_argnames_compat.py', 'tests/test_nnx_remat.py',
                        'tests/test_nnx_tree_tie.py', 'tests/upstream')
# The first argument `nox -s ci` gives the newest release's matrix session:
# run NEWEST_SESSION_TESTS apart, with XLA's defaults (matrix()).
XLA_DEFAULTS = '--newest-session-tests-at-xla-defaults'
# The first argument `nox -s ci` gives `nox -s newest`: import only, when the
# registry's newest releases are the newest pins (matrix() ran the rest).
UNLESS_PINNED = '--suites-unless-pinned'


@nox.session(python=PYTHONS[NEWEST])
def newest(session):
  """The newest Flax and JAX the registry serves now, unpinned: import, ties, static args, transparency.

  A release is tested the first time CI runs after it ships, before PINS
  names it. Fails saying the versions it saw. Given UNLESS_PINNED first (as
  `nox -s ci` does, after the newest release's matrix session ran these suites
  with XLA's defaults), it runs only the import when it sees the newest pins.
  """
  _fresh_reports(session)
  posargs = list(session.posargs)
  unless_pinned = posargs[:1] == [UNLESS_PINNED]
  if unless_pinned:
    del posargs[0]
  session.install('--upgrade', 'flax', 'jax', 'jaxlib', *_extra('test'), silent=True)
  session.install('--no-deps', '-e', str(ROOT), silent=True)
  seen = session.run(
      'python', '-c', 'import flax, jax, jaxlib;'
      ' print(f"flax {flax.__version__}, jax {jax.__version__}, jaxlib {jaxlib.__version__}")',
      silent=True).strip()
  pinned = 'flax {}, jax {}, jaxlib {}'.format(NEWEST, *PINS[NEWEST][:2])
  session.log(f'newest: {seen} (the newest pins: {pinned})'
              + ('' if seen == pinned else ': NOT YET IN PINS'))
  try:
    session.run('python', '-W', 'error', '-c', 'import flax_tieext, flax.linen',
                env={'FLAX_TIEEXT_AUTOPATCH': '1'})
    if unless_pinned and seen == pinned:
      session.log(f'newest: the suites ran on these releases with XLA\'s defaults in'
                  f' matrix({NEWEST}) (.nox/_reports/matrix({NEWEST})/ours-xla-defaults.xml)')
      return
    # With XLA's backend optimizations, as users compile (tests/conftest.py
    # turns them off everywhere else, for speed).
    _pytest(session, 'newest', '--end-to-end', '--tb=short', '--dist', 'worksteal',
            *(posargs or NEWEST_SESSION_TESTS), env={'TIEEXT_TEST_XLA_OPT': 'default'})
  except nox.command.CommandFailed:
    session.error(f'newest: fails on {seen}, the newest releases the registry serves'
                  f' (the matrix pins {pinned}): fix it, then add them to PINS')


@nox.session(python=PYTHONS[NEWEST])
def clients(session):
  """Real HF transformers / recurrentgemma models under the patch: their grads, their own tests."""
  _fresh_reports(session)
  _install(session, NEWEST, *_extra('test'), *CLIENT_REQUIREMENTS, no_deps=CLIENT_NO_DEPS)
  found = _pytest(session, 'clients', 'tests/clients', *session.posargs,
                  env={'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'})
  if 'passed' not in found.values():
    session.error('clients: no test passed')
  # recurrentgemma's own tests (Griffin built with nn.remat(static_argnums=...)
  # and nn.scan), from the installed package, with no pytest config of ours.
  package = pathlib.Path(session.run(
      'python', '-c', 'import recurrentgemma; print(recurrentgemma.__path__[0])',
      silent=True).strip())
  tests = sorted(str(p) for p in (package / 'jax').glob('*_test.py'))
  _plain_and_patched(session, 'recurrentgemma', *tests, cwd=session.create_tmp(),
                     options=('-c', os.devnull, f'--rootdir={package.parent}'),
                     root=package.parent)


@nox.session(python=PYTHONS[NEWEST])
def distributed(session):
  """A tied model over 2 jax.distributed processes: sharding, Orbax restores, faults, demo."""
  _fresh_reports(session)
  _install(session, NEWEST, *_extra('test'))
  # tests/distributed/long is left out of the default run (setup.cfg); naming
  # it beside tests/distributed would collect it once, ignored. One pytest
  # worker: each test starts 2 processes of its own, and the long tests share
  # one job.
  # Arguments replace what it runs.
  default_run = sorted(str(p) for p in (ROOT / 'tests' / 'distributed').glob('test_*.py'))
  _pytest(session, 'distributed', '-n', '0', '--end-to-end',
          *(session.posargs or ['tests/distributed/long', *default_run]))


# -- patches/: what JAX and Flax get (docs/upstream_patches.md) -------------------


@nox.session
def upstream(session):
  """patches/: the JAX reproducers per JAX release; the Flax PRs on Flax main, step by step.

  First, the JAX bug reports' reproducers (patches/jax/run.py) on each JAX
  release of the matrix: one line each, reproduces / fixed / not-applicable.
  Then tools/upstream_verify.py on the Flax PRs (patches/flax/, patches/docs/):
  each applies to Flax main alone and in sequence, and at each step lints,
  passes Flax's test files that reach the changed transforms,
  tests/upstream_compat_test.py and 300 generated call forms against main
  (tools/upstream_forms.py, printing their classes). Set UPSTREAM_FLAX_MAIN to a checkout of
  Flax main 18f8f311 to check on it rather than on the 0.12.8 sdist (CI).
  """
  # Flax 0.12.8 with its JAX, what its tests import, and the lint and
  # jupytext versions pinned in Flax's .pre-commit-config.yaml; pyflakes for
  # what Flax's ruff config (F401, unused imports, only) leaves out: undefined
  # names, names imported twice.
  session.install('flax==0.12.8', 'jax==0.10.2', 'jaxlib==0.10.2', 'optax', 'cloudpickle',
                  'pytest', 'pytest-xdist', 'ruff==0.1.3', 'pyupgrade==3.16.0',
                  'pyflakes==3.2.0', 'jupytext==1.13.8')
  # patches/jax/: each distinct (jax, jaxlib, Python) of PINS runs the
  # reproducers in fresh interpreters: this session's jax here, every other
  # in a throwaway venv .nox/_jax/jax-<version> holding only that jax and
  # jaxlib, made once on the release's Python (a release whose Python is
  # missing is skipped, saying so). It fails only if a reproducer crashes or
  # prints another word. About 15 s with the venvs made, 70 s making them.
  own = session.run('python', '-c', 'import importlib.metadata as m; print(m.version("jax"))',
                    silent=True).strip()
  for jax_v, jaxlib_v, python in sorted(set(PINS.values()),
                                        key=lambda p: tuple(int(n) for n in p[0].split('.'))):
    if jax_v == own:
      session.run('python', 'patches/jax/run.py')
      continue
    if not _FOUND[python]:
      session.log(f'patches/jax: jax {jax_v} skipped: its Python {python} is not here'
                  f' (pyenv install {python})')
      continue
    env = ROOT / '.nox' / '_jax' / f'jax-{jax_v}'
    # uv (what nox makes the sessions with) where it is here: seconds a venv
    # from its cache, where pip takes about 20.
    if not (env / 'bin' / 'python').exists():
      if UV:
        session.run(UV, 'venv', '-q', '--seed', '-p', _FOUND[python], str(env), external=True)
      else:
        session.run(_FOUND[python], '-m', 'venv', str(env), external=True)
    site = env / 'lib' / f'python{python}' / 'site-packages'
    if not all((site / f'{d}-{v}.dist-info').is_dir()
               for d, v in (('jax', jax_v), ('jaxlib', jaxlib_v))):
      if UV:
        session.run(UV, 'pip', 'install', '-q', '--python', str(env / 'bin' / 'python'),
                    f'jax=={jax_v}', f'jaxlib=={jaxlib_v}', external=True)
      else:
        session.run(str(env / 'bin' / 'python'), '-m', 'pip', 'install', '-q',
                    '--disable-pip-version-check', f'jax=={jax_v}', f'jaxlib=={jaxlib_v}',
                    external=True)
    session.run(str(env / 'bin' / 'python'), 'patches/jax/run.py', external=True)
  session.run('python', 'tools/upstream_verify.py')


# -- docs/ and benchmarks/ ------------------------------------------------------

DOCS_BUILD = ROOT / 'docs' / '_build'


def _sphinx(session, builder):
  session.run('python', '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', builder, 'docs',
              str(DOCS_BUILD / builder))


@nox.session(python=PYTHONS[NEWEST])
def docs(session):
  """The documentation site in docs/_build/html: Sphinx + MyST, warnings are errors, doctests run.

  First the quickstart's figure, docs/_static/demo_memory.png, drawn by the
  demo: where what it shows differs from what the demo draws now, it is
  drawn anew and the session fails, saying to commit it (docs/demo_figure.py).
  """
  _install(session, NEWEST, *_extra('docs'), *_extra('plot'), 'pytest')
  session.run('python', 'docs/demo_figure.py', 'docs/_static/demo_memory.png')
  shutil.rmtree(DOCS_BUILD, ignore_errors=True)
  _sphinx(session, 'html')
  _sphinx(session, 'doctest')
  # The docstrings' examples, which the API reference shows.
  session.run('python', '-m', 'pytest', '-o', 'addopts=', '--doctest-modules', 'flax_tieext',
              '-q')


@nox.session(python=PYTHONS[NEWEST])
def screenshots(session):
  """The key docs pages at 1280 px in headless Chromium: docs/_build/screenshots/*.png.

  `-- --reuse-html` takes the HTML the docs session built (as CI does).
  """
  if not shutil.which('chromium'):
    session.run('apt-get', 'update', '-qq', external=True)
    session.run('apt-get', 'install', '-y', '-qq', 'chromium', external=True)
  _install(session, NEWEST, *_extra('docs'), 'pillow')
  if not session.posargs or session.posargs[0] != '--reuse-html':
    _sphinx(session, 'html')
  session.run('python', 'docs/screenshots.py', str(DOCS_BUILD / 'html'),
              str(DOCS_BUILD / 'screenshots'))


@nox.session(python=PYTHONS[NEWEST])
def bench(session):
  """Benchmarks: writes benchmarks/results.json, renders docs/benchmarks.md and its PNG.

  `-- --device [ARGS]` runs the accelerator benchmarks instead
  (benchmarks/device.py ARGS, e.g. `--tiny` on a CPU): they write
  benchmarks/device_results.json, the page's Accelerator section. This
  session's JAX is the CPU build; on a TPU or GPU, run
  `python benchmarks/device.py` where JAX sees the device, then render.py.
  """
  _install(session, NEWEST, *_extra('test'), *_extra('plot'))
  if session.posargs[:1] == ['--device']:
    session.run('python', 'benchmarks/device.py', *session.posargs[1:])
  else:
    session.run('python', '-m', 'pytest', '-n', '0', 'benchmarks',
                '--benchmark-columns=median,rounds', *session.posargs)
  session.run('python', 'benchmarks/render.py')


# What the releases between the oldest and the newest run of our suite in
# `nox -s ci`: the tests whose subject is the release (the patch installed
# into it and its transparency, the Flax-style tests of every feature, ties
# through its lifted transforms, its remat signatures, its NNX), matched by
# module name with `pytest -k`. The rest of the tie and static-argument
# suites, whose subject is our own resolution logic, runs on the oldest, the
# README's and the newest release; `nox -s "matrix(<release>)"` by hand runs it
# all.
MIDDLE_RELEASE_TESTS = ('upstream', 'test_patch', 'test_transparency', 'test_testing_autopatch',
                        'test_static_argnames_compat', 'test_nnx', 'test_tie_lifting',
                        'test_tie_generated',  # its default draw (NEWEST_ONLY_IN_CI)
                        'test_docs_paste')  # where PASTED_ON, the REPL of each Python
# The generator's deeper draw and its nn.switch grid (tests/
# test_tie_generated.py, end_to_end) run on the newest release only in
# `nox -s ci`; every release runs its default draw and two nn.switch cases,
# and tools/generated_ties.py runs thousands on any release.
NEWEST_ONLY_IN_CI = ('test_differential', 'test_more_generated',
                     'test_the_cond_family_as_nn_switch')  # its end_to_end grid


@nox.session(python=False)
def ci(session):
  """Everything .ci/run runs after the README test command (CI_SESSIONS)."""
  # The README test command, just run by .ci/run in the environment nox runs
  # from, is our suite patched on that environment's Flax, less the tests
  # marked end_to_end: where that is a release of the matrix with its pins,
  # its matrix run adds the opted-out half and those end_to_end tests. The end_to_end tests run
  # here: the docs, the demo, the FLIP reproducers and the differential harness
  # on the newest release, the two-process jobs in the distributed session.
  #
  # To keep CI within its budget, the other releases run the opted-out half
  # only for the tie regression tests (marked installs_patch: they install
  # the patch themselves), and the releases between the oldest and the newest
  # run MIDDLE_RELEASE_TESTS only.
  readme_release = _release_of_this_environment()
  inner = [f'matrix({v})' for v in RELEASES[1:-1] if v != readme_release]
  middle = ' or '.join((*MIDDLE_RELEASE_TESTS, 'installs_patch'))
  for name in CI_SESSIONS:
    if name == f'matrix({readme_release})':
      # The opted-out half, and the patched tests the README run leaves to
      # --end-to-end (fresh interpreters, generated programs, the nesting
      # grid), less those CI runs on the newest release only.
      posargs = ['-k', 'opted-out or end_to_end' if readme_release == NEWEST else
                 'opted-out or (end_to_end and not (%s))' % ' or '.join(NEWEST_ONLY_IN_CI)]
    elif name in inner:
      posargs = ['-k', f'(not opted-out or installs_patch) and ({middle})'
                       f' and not ({" or ".join(NEWEST_ONLY_IN_CI)})']
    elif name == f'matrix({NEWEST})':
      # NEWEST_SESSION_TESTS with XLA's defaults, which `nox -s newest` then
      # leaves out when the registry serves these pins (UNLESS_PINNED).
      posargs = [XLA_DEFAULTS, '-k', 'not opted-out or installs_patch']
    elif name == f'matrix({RELEASES[0]})':
      # The differential harness and the deep generator: newest release only.
      posargs = ['-k', '(not opted-out or installs_patch) and not (%s)'
                 % ' or '.join(NEWEST_ONLY_IN_CI)]
    elif name.startswith('matrix('):
      posargs = ['-k', 'not opted-out or installs_patch']
    elif name == 'newest' and readme_release != NEWEST:
      posargs = [UNLESS_PINNED]
    else:
      posargs = ['--reuse-html'] if name == 'screenshots' else None
    session.notify(name, posargs)


def _release_of_this_environment():
  """The PINS release whose flax, jax, jaxlib and Python nox runs with, or None."""
  try:
    here = tuple(importlib.metadata.version(d) for d in ('flax', 'jax', 'jaxlib'))
  except importlib.metadata.PackageNotFoundError:
    return None
  python = '%d.%d' % sys.version_info[:2]
  return next((v for v, pins in PINS.items() if (v, *pins) == (*here, python)), None)
