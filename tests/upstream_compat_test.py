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

"""Programs that run on Flax main run the same with ``patches/flax/`` applied.

``nox -s upstream`` (``tools/upstream_verify.py``) runs this file with
``UPSTREAM_FLAX_BEFORE`` and ``UPSTREAM_FLAX_AFTER`` set to two Flax source
trees: Flax main, and Flax main with the PR applied. Each program below runs
in a fresh interpreter on each tree and prints one line per case: which
arguments the rematted function saw as Python values (static) rather than
tracers, and the output and gradient, or the error's type. Every case that
runs before must print the same line after. ``NEW`` cases are what the PR
adds; they must hold after. Without the two variables the tests are skipped.
"""

import os
import subprocess
import sys

import pytest

BEFORE = os.environ.get('UPSTREAM_FLAX_BEFORE')
AFTER = os.environ.get('UPSTREAM_FLAX_AFTER')

pytestmark = pytest.mark.skipif(
    not (BEFORE and AFTER), reason='needs UPSTREAM_FLAX_BEFORE/AFTER (nox -s upstream)')

PRELUDE = '''
import functools
import warnings
import jax, jax.numpy as jnp
from flax import linen as nn
from flax.core import init, lift
from flax.linen import partitioning

def static(*args):
  return ''.join('T' if isinstance(a, jax.core.Tracer) else 's' for a in args)

def case(name, run):
  SEEN.clear()
  try:
    with warnings.catch_warnings():  # as Flax's tests run: warnings are errors
      warnings.simplefilter('error')
      print(name, *run())
  except Exception as e:  # the type is what a user sees first
    print(name, 'raises', type(e).__name__)

x = jnp.linspace(-1., 1., 8).reshape(2, 4)

SEEN = []  # what each rematted call saw, static or traced

class Probe(nn.Module):
  @nn.compact
  def __call__(self, x, train=False, scale=2.):
    SEEN.append(static(x, train, scale))
    y = nn.Dense(3)(x) * scale
    return nn.relu(y) if train is True else y

def grad_sum(model, *args, **kwargs):
  variables = model.init(jax.random.key(0), *args, **kwargs)
  loss = lambda v: model.apply(v, *args, **kwargs).sum()
  value, grads = jax.value_and_grad(loss)(variables)
  return round(float(value), 4), round(float(jax.tree.reduce(
      lambda a, b: a + jnp.abs(b).sum(), grads, 0.)), 4)
'''

# Name -> program. Each prints "<case> <what it saw> <results>" lines.
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

case('maxtext', lambda: (*grad_sum(Decoder(), x, x, x, True, 'train'), SEEN[-1]))
''',
    'nn_remat_static_argnums': '''
forms = [2, (2,), (), (0,), (1,), (1, 2), (2, 3), (-1,), (-2,), (-3,), (-4,),
         (-5,), (-2, -3), [2]]
calls = {'pos': ((x, True), {}), 'pos3': ((x, True, 3.), {}),
         'kw': ((x,), {'train': True}), 'default': ((x,), {}),
         'mixed': ((x, True), {'scale': 3.})}
for form in forms:
  for call, (args, kwargs) in calls.items():
    model = nn.remat(Probe, static_argnums=form)()
    case(f'{form} {call}', lambda: (*grad_sum(model, *args, **kwargs), SEEN[-1]))
''',
    'nn_remat_decorator_and_methods': '''
class Decorated(nn.Module):
  @functools.partial(nn.remat, static_argnums=(2,))
  @nn.compact
  def __call__(self, x, train):
    SEEN.append(static(x, train))
    return nn.Dense(3)(x) if train else x

for form in [(1,), (0,), (-1,), ()]:
  model = nn.remat(Probe, methods={'__call__': {'static_argnums': form}})()
  case(f'methods {form}', lambda: (*grad_sum(model, x, True), SEEN[-1]))
case('decorator', lambda: (*grad_sum(Decorated(), x, True), SEEN[-1]))

class Parent(nn.Module):
  @nn.compact
  def __call__(self, x):
    return (nn.remat(Probe)()(x) + nn.checkpoint(Probe)()(x)
            + partitioning.remat(Probe)()(x))
variables = Parent().init(jax.random.key(0), x)
case('names', lambda: sorted(variables['params']))
''',
    'partitioning_remat_static_argnums': '''
forms = [(0,), (1,), (0, 1), (1, 2), (5,), (), (-1,), (-2,), (-3,), [1]]
calls = {'pos': ((x, True), {}), 'default': ((x,), {}),
         'pos3': ((x, True, 3.), {}), 'kw': ((x,), {'train': True})}
for form in forms:
  for call, (args, kwargs) in calls.items():
    model = partitioning.remat(Probe, static_argnums=form)()
    case(f'{form} {call}', lambda: (*grad_sum(model, *args, **kwargs), SEEN[-1]))
''',
    'lift_checkpoint_static_argnums': '''
def f(scope, x, train=False, scale=2.):
  SEEN.append(static(x, train, scale))
  w = scope.param('w', lambda k: jnp.ones((4, 3)))
  y = x @ w * scale
  return jax.nn.relu(y) if train is True else y

forms = [1, (0,), (1,), (0, 1), (-1,), (-2,), (-3,), (-4,), (-5,), (-6,), ()]
calls = {'pos': ((x, True), {}), 'default': ((x,), {}),
         'kw': ((x,), {'train': True}), 'pos3': ((x, True, 3.), {})}
for form in forms:
  for call, (args, kwargs) in calls.items():
    def run():
      fn = lift.checkpoint(f, static_argnums=form)
      y, variables = init(fn)(jax.random.key(0), *args, **kwargs)
      return round(float(y.sum()), 4), SEEN[-1]
    case(f'{form} {call}', run)
''',
}

# Name -> (program, what each of its lines must end with after the PR).
NEW = {
    'keyword_static_position': ('''
for remat, index in ((nn.remat, 2), (nn.checkpoint, 2), (partitioning.remat, 1)):
  model = remat(Probe, static_argnums=(index,))()
  case(remat.__name__, lambda: (*grad_sum(model, x, train=True), SEEN[-1]))
''', 'Tss'),
    'static_argnames': ('''
names = (lambda: 'train', lambda: ['train'], lambda: (n for n in ['train']))
for remat in (nn.remat, partitioning.remat):
  for name in names:
    for args, kwargs in (((x, True), {}), ((x,), {'train': True})):
      model = remat(Probe, static_argnames=name())()
      case(remat.__name__, lambda: (*grad_sum(model, *args, **kwargs), SEEN[-1]))
''', 'Tss'),
    'var_positional': ('''
class Varargs(nn.Module):
  @nn.compact
  def __call__(self, *args):
    SEEN.append(static(*args))
    return nn.Dense(3)(args[0]) * (2. if args[1] else 1.)

for remat, index in ((nn.remat, 2), (partitioning.remat, 1)):
  model = remat(Varargs, static_argnums=(index,))()
  case(remat.__name__, lambda: (*grad_sum(model, x, True), SEEN[-1]))
''', 'Ts'),
    'jit_checking_leaks': ('''
model = nn.remat(Probe, static_argnums=(2,))()
variables = model.init(jax.random.key(0), x, True)
def run():
  with jax.checking_leaks():
    y = jax.jit(lambda v, x: model.apply(v, x, True))(variables, x)
  return round(float(y.sum()), 4), SEEN[-1]
case('jit', run)
''', 'Tss'),
}


def run_lines(tree: str, program: str) -> list[str]:
  """The lines ``program`` prints on the Flax of ``tree``."""
  out = subprocess.run(
      [sys.executable, '-c', PRELUDE + program], capture_output=True, text=True,
      env={**os.environ, 'PYTHONPATH': tree, 'JAX_PLATFORMS': 'cpu'},
      timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout.splitlines()


@pytest.mark.parametrize('name', sorted(PROGRAMS))
def test_runs_as_before(name):
  before = run_lines(BEFORE, PROGRAMS[name])
  after = run_lines(AFTER, PROGRAMS[name])
  assert len(before) == len(after)
  changed = [(b, a) for b, a in zip(before, after)
             if ' raises ' not in b and a != b]
  assert not changed, '\n'.join(f'before: {b}\nafter:  {a}' for b, a in changed)


@pytest.mark.parametrize('name', sorted(NEW))
def test_new_behaviour(name):
  program, expected = NEW[name]
  lines = run_lines(AFTER, program)
  assert lines and all(line.endswith(' ' + expected) for line in lines), lines
