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

"""The FLIP's reproducers fail on plain Flax and work with ties, as it says.

Each script in docs/upstream/flip_reproducers/ runs in a fresh interpreter
twice: plain, with ``flax_tieext`` unimportable (and
``FLAX_TIEEXT_AUTOPATCH=0``), where a problem the FLIP claims must end in the
error the FLIP names and an alternative must run; and with the plugin, where
every script must run. The FLIP's own ``python`` blocks run with the plugin
imported first, which is how Flax would run them with ties in it.

The FLIP describes one Flax release, the one it names as where its
reproducers were run. On any other release these checks are skipped, saying
so: a plain failure there is not what the FLIP claims.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from flax_tieext import _compat

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLIP = ROOT / 'docs' / 'upstream' / 'flip-linen-ties.md'
FOLDER = ROOT / 'docs' / 'upstream' / 'flip_reproducers'

# (script, *arguments) -> the last line of a plain run's traceback, or None
# for an alternative that runs on plain Flax.
CASES = {
    ('remat_hand_shared_mask.py',): r"KeyError: 'graph'",
    ('remat_hand_shared_mask.py', '--no-remat'): None,
    ('scan_shared_module.py', 'inside'): r'AssertionError: one table per layer: \(4, 11, 2\)',
    ('scan_shared_module.py', 'outside'): r'flax\.errors\.ScopeParamShapeError: .*"table"',
    ('map_variables_lost_write.py',): r'AssertionError: writes lost: count 3\.0',
    ('nnx_tree_mode_shared.py',): r'ValueError: Duplicate Param',
    ('remat_static_flag_by_keyword.py',):
        r'ValueError: the `static_argnums` argument to `jax\.checkpoint`',
    ('alt_shared_instance.py',): None,
    ('alt_embed_attend.py',): None,
    ('alt_pass_values.py',): None,
    ('alt_nnx_graph_mode.py',): None,
}

# Blocks `flax_tieext` from importing: the interpreter is plain Flax.
_PLAIN = ("import runpy, sys; sys.modules['flax_tieext'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_path(sys.argv[0], run_name='__main__')")
_PATCHED = ("import runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
_FLIP_BLOCK = "import flax_tieext, sys; exec(compile(sys.stdin.read(), 'flip', 'exec'), {})"

pytestmark = pytest.mark.own_patch_mode


def _described_release():
  found = re.search(r'Every reproducer below was run on Flax (\d+\.\d+\.\d+)',
                    FLIP.read_text())
  assert found, 'the FLIP names the Flax release its reproducers were run on'
  return found[1]


def _skip_other_releases():
  described = _described_release()
  if _compat.FLAX_VERSION != described:
    pytest.skip(f'the FLIP describes Flax {described}; this is Flax {_compat.FLAX_VERSION}')


def _run(code, args, autopatch, source=None):
  env = {k: v for k, v in os.environ.items() if k != 'FLAX_TIEEXT_AUTOPATCH'}
  env.update(JAX_PLATFORMS='cpu', **({} if autopatch else {'FLAX_TIEEXT_AUTOPATCH': '0'}))
  return subprocess.run([sys.executable, '-c', code, *args], input=source,
                        capture_output=True, text=True, env=env, cwd=ROOT,
                        timeout=600, check=False)


def _ids(cases):
  return [' '.join(case) for case in cases]


def test_every_reproducer_is_checked_and_named_in_the_flip():
  text = FLIP.read_text()
  scripts = {case[0] for case in CASES}
  assert scripts == {p.name for p in FOLDER.glob('*.py')}
  for case in CASES:
    assert f'`{" ".join(case)}`' in text, f'the FLIP does not name {" ".join(case)}'


@pytest.mark.parametrize('case', list(CASES), ids=_ids(CASES))
def test_plain_flax_fails_as_the_flip_says(case):
  _skip_other_releases()
  result = _run(_PLAIN, [str(FOLDER / case[0]), *case[1:]], autopatch=False)
  if CASES[case] is None:
    assert result.returncode == 0, result.stderr
    return
  assert result.returncode != 0, f'{" ".join(case)} ran on plain Flax'
  assert re.search(f'^{CASES[case]}', result.stderr, re.M), result.stderr[-3000:]


@pytest.mark.parametrize('case', list(CASES), ids=_ids(CASES))
def test_with_the_plugin_it_works(case):
  _skip_other_releases()
  result = _run(_PATCHED, [str(FOLDER / case[0]), *case[1:]], autopatch=True)
  assert result.returncode == 0, result.stderr[-3000:]


def _flip_blocks():
  text = FLIP.read_text()
  return [pytest.param(m[1], id=f'flip:{text.count(chr(10), 0, m.start()) + 2}')
          for m in re.finditer(r'^```python\n(.*?)^```$', text, re.M | re.S)]


@pytest.mark.parametrize('source', _flip_blocks())
def test_the_flips_python_blocks_run(source):
  _skip_other_releases()
  result = _run(_FLIP_BLOCK, [], autopatch=True, source=source)
  assert result.returncode == 0, result.stderr[-3000:]
