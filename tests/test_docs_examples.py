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
* The ```` ```{testcode} ```` blocks of one page run in order in one fresh
  interpreter, as Sphinx's doctest builder runs them (one session per page),
  and what each prints must be the ```` ```{testoutput} ```` block right
  after it, compared with the builder's default option flags. They show
  plain code, which a reader copies and pastes as shown (no ``>>>``
  prompts; tests/test_docs_paste.py pastes them into the REPL).
* A block that is deliberately a fragment is preceded by the line
  ``<!-- fragment: why -->`` and is not run.
* A page that needs a module some supported Flax releases lack says so in
  its first lines, ``<!-- requires: flax.nnx.bridge -->``; where it cannot be
  imported, the page's examples are skipped with that reason. The same line
  right above one block says it of that block alone.

Other fences (``text``, ``bash``, directives) are not Python.

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
    r'```(?P<lang>python|\{testcode\})[^\n]*\n(?P<body>.*?)^```\s*\n'
    r'(?:\n```\{testoutput\}\n(?P<output>.*?)^```\s*$)?',
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

# Reads [[first line, code, output or null], ...] from stdin: runs each
# {testcode} block of a page in one namespace, as Sphinx's doctest builder
# does, and compares what it prints with its {testoutput} block.
_RUN_TESTCODE = """
import contextlib, doctest, io, json, sys
flags = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1
checker, namespace, failed = doctest.OutputChecker(), {'__name__': '__main__'}, []
for first, code, want in json.load(sys.stdin):
  where = f'{sys.argv[1]}:{first}'
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(code, where, 'exec'), namespace)
  got = printed.getvalue()
  if want is not None and not checker.check_output(want, got, flags):
    failed.append(f'{where}: printed\\n{got}expected\\n{want}')
sys.exit('\\n'.join(failed) if failed else 0)
"""


def _missing(rel, modules):
  return [pytest.mark.skip(reason=f'{rel} needs {module}, which this Flax lacks')
          for module in modules if not _importable(module)]


def pages():
  """(page as the docs name it, its text, its marks: a skip where it needs a module)."""
  for page in PAGES:
    text = page.read_text()
    rel = page.relative_to(ROOT).as_posix()
    yield rel, text, _missing(rel, re.findall(r'<!-- requires: (\S+) -->\n(?!```)', text))


def _examples():
  """pytest params: (page, what to run), ids `page:line`."""
  params = []
  for rel, text, marks in pages():
    testcode = []
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
        testcode.append([line, match['body'], match['output']])
    if testcode:
      params.append(pytest.param('testcode', json.dumps(testcode), marks=marks,
                                 id=f'{rel}:testcode'))
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
    result = _run(['-c', _RUN_TESTCODE, request.node.callspec.id], source)
  assert result.returncode == 0, f'{result.stdout}\n{result.stderr}'


@pytest.mark.needs_patch
@pytest.mark.parametrize('name, docstring', _shown_docstrings())
def test_docstring_examples_run_pasted_alone(name, docstring):
  result = _run(['-c', _RUN_DOCTEST, name], docstring)
  assert result.returncode == 0, f'{result.stdout}\n{result.stderr}'
