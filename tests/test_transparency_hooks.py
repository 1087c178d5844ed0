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

"""The hooks bound at install leave plain programs alone (issue 56).

``lift.pack``, ``lift._partial_pack``, ``Scope.rewound``, ``lift.scan``,
``flax.core.init`` and ``nnx.scan`` run under every program once the plugin
is imported. Plain Flax against patched, in fresh interpreters: what they
keep alive (live ``Scope`` objects and arrays, with the cycle collector
disabled and after ``gc.collect()``), the signatures and identities of each
hooked callable and of what it returns, and the errors of plain programs
given NumPy, scalar, tracer and cyclic arguments through ``flax.core``,
Linen and NNX. One interpreter per mode runs every check (:data:`PROBE`);
the interpreters and the heavier grid of nested transforms are ``end_to_end``
(the README's test command keeps the in-process checks).
"""

import contextvars
import gc
import inspect

import flax
import jax
import jax.numpy as jnp
import pytest

from flax.core import init, lift
from flax.core import scope as core_scope

from flax_tieext.core import tie_lift
from flax_tieext.core import ties
from test_transparency import run_python  # pylint: disable=g-bad-import-order


PROBE = r'''
import gc, json, re, sys, inspect, warnings, functools
import numpy as np
import jax, jax.numpy as jnp
import flax, flax.core
from flax.core import lift, scope as core_scope, init, apply
from flax.core import nn as core_nn
import flax.linen as nn
try:
  from flax import nnx
except ImportError:  # Flax 0.10.7 with its pinned JAX 0.8.1
  nnx = None
out = {'nnx': nnx is not None}

def clean(s):
  return re.sub(r'0x[0-9a-f]+', '0x', str(s)).splitlines()[0][:300] if str(s) else ''

def outcome(f):
  try:
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter('always')
      r = f()
    return ['ok', sorted(clean(x.message) for x in w)]
  except BaseException as e:
    return [type(e).__name__, clean(e)]

def live():
  return (sum(isinstance(o, core_scope.Scope) for o in gc.get_objects()),
          len(jax.live_arrays()))

X = jnp.ones((2, 3))
def dense(scope, x):
  return x @ scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 3))

def mv(scope, x):
  f = lift.map_variables(dense, 'params', lambda t: t, lambda t: t, init=True)
  return f(scope.push('a'), x)

PROGRAMS = {
  'map_variables': mv,
  'vmap': lambda s, x: lift.vmap(dense, variable_axes={'params': 0}, split_rngs={'params': True})(s.push('a'), x[None]),
  'scan': lambda s, x: lift.scan(lambda sc, c, y: (c, dense(sc, y)), variable_broadcast='params', split_rngs={'params': False})(s.push('a'), (), x[None]),
  'jit': lambda s, x: lift.jit(lambda sc, k, x: dense(sc, x))(s.push('a'), 0, x),
  'checkpoint': lambda s, x: lift.checkpoint(dense)(s.push('a'), x),
  'cond': lambda s, x: lift.cond(True, dense, dense, s.push('a'), x),
}
for gcmode in ('nogc', 'collect'):
  for name, prog in PROGRAMS.items():
    gc.collect(); gc.disable()
    base = live()
    counts = []
    for _ in range(3):
      y, v = init(prog)(jax.random.key(0), X); del y, v
      if gcmode == 'collect': gc.collect()
      now = live(); counts.append((now[0] - base[0], now[1] - base[1]))
    gc.enable()
    out[f'mem/{gcmode}/core/{name}'] = counts

class Dense3(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x)
class Body(nn.Module):
  @nn.compact
  def __call__(self, c, x):
    return nn.Dense(3)(c), None
LINEN = {
  'map_variables': lambda: nn.map_variables(Dense3, 'params', init=True)(),
  'jit': lambda: nn.jit(Dense3)(),
  'remat': lambda: nn.remat(Dense3)(),
}
class ScanM(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.scan(Body, variable_axes={'params': 0}, split_rngs={'params': True}, length=2)()(x, None)[0]
LINEN['jit_scan'] = lambda: nn.jit(ScanM)()
for gcmode in ('nogc', 'collect'):
  for name, mk in LINEN.items():
    m = mk()
    gc.collect(); gc.disable()
    base = live(); counts = []
    for _ in range(3):
      v = m.init(jax.random.key(0), X); y = m.apply(v, X); del v, y
      if gcmode == 'collect': gc.collect()
      now = live(); counts.append((now[0] - base[0], now[1] - base[1]))
    gc.enable()
    out[f'mem/{gcmode}/linen/{name}'] = counts
# a module kept by the user from inside a transform
for name in ('jit', 'remat'):
  kept = []
  def keep(next_fun, args, kwargs, ctx):
    if ctx.method_name == '__call__': kept.append(ctx.module)
    return next_fun(*args, **kwargs)
  m = LINEN[name]()
  gc.collect(); base = live()
  v = m.init(jax.random.key(0), X)
  with nn.intercept_methods(keep):
    m.apply(v, X)
  del v; gc.collect()
  now = live(); out[f'mem/kept/{name}'] = (now[0] - base[0], now[1] - base[1])
  del kept[:]

# signatures and identities
def sig(f):
  try:
    s = inspect.signature(f)
    own = inspect.signature(f, follow_wrapped=False)
    addr = lambda t: re.sub(r'0x[0-9a-f]+', '0x', t)  # a default's repr: its address
    return [addr(str(s)), [(p.name, str(p.kind), addr(repr(p.default))) for p in own.parameters.values()], getattr(f, '__qualname__', None)]
  except Exception as e:
    return repr(type(e))
F = lambda sc, c, y: (c, y)
def body_fn(scope_fn, repack_fn, vg, rg, *a): pass
def value(f):  # f's value, or the error an older release raises
  try:
    return f()
  except Exception as e:
    return ['raised', type(e).__name__]
CALLABLES = {
  'lift.scan': lambda: lift.scan, 'core.scan': lambda: flax.core.scan, 'lift.pack': lambda: lift.pack,
  'lift._partial_pack': lambda: lift._partial_pack, 'Scope.rewound': lambda: core_scope.Scope.rewound,
  'core.init': lambda: flax.core.init, 'scope.init': lambda: core_scope.init,
  'lift.scan(F)': lambda: lift.scan(F), 'pack(fn)': lambda: lift.pack(body_fn, (True,), (True,), (True,), name='x'),
  'init(dense)': lambda: init(dense), 'init(dense, mutable=False)': lambda: init(dense, mutable=False),
  'nnx.scan': lambda: nnx.scan, 'nnx.scan(f)': lambda: nnx.scan(lambda c, x: (c, x)), 'nnx.scan()': lambda: nnx.scan(length=3),
}
for k, f in CALLABLES.items():
  f = value(f)
  out[f'sig/{k}'] = f if isinstance(f, list) else sig(f)
def nf(c, x): return c, x
out['id/init'] = flax.core.init is core_scope.init
out['id/scan'] = flax.core.scan is lift.scan
out['id/nnx.scan(f).__wrapped__'] = value(lambda: nnx.scan(nf).__wrapped__ is nf)
out['id/init(dense).__wrapped__'] = value(lambda: init(dense).__wrapped__ is dense)
out['id/init(dense,False).__wrapped__'] = value(lambda: init(dense, mutable=False).__wrapped__ is dense)
out['id/scan(F).__wrapped__'] = getattr(lift.scan(F), '__wrapped__', None) is F
out['sig/nnx.scan(nf)'] = value(lambda: sig(nnx.scan(nf)))
out['nnx.Carry'] = hasattr(nnx, 'Carry')

# errors and keyword calls
SF = lift.scan(lambda sc, c, y: (c, dense(sc, y)), variable_broadcast='params', split_rngs={'params': False})
def scan_init_kw(s, x):
  return SF(s.push('a'), init=(), xs=x[None])
out['err/scan init='] = outcome(lambda: init(scan_init_kw)(jax.random.key(0), X))
out['err/scan F(s, init=c)'] = outcome(lambda: init(lambda s, x: SF(s, init=()))(jax.random.key(0), X))
out['err/scan F()'] = outcome(lambda: SF())
class ScanKw(nn.Module):
  @nn.compact
  def __call__(self, c, x, init=None):
    return nn.Dense(3)(c), None
class ScanKwM(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.scan(ScanKw, variable_axes={'params': 0}, split_rngs={'params': True}, length=2)()(x, None, init=1)[0]
out['err/nn.scan __call__ init='] = outcome(lambda: ScanKwM().init(jax.random.key(0), X))
def packed_body(scope_fn, repack_fn, vg, rg, x):
  sc = scope_fn(vg, rg); y = dense(sc, x); return y, repack_fn(sc)
out['err/pack positional name'] = outcome(lambda: init(lambda s, x: lift.pack(packed_body, (True,), (True,), (True,), 'mine')(s.push('a'), x))(jax.random.key(0), X))
out['err/pack unhashable name'] = outcome(lambda: init(lambda s, x: lift.pack(packed_body, (True,), (True,), (True,), name=['my', 'pack'])(s.push('a'), x))(jax.random.key(0), X))

# errors with NumPy, scalar, tracer, cyclic arguments through flax.core
def bad(scope, x, extra):
  raise ValueError('expected 3 features')
ARGS = {'numpy': np.ones(3), 'scalar': 1.5}
class Cyc: pass
cyc = Cyc(); cyc.me = cyc
ARGS['cyclic'] = cyc
CORE_T = {
  'scan': lambda f: lambda s, x, e: lift.scan(lambda sc, c, y, e: f(sc, y, e), variable_broadcast='params', split_rngs={'params': False}, in_axes=(0, lift.broadcast))(s.push('a'), (), x[None], e),
  'pack': lambda f: lambda s, x, e: lift.pack(lambda sf, rf, vg, rg, x, e: f(sf(vg, rg), x, e), (True,), (True,), (True,), name='p')(s.push('a'), x, e),
  'map_variables': lambda f: lambda s, x, e: lift.map_variables(f, 'params', init=True)(s.push('a'), x, e),
  'vmap': lambda f: lambda s, x, e: lift.vmap(f, in_axes=(0, None), variable_axes={'params': 0}, split_rngs={'params': True})(s.push('a'), x[None], e),
  'jit': lambda f: lambda s, x, e: lift.jit(lambda sc, k, x, e: f(sc, x, e))(s.push('a'), 0, x, e),
  'cond': lambda f: lambda s, x, e: lift.cond(True, f, f, s.push('a'), x, e),
}
for tname, t in CORE_T.items():
  for aname, a in ARGS.items():
    if tname in ('scan', 'vmap', 'pack', 'cond', 'map_variables') and aname == 'cyclic':
      pass
    out[f'err/core/{tname}/{aname}'] = outcome(lambda: init(t(bad))(jax.random.key(0), X, a))
  out[f'err/core/{tname}/tracer'] = outcome(lambda: jax.jit(lambda a: init(t(bad))(jax.random.key(0), X, a))(jnp.ones(3)))

# Linen
class BadL(nn.Module):
  @nn.compact
  def __call__(self, x, e):
    raise ValueError('expected 3 features')
for tname, t in {'remat': nn.remat, 'jit': nn.jit, 'vmap': lambda c: nn.vmap(c, in_axes=(0, None), variable_axes={'params': 0}, split_rngs={'params': True})}.items():
  for aname, a in ARGS.items():
    out[f'err/linen/{tname}/{aname}'] = outcome(lambda: t(BadL)().init(jax.random.key(0), X, a))

if nnx is not None:
  # NNX scan errors
  class Lin(nnx.Module):
    def __init__(self):
      self.w = nnx.Param(jnp.ones((3, 3)))
  def nbody(m, c, x, e):
    raise ValueError('expected 3 features')
  def cyc_model():
    m = Lin(); m.child = Lin(); m.child.parent = m; return m
  XS = jnp.ones((2, 3))
  for aname, a in {**ARGS, 'cyclic': None}.items():
    m = cyc_model() if aname == 'cyclic' else Lin()
    out[f'err/nnx.scan/{aname}'] = outcome(lambda: nnx.scan(nbody, in_axes=(None, nnx.Carry, 0, None))(m, X[0], XS, a))
  out['err/nnx.scan/tracer'] = outcome(lambda: jax.jit(lambda a: nnx.scan(nbody, in_axes=(None, nnx.Carry, 0, None))(Lin(), X[0], XS, a))(jnp.ones(3)))
  out['err/nnx.scan/length mismatch numpy'] = outcome(lambda: nnx.scan(lambda c, x, y: (c, x), in_axes=(nnx.Carry, 0, 0))(X[0], np.ones((2, 3)), np.ones((4, 3))))
  def okbody(m, c, x): return c, x
  out['err/nnx.scan/after cyclic'] = outcome(lambda: nnx.scan(okbody, in_axes=(None, nnx.Carry, 0))(Lin(), X[0], XS)[1].shape)
def act(x, a='tanh'):
  return jnp.tanh(x) if a == 'tanh' else x
out['err/nnx.remat str default'] = outcome(lambda: nnx.remat(act)(X))
print(json.dumps(out))
'''


@pytest.fixture(scope='module')
def probed():
  return run_python(PROBE, 'plain'), run_python(PROBE, 'patched')


def differing(probed, prefix):
  plain, patched = probed
  keys = [k for k in plain if k.startswith(prefix)]
  assert keys, prefix  # the probe checks something under this prefix
  assert set(keys) == {k for k in patched if k.startswith(prefix)}
  return {k: (plain[k], patched[k]) for k in keys if plain[k] != patched[k]}


@pytest.mark.own_patch_mode
@pytest.mark.end_to_end  # two fresh interpreters run PROBE: about 35 CPU-s
@pytest.mark.parametrize('prefix', [
    # Each inner root's link held a tuple holding the roots: a cycle, so
    # with the collector disabled every transform's scopes (and arrays)
    # stayed; and a module kept from inside a transform kept the outer
    # scope and the variables applied.
    'mem/nogc/core/', 'mem/nogc/linen/', 'mem/collect/', 'mem/kept/',
    # The lift.scan wrapper named a parameter init; pack's name was
    # keyword-only and hashed.
    'sig/', 'id/', 'err/scan ', 'err/nn.scan ', 'err/pack ',
    # nnx.scan's errors were inspected, vars() on NumPy, scalars, tracers;
    # a cyclic graph recursed without end.
    'err/core/', 'err/linen/', 'err/nnx.scan/',
    # A str default of a plain nnx.remat was left untraced.
    'err/nnx.remat',
])
def test_a_plain_program_runs_as_on_plain_flax(probed, prefix):
  """Plain Flax and patched, each in a fresh interpreter, run PROBE alike."""
  if prefix.startswith('err/nnx') and not probed[0]['nnx']:
    pytest.skip(f'Flax {flax.__version__}: flax.nnx does not import with its pinned JAX')
  assert not differing(probed, prefix)


@pytest.mark.end_to_end  # PROBE's interpreters
def test_the_probe_sees_what_it_compares(probed):
  # Not a comparison of two empty reports: the errors are the programs'.
  plain, _ = probed
  assert plain['err/core/jit/numpy'] == ['ValueError', 'expected 3 features']
  assert plain['err/pack unhashable name'][0] == 'ok'
  assert plain['id/init']
  assert plain['mem/nogc/core/vmap'] == [[0, 0]] * 3
  if not plain['nnx.Carry']:  # Flax 0.8.5's nnx.scan: no nnx.Carry, no f.__wrapped__
    return
  assert plain['id/nnx.scan(f).__wrapped__']
  assert plain['err/nnx.scan/numpy'] == ['ValueError', 'expected 3 features']
  assert plain['err/nnx.scan/cyclic'] == ['ValueError', 'expected 3 features']
  assert plain['err/nnx.scan/tracer'] == ['ValueError', 'expected 3 features']


def _live_scopes():
  return sum(isinstance(o, core_scope.Scope) for o in gc.get_objects())


def _dense(scope, x):
  return x @ scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 3))


def test_inner_roots_are_freed_without_the_cycle_collector():
  # In this process (patched): what the vmap's inner roots record makes no
  # cycle, so refcounting frees them as it does on plain Flax.
  vmapped = lambda s, x: lift.vmap(
      _dense, variable_axes={'params': 0}, split_rngs={'params': True})(
          s.push('a'), x[None])
  init(vmapped)(jax.random.key(0), jnp.ones((2, 3)))  # compiled once
  gc.collect()
  gc.disable()
  try:
    before = _live_scopes(), len(jax.live_arrays())
    for _ in range(3):
      init(vmapped)(jax.random.key(0), jnp.ones((2, 3)))
    after = _live_scopes(), len(jax.live_arrays())
  finally:
    gc.enable()
  assert after == before


def test_a_context_copied_inside_a_scan_keeps_nothing_of_the_call():
  copied = []

  def body(scope, c, x):
    copied.append(contextvars.copy_context())
    return c, _dense(scope, x)

  scanned = lift.scan(body, variable_broadcast='params',
                      split_rngs={'params': False})
  init(lambda s, x: scanned(s.push('a'), (), x[None]))(
      jax.random.key(0), jnp.ones((2, 3)))
  assert copied
  for context in copied:  # the record was read once, and emptied
    assert not context.get(tie_lift.SCAN_CALL, None)
  assert tie_lift.SCAN_CALL.get() is None


def test_a_pack_name_of_any_kind_is_handed_on_as_given():
  seen = []

  def body(scope_fn, repack_fn, variable_groups, rng_groups, x):
    scope = scope_fn(variable_groups, rng_groups)
    return _dense(scope, x), repack_fn(scope)

  for name in ('mine', ['my', 'pack'], None):
    packed = lift.pack(body, (True,), (True,), (True,), name)
    y, _ = init(lambda s, x, p=packed: p(s.push('a'), x))(
        jax.random.key(0), jnp.ones((2, 3)))
    seen.append(y.shape)
  assert seen == [(2, 3)] * 3



def _names_given_to_flax_pack(fn):
  """The ``name`` each of Flax's ``pack`` wrappers found behind ``fn`` holds."""
  names, todo = [], [fn]
  while todo:
    nonlocals = inspect.getclosurevars(todo.pop()).nonlocals
    if 'enable_kwargs' in nonlocals and 'name' in nonlocals:  # Flax's wrapper
      names.append(nonlocals['name'])
    todo += [v for v in nonlocals.values() if inspect.isfunction(v)]
  return names


def test_flax_pack_is_given_the_name_a_transform_gives_it():
  # lift.jit's pack used to get a str subclass (the site of its trace cache).
  jitted = lift.jit(lambda scope, key, x: _dense(scope, x))
  names = _names_given_to_flax_pack(jitted)
  assert names and all(type(n) is str for n in names), names  # pylint: disable=unidiomatic-typecheck
  y, _ = init(lambda s, x: jitted(s.push('a'), 0, x))(
      jax.random.key(0), jnp.ones((2, 3)))
  assert y.shape == (2, 3)
  assert ties.PACK_SITE.get() is None


GRID = r'''
import gc, json
import jax, jax.numpy as jnp
from flax.core import lift, scope as core_scope, init

def dense(scope, x):
  return x @ scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 3))

def wrap(kind, f):
  if kind == 'remat':
    return lift.checkpoint(f)
  if kind == 'map_variables':
    return lift.map_variables(f, 'params', init=True)
  if kind == 'jit':
    return lambda s, x: lift.jit(lambda sc, k, x: f(sc, x))(s, 0, x)
  if kind == 'cond':
    return lambda s, x: lift.cond(True, f, f, s, x)
  if kind == 'vmap':
    return lambda s, x: lift.vmap(f, variable_axes={'params': 0},
                                  split_rngs={'params': True})(s, x[None])[0]
  if kind == 'scan':
    return lambda s, x: lift.scan(
        lambda sc, c, y: (c, f(sc, y)), variable_broadcast='params',
        split_rngs={'params': False})(s, (), x[None])[1][0]

KINDS = ('remat', 'map_variables', 'jit', 'cond', 'vmap', 'scan')
out = {}
for outer in KINDS:
  for inner in KINDS:
    prog = lambda s, x: wrap(outer, wrap(inner, dense))(s.push('a'), x)
    for collect in (False, True):
      gc.collect(); gc.disable()
      scopes = lambda: sum(isinstance(o, core_scope.Scope) for o in gc.get_objects())
      base = scopes(), len(jax.live_arrays())
      y, v = init(prog)(jax.random.key(0), jnp.ones((2, 3)))
      y2 = init(prog)(jax.random.key(1), jnp.ones((2, 3)))[0]
      del y, v, y2
      if collect:
        gc.collect()
      now = scopes(), len(jax.live_arrays())
      gc.enable()
      out[f'{outer}/{inner}/{collect}'] = [now[0] - base[0], now[1] - base[1]]
print(json.dumps(out))
'''


@pytest.mark.end_to_end  # 36 nestings in two fresh interpreters
@pytest.mark.own_patch_mode
def test_nested_transforms_keep_alive_what_plain_flax_keeps():
  plain, patched = run_python(GRID, 'plain'), run_python(GRID, 'patched')
  assert len(plain) == 72
  assert {k: patched[k] for k in plain if patched[k] != plain[k]} == {}
