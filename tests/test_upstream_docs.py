"""The Flax docs PR in patches/docs/: every code block of its page runs.

The page ``docs/guides/flax_fundamentals/sharing_variables.md`` that the
patch adds is read from the patch itself; its ``python`` blocks run in order
as one program (as a reader pastes them) in a fresh interpreter on the
installed Flax, and each asserts what the text says it shows.
``tools/upstream_verify.py`` (``nox -s upstream``) runs this file.
"""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = 'docs/guides/flax_fundamentals/sharing_variables.md'
SECTIONS = ('## One module instance used in two places',
            '## `variable_broadcast` and `variable_carry` in `nn.scan`',
            '## `nn.map_variables` with a write-back', '## `nn.share_scope`', '## Beyond Linen')


def page_of(patch: pathlib.Path) -> str:
  """The text of PAGE as the patch adds it."""
  text = patch.read_text()
  start = text.index(f'+++ b/{PAGE}\n')
  hunk = text[start:].split('\n@@', 1)[1].split('\n', 1)[1]
  lines = []
  for line in hunk.splitlines():
    if line.startswith('diff --git') or line == '-- ':
      break
    lines.append(line[1:])
  return '\n'.join(lines) + '\n'


def blocks(page: str) -> list[str]:
  return re.findall(r'```python\n(.*?)```', page, re.S)


PATCHES = sorted((ROOT / 'patches' / 'docs').glob('*.patch'))


def test_the_page_has_each_pattern_and_what_it_cannot_do():
  page = page_of(PATCHES[0])
  for section in SECTIONS:
    assert section in page, section
  assert page.count('What it cannot do') + page.count('What they cannot do') == 4
  assert len(blocks(page)) >= 6


def test_every_code_block_runs():
  code = '\n\n'.join(blocks(page_of(PATCHES[0])))
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        timeout=600, check=False, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert done.returncode == 0, done.stderr[-3000:]
