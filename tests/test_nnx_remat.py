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

"""static_argnames / static_argnums on ``nnx.remat``.

The reference for every result and gradient is the same function called
without remat, on an identical model (same parameters and RNG state), as a
user would check it. ``flax.nnx.remat`` itself is reached through the patch
(``needs_patch``); ``flax_tieext.nnx.remat`` works either way.
"""

import functools
import inspect
import re

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext
from flax_tieext import _compat
from static_models import shown

try:
  from flax import nnx  # pylint: disable=g-import-not-at-top
except ImportError as e:  # Flax 0.10.7 on its pinned jax 0.8.1
  pytest.skip(
      f'flax.nnx does not import on Flax {_compat.FLAX_VERSION} / jax'
      f' {_compat.JAX_VERSION}: {e}', allow_module_level=True)
from flax_tieext.nnx import remat  # pylint: disable=g-import-not-at-top
if _compat.NNX_REMAT is None:
  pytest.skip(
      f'Flax {_compat.FLAX_VERSION} has no nnx.remat', allow_module_level=True
  )

needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch

# Graph mode, graph mode without graph updates, tree mode: the ways Flax's
# nnx.remat can run on releases that have them; the default elsewhere.
if 'graph' in inspect.signature(_compat.NNX_REMAT).parameters:
  MODES = [
      pytest.param({'graph': True, 'graph_updates': True}, id='graph'),
      pytest.param({'graph': True, 'graph_updates': False}, id='graph-no-updates'),
      pytest.param({'graph': False, 'graph_updates': False}, id='tree'),
  ]
else:
  MODES = [pytest.param({}, id='default')]


class MLP(nnx.Module):
  """Linear, then dropout that ``deterministic`` switches off in Python."""

  def __init__(self, rngs):
    self.linear = nnx.Linear(4, 4, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)


def forward(model, x, deterministic=False, activation='relu'):
  y = model.dropout(model.linear(x), deterministic=deterministic)
  return jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)


X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def assert_trees_equal(a, b):
  def equal(x, y):
    if jnp.issubdtype(getattr(x, 'dtype', None), jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(x, y)

  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(equal, a, b)


def assert_grads_equal(a, b):
  # Recomputed in the backward pass, gradients may differ from stored ones by
  # float rounding (they are bitwise equal on recent JAX releases).
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b
  )


def check_same_as_plain(rematted, *args, **kwargs):
  """``rematted(model, ...)`` == ``forward(model, ...)``: value, grads, RNGs."""
  model, plain_model = MLP(nnx.Rngs(0)), MLP(nnx.Rngs(0))
  loss = lambda f: lambda m: f(m, *args, **kwargs).sum()
  value, grads = nnx.value_and_grad(loss(rematted))(model)
  plain_value, plain_grads = nnx.value_and_grad(loss(forward))(plain_model)
  np.testing.assert_array_equal(value, plain_value)
  assert_grads_equal(grads, plain_grads)
  # Dropout drew the same keys, and the RNG counts moved on alike.
  assert_trees_equal(nnx.state(model), nnx.state(plain_model))


CALLS = [
    pytest.param((X, True), {}, id='positional'),
    pytest.param((X,), {'deterministic': True}, id='keyword'),
    pytest.param((X,), {}, id='omitted'),
    pytest.param((X, False, 'tanh'), {}, id='positional-both'),
    pytest.param((X,), {'activation': 'tanh', 'deterministic': True}, id='keyword-both'),
]


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('args, kwargs', CALLS)
def test_named_flags_are_static_however_passed(mode, args, kwargs):
  rematted = remat(
      forward, static_argnames=('deterministic', 'activation'), **mode
  )
  check_same_as_plain(rematted, *args, **kwargs)


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('args, kwargs', CALLS)
def test_static_argnums_also_covers_keyword_and_omitted_calls(mode, args, kwargs):
  # Counted from the first parameter, `model` is 0, as in jax.checkpoint.
  check_same_as_plain(remat(forward, static_argnums=(2, 3), **mode), *args, **kwargs)


@pytest.mark.parametrize('mode', MODES)
def test_decorated_method(mode):

  class Rematted(MLP):

    @remat(static_argnames='deterministic', **mode)
    def __call__(self, x, deterministic=False):
      return forward(self, x, deterministic)

  model, plain_model = Rematted(nnx.Rngs(0)), MLP(nnx.Rngs(0))
  loss = lambda m: m(X, deterministic=True).sum()
  plain_loss = lambda m: forward(m, X, deterministic=True).sum()
  value, grads = nnx.value_and_grad(loss)(model)
  plain_value, plain_grads = nnx.value_and_grad(plain_loss)(plain_model)
  np.testing.assert_array_equal(value, plain_value)
  assert_grads_equal(grads, plain_grads)
  np.testing.assert_array_equal(model(X, True), forward(plain_model, X, True))
  np.testing.assert_array_equal(model(X), forward(plain_model, X))


def test_under_jit_a_new_static_value_retraces():
  traces = []

  def counted(model, x, deterministic=False):
    traces.append(deterministic)
    return forward(model, x, deterministic)

  rematted = remat(counted, static_argnames='deterministic')

  model, plain_model = MLP(nnx.Rngs(0)), MLP(nnx.Rngs(0))
  graphdef, state = nnx.split(model)

  @functools.partial(jax.jit, static_argnames='deterministic')
  def step(state, x, deterministic):
    return rematted(nnx.merge(graphdef, state), x, deterministic=deterministic)

  for deterministic in (True, False, True):
    np.testing.assert_array_equal(
        step(state, X, deterministic), forward(plain_model, X, deterministic)
    )
  assert traces == [True, False]  # the second True is jit's cached trace


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('value, change', [
    pytest.param([1.0, 2.0], lambda w: w.__setitem__(0, 100.0), id='list'),
    pytest.param({'a': [1.0]}, lambda w: w['a'].__setitem__(0, 100.0), id='dict'),
    pytest.param(np.ones(2), lambda w: w.__setitem__(0, 100.0), id='array'),
])
def test_a_static_container_changed_in_place_is_traced_as_flax_traces_it(
    mode, value, change):
  # Issue 47: the same static object, changed in place between calls, is
  # traced and read as Flax's own nnx.remat traces it by index: graph mode
  # makes a container anew at each call (a new trace reads the new
  # contents), tree mode and an array are keyed by identity (the first
  # trace is kept, on plain Flax too).
  first = lambda w: float(np.ravel(jax.tree.leaves(w))[0])

  def run(transform, **static):
    traces, w = [], jax.tree.map(lambda v: v, value)
    if isinstance(w, np.ndarray):
      w = w.copy()
    f = transform(lambda x, w: traces.append(1) or x * first(w), **static,
                  **mode)
    outs = [f(X, w)]
    change(w)
    outs += [f(X, w), f(X, w)]
    return len(traces), [np.asarray(o) for o in outs]

  flax_own = run(_compat.NNX_REMAT, static_argnums=(1,))
  for static in ({'static_argnames': 'w'}, {'static_argnums': (1,)}):
    ours = run(remat, **static)
    assert ours[0] == flax_own[0], static
    for a, b in zip(ours[1], flax_own[1]):
      np.testing.assert_array_equal(a, b)


@needs_patch
def test_flax_nnx_remat_takes_static_argnames_under_the_patch():
  assert flax_tieext.is_installed()

  class Rematted(MLP):

    @nnx.remat(static_argnames='deterministic')
    def __call__(self, x, deterministic=False):
      return forward(self, x, deterministic)

  model, plain_model = Rematted(nnx.Rngs(0)), MLP(nnx.Rngs(0))
  np.testing.assert_array_equal(
      model(X, deterministic=True), forward(plain_model, X, True)
  )
  for owner, attr in _compat.NNX_REMAT_ALIASES:
    assert getattr(owner, attr) is nnx.remat, f'{owner.__name__}.{attr}'


@needs_patch
def test_uninstall_gives_back_flax_nnx_remat():
  flax_tieext.uninstall()
  try:
    with pytest.raises(TypeError, match='static_argnames'):
      nnx.remat(forward, static_argnames='deterministic')
  finally:
    flax_tieext.install()
  check_same_as_plain(
      nnx.remat(forward, static_argnames='deterministic'), X, True
  )


# -- errors: what the Linen transforms say, in nnx.remat's terms --------------


def test_misspelled_name_is_refused_at_the_call_with_the_parameter_it_meant():
  # As jax.checkpoint's own checks: at the call, not when wrapping (a
  # library may define remat variants it never calls).
  rematted = remat(forward, static_argnames='determinstic')
  with pytest.raises(ValueError) as e:
    rematted(MLP(nnx.Rngs(0)), X)
  message = str(e.value)
  assert 'nnx.remat' in message and "'determinstic'" in message
  assert "'deterministic'" in message  # the near match
  assert 'forward(model, x, deterministic=False' in message  # the signature


@installs_patch  # the explanations come with the patch
def test_out_of_range_index_shows_the_numbering_with_model_as_zero():
  rematted = remat(forward, static_argnums=4)
  with pytest.raises(ValueError) as e:
    rematted(MLP(nnx.Rngs(0)), X)
  message = str(e.value)
  assert 'static_argnums index 4' in message
  lines = message.splitlines()
  assert any(l.split()[:2] == ['0', '|'] and 'model' in l for l in lines)
  assert any(l.split()[:2] == ['2', '|'] and 'deterministic' in l for l in lines)
  assert 'static_argnames=' in message


@installs_patch  # the explanations come with the patch
def test_array_for_a_static_argument_fails_as_in_flax_and_is_named():
  # An array is a valid static value; used as a flag it fails as it does
  # without remat, and the note names the static argument.
  rematted = remat(forward, static_argnames='deterministic')
  flag = jnp.ones((2,))
  with pytest.raises(ValueError) as plain:
    forward(MLP(nnx.Rngs(0)), X, flag)
  with pytest.raises(ValueError) as e:
    rematted(MLP(nnx.Rngs(0)), X, flag)
  assert str(e.value).split('\n')[0] == str(plain.value).split('\n')[0]
  message = shown(e.value)
  assert '`deterministic` of forward(' in message
  assert 'array of shape (2,)' in message


@installs_patch  # the explanations come with the patch
def test_traced_flag_error_says_which_argument_to_make_static():

  def dropout(model, x, deterministic=False):
    return model.dropout(x, deterministic=deterministic)

  with pytest.raises(jax.errors.ConcretizationTypeError) as e:
    remat(dropout)(MLP(nnx.Rngs(0)), X, True)
  notes = '\n'.join(getattr(e.value, '__notes__', ())) or str(e.value)
  assert "static_argnames='deterministic'" in notes
  # Following the advice works.
  rematted = remat(dropout, static_argnames='deterministic')
  np.testing.assert_array_equal(
      rematted(MLP(nnx.Rngs(0)), X, deterministic=True), X
  )


def test_flax_checks_are_kept():
  # Whatever Flax's own nnx.remat refuses, ours refuses the same way.
  model = MLP(nnx.Rngs(0))
  bound = model.linear.__call__
  try:
    _compat.NNX_REMAT(bound)
  except Exception as flax_error:  # pylint: disable=broad-except
    with pytest.raises(type(flax_error), match=re.escape(str(flax_error))):
      remat(bound)
  else:
    # This Flax accepts a bound method: so do we.
    np.testing.assert_array_equal(remat(bound)(X), model.linear(X))
