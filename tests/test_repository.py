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


"""The repository's entry points do what README.md tells a user."""

import ast
import configparser
import pathlib
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _readme_test_command():
  """The indented command line after "Run the tests" in README.md."""
  lines = (ROOT / 'README.md').read_text().splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith('Run the tests'))
  command = next(line for line in lines[start + 1:] if line.strip())
  assert command.startswith('    '), f'not an indented code line: {command!r}'
  return command.strip()


def _noxfile_assignment(name):
  tree = ast.parse((ROOT / 'noxfile.py').read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in node.targets
    ):
      return ast.literal_eval(node.value)
  raise AssertionError(f'noxfile.py assigns no {name}')


def test_ci_runs_the_readme_test_command_exactly():
  command = _readme_test_command()
  ci_lines = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()]
  assert command in ci_lines


def test_support_matrix_page_is_the_one_ci_tests():
  pins = _noxfile_assignment('PINS')
  section = (ROOT / 'docs' / 'support_matrix.md').read_text()
  rows = {}
  for line in section.splitlines():
    cells = [c.strip().strip('`') for c in line.strip().strip('|').split('|')]
    if len(cells) >= 4 and re.fullmatch(r'\d+\.\d+\.\d+', cells[0]):
      rows[cells[0]] = tuple(cells[1:4])
  assert rows == pins


def test_readme_opens_with_the_package_description():
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / 'setup.cfg')
  lines = (ROOT / 'README.md').read_text().splitlines()
  assert lines[0] == '# flax-tieext'
  assert lines[2].replace('`', '') == cfg['metadata']['description']


def test_readme_links_the_guides_right_after_the_commands():
  text = (ROOT / 'README.md').read_text()
  after_commands = text[text.index(_readme_test_command()):].split('\n---\n')[0]
  for page in ('quickstart', 'tie_guide', 'static_arguments'):
    assert f'](docs/{page}.md)' in after_commands, page
    assert (ROOT / 'docs' / f'{page}.md').exists(), page


@pytest.mark.end_to_end  # starts nox or pytest: left to --end-to-end and CI
def test_every_nox_command_in_the_docs_names_a_session():
  # nox is in the `test` extra; the matrix's environments leave it out.
  pytest.importorskip('nox', reason='nox is not installed here')
  listing = subprocess.run(
      [sys.executable, '-m', 'nox', '-l', '--no-color'], cwd=ROOT,
      capture_output=True, text=True, check=True,
  ).stdout
  sessions = set(re.findall(r'^[*-] (\S+)', listing, re.M))
  pages = [ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')]
  for page in pages:
    for name in re.findall(r'\bnox -s ["\']?([\w.-]+(?:\([\w.]+\))?)', page.read_text()):
      plain = name.split('(')[0]
      assert name in sessions or plain in {s.split('(')[0] for s in sessions}, (
          f'{page.name}: `nox -s {name}` is not a session: {sorted(sessions)}')


@pytest.mark.end_to_end  # starts nox or pytest: left to --end-to-end and CI
def test_a_session_whose_python_is_missing_fails_saying_how_to_get_it(tmp_path):
  pytest.importorskip('nox', reason='nox is not installed here')
  # The harness alone, where the newest release's Python cannot be found:
  # nothing on PATH but this interpreter's directory, and an empty pyenv.
  for name in ('noxfile.py', 'setup.cfg', '.ci/harness.py'):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    shutil.copy(ROOT / name, tmp_path / name)
  newest = max(_noxfile_assignment('PINS').items(),
               key=lambda item: tuple(int(p) for p in item[0].split('.')))
  flax, (_, _, python) = newest
  env = dict(os.environ, PATH=str(pathlib.Path(sys.executable).parent),
             PYENV_ROOT=str(tmp_path / 'pyenv'))
  if shutil.which(f'python{python}', path=env['PATH']):
    pytest.skip(f'this interpreter is Python {python}')
  result = subprocess.run(
      [sys.executable, '-m', 'nox', '--no-color', '-s', f'matrix({flax})'],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
  output = result.stdout + result.stderr
  assert result.returncode != 0, output
  assert f'Flax {flax} is tested on Python {python}, which is not here' in output, output
  assert f'pyenv install {python}' in output, output
  assert f'Session matrix({flax}) aborted' in output, output  # nox's word for failed


@pytest.mark.end_to_end  # starts nox or pytest: left to --end-to-end and CI
def test_each_test_module_the_middle_releases_run_exists():
  """A misspelt entry of MIDDLE_RELEASE_TESTS would silently select nothing in CI."""
  modules = [str(p.relative_to(ROOT)) for p in (ROOT / 'tests').rglob('test_*.py')]
  modules += [str(p.relative_to(ROOT)) for p in (ROOT / 'tests' / 'upstream').glob('*.py')]
  for name in _noxfile_assignment('MIDDLE_RELEASE_TESTS'):
    assert any(name in m for m in modules), name


def _collected(*args):
  """(test modules, output) of ``pytest --collect-only`` with our configuration."""
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '--collect-only', '-n', '0', *args],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  return set(re.findall(r'<Module (\S+)>', result.stdout)), result.stdout


@pytest.mark.end_to_end  # starts nox or pytest: left to --end-to-end and CI
def test_a_plain_run_leaves_out_the_end_to_end_tests_saying_so():
  # tests/distributed: the launcher's tests, and two-process jobs (end_to_end).
  plain, output = _collected('tests/distributed')
  assert plain == {'test_launch.py'}, output
  assert 'deselected' in output and 'pytest --end-to-end runs them' in output, output
  everything, output = _collected('--end-to-end', 'tests/distributed')
  assert 'test_two_processes.py' in everything, output
  assert 'deselected' not in output and 'pytest --end-to-end runs them' not in output, output
  # A test file named on the command line runs as named.
  named, output = _collected('tests/distributed/test_two_processes.py')
  assert named == {'test_two_processes.py'} and 'deselected' not in output, output



def _conftest(pytestconfig):
  # tests/conftest.py as pytest loaded it: `import conftest` may find another
  # directory's.
  return next(p for p in pytestconfig.pluginmanager.get_plugins()
              if getattr(p, '__file__', None) == str(ROOT / 'tests' / 'conftest.py'))


class _Reporter:

  def __init__(self):
    self.lines = []

  def write(self, text):
    del text

  def write_line(self, line):
    self.lines.append(line)


def test_progress_lines_are_stamped_and_name_the_tests_running(pytestconfig):
  """The README's test run: collection, then a stamped line at least every 30 s."""
  # It names the areas started, those not yet, and the tests running; one
  # running for more than 30 s with the first line of its docstring.
  now, reporter = [100.0], _Reporter()
  progress = _conftest(pytestconfig).Progress(reporter, clock=lambda: now[0])
  now[0] += 29
  progress.beat()  # not yet 30 s: nothing
  now[0] += 2
  progress.beat()
  this = ('tests/test_repository.py::'
          'test_progress_lines_are_stamped_and_name_the_tests_running')
  progress._collected(['tests/test_tie_init.py::a', this])  # pylint: disable=protected-access
  now[0] += 5
  progress.beat()  # said 5 s ago: nothing
  progress.pytest_runtest_logstart(this)  # the first test: what is to run
  now[0] += 45
  progress.beat()
  assert reporter.lines == [
      '0:31 still collecting: each worker process imports JAX, Flax and every test file'
      ' before the first test runs',
      '0:36 to run: docs, demo and repository 1, ties 1',
      '1:21 done so far: docs, demo and repository 0/1; not started yet: ties (1);'
      ' running: test_repository.py::'
      'test_progress_lines_are_stamped_and_name_the_tests_running (for 0:45: The'
      " README's test run: collection, then a stamped line at least every 30 s.)",
  ]
  progress.pytest_runtest_logfinish(this)
  progress.pytest_runtest_logstart('tests/test_tie_init.py::a')
  now[0] += 30
  progress.beat()
  assert reporter.lines[-1] == (
      '1:51 done so far: docs, demo and repository 0/1, ties 0/1; running:'
      ' test_tie_init.py::a (for 0:30)')


def test_the_readme_states_the_cpu_budget_its_test_run_checks(pytestconfig):
  """README, conftest and CHANGELOG state one CPU budget for the test command."""
  budget = _conftest(pytestconfig).CPU_BUDGET_SECONDS
  readme = (ROOT / 'README.md').read_text()
  paragraph = readme[readme.index('Run the tests'):readme.index(_readme_test_command())]
  assert f'under {budget} CPU-seconds' in paragraph, paragraph
  assert f'under {budget} CPU-seconds' in (ROOT / 'CHANGELOG.md').read_text()
  assert 'TIEEXT_TEST_CPU_BUDGET=enforce' in (ROOT / '.ci' / 'run').read_text()


@pytest.mark.parametrize('seconds, enforce, status', [
    (100.0, True, 0), (300.0, False, 0), (300.0, True, 1)])
def test_the_run_ends_with_its_cpu_time_and_ci_fails_it_over_budget(
    pytestconfig, monkeypatch, seconds, enforce, status):
  """The run ends with its CPU time against the README's figure."""
  conftest = _conftest(pytestconfig)
  monkeypatch.setattr(conftest, '_is_readme_run', lambda config: True)
  if enforce:
    monkeypatch.setenv('TIEEXT_TEST_CPU_BUDGET', 'enforce')
  else:
    monkeypatch.delenv('TIEEXT_TEST_CPU_BUDGET', raising=False)

  class Session:
    config = pytestconfig
    exitstatus = pytest.ExitCode.OK

  session = Session()
  try:
    conftest._cpu_report(session, seconds, 2)  # pylint: disable=protected-access
    line = pytestconfig.stash[conftest._CPU_LINE]  # pylint: disable=protected-access
  finally:
    del pytestconfig.stash[conftest._CPU_LINE]  # pylint: disable=protected-access
  budget = conftest.CPU_BUDGET_SECONDS
  assert line.startswith(f'CPU time: {seconds:.1f} s (pytest and its 2 workers')
  assert line.endswith(f'under {budget} s on two cores: ' + (
      'within it' if seconds <= budget else f'OVER by {seconds - budget:.1f} s'))
  assert session.exitstatus == status


def _tracked_texts():
  """(path, text) of each tracked text file; none outside a git checkout."""
  listed = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, text=True,
                          check=False)
  if listed.returncode:
    pytest.skip('not a git checkout: no tracked files to read')
  for name in filter(None, listed.stdout.split('\0')):
    try:
      yield name, (ROOT / name).read_text()
    except (UnicodeDecodeError, OSError):  # binary, or deleted in the work tree
      continue


# A directory of one machine: a home, scratch or mount directory and a name in
# it. Ignored output (.gitignore) is not tracked, so it is not read. The docs'
# example commands name scratch directories a user picks; they stay.
_MACHINE_PATH = re.compile(r'(?<![\w.~/$-])/(?:tmp|home|work|root)/[\w.+-]+')
_EXAMPLE_SCRATCH = {'/tmp/run', '/tmp/ckpt'}


def test_no_tracked_file_names_a_path_of_one_machine():
  found = [f'{name}:{n}: {match}'
           for name, text in _tracked_texts()
           for n, line in enumerate(text.splitlines(), 1)
           for match in _MACHINE_PATH.findall(line) if match not in _EXAMPLE_SCRATCH]
  assert not found, 'paths of one machine:\n' + '\n'.join(found)


def test_what_is_sent_upstream_carries_no_copyright_header_of_ours():
  # JAX reports, Flax patches and the FLIP are the sender's to JAX and Flax,
  # under their projects' terms; the header is for this package's files.
  ours = [name for name, text in _tracked_texts()
          if name.startswith('patches/') and 'The flax-tieext Authors' in text]
  assert not ours, ours
