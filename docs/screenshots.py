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
whole pages, cut below the last line of content.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

from PIL import Image
from PIL import ImageChops

PAGES = ('index', 'quickstart', 'static_arguments', 'tie_guide', 'api', 'support_matrix')
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


def main(argv):
  html, out = pathlib.Path(argv[1]), pathlib.Path(argv[2])
  chromium = shutil.which('chromium') or shutil.which('chromium-browser')
  if chromium is None:
    sys.exit('chromium not found: apt-get install chromium')
  out.mkdir(parents=True, exist_ok=True)
  for page in PAGES:
    png = out / f'{page}.png'
    height = screenshot(chromium, html / f'{page}.html', png)
    print(f'{png} ({WIDTH} x {height})')


if __name__ == '__main__':
  main(sys.argv)
