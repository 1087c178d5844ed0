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

"""Screenshots of the key pages of the built docs, 1280 px wide (``nox -s screenshots``).

    python docs/screenshots.py docs/_build/html docs/_build/screenshots

Writes ``<page>.png`` per page with headless Chromium (Debian's ``chromium``),
whole pages, cut below the last line of content: every page with a table, and
the guides. Exits 1 if, at that width, a table cell breaks a word across lines
or a table is wider than the text column (Chromium's own layout, measured by
:data:`_PROBE` on a copy of the page).
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image
from PIL import ImageChops

PAGES = ('index', 'quickstart', 'static_arguments', 'tie_guide', 'api', 'support_matrix',
         'benchmarks', 'design', 'scaling', 'upstream_patches')
WIDTH = 1280
MAX_HEIGHT = 16000  # taller than any page; the blank rest is cut off


def screenshot(chromium, html, png):
  with tempfile.TemporaryDirectory() as profile:
    subprocess.run(
        [chromium, '--headless', '--no-sandbox', '--disable-gpu',
         f'--user-data-dir={profile}', f'--window-size={WIDTH},{MAX_HEIGHT}',
         f'--screenshot={png}', html.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )
  image = Image.open(png).convert('RGB')
  background = Image.new('RGB', image.size, image.getpixel((WIDTH - 1, image.height - 1)))
  box = ImageChops.difference(image, background).getbbox()
  bottom = min(image.height, box[3] + 40) if box else image.height
  image.crop((0, 0, WIDTH, bottom)).save(png)
  return bottom


# Run after layout: each word of a table cell that spans two lines, and each
# table wider than the text column, into <body data-problems="...">.
_PROBE = """<script>
window.addEventListener('load', () => {
  const problems = [];
  const column = document.querySelector('div.body').getBoundingClientRect();
  document.querySelectorAll('table').forEach((table, index) => {
    const box = table.getBoundingClientRect();
    if (box.right > column.right + 1) {
      problems.push(`table ${index + 1} is ${Math.round(box.width)} px wide, wider than the`
                    + ` column (${Math.round(column.width)} px)`);
    }
    const texts = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
    for (let node; (node = texts.nextNode());) {
      // A word ends at a space or after a hyphen ('read-' 'only').
      for (const word of node.data.matchAll(/-*[^\\s-]+-*/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const lines = new Set([...range.getClientRects()].filter(r => r.width > 0)
                                .map(r => Math.round(r.top)));
        if (lines.size > 1) {
          problems.push(`table ${index + 1}: ${JSON.stringify(word[0])} is broken across lines`);
        }
      }
    }
  });
  document.body.setAttribute('data-problems', JSON.stringify(problems));
});
</script>"""


def table_problems(chromium, html):
  """Words broken inside a table cell, and tables wider than the column."""
  probe = html.with_name(f'_probe_{html.name}')
  probe.write_text(html.read_text().replace('</body>', _PROBE + '</body>'))
  try:
    with tempfile.TemporaryDirectory() as profile:
      dom = subprocess.run(
          [chromium, '--headless', '--no-sandbox', '--disable-gpu',
           f'--user-data-dir={profile}', f'--window-size={WIDTH},{MAX_HEIGHT}',
           '--virtual-time-budget=10000', '--dump-dom', probe.resolve().as_uri()],
          check=True, capture_output=True, text=True, timeout=120,
      ).stdout
  finally:
    probe.unlink()
  found = re.search(r'<body[^>]* data-problems="([^"]*)"', dom)
  if found is None:
    raise RuntimeError(f'{html}: the table probe did not run')
  return json.loads(found[1].replace('&quot;', '"').replace('&amp;', '&'))


def main(argv):
  html, out = pathlib.Path(argv[1]), pathlib.Path(argv[2])
  chromium = shutil.which('chromium') or shutil.which('chromium-browser')
  if chromium is None:
    sys.exit('chromium not found: apt-get install chromium')
  out.mkdir(parents=True, exist_ok=True)
  problems = []
  for page in PAGES:
    png = out / f'{page}.png'
    height = screenshot(chromium, html / f'{page}.html', png)
    print(f'{png} ({WIDTH} x {height})')
    problems += [f'{page}.html: {p}' for p in table_problems(chromium, html / f'{page}.html')]
  if problems:
    sys.exit(f'at {WIDTH} px:\n' + '\n'.join(problems))


if __name__ == '__main__':
  main(sys.argv)
