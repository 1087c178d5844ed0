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

``nox -l`` lists them. ``nox`` alone runs ``tests``. The names are an interface
(README "Support matrix", ``.ci/run``):

* ``tests``: our suite on the newest pinned Flax.
* ``matrix-<flax>``: one venv per supported Flax release (pins in ``PINS``)
  running our suite patched and unpatched, then Flax's own transform tests
  from that release's sdist, plain and under ``-p flax_tieext.testing.autopatch``;
  fails unless the two runs pass exactly the same tests with no failure.
* ``clients``: HF transformers and recurrentgemma models train bitwise
  identically with and without ``import flax_tieext``.
* ``docs``: builds ``docs/`` (HTML and doctests, warnings are errors) and runs
  the docstrings' examples.
* ``bench``: runs ``benchmarks/`` and renders ``docs/benchmarks.md``.
* ``ci``: queues everything ``.ci/run`` runs (``CI_SESSIONS``).

Every pytest run writes JUnit XML to ``.nox/_reports/<session>/<run>.xml``;
``.ci/summary.py`` adds them up.
"""

import configparser
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET

import nox

ROOT = pathlib.Path(__file__).resolve().parent
REPORTS = ROOT / '.nox' / '_reports'
SDISTS = ROOT / '.nox' / '_sdists'

# The support matrix, and the one place it is recorded: each supported Flax
# release -> the (jax, jaxlib) it is tested with. Left alone, pip would pair
# every release with the newest jax, which only the newest Flax works with.
# README "Support matrix" mirrors this table (tests/test_repository.py checks).
# Flax 0.7.5 is not supported: it needs jax 0.4.19 and numpy<2.
PINS = {
    '0.8.5': ('0.4.35', '0.4.35'),
    '0.9.0': ('0.4.35', '0.4.35'),
    '0.10.7': ('0.8.1', '0.8.1'),
    '0.11.2': ('0.8.1', '0.8.1'),
    '0.12.0': ('0.8.1', '0.8.1'),
    '0.12.8': ('0.10.2', '0.10.2'),
}
NEWEST = max(PINS, key=lambda v: tuple(int(p) for p in v.split('.')))

# Flax's own tests of what the patch replaces: lifted transforms (core and
# linen) and nn.partitioning. Run from the release's sdist with its own pytest
# config (pyproject.toml: filterwarnings = error).
UPSTREAM_TESTS = (
    'tests/core/core_lift_test.py',
    'tests/linen/linen_transforms_test.py',
    'tests/linen/partitioning_test.py',
)
# What those tests import beyond Flax and its dependencies.
UPSTREAM_TEST_REQUIREMENTS = ('pytest', 'absl-py')

# Real clients of nn.remat / nn.partitioning.remat, on the newest Flax.
# transformers 4.57.6 is the last release with Flax models. recurrentgemma
# 1.0.1 pins absl-py<2 and numpy<2.4, which conflict with that Flax, so it is
# installed with --no-deps plus what its JAX code actually imports.
CLIENTS_FLAX = NEWEST
CLIENT_REQUIREMENTS = ('transformers==4.57.6',)
CLIENT_NO_DEPS = ('recurrentgemma==1.0.1',)
CLIENT_EXTRA_REQUIREMENTS = ('einops', 'jaxtyping', 'typeguard>=2,<3', 'sentencepiece')

# What `nox -s ci` (and so .ci/run) runs, in order. Add new CI sessions here
# (e.g. 'upstream', 'docs', 'bench').
CI_SESSIONS = [*(f'matrix-{v}' for v in PINS), 'clients', 'upstream', 'docs']

nox.options.sessions = ['tests']


def _test_requirements():
  """The `test` extra of setup.cfg, less nox (a session never runs nox)."""
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / 'setup.cfg')
  reqs = cfg['options.extras_require']['test'].split()
  return [r for r in reqs if not r.lower().startswith('nox')]


def _extra(name):
  """The requirements of the extra `name` in setup.cfg."""
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / 'setup.cfg')
  return cfg['options.extras_require'][name].split()


def _install(session, flax, *extra, no_deps=()):
  """Pinned flax/jax/jaxlib and `extra` in one resolve, then this package."""
  jax, jaxlib = PINS[flax]
  session.install(f'flax=={flax}', f'jax=={jax}', f'jaxlib=={jaxlib}', *extra, silent=True)
  if no_deps:
    session.install('--no-deps', *no_deps, silent=True)
  session.install('--no-deps', '-e', str(ROOT), silent=True)
  session.run(
      'python', '-c',
      'import flax, jax, jaxlib, numpy; print(f"flax {flax.__version__}, jax'
      ' {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {numpy.__version__}")',
  )


def _report_path(session, run):
  path = REPORTS / session.name / f'{run}.xml'
  path.parent.mkdir(parents=True, exist_ok=True)
  return path


def _pytest(session, run, *args, env=None):
  """Runs pytest writing a JUnit report; returns its exit code (never raises)."""
  xml = _report_path(session, run)
  xml.unlink(missing_ok=True)
  start = time.monotonic()
  try:
    session.run('python', '-m', 'pytest', f'--junitxml={xml}', *args, env=env)
    code = 0
  except nox.command.CommandFailed as e:
    code = e.return_code if e.return_code is not None else -1
  session.log(f'{session.name} {run}: {time.monotonic() - start:.0f} s')
  return code


def _pytest_side_by_side(session, runs, cwd):
  """Runs independent pytest runs at once (one core each); returns exit codes.

  `runs` is [(run name, pytest args, extra env)]. Each run's output goes to
  ``.nox/_reports/<session>/<run>.log`` and is printed, whole, once all ended.
  """
  venv_env = {k: v for k, v in session.env.items() if v is not None}
  base_env = dict(os.environ, **venv_env)
  base_env['PATH'] = os.pathsep.join([session.bin, base_env.get('PATH', '')])
  base_env['VIRTUAL_ENV'] = session.virtualenv.location
  procs = {}
  start = time.monotonic()
  for run, args, env in runs:
    xml = _report_path(session, run)
    xml.unlink(missing_ok=True)
    cmd = [os.path.join(session.bin, 'python'), '-m', 'pytest', f'--junitxml={xml}', *args]
    env_text = ''.join(f'{k}={v} ' for k, v in env.items())
    session.log(f'[{run}, in {cwd}] {env_text}{subprocess.list2cmdline(cmd)}')
    log = open(xml.with_suffix('.log'), 'w')  # pylint: disable=consider-using-with
    procs[run] = (subprocess.Popen(
        cmd, cwd=cwd, env=dict(base_env, **env), stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    ), log)
  codes = {}
  for run, (proc, log) in procs.items():
    codes[run] = proc.wait()
    log.close()
  for run, _, _ in runs:
    sys.stdout.write(f'\n----- {session.name} {run} (exit {codes[run]}) -----\n')
    sys.stdout.write(_report_path(session, run).with_suffix('.log').read_text())
    sys.stdout.flush()
  session.log(f'{session.name} {", ".join(codes)}: {time.monotonic() - start:.0f} s side by side')
  return codes


def _outcomes(xml):
  """{test id: 'passed' | 'failed' | 'error' | 'skipped'} from a JUnit report."""
  outcomes = {}
  for case in ET.parse(xml).getroot().iter('testcase'):
    test_id = f"{case.get('classname')}::{case.get('name')}"
    tags = {child.tag for child in case}
    for tag, outcome in (('error', 'error'), ('failure', 'failed'), ('skipped', 'skipped')):
      if tag in tags:
        outcomes[test_id] = outcome
        break
    else:
      outcomes[test_id] = 'passed'
  return outcomes


def _counts(outcomes):
  n = lambda kind: sum(1 for o in outcomes.values() if o == kind)
  return (
      f"{n('passed')} passed, {n('failed')} failed, {n('skipped')} skipped,"
      f" {n('error')} errors"
  )


def _check(session, run, code, ok_codes=(0,)):
  """One line of counts for a run; returns (outcomes, problem or None)."""
  xml = _report_path(session, run)
  if not xml.exists():
    return {}, f'{run}: pytest exited {code} without a report'
  outcomes = _outcomes(xml)
  session.log(f'{session.name} {run}: {_counts(outcomes)} (exit {code})')
  if code not in ok_codes:
    bad = sorted(t for t, o in outcomes.items() if o in ('failed', 'error'))
    listing = ''.join(f'\n    {t}' for t in bad[:30])
    return outcomes, f'{run}: pytest exited {code}; failing:{listing or " (see log)"}'
  return outcomes, None


def _upstream_checkout(session, flax):
  """pyproject.toml and tests/ of Flax `flax`'s sdist (downloaded once, cached).

  Only those are extracted, so the tests import the *installed* Flax.
  """
  dest = SDISTS / f'flax-{flax}'
  if dest.is_dir():
    return dest
  tarball = SDISTS / f'flax-{flax}.tar.gz'
  if not tarball.exists():
    session.run(
        'python', '-m', 'pip', 'download', '--quiet', '--no-deps', '--no-binary', ':all:',
        '--dest', str(SDISTS), f'flax=={flax}', silent=True,
    )
  tmp = SDISTS / f'.flax-{flax}.partial'
  shutil.rmtree(tmp, ignore_errors=True)
  with tarfile.open(tarball) as tar:
    top = f'flax-{flax}/'
    members = []
    for m in tar.getmembers():
      rel = m.name[len(top):] if m.name.startswith(top) else None
      if rel == 'pyproject.toml' or (rel or '').startswith('tests/'):
        m.name = rel
        members.append(m)
    try:
      tar.extractall(tmp, members=members, filter='data')
    except TypeError:  # Python without extraction filters (< 3.10.12, 3.11.4)
      tar.extractall(tmp, members=members)
  missing = [t for t in UPSTREAM_TESTS if not (tmp / t).exists()]
  if missing:
    session.error(f'flax {flax} sdist lacks {missing}')
  tmp.rename(dest)
  return dest


def _matrix(session, flax):
  shutil.rmtree(REPORTS / session.name, ignore_errors=True)
  _install(session, flax, *_test_requirements(), *UPSTREAM_TEST_REQUIREMENTS)
  problems = []

  # (a) Our whole suite, patched at import (the default), and (b) with the
  # patch opted out: everything but what needs it (exit 5, every test
  # deselected, is fine there).
  tb = ('--tb=short',)
  codes = _pytest_side_by_side(session, [
      ('ours', (*tb, *session.posargs), {'FLAX_TIEEXT_AUTOPATCH': '1'}),
      ('ours-unpatched', ('-m', 'not needs_patch', *tb, *session.posargs),
       {'FLAX_TIEEXT_AUTOPATCH': '0'}),
  ], cwd=ROOT)
  problems.append(_check(session, 'ours', codes['ours'])[1])
  problems.append(_check(session, 'ours-unpatched', codes['ours-unpatched'], ok_codes=(0, 5))[1])

  # (c) Flax's own transform tests from the release's sdist, with its own
  # pytest config, plain and with the patch installed before collection.
  checkout = _upstream_checkout(session, flax)
  upstream = ('-p', 'no:cacheprovider', '-rfE', *tb)
  codes = _pytest_side_by_side(session, [
      ('flax-plain', (*upstream, *UPSTREAM_TESTS), {}),
      ('flax-patched', (*upstream, '-p', 'flax_tieext.testing.autopatch', *UPSTREAM_TESTS), {}),
  ], cwd=checkout)
  runs = {}
  for run, code in codes.items():
    runs[run], problem = _check(session, run, code)
    problems.append(problem)
  passing = {run: {t for t, o in out.items() if o == 'passed'} for run, out in runs.items()}
  only_plain = sorted(passing['flax-plain'] - passing['flax-patched'])
  only_patched = sorted(passing['flax-patched'] - passing['flax-plain'])
  if not passing['flax-plain']:
    problems.append('flax-plain: no upstream test passed')
  if only_plain or only_patched:
    problems.append(
        'upstream passing sets differ: passing only plain:'
        + ''.join(f'\n    {t}' for t in only_plain)
        + '\n  passing only patched:'
        + ''.join(f'\n    {t}' for t in only_patched)
    )
  else:
    session.log(
        f'{session.name}: plain and patched upstream runs pass the same'
        f' {len(passing["flax-plain"])} tests'
    )

  problems = [p for p in problems if p]
  if problems:
    session.error(f'{session.name} (flax {flax}):\n  ' + '\n  '.join(problems))


def _matrix_session(flax):
  jax, _ = PINS[flax]

  def matrix(session):
    _matrix(session, flax)

  matrix.__doc__ = (
      f'Flax {flax} / jax {jax}: our suite patched and unpatched, and Flax\'s'
      ' own transform tests plain vs patched.'
  )
  return nox.session(name=f'matrix-{flax}', tags=['matrix'])(matrix)


for _flax in PINS:
  globals()[f'matrix_{_flax.replace(".", "_")}'] = _matrix_session(_flax)


@nox.session
def tests(session):
  """Our suite on the newest pinned Flax (arguments go to pytest)."""
  _install(session, NEWEST, *_test_requirements())
  session.run('python', '-m', 'pytest', *session.posargs)


@nox.session
def clients(session):
  """Real HF transformers / recurrentgemma models: identical loss and grads under the patch."""
  shutil.rmtree(REPORTS / session.name, ignore_errors=True)
  _install(
      session, CLIENTS_FLAX, 'pytest', *CLIENT_REQUIREMENTS, *CLIENT_EXTRA_REQUIREMENTS,
      no_deps=CLIENT_NO_DEPS,
  )
  code = _pytest(
      session, 'clients', 'tests/clients', *session.posargs,
      env={'HF_HUB_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1'},
  )
  outcomes, problem = _check(session, 'clients', code)
  if problem or not any(o == 'passed' for o in outcomes.values()):
    session.error(problem or 'clients: no test passed')


# -- patches/main: the upstream PR series (tools/upstream.py) -------------------


@nox.session
def upstream(session):
  """patches/main is current and applies; Flax's lint and core + linen suites pass on it."""
  # Flax 0.12.8 with its JAX, what its tests import, and the lint versions
  # pinned in Flax's .pre-commit-config.yaml.
  session.install('flax==0.12.8', 'jax==0.10.2', 'jaxlib==0.10.2', 'optax', 'cloudpickle',
                  'pytest', 'pytest-xdist', 'ruff==0.1.3', 'pyupgrade==3.16.0')
  session.run('python', 'tools/upstream_verify.py')


# -- docs/ and benchmarks/ ------------------------------------------------------

DOCS_BUILD = ROOT / 'docs' / '_build'


@nox.session
def docs(session):
  """The documentation site: Sphinx + MyST, warnings are errors, doctests run."""
  _install(session, NEWEST, *_extra('docs'), 'pytest')
  shutil.rmtree(DOCS_BUILD, ignore_errors=True)
  for builder in ('html', 'doctest'):
    session.run(
        'python', '-m', 'sphinx', '-W', '--keep-going', '-b', builder, 'docs',
        str(DOCS_BUILD / builder), *session.posargs,
    )
  # The docstrings' examples, which the API reference shows.
  session.run('python', '-m', 'pytest', '--doctest-modules', 'flax_tieext', '-q')


@nox.session
def bench(session):
  """Benchmarks: writes benchmarks/results.json, renders docs/benchmarks.md and its PNG."""
  _install(session, NEWEST, *_test_requirements(), *_extra('plot'))
  session.run(
      'python', '-m', 'pytest', 'benchmarks', '--benchmark-columns=median,rounds',
      *session.posargs,
  )
  session.run('python', 'benchmarks/render.py')


@nox.session(python=False)
def ci(session):
  """Everything .ci/run runs after the README test command (CI_SESSIONS)."""
  for name in CI_SESSIONS:
    session.notify(name)
