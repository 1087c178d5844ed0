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

"""Programs run on Flax main and on main with ``patches/flax/`` applied: what differs.

``nox -s upstream`` (``tools/upstream_verify.py``) runs this file with
``UPSTREAM_FLAX_BEFORE`` and ``UPSTREAM_FLAX_AFTER`` set to two Flax source
trees, Flax main and Flax main with some of the PRs applied, and
``UPSTREAM_PATCHES`` to the numbers of those PRs (``0001,0002``). Each
program below runs in a fresh interpreter on each tree and prints one line
per case: how it ended (``ok`` and what it computed, or ``raises`` and the
error's type), which arguments the rematted method saw as Python values
rather than tracers, how many times the method ran (init and the gradient:
its traces), and the warnings the case raised. A warning is recorded, never turned into an error: a program that
runs on main with a warning (``nn.partitioning.remat`` dropping a keyword
argument) is a program that runs, and must run the same after.

Every line must be the same after, except a case that ``CHANGES`` lists for
an applied PR: a behaviour change that PR's message states, before and
after (``tests/test_patches.py`` checks that the message does). ``NEW``
cases are what a PR adds; they must hold once it is applied. Without the
two trees the tests are skipped.
"""

import hashlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

BEFORE = os.environ.get('UPSTREAM_FLAX_BEFORE')
AFTER = os.environ.get('UPSTREAM_FLAX_AFTER')
APPLIED = set(filter(None, os.environ.get('UPSTREAM_PATCHES', '').split(',')))

pytestmark = pytest.mark.skipif(
    not (BEFORE and AFTER), reason='needs UPSTREAM_FLAX_BEFORE/AFTER (nox -s upstream)')

PRELUDE = '''
import functools
import warnings
import jax, jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.core import init, lift
from flax.linen import partitioning

def static(*args):
  return ''.join('T' if isinstance(a, jax.core.Tracer) else 's' for a in args)

def case(name, run):
  """Prints how `run` ends, with the warnings it raised (recorded, not errors)."""
  SEEN.clear()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    try:
      line = ['ok', *run()]
    except Exception as e:  # the type is what a user sees first
      line = ['raises', type(e).__name__]
  warned = sorted({f'{w.category.__name__}({str(w.message)[:48]})' for w in caught})
  print(name, '|', *line, '|', *warned)

x = jnp.linspace(-1., 1., 8).reshape(2, 4)

SEEN = []  # what each rematted call saw, static or traced

class Probe(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=False, scale=2.):
    SEEN.append(static(x, deterministic, scale))
    y = nn.Dense(3)(x) * scale
    if not deterministic:  # a Python bool: a tracer here raises
      y = nn.relu(y)
    return y

def grad_sum(model, *args, **kwargs):
  variables = model.init(jax.random.key(0), *args, **kwargs)
  loss = lambda v: model.apply(v, *args, **kwargs).sum()
  value, grads = jax.value_and_grad(loss)(variables)
  return (round(float(value), 4), round(float(jax.tree.reduce(
      lambda a, b: a + jnp.abs(b).sum(), grads, 0.)), 4),
          SEEN[-1] if SEEN else '-', f'traced {len(SEEN)}x')
'''

CALLS = '''
calls = {'pos': ((x, True), {}), 'pos3': ((x, True, 3.), {}),
         'kw': ((x,), {'deterministic': True}), 'default': ((x,), {}),
         'kw_scale': ((x,), {'scale': 3.}), 'mixed': ((x, True), {'scale': 3.})}
'''

# Name -> program. Each prints "<case> | <how it ended> | <warnings>" lines.
PROGRAMS = {
    # MaxText's decoder: nn.scan over nn.remat with negative static_argnums.
    'maxtext_scan_over_remat': '''
class Block(nn.Module):
  @nn.compact
  def __call__(self, y, segment_ids, positions, deterministic, model_mode):
    SEEN.append(static(y, segment_ids, positions, deterministic, model_mode))
    if deterministic and model_mode == 'train':
      y = nn.Dense(4)(y) * segment_ids.mean() + positions.mean()
    return y, None

class Decoder(nn.Module):
  @nn.compact
  def __call__(self, y, *args):
    block = nn.remat(Block, static_argnums=(-1, -2, -3, -4, -5))
    y, _ = nn.scan(block, variable_axes={'params': 0},
                   split_rngs={'params': True},
                   in_axes=(nn.broadcast,) * 4, length=3)(name='layers')(y, *args)
    return y

case('maxtext', lambda: grad_sum(Decoder(), x, x, x, True, 'train'))
''',
    'nn_remat_static_argnums': CALLS + '''
forms = [2, (2,), (), (0,), (1,), (1, 2), (2, 3), (3,), (4,), (9,), (-1,), (-2,),
         (-3,), (-4,), (-5,), (-6,), (-2, -3), (-1, -4), (2, 2), [2], (True,)]
for form in forms:  # nn.remat is nn.checkpoint
  for call, (args, kwargs) in calls.items():
    case(f'{form} {call}',
         lambda: grad_sum(nn.remat(Probe, static_argnums=form)(), *args, **kwargs))
''',
    'nn_remat_methods_and_decorator': '''
class Decorated(nn.Module):
  @functools.partial(nn.remat, static_argnums=(2,))
  @nn.compact
  def __call__(self, x, deterministic):
    SEEN.append(static(x, deterministic))
    return nn.Dense(3)(x) if deterministic else x

class Two(nn.Module):
  def setup(self):
    self.dense = nn.Dense(3)
  def __call__(self, x, deterministic=False):
    SEEN.append(static(x, deterministic))
    return self.dense(x) if not deterministic else x
  def encode(self, x, deterministic=False):
    SEEN.append(static(x, deterministic))
    return self.dense(x) * 2. if not deterministic else x

for form in [(1,), (0,), (-1,), ()]:
  case(f'methods dict {form}', lambda: grad_sum(
      nn.remat(Probe, methods={'__call__': {'static_argnums': form}})(), x, True))
for methods in ([], (), ['__call__'], ['__call__', 'encode'], ['encode'], '__call__'):
  for form in ((), (2,)):
    remat = lambda: nn.remat(Two, static_argnums=form, methods=methods)()
    case(f'methods {methods!r} {form}', lambda: grad_sum(remat(), x, True))
    case(f'methods {methods!r} {form} encode',
         lambda: grad_sum(remat(), x, True, method='encode'))
class Narrow(Two):
  def encode(self, x):
    SEEN.append(static(x))
    return self.dense(x) * 2.

for form in ((), (2,)):  # methods of two signatures
  remat = lambda: nn.remat(Narrow, static_argnums=form, methods=['__call__', 'encode'])()
  case(f'two signatures {form}', lambda: grad_sum(remat(), x, False))
  case(f'two signatures {form} encode', lambda: grad_sum(remat(), x, method='encode'))

def wrap(fn):  # without functools.wraps
  def wrapper(*args, **kwargs):
    return fn(*args, **kwargs)
  return wrapper

class Wrapped(nn.Module):
  @nn.compact
  @wrap
  def __call__(self, x, deterministic):
    SEEN.append(static(x, deterministic))
    return nn.Dense(3)(x) if not deterministic else x

for form in ((2,), (1,), (3,), (-2,), (0,)):
  case(f'wrapper {form}', lambda: grad_sum(nn.remat(Wrapped, static_argnums=form)(), x, False))
case('decorator', lambda: grad_sum(Decorated(), x, True))
case('decorator kw', lambda: grad_sum(Decorated(), x, deterministic=True))

class Parent(nn.Module):
  @nn.compact
  def __call__(self, x):
    return (nn.remat(Probe)()(x) + nn.checkpoint(Probe, static_argnums=(2,))()(x, True)
            + partitioning.remat(Probe)()(x))
variables = Parent().init(jax.random.key(0), x)
case('names', lambda: [sorted(variables['params'])])
''',
    'partitioning_remat': CALLS + '''
forms = [(0,), (1,), (0, 1), (1, 2), (5,), (), (-1,), (-2,), (-3,), [1], 1]
for form in forms:
  for call, (args, kwargs) in calls.items():
    case(f'{form} {call}', lambda: grad_sum(
        partitioning.remat(Probe, static_argnums=form)(), *args, **kwargs))
''',
    'lift_checkpoint': '''
def f(scope, x, deterministic=False, scale=2.):
  SEEN.append(static(x, deterministic, scale))
  w = scope.param('w', lambda k: jnp.ones((4, 3)))
  y = x @ w * scale
  return jax.nn.relu(y) if not deterministic else y

forms = [1, (0,), (1,), (0, 1), (3,), (-1,), (-2,), (-3,), (-4,), (-5,), (-6,),
         (-7,), (), [1], (True,)]
calls = {'pos': ((x, True), {}), 'default': ((x,), {}),
         'kw': ((x,), {'deterministic': True}), 'pos3': ((x, True, 3.), {})}
for form in forms:
  for call, (args, kwargs) in calls.items():
    def run():
      fn = lift.checkpoint(f, static_argnums=form)
      y, variables = init(fn)(jax.random.key(0), *args, **kwargs)
      return round(float(y.sum()), 4), SEEN[-1]
    case(f'{form} {call}', run)
''',
    # jax.checking_leaks() raises on the leak that PR 0001 fixes.
    'checking_leaks': '''
for remat, index in ((nn.remat, 2), (partitioning.remat, 1)):
  def run():
    model = remat(Probe, static_argnums=(index,))()
    variables = model.init(jax.random.key(0), x, True)
    with jax.checking_leaks():
      y = jax.jit(lambda v, x: model.apply(v, x, True))(variables, x)
    return round(float(y.sum()), 4), SEEN[-1]
  case(f'{remat.__name__} jit', run)
''',
}

# The behaviour changes each PR states in its message, for cases of
# PROGRAMS: (PR, program, case pattern, how the case ends on main, how it
# may end after, what the PR's message says about it). Only cases that fail
# on main are listed: a case that runs on main must run the same.
# (TracerBoolConversionError: the call runs into the Probe's flag, traced.)
RUNS = r'^(ok|raises TracerBoolConversionError)'
# As the same indices in a tuple: runs, or a ValueError for an index out of
# range for the call.
AS_TUPLE = r'^(ok|raises (TracerBoolConversionError|ValueError))'
CHANGES = [
    ('0001', 'checking_leaks', r'^checkpoint jit', r'^raises ', r'^ok \S+ Tss',
     'jax.checking_leaks() reports a leaked'),
    ('0001', 'lift_checkpoint', r'^\[', r'^raises TypeError', AS_TUPLE,
     'static_argnums a list, or holding NumPy integers'),
    ('0001', 'nn_remat_static_argnums', r'^\[', r'^raises TypeError', AS_TUPLE,
     'static_argnums a list, or holding NumPy integers'),
    # jax.checkpoint's ValueError: a static position passed by keyword or
    # left to its default.
    ('0002', 'nn_remat_static_argnums', r'', r'^raises ValueError', RUNS,
     'leaving train to its default'),
    ('0002', 'nn_remat_static_argnums', r'^\[', r'^raises TypeError', RUNS,
     'static_argnums=[2]) (a list)'),
    ('0002', 'nn_remat_methods_and_decorator', r'^decorator kw', r'^raises ValueError',
     RUNS, 'leaving train to its default'),
]

# Name -> (PR, program, what each of its lines must match after that PR).
NEW = {
    'static_argnames': ('0002', CALLS + '''
names = (lambda: 'deterministic', lambda: ['deterministic'],
         lambda: (n for n in ['deterministic']))
for name in names:
  for call, (args, kwargs) in calls.items():
    if 'deterministic' in kwargs or len(args) > 1 or call == 'default':
      case(call, lambda: grad_sum(
          nn.remat(Probe, static_argnames=name())(), *args, **kwargs))
''', r'ok \S+ \S+ Ts[sT] '),
    'static_names_are_checked': ('0002', '''
for kwargs in ({'static_argnames': 'determinstic'}, {'static_argnames': 'self'},
               {'static_argnames': 'x', 'methods': {'__call__': {}}}):
  case(str(kwargs), lambda: [nn.remat(Probe, **kwargs)])
for form in ((4,), [4], np.int64(4)):  # at the call, as jax.checkpoint did
  case(repr(form), lambda: grad_sum(nn.remat(Probe, static_argnums=form)(), x, True))
''', r'raises ValueError'),
    'var_positional': ('0002', '''
class Varargs(nn.Module):
  @nn.compact
  def __call__(self, *args):
    SEEN.append(static(*args))
    return nn.Dense(3)(args[0]) * (2. if args[1] else 1.)

case('varargs', lambda: grad_sum(nn.remat(Varargs, static_argnums=(2,))(), x, True))
''', r'ok \S+ \S+ Ts '),
    'numpy_and_list_indices': ('0001', '''
for form in (np.int64(1), (np.int64(1),), [1], np.array([1])):
  def run():
    def f(scope, x, deterministic):
      SEEN.append(static(x, deterministic))
      return x * 2. if deterministic else x
    y, _ = init(lift.checkpoint(f, static_argnums=form))(jax.random.key(0), x, True)
    return round(float(y.sum()), 4), SEEN[-1]
  case(repr(form), run)
''', r'ok \S+ Ts '),
    'methods_of_two_signatures': ('0002', '''
class Two(nn.Module):
  def setup(self):
    self.dense = nn.Dense(3)
  def __call__(self, x, deterministic=False):
    SEEN.append(static(x, deterministic))
    return self.dense(x) if not deterministic else x
  def encode(self, x):
    SEEN.append(static(x))
    return self.dense(x) * 2.

for static_args in ({'static_argnums': (2,)}, {'static_argnames': 'deterministic'}):
  remat = lambda: nn.remat(Two, methods=['__call__', 'encode'], **static_args)()
  case(f'{static_args} pos', lambda: grad_sum(remat(), x, True))
  case(f'{static_args} kw', lambda: grad_sum(remat(), x, deterministic=True))
case('encode', lambda: grad_sum(remat(), x, method='encode'))
''', r'ok \S+ \S+ Ts? '),
    'no_leak_under_jit': ('0001', '''
def run():
  model = nn.remat(Probe, static_argnums=(2,))()
  variables = model.init(jax.random.key(0), x, True)
  with jax.checking_leaks():
    y = jax.jit(lambda v, x: model.apply(v, x, True))(variables, x)
  return round(float(y.sum()), 4), SEEN[-1]
case('jit', run)
''', r'ok \S+ Tss '),
}


def run_lines(tree: str, program: str) -> list[str]:
  """The lines ``program`` prints on the Flax of ``tree``.

  Main's lines are kept in ``$UPSTREAM_COMPAT_CACHE`` where it is set: one
  ``nox -s upstream`` compares several trees with the same main.
  """
  cache = os.environ.get('UPSTREAM_COMPAT_CACHE') if tree == BEFORE else None
  key = hashlib.sha256((PRELUDE + program).encode()).hexdigest()[:24]
  kept = pathlib.Path(cache, f'{key}.txt') if cache else None
  if kept and kept.exists():
    return kept.read_text().splitlines()
  out = subprocess.run(
      [sys.executable, '-c', PRELUDE + program], capture_output=True, text=True,
      env={**os.environ, 'PYTHONPATH': tree, 'JAX_PLATFORMS': 'cpu'},
      timeout=900, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  if kept:
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(out.stdout)
  return out.stdout.splitlines()


def changed(name: str, before: str, after: str, applied=frozenset(APPLIED)) -> str | None:
  """The stated change of an applied PR that turns ``before`` into ``after``, or None."""
  case, ended_before = before.split(' | ')[:2]
  ended_after = after.split(' | ')[1]
  for pr, program, pattern, was, becomes, stated in CHANGES:
    if (pr in applied and program == name and re.search(pattern, case)
        and re.search(was, ended_before) and re.search(becomes, ended_after)):
      return stated
  return None


@pytest.mark.parametrize('name', sorted(PROGRAMS))
def test_runs_as_before(name):
  before = run_lines(BEFORE, PROGRAMS[name])
  after = run_lines(AFTER, PROGRAMS[name])
  assert [b.split(' | ')[0] for b in before] == [a.split(' | ')[0] for a in after]
  differ = [(b, a) for b, a in zip(before, after)
            if a != b and changed(name, b, a) is None]
  assert not differ, '\n'.join(f'before: {b}\nafter:  {a}' for b, a in differ)


@pytest.mark.parametrize('name', sorted(NEW))
def test_new_behaviour(name):
  pr, program, expected = NEW[name]
  if pr not in APPLIED:
    pytest.skip(f'PR {pr} is not applied')
  lines = run_lines(AFTER, program)
  wrong = [line for line in lines if not re.search(expected, line.split(' | ', 1)[1])]
  assert lines and not wrong, '\n'.join(wrong)
