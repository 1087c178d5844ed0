"""The Flax docs PR in patches/docs/: an executed guide whose every cell runs.

The PR adds ``docs/guides/flax_fundamentals/sharing_variables.ipynb`` and its
MyST twin ``sharing_variables.md`` (a jupytext pair, as Flax's executed
guides are). Both are read from the patch itself. The notebook has no
outputs, so Flax's docs build (myst-nb, ``nb_execution_mode`` left at
``auto``, ``nb_execution_raise_on_error = True``) executes it; here its code
cells run in order, as one program, in a fresh interpreter on the installed
Flax, and each asserts what the text says it shows.
``tools/upstream_verify.py`` (``nox -s upstream``) runs this file.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = 'docs/guides/flax_fundamentals/sharing_variables'
SECTIONS = ('## One module instance used in two places', '## A tied output layer: `nn.Embed.attend`',
            '## `variable_broadcast` and `variable_carry` in `nn.scan`',
            '## `nn.map_variables` with a write-back', '## `nn.share_scope`', '## Beyond Linen')
PATCHES = sorted((ROOT / 'patches' / 'docs').glob('*.patch'))


def added_file(patch: pathlib.Path, path: str) -> str:
  """The text of the file ``path`` that ``patch`` creates."""
  text = patch.read_text()
  start = text.index(f'+++ b/{path}\n')
  hunk = text[start:].split('\n@@', 1)[1].split('\n', 1)[1]
  lines = []
  for line in hunk.splitlines():
    if line.startswith('diff --git') or line == '-- ':
      break
    lines.append(line[1:])
  return '\n'.join(lines) + '\n'


def myst_cells(page: str) -> list[tuple[str, str]]:
  """``(type, source)`` of each cell of a jupytext MyST page, as jupytext reads it."""
  body = re.sub(r'\A---\n.*?\n---\n', '', page, flags=re.S)
  cells = []
  for i, part in enumerate(re.split(r'^```\{code-cell\}\n(.*?)^```\n', body, flags=re.S | re.M)):
    if i % 2:
      cells.append(('code', part.strip('\n')))
    else:
      cells += [('markdown', md.strip('\n')) for md in re.split(r'^\+\+\+\n', part, flags=re.M)
                if md.strip()]
  return cells


def notebook_cells(notebook: dict) -> list[tuple[str, str]]:
  return [(c['cell_type'], ''.join(c['source'])) for c in notebook['cells']]


@pytest.fixture(scope='module')
def guide():
  return (added_file(PATCHES[0], f'{GUIDE}.md'),
          json.loads(added_file(PATCHES[0], f'{GUIDE}.ipynb')))


def test_the_page_has_each_pattern_and_what_it_cannot_do(guide):
  page, _ = guide
  for section in SECTIONS:
    assert section in page, section
  assert page.count('What it cannot do') + page.count('What they cannot do') == 5
  assert 'third-party' not in page.lower()


def test_the_notebook_is_the_pair_of_its_myst_page(guide):
  page, notebook = guide
  assert notebook['metadata']['jupytext']['formats'] == 'ipynb,md:myst'
  assert notebook_cells(notebook) == myst_cells(page)
  try:
    import jupytext  # pylint: disable=g-import-not-at-top
  except ImportError:
    return  # nox -s upstream installs the jupytext of Flax's pre-commit
  read = jupytext.reads(page, fmt='md:myst')
  assert [(c.cell_type, c.source) for c in read.cells] == notebook_cells(notebook)


def test_the_docs_build_executes_the_notebook(guide):
  _, notebook = guide
  code = [c for c in notebook['cells'] if c['cell_type'] == 'code']
  assert len(code) >= 8
  # myst-nb's `auto` mode executes a notebook missing outputs; none is skipped.
  assert all(not c['outputs'] and 'skip-execution' not in c['metadata'].get('tags', [])
             for c in code)
  index = (ROOT / 'patches' / 'docs').glob('*.patch')
  assert any('+   sharing_variables\n' in p.read_text() for p in index)


def test_each_checking_cell_ends_in_the_value_it_checks(guide):
  # The built page shows a cell's last expression; a cell ending in an
  # `assert` would show nothing.
  _, notebook = guide
  for kind, source in notebook_cells(notebook):
    last = source.splitlines()[-1]
    if kind == 'code' and 'assert ' in source:
      assert not last.startswith(('assert ', ' ')) and ' = ' not in last, last


def test_every_code_cell_runs(guide):
  _, notebook = guide
  code = '\n\n'.join(source for kind, source in notebook_cells(notebook) if kind == 'code')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        timeout=600, check=False, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert done.returncode == 0, done.stderr[-3000:]
