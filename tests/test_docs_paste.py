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

"""Every code block of README.md and docs/*.md pastes into Python's REPL.

A reader copies a block (```` ```python ````, ```` ```{testcode} ````) as it is
shown and pastes it at the ``>>>`` prompt. The test does that to the real
interactive interpreter of the Python running it, through a pseudo-terminal,
one REPL per page with its blocks pasted in order, and fails where the
interpreter reports an error in the pasted code (a traceback or a
``SyntaxError`` naming ``<stdin>`` or ``<python-input-N>``).

The REPLs differ:

* The classic REPL (Python 3.11 and 3.12, and 3.13 with
  ``PYTHON_BASIC_REPL=1`` or on a terminal it cannot drive) reads a paste line
  by line, as if typed. An empty line ends an indented block, so a class whose
  methods are separated by blank lines falls apart (``IndentationError``), and
  a statement right after an indented block, with no blank line between, is
  a ``SyntaxError``.
* Python 3.13's REPL turns on bracketed paste, so a terminal hands it the
  paste as one input, which it runs as a whole.

On 3.13 both are pasted into; on 3.11 and 3.12, the classic one. The test runs
on the newest release of each supported Python (noxfile.py: PASTED_ON).

The API page (docs/api.md) shows the docstrings' examples with ``>>>``
prompts; its copy button (sphinx-copybutton, docs/conf.py) copies the code
without them, and the blank ``...`` lines as empty lines. Those examples are
pasted as it copies them.
"""

import fcntl
import json
import os
import pathlib
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from test_docs_examples import FENCE
from test_docs_examples import ROOT
from test_docs_examples import _importable
from test_docs_examples import _shown_docstrings
from test_docs_examples import pages

pytestmark = [pytest.mark.end_to_end, pytest.mark.needs_patch]

# Where the pasted code failed: the file name the REPL gives pasted input.
FAILED = re.compile(r'File "<(?:stdin|python-input-\d+)>"')
# Escape sequences a terminal interprets (colours, cursor moves, modes).
ESCAPE = re.compile(r'\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>])')
BRACKETED_PASTE_ON = '\x1b[?2004h'
PAGE_TIMEOUT_S = 600


def copied_with_the_copy_button(shown: str) -> str:
  """What the site's copy button copies of a code block ``shown`` as rendered.

  sphinx-copybutton's ``formatCopyText`` with docs/conf.py's settings: where
  a line starts with a prompt (``copybutton_prompt_text``, a regular
  expression), each such line is kept without it and every other line (the
  examples' output) is left out; a block without prompts is copied whole.
  """
  conf = (ROOT / 'docs' / 'conf.py').read_text()
  prompt = re.search(r"^copybutton_prompt_text = r'(.*)'$", conf, re.M)
  if 'sphinx_copybutton' not in conf or prompt is None:  # copied as shown
    return shown
  regexp = re.compile(f'^({prompt[1]})(.*)')
  matches = [regexp.match(line) for line in shown.splitlines()]
  if not any(matches):  # no prompt: the block as shown
    return shown
  return '\n'.join(m[2] for m in matches if m) + '\n'


def rendered_examples(docstring: str) -> str:
  """A docstring's examples as the API page shows them: at the left margin."""
  return '\n'.join(line.lstrip() for line in docstring.splitlines()
                   if line.lstrip().startswith(('>>>', '...')))


def _pages():
  """pytest params: (name, [blocks as shown]), one per page with code."""
  params = []
  for rel, text, marks in pages():
    blocks = [match['body'] for match in FENCE.finditer(text)
              if not match['marker'] and (
                  not match['requires'] or _importable(match['requires']))]
    if blocks:
      params.append(pytest.param(rel, blocks, id=rel, marks=marks))
  docstrings = [p.values[1] for p in _shown_docstrings() if p.values[1]]
  params.append(pytest.param(
      'docs/api.md',
      [copied_with_the_copy_button(rendered_examples(d)) for d in docstrings],
      id='docs/api.md (docstrings, as the copy button copies them)'))
  return params


def _repls():
  if sys.version_info >= (3, 13):
    return [pytest.param({}, id='new-repl'),
            pytest.param({'PYTHON_BASIC_REPL': '1'}, id='basic-repl')]
  return [pytest.param({}, id='classic-repl')]


class Terminal:
  """An interactive interpreter in a pseudo-terminal, driven as a person does."""

  def __init__(self, env):
    master, slave = os.openpty()
    # 50 rows of 200 columns: the new REPL lays out its input by the size.
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack('HHHH', 50, 200, 0, 0))
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, '-q'], stdin=slave, stdout=slave, stderr=slave,
        env=env, cwd=ROOT, start_new_session=True)
    os.close(slave)
    self.fd, self.raw = master, ''
    self.deadline = time.monotonic() + PAGE_TIMEOUT_S

  @property
  def shown(self):
    """What the terminal shows, without its escape sequences."""
    return ESCAPE.sub('', self.raw).replace('\r', '')

  def _pump(self, pending=b''):
    """Reads what the REPL writes; writes ``pending`` as it takes it."""
    while True:
      if time.monotonic() > self.deadline:
        raise TimeoutError(f'the REPL did not answer within {PAGE_TIMEOUT_S} s')
      readable, writable, _ = select.select(
          [self.fd], [self.fd] if pending else [], [], 0.2)
      if readable:
        try:
          data = os.read(self.fd, 65536)
        except OSError:  # the REPL exited
          return pending
        self.raw += data.decode('utf-8', 'replace')
      if writable:
        pending = pending[os.write(self.fd, pending[:1024]):]
      if not readable and not pending:
        return pending

  def type(self, text):
    self._pump(text.encode())

  def wait_for(self, pattern):
    while not re.search(pattern, self.shown):
      if self.process.poll() is not None:
        self._pump()
        raise AssertionError(f'the REPL exited:\n{self.shown[-3000:]}')
      self._pump()
      time.sleep(0.05)

  def paste(self, block):
    """Pastes ``block`` as a terminal does (Enter is a carriage return)."""
    text = block.rstrip('\n').replace('\n', '\r') + '\r'
    if BRACKETED_PASTE_ON in self.raw:
      text = f'\x1b[200~{text}\x1b[201~'
    self.type(text)
    self.type('\r')  # the reader presses Enter after the paste

  def close(self):
    self.type('\x04')
    try:
      self.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
    os.close(self.fd)


@pytest.mark.parametrize('repl', _repls())
@pytest.mark.parametrize('page, blocks', _pages())
def test_each_block_pastes_into_the_repl(page, blocks, repl):
  env = dict(os.environ, JAX_PLATFORMS='cpu', TERM='xterm-256color',
             PYTHON_COLORS='0', **repl)
  for name in ('FLAX_TIEEXT_AUTOPATCH', 'PYTHONSTARTUP', 'PYTHON_BASIC_REPL'):
    if name not in repl:
      env.pop(name, None)  # the docs describe the default
  terminal = Terminal(env)
  try:
    terminal.wait_for(r'>>> ')
    for n, block in enumerate(blocks, 1):
      terminal.paste(block)
      # Typed ahead: the REPL reads it once the block has run.
      terminal.type(f'print("pasted", "block", {n})\r')
      terminal.wait_for(rf'pasted block {n}\n')
  finally:
    terminal.close()
  shown = terminal.shown
  failed = FAILED.search(shown)
  assert not failed, (
      f'{page}, pasted block by block into the REPL of Python'
      f' {sys.version.split()[0]} ({json.dumps(repl) if repl else "its default"}),'
      f' fails:\n{shown[max(0, failed.start() - 2500):failed.start() + 1500]}')


def test_the_copy_button_copies_each_block_of_the_pages_as_shown():
  # What a reader copies from the site is what a reader of the Markdown
  # copies, and what the test above pastes.
  changed = [f'{page}: {block.splitlines()[0]}'
             for page, blocks in (p.values for p in _pages()[:-1])
             for block in blocks
             if copied_with_the_copy_button(block) != block]
  assert not changed, changed
