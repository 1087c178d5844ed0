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

Each script in docs/upstream/flip_reproducers/ runs twice, each time as
``__main__`` with its own arguments: plain, with ``flax_tieext`` unimportable
(and ``FLAX_TIEEXT_AUTOPATCH=0``), where a problem the FLIP claims must end in
the error the FLIP names and an alternative must run; and with the plugin
imported first, where every script must run, as must the FLIP's own
``python`` blocks: that is how Flax would run them with ties in it. The
scripts of each mode share one fresh interpreter (so JAX and Flax are
imported once per mode, not once per script); each script and block runs in
globals of its own, and the scripts touch no global state of JAX or Flax.

The FLIP describes one Flax release, the one it names as where its
reproducers were run. On any other release these checks are skipped, saying
so: a plain failure there is not what the FLIP claims.
"""

import json
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

# Runs each (name, argv, source) of the JSON on stdin in this interpreter:
# the script argv[0] as __main__, or `source` in fresh globals. Writes
# {name: its traceback, or None} to the file job["out"]. Plain, it blocks
# `flax_tieext` from importing; patched, it imports it first.
_RUNNER = """
import json, runpy, sys, traceback
job = json.load(sys.stdin)
if job['plain']:
  sys.modules['flax_tieext'] = None
else:
  import flax_tieext
failed = {}
for name, argv, source in job['runs']:
  sys.argv = argv
  try:
    if source is None:
      runpy.run_path(argv[0], run_name='__main__')
    else:
      exec(compile(source, 'flip', 'exec'), {})
    failed[name] = None
  except SystemExit as e:  # as its own interpreter would exit
    failed[name] = None if e.code in (None, 0) else traceback.format_exc()
  except BaseException:
    failed[name] = traceback.format_exc()
with open(job['out'], 'w') as f:
  json.dump(failed, f)
"""

pytestmark = [pytest.mark.own_patch_mode, pytest.mark.end_to_end]


def _described_release():
  found = re.search(r'Every reproducer below was run on Flax (\d+\.\d+\.\d+)',
                    FLIP.read_text())
  assert found, 'the FLIP names the Flax release its reproducers were run on'
  return found[1]


def _skip_other_releases():
  described = _described_release()
  if _compat.FLAX_VERSION != described:
    pytest.skip(f'the FLIP describes Flax {described}; this is Flax {_compat.FLAX_VERSION}')


def _run_all(runs, plain, tmp_path):
  """{name: traceback or None} of `runs` in one fresh interpreter, plain or patched."""
  _skip_other_releases()
  out = tmp_path / 'failed.json'
  env = {k: v for k, v in os.environ.items() if k != 'FLAX_TIEEXT_AUTOPATCH'}
  env.update(JAX_PLATFORMS='cpu', **({'FLAX_TIEEXT_AUTOPATCH': '0'} if plain else {}))
  job = json.dumps({'plain': plain, 'out': str(out), 'runs': runs})
  result = subprocess.run([sys.executable, '-c', _RUNNER], input=job, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=900, check=False)
  assert result.returncode == 0 and out.exists(), result.stderr[-3000:]
  return json.loads(out.read_text())


def _name(case):
  return ' '.join(case)


def _script_runs():
  return [(_name(case), [str(FOLDER / case[0]), *case[1:]], None) for case in CASES]


def _flip_blocks():
  """{'flip:<line>': source} of the FLIP's ``python`` blocks."""
  text = FLIP.read_text()
  return {f'flip:{text.count(chr(10), 0, m.start()) + 2}': m[1]
          for m in re.finditer(r'^```python\n(.*?)^```$', text, re.M | re.S)}


def test_every_reproducer_is_checked_and_named_in_the_flip():
  text = FLIP.read_text()
  scripts = {case[0] for case in CASES}
  assert scripts == {p.name for p in FOLDER.glob('*.py')}
  for case in CASES:
    assert f'`{_name(case)}`' in text, f'the FLIP does not name {_name(case)}'
  assert _flip_blocks(), 'the FLIP has python blocks'


def test_plain_flax_fails_as_the_flip_says(tmp_path):
  failed = _run_all(_script_runs(), True, tmp_path)
  wrong = []
  for case, error in CASES.items():
    got = failed[_name(case)]
    if error is None and got is not None:
      wrong.append(f'{_name(case)} fails on plain Flax:\n{got[-3000:]}')
    elif error is not None and got is None:
      wrong.append(f'{_name(case)} ran on plain Flax')
    elif error is not None and not re.search(f'^{error}', got, re.M):
      wrong.append(f'{_name(case)} does not end in {error!r}:\n{got[-3000:]}')
  assert not wrong, '\n\n'.join(wrong)


def test_with_the_plugin_the_scripts_and_the_flips_blocks_run(tmp_path):
  blocks = [(name, ['flip'], source) for name, source in _flip_blocks().items()]
  failed = _run_all(_script_runs() + blocks, False, tmp_path)
  wrong = [f'{name} fails with the plugin:\n{got[-3000:]}'
           for name, got in failed.items() if got is not None]
  assert not wrong, '\n\n'.join(wrong)
