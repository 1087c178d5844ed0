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

"""The quickstart's figure, drawn by the demo (``nox -s docs`` runs this).

    python docs/demo_figure.py docs/_static/demo_memory.png

Measures what ``flax-tieext --plot FILE.png`` plots at the demo's default
depth (``flax_tieext.demo.write_plot``) and draws it to a temporary file. The
PNG holds what it shows, its numbers and texts (``demo.figure_data``), so the
figure at the path given is compared by those, not by pixels, which differ
between matplotlib releases. Where they differ, the figure there is stale: it
is replaced by the new one, and the script exits 1 saying to commit it; CI's
``nox -s docs`` fails so.
"""

import os
import shutil
import sys
import tempfile

from flax_tieext.examples import measure

measure.keep_remat_on_cpu()  # before JAX starts, as the demo does

from flax_tieext import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(path: str) -> int:
  with tempfile.TemporaryDirectory() as tmp:
    drawn = os.path.join(tmp, os.path.basename(path))
    with demo._heartbeat():  # pylint: disable=protected-access
      if not demo.write_plot(drawn, build_layers()):
        return 1
    if demo.shown_figure_data(drawn) == demo.shown_figure_data(path):
      print(f'{path}: up to date')
      return 0
    shutil.copyfile(drawn, path)
  print(f'{path} was stale (its numbers or texts differ from what the demo draws'
        ' now): it is drawn anew; commit it.', file=sys.stderr)
  return 1


def build_layers() -> int:
  """The demo's default depth (``--layers``), at which ``--plot`` ends."""
  return demo.build_parser().get_default('layers')


if __name__ == '__main__':
  sys.exit(main(sys.argv[1]))
