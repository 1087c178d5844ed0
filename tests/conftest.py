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

"""Shared test configuration: ``--opted-out-too``, ``--end-to-end``.

``pytest --opted-out-too`` runs the suite twice in one process: every test as
usual (patched at import), and every test once more with the patch uninstalled
(test id suffix ``[opted-out]``), which is what a user with
``FLAX_TIEEXT_AUTOPATCH=0`` runs: ``uninstall()`` restores Flax's exact
original objects (tests/test_patch.py), and interpreters the test starts get
``FLAX_TIEEXT_AUTOPATCH=0``. The version matrix uses it to cover both modes
with one collection, in one process per xdist worker.

Two markers leave a test's opted-out copy out: ``needs_patch`` (it relies on
the patch), and ``own_patch_mode`` (everything it checks runs in interpreters
whose ``FLAX_TIEEXT_AUTOPATCH`` it sets itself, so the copy would repeat it).
A third, ``installs_patch``, keeps the copy and installs the patch for the
test, as a user with ``FLAX_TIEEXT_AUTOPATCH=0`` calls ``flax_tieext.install()``
to use ties (the tie regression tests of issue 16).

Tests marked ``end_to_end`` are the longer ones: fresh interpreters (the
docs' examples, the demo, the patch installed at import, plain Flax against
patched), generated programs and properties, whole models trained, the grids
of every transform and nesting order (tests/test_tie_lifting.py, each pair of
transforms of tests/test_tie_init.py), sharding on eight devices, Python
call counts, two-process jobs. Without them the README's test command takes
under 240 CPU-seconds on two cores (CPU_BUDGET_SECONDS; measured in CHANGELOG.md).
A plain ``pytest`` leaves them out (and says so in its header) unless given
``--end-to-end`` or the test file by name; ``nox -s ci`` (so CI) runs them
all.

What the run prints (:class:`Progress`): within seconds, what it collects;
then at least every 30 s a line stamped ``0:46`` (minutes:seconds since the
start) with the tests done per area of the suite and the test files running.
"""

import ast
import collections
import functools
import os
import pathlib
import threading
import time

import pytest

# XLA's backend optimizations (LLVM's passes) take about half of the suite's
# CPU time on two cores and change nothing the suite checks: values, trees,
# gradients and trace counts, and compiled costs compared within one run.
# Set before JAX starts its backend; the interpreters tests start inherit
# it. TIEEXT_TEST_XLA_OPT=default keeps XLA's default (`nox -s newest` runs
# the tie, static-argument and transparency suites so; noxfile.py).
if os.environ.get('TIEEXT_TEST_XLA_OPT', '0') != 'default':
  os.environ['XLA_FLAGS'] = ' '.join(filter(None, (
      os.environ.get('XLA_FLAGS'), '--xla_backend_optimization_level=0')))

# JAX's persistent compilation cache (nox sets JAX_COMPILATION_CACHE_DIR): one
# folder per xdist worker. Two workers compiling one program at once race on
# its entry, one reading it while the other writes it; JAX 0.4.35 then
# crashed the reading worker (a segmentation fault in
# compilation_cache.get_executable_and_time, Flax 0.8.5's session) where
# newer JAX warns. Set before JAX is imported; interpreters a test starts
# inherit the worker's folder.
if os.environ.get('JAX_COMPILATION_CACHE_DIR') and os.environ.get('PYTEST_XDIST_WORKER'):
  os.environ['JAX_COMPILATION_CACHE_DIR'] = os.path.join(
      os.environ['JAX_COMPILATION_CACHE_DIR'], os.environ['PYTEST_XDIST_WORKER'])

OPTED_OUT = 'opted-out'
ROOT = pathlib.Path(__file__).resolve().parent.parent  # test ids are relative to it


def pytest_addoption(parser):
  parser.addoption(
      '--opted-out-too', action='store_true',
      help='also run each test not marked needs_patch or own_patch_mode with the patch'
           ' uninstalled',
  )
  parser.addoption(
      '--end-to-end', action='store_true',
      help='also run the tests marked end_to_end (docs examples, the demo, the differential'
           ' harness, the FLIP reproducers, two-process jobs: fresh interpreters)',
  )


# Areas of the suite, by test file name, for the progress lines
# (first match wins).
AREAS = (
    ('ties', ('test_tie_', 'upstream/core_tie', 'upstream/linen_tie')),
    ('static arguments', ('test_static_', 'upstream/')),
    ('NNX', ('test_nnx_',)),
    ('the patch and its transparency', ('test_patch', 'test_transparency',
                                        'test_differential', 'test_testing_')),
    ('multi-process', ('distributed/',)),
)


def area(nodeid: str) -> str:
  """The area of the suite a test id belongs to (``AREAS``; else 'the rest')."""
  path = nodeid.split('::')[0]
  path = path[len('tests/'):] if path.startswith('tests/') else path
  return next((name for name, prefixes in AREAS
               if any(path.startswith(p) for p in prefixes)),
              'docs, demo and repository')


def what_it_does(nodeid: str) -> str | None:
  """The first line of a test's docstring, read from its file (not imported).

  The xdist controller, which prints the progress, imports no test file.
  """
  path, _, name = nodeid.partition('::')
  name = name.split('[')[0]
  try:
    doc = _docstrings(ROOT / path).get(name)
  except (OSError, SyntaxError):
    doc = None
  return doc.strip().splitlines()[0] if doc else None


@functools.lru_cache(maxsize=None)
def _docstrings(path):
  """``{'test_x': doc, 'TestCase::test_y': doc}`` of a test file."""
  found = {}

  def visit(node, prefix):
    for child in node.body:
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        found[prefix + child.name] = ast.get_docstring(child)
      elif isinstance(child, ast.ClassDef):
        visit(child, f'{prefix}{child.name}::')

  visit(ast.parse(path.read_text()), '')
  return found


def stamp(seconds: float) -> str:
  """``0:46``, ``1:16``: minutes and seconds since the run started."""
  minutes, seconds = divmod(int(seconds), 60)
  return f'{minutes}:{seconds:02d}'


class Progress:
  """Progress a person can read: per area of the suite, what is done.

  Dots alone say nothing of what is running. The first line says what is
  being collected; then at least every ``EVERY`` seconds a line gives the
  tests done per area and the test files running (with how long their
  current test has run), and each area, as it finishes, its counts. Works
  with and without xdist (the controller sees every worker's reports). The
  lines between reports come from a thread of the xdist controller, which
  runs no test; without xdist a test's output capture would swallow them, so
  there the lines come with the reports.
  """

  EVERY = 30.0

  def __init__(self, reporter, clock=time.monotonic):
    self.reporter = reporter
    self.clock = clock
    self.start = self.said = clock()
    self.total = collections.Counter()
    self.done = collections.defaultdict(collections.Counter)
    self.finished = set()
    self.running = {}  # test id -> when it started
    self.announced = False  # whether 'to run' was said
    self.started = set()  # the areas a test of which has started
    self.lock = threading.RLock()
    self.stop = threading.Event()

  def _collected(self, nodeids):
    with self.lock:
      if not self.total:
        self.total.update(area(n) for n in nodeids)

  def _areas(self, count, names=None):
    return ', '.join(f'{name} {count(name)}'
                     for name in sorted(self.total if names is None else names))

  def _say(self, line):
    with self.lock:
      self.said = self.clock()
      # Past the dots of the line being written (ensure_newline knows only of
      # lines that name a file, which -q and xdist do not write).
      if getattr(getattr(self.reporter, '_tw', None), 'width_of_current_line', 0):
        self.reporter.write('\n')
      self.reporter.write_line(f'{stamp(self.said - self.start)} {line}')

  def beat(self):
    """The line of a run that has said nothing for ``EVERY`` seconds, if due.

    It counts the areas that have started; those still waiting are named
    with their sizes, and each running test with how long it has run (past
    ``EVERY`` seconds, with what it does: its docstring's first line).
    """
    with self.lock:
      now = self.clock()
      if now - self.said < self.EVERY:
        return
      if not self.announced:
        self._say('still collecting: each worker process imports JAX, Flax and'
                  ' every test file before the first test runs')
        return
      started = [a for a in self.total
                 if a in self.started and a not in self.finished]
      waiting = [a for a in sorted(self.total)
                 if a not in self.finished and a not in started]
      line = 'done so far: ' + self._areas(
          lambda name: f'{sum(self.done[name].values())}/{self.total[name]}',
          started)
      if waiting:
        line += '; not started yet: ' + ', '.join(
            f'{a} ({self.total[a]})' for a in waiting)
      if self.running:
        line += '; running: ' + ', '.join(
            self._running(nodeid, now - since) for nodeid, since in sorted(
                self.running.items(), key=lambda i: i[1]))
      self._say(line)

  def _running(self, nodeid, seconds):
    shown = nodeid[len('tests/'):] if nodeid.startswith('tests/') else nodeid
    doing = what_it_does(nodeid) if seconds >= self.EVERY else None
    return f'{shown} (for {stamp(seconds)}' + (f': {doing})' if doing else ')')

  def _beat_every_second(self):
    while not self.stop.wait(0.5):
      self.beat()

  @pytest.hookimpl(trylast=True)  # below the header pytest prints
  def pytest_sessionstart(self, session):
    config = session.config
    args = ' '.join(config.args) or 'tests'
    workers = getattr(config.option, 'numprocesses', None)
    self._say(f'collecting {args}' + (
        f' in {workers} worker processes, each importing JAX, Flax and every'
        ' test file' if workers else ', importing JAX, Flax and every test file')
              + ': a line at least every'
        f' {self.EVERY:.0f} s from now on says what is running')
    if config.pluginmanager.has_plugin('dsession'):  # the xdist controller
      threading.Thread(target=self._beat_every_second, name='tieext-progress',
                       daemon=True).start()

  def pytest_sessionfinish(self):
    self.stop.set()

  @pytest.hookimpl(optionalhook=True)
  def pytest_xdist_node_collection_finished(self, node, ids):  # pylint: disable=unused-argument
    self._collected(ids)

  def pytest_collection_finish(self, session):
    if not hasattr(session.config, 'workerinput'):
      self._collected([item.nodeid for item in session.items])

  def pytest_runtest_logstart(self, nodeid):
    with self.lock:
      if not self.announced and self.total:
        # Here, not when the first worker has collected: xdist is still
        # writing its own collection status then.
        self.announced = True
        self._say('to run: ' + self._areas(lambda name: self.total[name]))
      self.running[nodeid] = self.clock()
      self.started.add(area(nodeid))

  def pytest_runtest_logfinish(self, nodeid):
    with self.lock:
      self.running.pop(nodeid, None)

  def pytest_runtest_logreport(self, report):
    with self.lock:
      self._logreport(report)

  def _logreport(self, report):
    name = area(report.nodeid)
    if report.when == 'call' or report.when == 'setup' and not report.passed:
      outcome = 'error' if report.when == 'setup' and report.failed else (
          report.outcome)
      if hasattr(report, 'wasxfail'):
        outcome = 'xfailed' if report.skipped else 'xpassed'
      self.done[name][outcome] += 1
    elif report.when == 'teardown' and report.failed:
      self.done[name]['error'] += 1
    if report.when != 'teardown' or not self.total:
      return
    counts = self.done[name]
    if name not in self.finished and sum(counts.values()) >= self.total[name]:
      self.finished.add(name)
      self._say(f'done: {name}: ' + ', '.join(
          f'{n} {o}' for o, n in sorted(counts.items())))
    else:
      self.beat()


@pytest.hookimpl(trylast=True)  # after the terminal reporter is made
def pytest_configure(config):
  reporter = config.pluginmanager.get_plugin('terminalreporter')
  if reporter is not None and not hasattr(config, 'workerinput'):
    config.pluginmanager.register(Progress(reporter), 'tieext-progress')


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
  """The patch installed before a test file imports Flax (not in the xdist controller).

  Here rather than at the top of this file: the controller, which collects
  and runs no test, then never imports JAX, and the first lines come before
  the seconds the import takes.
  """
  if not session.config.pluginmanager.has_plugin('dsession'):
    import flax_tieext  # pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name


@pytest.hookimpl(wrapper=True)
def pytest_report_header(config):
  # pytest-benchmark's defaults line, in a run of tests/, which benchmarks
  # nothing (the benchmarks are in benchmarks/, with a conftest of their own).
  lines = [line for line in (yield) if not (
      isinstance(line, str) and line.startswith('benchmark:'))]
  if not config.getoption('end_to_end'):
    lines.append('end_to_end tests (fresh interpreters, generated programs, whole models'
                 ' trained, the grids of every transform and nesting, 8-device sharding,'
                 ' two-process jobs) are left out unless named: pytest --end-to-end runs'
                 ' them')
  return lines


def pytest_generate_tests(metafunc):
  if metafunc.config.getoption('opted_out_too'):
    metafunc.fixturenames.append('patch_mode')
    metafunc.parametrize('patch_mode', ['patched', OPTED_OUT], indirect=True)


# Directories whose tests are all end_to_end: the Flax-style tests of what
# patches/ proposes (tests/upstream/, in Flax's test style, so without our
# markers), which repeat the features' own suites in Flax's form.
END_TO_END_DIRS = (ROOT / 'tests' / 'upstream',)


@pytest.hookimpl(tryfirst=True)  # before -k reads the markers
def pytest_collection_modifyitems(config, items):
  for item in items:
    if any(d in item.path.parents for d in END_TO_END_DIRS):
      item.add_marker(pytest.mark.end_to_end)
  named = {pathlib.Path(arg.split('::')[0]).resolve() for arg in config.args}
  def left_out(item):
    if (item.get_closest_marker('end_to_end') and not config.getoption('end_to_end')
        and item.path not in named
        # (an END_TO_END_DIRS directory runs when named, as a file does)
        and not any(d in named and d in item.path.parents for d in END_TO_END_DIRS)):
      return True
    callspec = getattr(item, 'callspec', None)
    return (
        config.getoption('opted_out_too')
        and callspec is not None
        and callspec.params.get('patch_mode') == OPTED_OUT
        and any(item.get_closest_marker(m) for m in ('needs_patch', 'own_patch_mode'))
    )

  drop = [item for item in items if left_out(item)]
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = [item for item in items if not left_out(item)]

@pytest.fixture
def patch_mode(request):
  """Opts the test out of the patch in the opted-out mode.

  The patch is uninstalled for the test's duration, and the interpreters the
  test starts (the demo, pytest runs) see ``FLAX_TIEEXT_AUTOPATCH=0``. Its own
  MonkeyPatch, not the test's: the patch is installed again after the test's
  fixtures have put back what they took from Flax.
  """
  if request.param != OPTED_OUT:
    yield request.param
    return
  import flax_tieext  # pylint: disable=g-import-not-at-top
  with pytest.MonkeyPatch.context() as env:
    env.setenv('FLAX_TIEEXT_AUTOPATCH', '0')
    was_installed = flax_tieext.is_installed()
    flax_tieext.uninstall()
    try:
      yield request.param
    finally:
      if was_installed:
        flax_tieext.install()


@pytest.fixture(autouse=True)
def patch_installed(request):
  """Sets the test's patch mode; installs the patch for ``installs_patch``.

  The mode is requested here: pytest (9 at least) does not set up a fixture
  that ``pytest_generate_tests`` only parametrizes, so without this request
  every opted-out copy would run patched.
  """
  callspec = getattr(request.node, 'callspec', None)
  if callspec is not None and 'patch_mode' in callspec.params:
    request.getfixturevalue('patch_mode')  # opted out first, then install
  if request.node.get_closest_marker('installs_patch') is None:
    yield
    return
  import flax_tieext  # pylint: disable=g-import-not-at-top
  was_installed = flax_tieext.is_installed()
  flax_tieext.install()
  yield
  if not was_installed:
    flax_tieext.uninstall()


# What ``tie_invariants`` did in this process (the xdist controller sums its
# workers'): the run's summary says it.
TIE_INVARIANT_COUNTS = collections.Counter()


@pytest.fixture(autouse=True)
def tie_invariants(request):
  """On every Linen model a test initializes: the reference semantics.

  ``init_with_output``'s output is what ``apply`` of the variables it returned
  gives (same arguments, method and rngs), where that apply writes nothing
  (a model that updates state at apply computes from other values): a model
  whose ties are declared inside it (inner ties) too. What init stored holds
  no target of a tied class's ties. Untied models are checked as well: what
  holds for one shared instance in plain Flax holds for them, patched or not.

  On every test of the suite. Each init is recorded as it returns and
  checked when the test is done, after its own assertions: a test that counts
  traces, Python calls or a view's calls has read its counters by then, so
  the check's ``apply`` is counted by none. The records (the module, its
  arguments, output and variables) live until then only. An init inside a
  JAX trace (``jax.jit(model.init)``, ``jax.eval_shape``) returns tracers,
  which are no values once the trace is done: it is not checked. A test whose
  models must not be checked says why with ``@pytest.mark.no_tie_invariants``
  (a reason as its argument).
  """
  if (request.node.get_closest_marker('no_tie_invariants')
      or os.environ.get('TIEEXT_TEST_TIE_INVARIANTS') == '0'):  # (to time it)
    yield
    return
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax.core.scope import DenyList  # pylint: disable=g-import-not-at-top
  init_with_output = nn.Module.init_with_output
  records = []
  counts = TIE_INVARIANT_COUNTS

  def copied(tree):
    # Fresh containers (and NumPy arrays): the test may change its own.
    return jax.tree_util.tree_map(
        lambda x: x.copy() if isinstance(x, np.ndarray) else x, tree)

  def recorded(self, rngs, *args, method=None,
               mutable=DenyList('intermediates'), **kwargs):
    y, variables = init_with_output(self, rngs, *args, method=method,
                                    mutable=mutable, **kwargs)
    if self.scope is not None or kwargs.get('capture_intermediates') or (
        mutable not in (True, DenyList('intermediates'))) or callable(method):
      return y, variables
    started = time.process_time()
    if any(isinstance(leaf, jax.core.Tracer)
           for leaf in jax.tree_util.tree_leaves((y, variables, args, kwargs))):
      counts['inits traced, not checked'] += 1
      return y, variables
    records.append((self, copied(rngs), copied(args), copied(kwargs), method,
                    copied(y), copied(variables), _patch_installed()))
    counts['CPU seconds'] += time.process_time() - started
    return y, variables

  nn.Module.init_with_output = recorded
  try:
    yield
  finally:
    nn.Module.init_with_output = init_with_output
  started = time.process_time()
  checked = False
  try:
    while records:  # (the first first; each dropped once checked)
      checked |= _check_tie_invariants(*records.pop(0), counts=counts)
  finally:
    records.clear()
    counts['tests'] += checked
    counts['CPU seconds'] += time.process_time() - started


def _patch_installed():
  import flax_tieext  # pylint: disable=g-import-not-at-top
  return flax_tieext.is_installed()


def _check_tie_invariants(module, rngs, args, kwargs, method, y, variables,
                          installed, counts):
  """``tie_invariants``' check of one init; False where there was none."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import flax_tieext  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax_tieext.core import tie_spec  # pylint: disable=g-import-not-at-top
  # Stacked declarations mean their union (a part may be invalid alone).
  declarations = getattr(type(module), '_tie_declarations', ())
  for tie in tie_spec.compose(sum([tie_spec.absolute(t, c, (), in_scan=s)
                                   for t, c, s in declarations], ())):
    for col in variables:
      assert not tie.applies_to(col) or tie_spec.walk(
          variables[col], tie.target) is None, (
              f'init of {type(module).__name__} stored the target of'
              f' {tie.describe(col)}')
  keys = rngs if isinstance(rngs, dict) else {'params': rngs}
  # Under the patch mode the init ran in (the test's opted-out copy, or a
  # test that uninstalled or installed the patch itself).
  was = flax_tieext.is_installed()
  if was != installed:
    (flax_tieext.install if installed else flax_tieext.uninstall)()
  try:
    again, written = module.apply(variables, *args, rngs=keys, method=method,
                                  mutable=True, **kwargs)
  except Exception:  # pylint: disable=broad-except
    counts['inits whose apply raised'] += 1
    return False  # the test's to say (apply may be what it checks)
  finally:
    if was != installed:
      (flax_tieext.install if was else flax_tieext.uninstall)()
  written, variables_now = nn.unbox(written), nn.unbox(variables)
  if (jax.tree_util.tree_structure(written)
      != jax.tree_util.tree_structure(variables_now)) or not all(
          np.array_equal(a, b) for a, b in zip(
              jax.tree_util.tree_leaves(written),
              jax.tree_util.tree_leaves(variables_now))):
    counts['inits whose apply writes'] += 1
    return False
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5,
      err_msg=f'init_with_output != apply of {type(module).__name__}')
                         if np.issubdtype(np.asarray(a).dtype, np.number)
                         else np.testing.assert_equal(a, b), y, again)
  counts['models checked'] += 1
  return True


# The README's test command (a plain ``pytest``: the default test paths, no
# --end-to-end, no --opted-out-too) takes at most this many CPU seconds on two
# cores, the pytest process and its workers together: "under four
# CPU-minutes" (README.md, CHANGELOG.md). It ends saying how much it took;
# with TIEEXT_TEST_CPU_BUDGET=enforce (.ci/run) a run over it fails.
CPU_BUDGET_SECONDS = 240


def _cpu_seconds(children=True):
  """CPU time of this process (and the processes it started and waited for)."""
  import resource  # pylint: disable=g-import-not-at-top
  who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if children else [])
  return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who))


WORKER_CPU_SECONDS = []


def _is_readme_run(config):
  return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
          and not config.getoption('end_to_end')
          and not config.getoption('opted_out_too'))


def pytest_sessionfinish(session):
  config = session.config
  workeroutput = getattr(config, 'workeroutput', None)
  if workeroutput is not None:  # an xdist worker: to the controller
    workeroutput['tie_invariants'] = dict(TIE_INVARIANT_COUNTS)
    workeroutput['cpu_seconds'] = _cpu_seconds()  # with the interpreters it started
    return
  # The controller: its own time, and its workers' as they reported it
  # (whether it has reaped them yet or not). Without xdist, this process
  # and the interpreters its tests started.
  workers = len(WORKER_CPU_SECONDS)
  _cpu_report(session, _cpu_seconds(children=False) + sum(WORKER_CPU_SECONDS)
              if workers else _cpu_seconds(), workers)


def _cpu_report(session, seconds, workers):
  """Keeps the run's CPU line; fails an enforced run over the budget."""
  config = session.config
  readme_run = _is_readme_run(config)
  over = readme_run and seconds > CPU_BUDGET_SECONDS
  config.stash[_CPU_LINE] = (
      f'CPU time: {seconds:.1f} s (pytest'
      + (f' and its {workers} workers' if workers else '')
      + ', with the interpreters the tests started)'
      + (f'; the README promises under {CPU_BUDGET_SECONDS} s on two cores: '
         + (f'OVER by {seconds - CPU_BUDGET_SECONDS:.1f} s' if over else 'within it')
         if readme_run else ''))
  if over and os.environ.get('TIEEXT_TEST_CPU_BUDGET') == 'enforce' and (
      session.exitstatus == pytest.ExitCode.OK):
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_CPU_LINE = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pylint: disable=unused-argument
  output = getattr(node, 'workeroutput', {})
  TIE_INVARIANT_COUNTS.update(output.get('tie_invariants', {}))
  if 'cpu_seconds' in output:
    WORKER_CPU_SECONDS.append(output['cpu_seconds'])


@pytest.hookimpl(trylast=True)  # its last lines
def pytest_terminal_summary(terminalreporter, config):
  counts = collections.Counter(TIE_INVARIANT_COUNTS)
  if counts['models checked'] or config.option.verbose > 0:
    terminalreporter.write_line(_tie_invariants_line(counts, config.option.verbose))
  # The summary's last line, right above pytest's count of the tests: the
  # run's CPU time against the README's figure.
  line = config.stash.get(_CPU_LINE, None)
  if line:
    terminalreporter.write_line(line)


def _tie_invariants_line(counts, verbose):
  line = (f'tie_invariants: init_with_output equals apply (the reference'
          f' semantics) for each of the {counts["models checked"]} models'
          f' initialized in {counts["tests"]} tests'
          f' ({counts["CPU seconds"]:.1f} CPU-s)')
  if verbose > 0:
    # Inits the check leaves to the test: none of these is a failure.
    skipped = [(counts['inits traced, not checked'], 'inside a JAX trace'
                ' (jax.jit(model.init), eval_shape: tracers, no values)'),
               (counts['inits whose apply raised'], 'whose apply raised (the'
                ' test checks that error itself)'),
               (counts['inits whose apply writes'], 'whose apply updates'
                ' state (it computes from other values)')]
    line += '; not compared: ' + ', '.join(
        f'{n} inits {why}' for n, why in skipped if n) if any(
            n for n, _ in skipped) else ''
  return line
