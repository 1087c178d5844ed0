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

"""Every code example in README.md and docs/*.md runs as a reader pastes it.

* A ```` ```python ```` block runs alone in a fresh interpreter: it must bring
  its own imports and inputs. Its ``assert`` lines are what the text claims.
* The ```` ```{doctest} ```` blocks of one page run in order in one fresh
  interpreter, as Sphinx's doctest builder runs them (one session per page),
  with its default option flags.
* A block that is deliberately a fragment is preceded by the line
  ``<!-- fragment: why -->`` and is not run.
* A page that needs a module some supported Flax releases lack says so in
  its first lines, ``<!-- requires: flax.nnx.bridge -->``; where it cannot be
  imported, the page's examples are skipped with that reason. The same line
  right above one block says it of that block alone.

Other fences (``text``, ``bash``, directives) are not Python.

Every block also pastes into an interactive interpreter: its lines go, one at
a time, to ``code.InteractiveConsole`` as a reader types them at the prompt
(for a doctest block, the text after each ``>>>`` and ``...``). There a
compound statement ends only at an empty line, so a ``def`` followed straight
by ``>>> g = ...``, or a blank line inside a function body, is a
``SyntaxError`` that a script run does not show. The python blocks of a page
each get a fresh console; its doctest blocks share one, as above.

The docstrings the API page (docs/api.md) shows, which ``help()`` shows too,
run the same way: each one's examples in order in a fresh interpreter, with
only the imports they show.
"""

import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.end_to_end

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
FENCE = re.compile(
    r'^(?P<marker><!-- fragment:[^\n]*-->\n)?'
    r'(?:<!-- requires: (?P<requires>\S+) -->\n)?'
    r'```(?P<lang>python|\{doctest\})[^\n]*\n(?P<body>.*?)^```\s*$',
    re.M | re.S,
)

# What `doctest_default_flags` of sphinx.ext.doctest sets.
_RUN_DOCTEST = """
import doctest, sys
flags = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1
test = doctest.DocTestParser().get_doctest(sys.stdin.read(), {}, sys.argv[1], sys.argv[1], 0)
runner = doctest.DocTestRunner(optionflags=flags)
runner.run(test)
sys.exit(1 if runner.failures or not runner.tries else 0)
"""

# Reads [[kind, first line, source], ...] from stdin; each block goes, line by
# line, to an InteractiveConsole (a fresh one per python block, one for all
# doctest blocks), and each line after it has run. Exits 1 listing what failed.
_PASTE_INTO_REPL = r"""
import code, json, sys, traceback

class Console(code.InteractiveConsole):
  def __init__(self):
    super().__init__({'__name__': '__main__'})
    self.errors, self.where = [], None
  def _record(self, text):
    self.errors.append(f'{sys.argv[1]}:{self.where}: {text.strip()}')
  def showsyntaxerror(self, filename=None, **kwargs):
    self._record(''.join(traceback.format_exception_only(*sys.exc_info()[:2])))
  def showtraceback(self):
    self._record(''.join(traceback.format_exception(*sys.exc_info())))

def typed(kind, source):
  lines = source.splitlines()
  for n, line in enumerate(lines):
    if kind == 'python':
      # A paste keeps a blank line inside an indented block in that block.
      after = next((l for l in lines[n + 1:] if l.strip()), '')
      if line.strip() or not after[:1].isspace():
        yield n, line
    elif line.startswith(('>>> ', '... ')) or line in ('>>>', '...'):
      yield n, line[4:]

errors, doctest_console = [], Console()
for kind, first, source in json.load(sys.stdin):
  console = Console() if kind == 'python' else doctest_console
  more = False
  for n, line in typed(kind, source):
    if not more:
      console.where = first + n
    more = console.push(line)
  if more:  # the reader presses Enter after the paste
    console.push('')
  errors += console.errors
  console.errors = []
sys.exit('\n\n'.join(errors) if errors else 0)
"""


def _missing(rel, modules):
  return [pytest.mark.skip(reason=f'{rel} needs {module}, which this Flax lacks')
          for module in modules if not _importable(module)]


def _examples():
  """pytest params: (page, what to run), ids `page:line`."""
  params = []
  for page in PAGES:
    text = page.read_text()
    rel = page.relative_to(ROOT).as_posix()
    marks = _missing(rel, re.findall(r'<!-- requires: (\S+) -->\n(?!```)', text))
    doctests = []
    for match in FENCE.finditer(text):
      if match['marker']:
        continue
      line = text.count('\n', 0, match.start('body')) + 1
      if match['lang'] == 'python':
        block = [match['requires']] if match['requires'] else []
        params.append(pytest.param(
            'python', match['body'], id=f'{rel}:{line}',
            marks=marks + _missing(f'{rel}:{line}', block)))
      else:
        doctests.append(match['body'])
    if doctests:
      params.append(pytest.param('doctest', '\n'.join(doctests), marks=marks,
                                 id=f'{rel}:doctests'))
  return params


def _pages():
  """pytest params: (page, [[kind, first line, source], ...]), ids `page`."""
  params = []
  for page in PAGES:
    text = page.read_text()
    rel = page.relative_to(ROOT).as_posix()
    if '>>>' not in text and '```python' not in text:
      continue
    marks = _missing(rel, re.findall(r'<!-- requires: (\S+) -->\n(?!```)', text))
    blocks = []
    for match in FENCE.finditer(text):
      if match['marker'] or (match['requires'] and not _importable(
          match['requires'])):
        continue
      line = text.count('\n', 0, match.start('body')) + 1
      blocks.append(['python' if match['lang'] == 'python' else 'doctest',
                     line, match['body']])
    if blocks:
      params.append(pytest.param(rel, blocks, id=rel, marks=marks))
  return params


def _shown_docstrings():
  """pytest params: (name, docstring) of each object docs/api.md documents with examples."""
  params, seen = [], set()
  for name in re.findall(r'^\.\. auto\w+:: (\S+)', (ROOT / 'docs' / 'api.md').read_text(), re.M):
    try:
      obj = _resolve(name)
    except Exception as e:  # pylint: disable=broad-except
      params.append(pytest.param(name, '', id=name, marks=pytest.mark.skip(
          reason=f'{name} does not import with this Flax: {e!r}')))
      continue
    if id(obj) not in seen and '>>> ' in (obj.__doc__ or ''):
      seen.add(id(obj))
      params.append(pytest.param(name, obj.__doc__, id=name))
  assert params, 'docs/api.md documents no docstring with examples'
  return params


def _resolve(name):
  """The object `name` documents: `flax_tieext.lift.tie` is an attribute path."""
  module, _, attr = name.rpartition('.')
  try:
    return getattr(importlib.import_module(module), attr)
  except ModuleNotFoundError:
    return getattr(_resolve(module), attr)


def _importable(module):
  try:
    importlib.import_module(module)
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def _run(args, source):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('FLAX_TIEEXT_AUTOPATCH', None)  # the docs describe the default
  return subprocess.run(
      [sys.executable, *args], input=source, capture_output=True, text=True,
      env=env, cwd=ROOT, timeout=600, check=False,
  )


@pytest.mark.needs_patch
@pytest.mark.parametrize('kind, source', _examples())
def test_example_runs_pasted_alone(kind, source, request):
  if kind == 'python':
    result = _run(['-'], source)
  else:
    result = _run(['-c', _RUN_DOCTEST, request.node.callspec.id], source)
  assert result.returncode == 0, f'{result.stdout}\n{result.stderr}'


@pytest.mark.needs_patch
@pytest.mark.parametrize('page, blocks', _pages())
def test_examples_paste_into_an_interactive_interpreter(page, blocks):
  result = _run(['-c', _PASTE_INTO_REPL, page], json.dumps(blocks))
  assert result.returncode == 0, (
      f'{page}: pasted line by line into an interactive interpreter:\n'
      f'{result.stderr}')


@pytest.mark.needs_patch
@pytest.mark.parametrize('name, docstring', _shown_docstrings())
def test_docstring_examples_run_pasted_alone(name, docstring):
  result = _run(['-c', _RUN_DOCTEST, name], docstring)
  assert result.returncode == 0, f'{result.stdout}\n{result.stderr}'
