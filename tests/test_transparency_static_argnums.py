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

"""Every ``static_argnums`` plain Flax takes means under the patch what it means on plain Flax.

Each case builds a remat with a ``static_argnums`` of a kind a user may pass
(NumPy integers, bools, ranges, sets, arrays, lists, negative and
out-of-range values, the index of ``self``) on every entry point
(``nn.remat``, ``nn.partitioning.remat``, ``lift.checkpoint``, ``nnx.remat``
in graph and tree mode), then calls it. The cases run in fresh interpreters:
plain (``flax_tieext`` never imported), patched, patched after
``flax_tieext.uninstall()``, and imported late (after the transforms were
built). Each must report what plain Flax reports: the result, or the type
of the error; the trace count of an NNX remat called with the same
unhashable static value; and, for memory, no more Scopes and arrays alive
after failed calls and eager steps than plain Flax keeps. A case that needs
what a release lacks (``nnx.remat``, its tree mode) is skipped there, the
reason naming the release.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from flax_tieext import _compat

pytestmark = [pytest.mark.own_patch_mode, pytest.mark.end_to_end]

PRELUDE = '''
import gc, json, sys
import jax, jax.numpy as jnp, numpy as np, flax, flax.linen as nn
from flax.core import lift
from flax.core.scope import Scope
import flax.linen.partitioning
mode = sys.argv[1]
if mode in ('patched', 'uninstalled'):
  import flax_tieext
  if mode == 'uninstalled':
    flax_tieext.uninstall()
key, x = jax.random.key(0), jnp.ones((2, 3))

class One(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)

class M(nn.Module):
  @nn.compact
  def __call__(self, x, flag):
    y = nn.Dense(2)(x)
    return y if flag else -y

def fn(scope, x, flag):
  w = scope.param('w', lambda k: jnp.ones((3, 2)))
  return x @ w if flag else -(x @ w)

def summary(value):
  return jax.tree_util.tree_map(lambda a: round(float(jnp.sum(a)), 4), value)

def alive():
  gc.collect()
  return [sum(isinstance(o, Scope) for o in gc.get_objects()),
          len(jax.live_arrays())]

'''

# name -> (build, use): `build` makes `r`, `use` calls it and sets `out`.
# Each runs in a try block; an exception reports its type.
CASES = {
    # A failed call keeps nothing alive (plain: nothing).
    'failed_calls_kept_alive': (
        'r = nn.remat(One, static_argnums=(2,)); before = alive()',
        'for _ in range(3):\n'
        '  try: r().init(key, x)\n'
        '  except ValueError: pass\n'
        'out = {"memory": [a - b for a, b in zip(alive(), before)]}'),
    # JAX's static_argnums cache keeps each eager step's arrays on plain Flax.
    'eager_steps_kept_alive': (
        'r = nn.remat(M, static_argnums=(2,))\n'
        'v = r().init(key, x, True); before = alive()',
        'for _ in range(5):\n'
        '  v = jax.tree_util.tree_map(lambda a: a * 0.5,'
        ' jax.grad(lambda v: r().apply(v, x, True).sum())(v))\n'
        'out = {"memory": [a - b for a, b in zip(alive(), before)]}'),
    'partitioning_index_past_the_arguments': (
        'r = nn.partitioning.remat(One, static_argnums=(1,))',
        'out = summary(r().init(key, x))'),
    # The index of `x` (nn.partitioning.remat does not count `self`), given
    # as NumPy: plain Flax closes over `x`.
    'partitioning_numpy_array_of_x': (
        'r = nn.partitioning.remat(One, static_argnums=np.array([0]))',
        'out = summary(r().init(key, x))'),
    'partitioning_numpy_int_of_x_in_tuple': (
        'r = nn.partitioning.remat(One, static_argnums=(np.int64(0),))',
        'out = summary(r().init(key, x))'),
    'partitioning_numpy_array': (
        'r = nn.partitioning.remat(M, static_argnums=np.array([1]))',
        'out = summary(r().init(key, x, True))'),
    'partitioning_numpy_int_in_tuple': (
        'r = nn.partitioning.remat(M, static_argnums=(np.int64(1),))',
        'out = summary(r().init(key, x, True))'),
    'partitioning_numpy_int': (
        'r = nn.partitioning.remat(M, static_argnums=np.int64(1))',
        'out = summary(r().init(key, x, True))'),
    'partitioning_negative': (
        'r = nn.partitioning.remat(M, static_argnums=-3)',
        'out = summary(r().init(key, x, True))'),
    'partitioning_negative_in_tuple': (
        'r = nn.partitioning.remat(M, static_argnums=(-1,))',
        'out = summary(r().init(key, x, True))'),
    'partitioning_range': (
        'r = nn.partitioning.remat(M, static_argnums=range(1, 2))',
        'out = summary(r().init(key, x, True))'),
    'partitioning_set': (
        'r = nn.partitioning.remat(M, static_argnums={1})',
        'out = summary(r().init(key, x, True))'),
    'partitioning_str': (
        'r = nn.partitioning.remat(M, static_argnums="flag")',
        'out = summary(r().init(key, x, True))'),
    'remat_numpy_int': (
        'r = nn.remat(M, static_argnums=np.int64(2))',
        'out = summary(r().init(key, x, True))'),
    'remat_negative_last': (
        'r = nn.remat(M, static_argnums=-2)',
        'out = summary(r().init(key, x, True))'),
    'remat_negative_one': (
        'r = nn.remat(M, static_argnums=-1)',
        'out = summary(r().init(key, x, True))'),
    'remat_negative_out_of_range': (
        'r = nn.remat(M, static_argnums=-9)',
        'out = summary(r().init(key, x, True))'),
    'remat_bool': (
        'r = nn.remat(M, static_argnums=True)',
        'out = summary(r().init(key, x, True))'),
    'remat_range': (
        'r = nn.remat(M, static_argnums=range(2, 3))',
        'out = summary(r().init(key, x, True))'),
    'remat_set': (
        'r = nn.remat(M, static_argnums={2})',
        'out = summary(r().init(key, x, True))'),
    'remat_list': (
        'r = nn.remat(M, static_argnums=[2])',
        'out = summary(r().init(key, x, True))'),
    'remat_array': (
        'r = nn.remat(M, static_argnums=np.array([2]))',
        'out = summary(r().init(key, x, True))'),
    'remat_none': (
        'r = nn.remat(M, static_argnums=None)',
        'out = summary(r().init(key, x, True))'),
    'remat_index_of_self': (
        'r = nn.remat(M, static_argnums=(0,))',
        'out = summary(r().init(key, x, True))'),
    'remat_out_of_range': (
        'r = nn.remat(M, static_argnums=(5,))',
        'out = summary(r().init(key, x, True))'),
    'lift_numpy_int': (
        'r = lift.checkpoint(fn, static_argnums=np.int64(1))',
        'out = summary(flax.core.init(r)(key, x, True))'),
    'lift_negative_last': (
        'r = lift.checkpoint(fn, static_argnums=-3)',
        'out = summary(flax.core.init(r)(key, x, True))'),
    'lift_negative_one': (
        'r = lift.checkpoint(fn, static_argnums=-1)',
        'out = summary(flax.core.init(r)(key, x, True))'),
    'lift_bool': (
        'r = lift.checkpoint(fn, static_argnums=False)',
        'out = summary(flax.core.init(r)(key, x, True))'),
    'nnx_numpy_int': (
        'r = nnx.remat(lambda x, flag: x if flag else -x,'
        ' static_argnums=np.int64(1))',
        'out = summary(r(x, True))'),
    'nnx_negative': (
        'r = nnx.remat(lambda x, flag: x if flag else -x, static_argnums=-1)',
        'out = summary(r(x, True))'),
    'nnx_negative_out_of_range': (
        'r = nnx.remat(lambda x, flag: x if flag else -x, static_argnums=-3)',
        'out = summary(r(x, True))'),
    'nnx_numpy_int_tree_mode': (
        'r = nnx.remat(lambda x, flag: x if flag else -x,'
        ' static_argnums=np.int64(1), graph=False)',
        'out = summary(r(x, True))'),
    'nnx_bool': (
        'r = nnx.remat(lambda m, x: m(x), static_argnums=True)',
        'out = summary(r(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), x))'),
    # Plain Flax refuses it (JAX's TypeError); it once made `x` static.
    'nnx_bool_tree_mode': (
        'r = nnx.remat(lambda m, x: m(x), static_argnums=True, graph=False)',
        'out = summary(r(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), x))'),
    # The same unhashable static value at each call: traced once.
    'nnx_unhashable_static_value': (
        'traces = []\n'
        'r = nnx.remat(lambda x, w: traces.append(1) or x * w.sum(),'
        ' static_argnums=(1,))\n'
        'w = np.ones(3)',
        'for _ in range(4): r(x, w)\n'
        'out = {"traces": len(traces)}'),
    'nnx_hashable_static_value': (
        'traces = []\n'
        'r = nnx.remat(lambda x, w: traces.append(1) or x * w, static_argnums=(1,))',
        'for _ in range(4): r(x, 3.0)\n'
        'out = {"traces": len(traces)}'),
    'nnx_unhashable_static_list_tree_mode': (
        'traces = []\n'
        'r = nnx.remat(lambda x, w: traces.append(1) or x * sum(w),'
        ' static_argnums=(1,), graph=False)\n'
        'w = [1.0, 2.0]',
        'for _ in range(4): r(x, w)\n'
        'out = {"traces": len(traces)}'),
    'nnx_unhashable_static_dict_tree_mode': (
        'traces = []\n'
        'r = nnx.remat(lambda x, w: traces.append(1) or x * w["a"],'
        ' static_argnums=(1,), graph=False)\n'
        'w = {"a": 2.0}',
        'for _ in range(4): r(x, w)\n'
        'out = {"traces": len(traces)}'),

    # A static container changed in place between calls (issue 47): graph
    # mode makes every container anew at each call, so plain Flax traces
    # again and reads the new contents; tree mode and a NumPy array are
    # keyed by identity, as jax.checkpoint keys them, and keep the first
    # trace. The patch does each as plain Flax does.
    **{f'nnx_mutated_static_{kind}{mode}': (
        'traces = []\n'
        f'r = nnx.remat(lambda x, w: traces.append(1) or x * {read},'
        f' static_argnums=(1,){flags})\n'
        f'w = {value}',
        'a = r(x, w)\n'
        f'{change}\n'
        'b = r(x, w); c = r(x, w)\n'
        'out = {"traces": len(traces), "out": summary([a, b, c])}')
       for kind, value, read, change in (
           ('list', '[1.0, 2.0]', 'w[0]', 'w[0] = 100.0'),
           ('dict', '{"a": 1.0}', 'w["a"]', 'w["a"] = 100.0'),
           ('nested', '([1.0], 2.0)', 'w[0][0]', 'w[0][0] = 100.0'),
           ('array', 'np.ones(2)', 'float(w[0])', 'w[0] = 100.0'))
       for mode, flags in (('', ''),
                           ('_no_graph_updates', ', graph_updates=False'),
                           ('_tree_mode', ', graph=False'))},
    # The same on the Linen entry points, which trace at every call on
    # plain Flax (each call makes its remat anew) and close over static
    # values under the patch.
    **{f'{entry}_mutated_static_list': (
        'traces = []\n'
        'class MW(nn.Module):\n'
        '  @nn.compact\n'
        '  def __call__(self, x, w):\n'
        '    traces.append(1)\n'
        '    return nn.Dense(2)(x) * w[0]\n'
        f'r = {make}\n'
        'w = [1.0]\n'
        'v = r().init(key, x, w); traces.clear()',
        'a = r().apply(v, x, w)\n'
        'w[0] = 100.0\n'
        'b = r().apply(v, x, w)\n'
        'out = {"traces": len(traces), "out": summary([a, b])}')
       for entry, make in (
           ('remat', 'nn.remat(MW, static_argnums=(2,))'),
           ('partitioning', 'nn.partitioning.remat(MW, static_argnums=(1,))'),
           ('checkpoint_negative', 'nn.checkpoint(MW, static_argnums=-1)'))},
    'lift_mutated_static_list': (
        'traces = []\n'
        'def fw(scope, x, w):\n'
        '  traces.append(1)\n'
        '  return x @ scope.param("w", lambda k: jnp.ones((3, 2))) * w[0]\n'
        'r = lift.checkpoint(fw, static_argnums=-1)\n'
        'w = [1.0]\n'
        'v = flax.core.init(r)(key, x, w)[1]; traces.clear()',
        'a = flax.core.apply(r)(v, x, w)\n'
        'w[0] = 100.0\n'
        'b = flax.core.apply(r)(v, x, w)\n'
        'out = {"traces": len(traces), "out": summary([a, b])}'),
}

MODES = ('plain', 'patched', 'uninstalled', 'late')


def absent(nnx: bool, tree_mode: bool) -> str | None:
  """Why this Flax cannot run a program that needs ``nnx.remat`` (its modes).

  None if it can; else the reason, naming the release. A case named
  ``nnx_*`` needs ``nnx.remat``, one named ``*_tree_mode`` or
  ``*_no_graph_updates`` its ``graph=`` / ``graph_updates=`` modes.
  """
  if nnx and _compat.NNX_REMAT is None:
    return (f'Flax {_compat.FLAX_VERSION} has no nnx.remat (or flax.nnx does'
            ' not import with this JAX)')
  if tree_mode and not _compat.NNX_REMAT_MODES:
    return (f'Flax {_compat.FLAX_VERSION}: nnx.remat has no tree mode'
            ' (graph=False) or graph_updates=')
  return None


def _absent(case: str) -> str | None:
  return absent(case.startswith('nnx_'),
                case.endswith(('_tree_mode', '_no_graph_updates')))


PRESENT = [case for case in CASES if _absent(case) is None]


def _program():
  """One interpreter's program: builds every case this Flax has, then uses each."""
  nnx = any(case.startswith('nnx_') for case in PRESENT)
  lines = [PRELUDE, 'from flax import nnx' if nnx else '', 'built, reports = {}, {}']
  for name in PRESENT:
    build, _ = CASES[name]
    lines += [
        'try:', textwrap.indent(build, '  '),
        f'  built[{name!r}] = dict(locals())',
        'except Exception as e:',
        f'  reports[{name!r}] = type(e).__name__',
    ]
  lines += ["if mode == 'late':", '  import flax_tieext']
  for name in PRESENT:
    _, use = CASES[name]
    lines += [
        f'if {name!r} not in reports:',
        f'  globals().update(built[{name!r}])',
        '  try:', textwrap.indent(use, '    '),
        f'    reports[{name!r}] = out',
        '  except Exception as e:',
        f'    reports[{name!r}] = type(e).__name__',
    ]
  lines.append("print('REPORT ' + json.dumps(reports))")
  return '\n'.join(lines)


@pytest.fixture(scope='module')
def reports():
  source = _program()
  env = dict(os.environ, JAX_PLATFORMS='cpu', FLAX_TIEEXT_AUTOPATCH='1')
  found = {}
  for mode in MODES:
    done = subprocess.run([sys.executable, '-c', source, mode],
                          capture_output=True, text=True, env=env,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith('REPORT '))
    found[mode] = json.loads(line[len('REPORT '):])
  return found


@pytest.mark.parametrize('mode', MODES[1:])
@pytest.mark.parametrize('case', list(CASES))
def test_static_argnums_as_on_plain_flax(reports, case, mode):
  if _absent(case):
    pytest.skip(_absent(case))
  plain, other = reports['plain'][case], reports[mode][case]
  if isinstance(plain, dict) and 'memory' in plain:
    # The patch may keep less alive (it closes over static values where
    # JAX's cache keeps them), never more.
    assert isinstance(other, dict), other
    assert all(o <= p for o, p in zip(other['memory'], plain['memory'])), (
        f'{mode} keeps {other["memory"]} (Scopes, arrays) alive, plain'
        f' Flax {plain["memory"]}')
  else:
    assert other == plain


def test_the_cases_cover_results_and_errors(reports):
  # Plain Flax both runs and refuses among these: the comparison is not
  # between two columns of the same error.
  outcomes = list(reports['plain'].values())
  assert any(isinstance(o, str) and o.endswith('Error') for o in outcomes)
  assert sum(not isinstance(o, str) for o in outcomes) >= 10
