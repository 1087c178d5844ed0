"""The import-time monkeypatch: reversible, idempotent, version-checked."""

import importlib
import os
import subprocess
import sys
import textwrap

import flax
import flax.core
import flax.core.lift
import flax.core.scope
import flax.linen as nn
import flax.linen.partitioning
import flax.linen.transforms
import jax
import jax.numpy as jnp
import pytest

import flax_tieext
from flax_tieext import _compat
from flax_tieext import _patch



def _targets():
  """(owner, attribute) of every binding of the patch (flax_tieext._patch)."""
  bindings = [*_patch._bindings(), *_patch._machinery_bindings(),  # pylint: disable=protected-access
              *_patch._partitioning_bindings()]  # pylint: disable=protected-access
  return list(dict.fromkeys((b.owner, b.attr) for b in bindings))


def snapshot():
  return {(id(owner), attr): vars(owner).get(attr) for owner, attr in _targets()}


@pytest.fixture
def originals():
  """The exact original objects, read while the patch is uninstalled."""
  was_installed = flax_tieext.is_installed()
  flax_tieext.uninstall()
  try:
    yield snapshot()
  finally:
    if was_installed:
      flax_tieext.install()
    else:
      flax_tieext.uninstall()


def test_uninstall_restores_the_exact_original_objects(originals):
  flax_tieext.install()
  _declare_a_tie()  # binds the Scope machinery too
  assert flax_tieext.is_installed()
  assert nn.tie is flax_tieext.linen.tie
  assert nn.remat is flax_tieext.linen.remat
  assert flax.core.lift.checkpoint is flax_tieext.lift.checkpoint
  flax_tieext.uninstall()
  assert not flax_tieext.is_installed()
  after = snapshot()
  for owner, attr in _targets():
    original = originals[(id(owner), attr)]
    if original is None:  # added by the patch, such as nn.tie
      assert attr not in vars(owner), f'{owner.__name__}.{attr} left behind'
    else:
      assert after[(id(owner), attr)] is original, attr


def test_install_twice_is_a_no_op(originals):
  flax_tieext.install()
  first = snapshot()
  flax_tieext.install()
  assert snapshot() == first
  flax_tieext.uninstall()
  flax_tieext.uninstall()  # and so is a second uninstall
  assert snapshot() == originals


def test_reload_keeps_one_installation(originals):
  flax_tieext.install()
  _declare_a_tie()
  installed = snapshot()
  importlib.reload(flax_tieext)
  assert flax_tieext.is_installed()
  _declare_a_tie()
  assert snapshot() == installed  # the Scope hooks are not wrapped twice
  hook = flax.core.scope.Scope.push
  assert hook.__wrapped__ is originals[(id(flax.core.scope.Scope), 'push')]
  flax_tieext.uninstall()
  assert snapshot() == originals


def _declare_a_tie():
  """Declares a tie, which binds the tie machinery (Scope, pack)."""

  class Pair(nn.Module):

    @nn.compact
    def __call__(self, x):
      return nn.Dense(2, name='b')(nn.Dense(2, name='a')(x))

  nn.tie(Pair, {'b': 'a'})().init(jax.random.key(0), jnp.ones((1, 2)))


@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
@pytest.mark.own_patch_mode
def test_scope_machinery_is_bound_at_the_first_tie_only():
  # A program that declares no tie runs Flax's own Scope methods but
  # rewound, and imports nothing it did not import (nn.partitioning is bound
  # on import). pack and rewound are bound at install: pack records on each
  # inner root the scope it is made from (rewound carries it), for a tie
  # declared later inside the transform.
  result = run_python("""
      import sys
      import flax.core.lift, flax.core.scope, flax.linen as nn
      Scope = flax.core.scope.Scope
      before = (Scope.push, Scope.param, Scope._collection, Scope.variables)
      linking = (flax.core.lift._partial_pack, flax.core.lift.pack,
                 Scope.rewound)
      import flax_tieext
      import jax, jax.numpy as jnp
      class M(nn.Module):
        @nn.compact
        def __call__(self, x):
          return nn.remat(nn.Dense)(2)(x)
      M().init(jax.random.key(0), jnp.ones((1, 2)))
      print((Scope.push, Scope.param, Scope._collection, Scope.variables)
            == before and all(
                bound.__wrapped__ is original for bound, original in zip(
                    (flax.core.lift._partial_pack, flax.core.lift.pack,
                     Scope.rewound), linking)),
            'flax.linen.partitioning' in sys.modules, hasattr(nn, 'partitioning'))
      class Pair(nn.Module):
        @nn.compact
        def __call__(self, x):
          return nn.Dense(2, name='b')(nn.Dense(2, name='a')(x))
      nn.tie(Pair, {'b': 'a'})().init(jax.random.key(0), jnp.ones((1, 2)))
      print(flax.core.scope.Scope.push.__wrapped__ is before[0])
      import flax.linen.partitioning
      print(nn.partitioning.remat is flax_tieext.linen.partitioning.remat)
      flax_tieext.uninstall()
      print((Scope.push, Scope.param, Scope._collection, Scope.variables)
            == before and (flax.core.lift._partial_pack, flax.core.lift.pack,
                           Scope.rewound) == linking,
            nn.partitioning.remat is flax_tieext.linen.partitioning.remat)
  """, FLAX_TIEEXT_AUTOPATCH='1')
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == [
      'True', 'False', 'False', 'True', 'True', 'True', 'False']


def test_install_refuses_a_flax_it_cannot_patch(originals, monkeypatch):
  monkeypatch.setattr(_patch, 'missing_features',
                      lambda: ['flax.core.lift._partial_pack (test)'])
  with pytest.raises(flax_tieext.PatchError) as info:
    flax_tieext.install()
  message = str(info.value)
  assert _compat.FLAX_VERSION in message
  assert '_partial_pack' in message
  assert snapshot() == originals  # Flax untouched


@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
def test_autopatch_warns_and_leaves_flax_untouched(originals, monkeypatch):
  monkeypatch.delenv(_patch.AUTOPATCH_ENV, raising=False)  # opted-out runs
  monkeypatch.setattr(_patch, 'missing_features',
                      lambda: ['flax.core.lift.pack (test)'])
  with pytest.warns(RuntimeWarning, match='cannot patch Flax'):
    _patch.autopatch()
  assert snapshot() == originals


def run_python(code, **env):
  full_env = dict(os.environ, **env)
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                        capture_output=True, text=True, env=full_env,
                        check=False)


@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
@pytest.mark.own_patch_mode
def test_opt_out_with_environment_variable():
  result = run_python("""
      import flax.linen as nn
      import flax_tieext
      print(flax_tieext.is_installed(), hasattr(nn, 'tie'))
      flax_tieext.install()
      print(flax_tieext.is_installed(), hasattr(nn, 'tie'))
  """, FLAX_TIEEXT_AUTOPATCH='0')
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['False', 'False', 'True', 'True']


def test_each_copy_runs_in_its_patch_mode(request):
  # With --opted-out-too, the opted-out copy of a test runs with the patch
  # uninstalled (conftest.patch_mode); pytest 9 did not set that fixture up,
  # and every copy ran patched.
  callspec = getattr(request.node, 'callspec', None)
  mode = callspec.params.get('patch_mode', 'patched') if callspec else 'patched'
  assert flax_tieext.is_installed() == (mode == 'patched'), mode
  assert (os.environ.get('FLAX_TIEEXT_AUTOPATCH') == '0') == (mode != 'patched')


@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
@pytest.mark.own_patch_mode
def test_import_warns_nothing_under_w_error():
  # Issue 45: on JAX 0.12.1 the import touched the deprecated
  # jax.sharding.SingleDeviceSharding, and a suite that turns warnings into
  # errors (Flax's own) failed at collection. Each release of the matrix
  # runs this on its pinned JAX.
  result = subprocess.run(
      [sys.executable, '-W', 'error', '-c',
       'import flax_tieext, flax.linen; print(flax_tieext.is_installed())'],
      capture_output=True, text=True, check=False,
      env=dict(os.environ, FLAX_TIEEXT_AUTOPATCH='1'))
  assert result.returncode == 0, (
      f'flax {flax.__version__}, jax {jax.__version__}:\n{result.stderr}')
  assert result.stdout.split() == ['True']


@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
@pytest.mark.own_patch_mode
def test_import_patches_by_default():
  result = run_python("""
      import flax.linen as nn
      import flax_tieext
      print(flax_tieext.is_installed(), nn.tie is flax_tieext.linen.tie)
  """, FLAX_TIEEXT_AUTOPATCH='1')
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['True', 'True']



@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
@pytest.mark.own_patch_mode
def test_nnx_remat_is_patched_when_the_program_imports_flax_nnx():
  # import flax_tieext does not import flax.nnx (Linen users pay nothing for
  # it); nnx.remat gains static_argnames whenever the program imports it,
  # before or after flax_tieext, and uninstall gives Flax's back.
  nnx = pytest.importorskip('flax.nnx', exc_type=ImportError)
  if not hasattr(nnx, 'remat'):
    pytest.skip('this Flax has no nnx.remat')
  result = run_python("""
      import sys
      import flax.linen
      import flax_tieext
      print('flax.nnx' in sys.modules)
      from flax import nnx
      print(nnx.remat is flax_tieext.nnx.remat)
      flax_tieext.uninstall()
      print(nnx.remat is flax_tieext._compat.NNX_REMAT)
      flax_tieext.install()
      print(nnx.remat is flax_tieext.nnx.remat)
  """, FLAX_TIEEXT_AUTOPATCH='1')
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['False', 'True', 'True', 'True']
  result = run_python("""
      from flax import nnx
      import flax_tieext
      print(nnx.remat is flax_tieext.nnx.remat)
  """, FLAX_TIEEXT_AUTOPATCH='1')
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['True']


@pytest.mark.end_to_end  # a fresh interpreter: left to --end-to-end and CI
@pytest.mark.own_patch_mode
def test_nnx_scan_wrapper_is_bound_once_and_uninstalled():
  # With NNX ties (tree mode), nnx.scan is wrapped to name a tied source it
  # slices; install() twice wraps it once, uninstall() gives Flax's back.
  pytest.importorskip('flax.nnx', exc_type=ImportError)
  result = run_python("""
      from flax import nnx
      import flax_tieext
      from flax_tieext.nnx import _tree_mode
      print(_tree_mode.TREE_MODE)
      if _tree_mode.TREE_MODE:
        from flax.nnx.transforms import iteration
        print(nnx.scan.__wrapped__ is iteration.scan)
        flax_tieext.uninstall()
        print(nnx.scan is iteration.scan)
        flax_tieext.install()
        flax_tieext.install()
        print(nnx.scan.__wrapped__ is iteration.scan)
  """, FLAX_TIEEXT_AUTOPATCH='1')
  assert result.returncode == 0, result.stderr
  if result.stdout.split() == ['False']:
    pytest.skip(f'Flax {_compat.FLAX_VERSION}: no NNX tree mode, no NNX ties')
  assert result.stdout.split() == ['True'] * 4
  # flax_tieext.nnx imported first: its import of flax.nnx binds the hook.
  result = run_python("""
      import flax_tieext.nnx
      from flax import nnx
      from flax.nnx.transforms import iteration
      print(nnx.scan.__wrapped__ is iteration.scan)
  """, FLAX_TIEEXT_AUTOPATCH='1')
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['True']


@pytest.mark.needs_patch
def test_every_flax_name_the_patch_binds_is_the_plugin_object():
  # Why the other test files call flax_tieext's objects only: installed, they
  # are what Flax's own names (nn.remat, nn.checkpoint, flax.core.remat, ...)
  # are bound to.
  assert flax_tieext.is_installed()
  for b in _patch._bindings():  # pylint: disable=protected-access
    if isinstance(b.make, _patch._Use):  # pylint: disable=protected-access
      assert getattr(b.owner, b.attr) is b.make.obj, b.attr
  assert nn.remat is nn.checkpoint is flax_tieext.linen.checkpoint
  assert flax.core.remat is flax.core.lift.checkpoint is flax_tieext.lift.checkpoint


def test_missing_features_names_what_a_broken_flax_lacks(originals):
  # An earlier plugin or a future Flax without a method the hooks wrap.
  push = flax.core.scope.Scope.push
  del flax.core.scope.Scope.push
  try:
    assert _patch.missing_features() == ['Scope.push']
    with pytest.raises(flax_tieext.PatchError, match='Scope.push'):
      flax_tieext.install()
  finally:
    flax.core.scope.Scope.push = push
  assert snapshot() == originals


@pytest.mark.installs_patch
def test_tied_module_bound_before_uninstall_names_install():
  # A module bound while the patch was installed, called after uninstall():
  # the TieError that apply gives, not Flax's ScopeParamNotFoundError.

  class Pair(nn.Module):

    @nn.compact
    def __call__(self, x):
      a = nn.Dense(2, name='a')(x)
      return nn.remat(nn.Dense)(2, name='b')(a)

  x = jnp.ones((1, 2))
  tied = nn.tie(Pair, {'b/kernel': 'a/kernel'})
  variables = tied().init(jax.random.key(0), x)
  bound = tied().bind(variables)
  expected = bound(x)
  flax_tieext.uninstall()
  try:
    with pytest.raises(flax_tieext.TieError, match=r'flax_tieext\.install\(\)'):
      bound(x)
  finally:
    flax_tieext.install()
  assert jnp.array_equal(bound(x), expected)
  shared = {'params': {'a': variables['params']['a'], 'b': {
      **variables['params']['b'], 'kernel': variables['params']['a']['kernel']}}}
  assert jnp.array_equal(expected, Pair().apply(shared, x))
