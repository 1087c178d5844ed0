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

"""static_argnames / static_argnums: what now works, on every entry point.

Each test builds its reference the way a user would without rematerialization
(the plain Module or scope function, called the same way) and compares.

There are three distinct functions: ``nn.checkpoint`` (``nn.remat`` is the same
object), ``nn.partitioning.remat`` and ``lift.checkpoint`` (``lift.remat``,
``flax.core.remat``). With the patch installed, Flax's names *are* the
``flax_tieext`` objects used here (tests/test_patch.py checks that), so the
tests call those, which also work with the patch opted out.
"""

import functools
import warnings

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_tieext import lift as ext_lift
from static_models import ENTRIES as LINEN_ENTRY_POINTS
from static_models import MLP  # the field report's model
from tie_models import assert_trees_close  # remat may round differently

LIFT_ENTRY_POINTS = [pytest.param(ext_lift.checkpoint, id='lift.checkpoint')]

REMAT_PRIMITIVES = {'checkpoint', 'remat', 'remat2'}

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
RNGS = {'dropout': jax.random.key(7)}


def _variables():
  return MLP().init(jax.random.key(0), X, True)


def _eqns(jaxpr):
  """Every equation of a (closed) jaxpr, those of its sub-jaxprs included."""
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if hasattr(sub, 'eqns') or hasattr(getattr(sub, 'jaxpr', None), 'eqns'):
          yield from _eqns(sub)


def _primitives(jaxpr):
  return {eqn.primitive.name for eqn in _eqns(jaxpr)}


def _remat_eqns(jaxpr):
  return [eqn for eqn in _eqns(jaxpr) if eqn.primitive.name in REMAT_PRIMITIVES]


def _call(module, variables, style):
  """Calls ``module(x, deterministic=...)`` in one of the three styles."""
  if style == 'positional':
    return module.apply(variables, X, True)
  if style == 'keyword':
    return module.apply(variables, X, deterministic=False, rngs=RNGS)
  assert style == 'omitted'  # deterministic=False, its default
  return module.apply(variables, X, rngs=RNGS)


STYLES = ['positional', 'keyword', 'omitted']


def _static_spec(kind, first_index):
  # Every way to say "deterministic is static" in this entry point's terms.
  return {
      'static_argnames': {'static_argnames': 'deterministic'},
      'static_argnames_list': {'static_argnames': ['deterministic']},
      'static_argnums': {'static_argnums': first_index + 1},
      'static_argnums_tuple': {'static_argnums': (first_index + 1,)},
  }[kind]


SPECS = [
    'static_argnames',
    'static_argnames_list',
    'static_argnums',
    'static_argnums_tuple',
]


@pytest.mark.parametrize('style', STYLES)
@pytest.mark.parametrize('spec', SPECS)
@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_flag_is_static_however_passed(entry, first_index, spec, style):
  # Field failure: static_argnums=2 worked positionally only; names did not
  # exist. (A negative index keeps Flax's meaning: tests/test_differential.py.)
  variables = _variables()
  remat_mlp = entry(MLP, **_static_spec(spec, first_index))
  expected = _call(MLP(), variables, style)
  np.testing.assert_array_equal(_call(remat_mlp(), variables, style), expected)


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_init_with_static_flag_matches_plain_init(entry, first_index):
  remat_mlp = entry(MLP, static_argnames='deterministic')
  got = remat_mlp().init(jax.random.key(0), X, deterministic=True)
  expected = MLP().init(jax.random.key(0), X, deterministic=True)
  jax.tree_util.tree_map(np.testing.assert_array_equal, got, expected)


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_gradients_match_plain_and_are_rematerialized(entry, first_index):
  variables = _variables()
  remat_mlp = entry(MLP, static_argnames='deterministic')

  def loss(module):
    return lambda v: (module.apply(v, X, rngs=RNGS) ** 2).sum()

  expected = jax.grad(loss(MLP()))(variables)
  got = jax.grad(loss(remat_mlp()))(variables)
  assert_trees_close(got, expected)
  jaxpr = jax.make_jaxpr(jax.grad(loss(remat_mlp())))(variables)
  assert _primitives(jaxpr) & REMAT_PRIMITIVES


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_static_flag_under_jit(entry, first_index):
  variables = _variables()
  remat_mlp = entry(MLP, static_argnames='deterministic')
  apply = jax.jit(remat_mlp().apply, static_argnames='deterministic')
  expected = MLP().apply(variables, X, deterministic=False, rngs=RNGS)
  got = apply(variables, X, deterministic=False, rngs=RNGS)
  assert_trees_close(got, expected)


def _decorated(decorator):
  class Decorated(nn.Module):

    @decorator
    @nn.compact
    def __call__(self, x, deterministic=False):
      x = nn.Dense(4)(x)
      return nn.Dropout(0.5, deterministic=deterministic)(x)

  return Decorated


@pytest.mark.parametrize('style', STYLES)
@pytest.mark.parametrize('spec', ['static_argnames', 'static_argnums'])
@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_decorator_factory_above_compact(entry, first_index, spec, style):
  # Field failure: @nn.checkpoint(static_argnums=1) was a TypeError (target
  # missing).
  decorated = _decorated(entry(**_static_spec(spec, first_index)))
  variables = _variables()
  expected = _call(MLP(), variables, style)
  np.testing.assert_array_equal(_call(decorated(), variables, style), expected)


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_functools_partial_of_the_transform(entry, first_index):
  remat = functools.partial(entry, static_argnames='deterministic')
  variables = _variables()
  for wrapped in (remat(MLP), _decorated(remat)):
    for style in STYLES:
      np.testing.assert_array_equal(
          _call(wrapped(), variables, style), _call(MLP(), variables, style)
      )


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_partially_applied_module_class(entry, first_index):
  class Scaled(nn.Module):
    scale: float

    @nn.compact
    def __call__(self, x, deterministic=False):
      return MLP()(x, deterministic) * self.scale

  plain = functools.partial(Scaled, scale=3.0)
  remat = entry(plain, static_argnames='deterministic')
  variables = plain().init(jax.random.key(0), X, True)
  np.testing.assert_array_equal(
      remat().apply(variables, X, rngs=RNGS),
      plain().apply(variables, X, rngs=RNGS),
  )


class TwoMethods(nn.Module):
  """Methods with different signatures: each resolves its own."""

  def setup(self):
    self.dense = nn.Dense(4)
    self.dropout = nn.Dropout(0.5)

  def __call__(self, x, deterministic=False):
    return self.dropout(self.dense(x), deterministic=deterministic)

  def encode(self, x, *, mode='tanh'):
    y = self.dense(x)
    return jnp.tanh(y) if mode == 'tanh' else jax.nn.relu(y)


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_methods_list_resolves_each_signature(entry, first_index):
  # deterministic exists only in __call__, mode only in encode.
  remat = entry(
      TwoMethods,
      static_argnames=('deterministic', 'mode'),
      methods=['__call__', 'encode'],
  )
  variables = TwoMethods().init(jax.random.key(0), X, True)
  np.testing.assert_array_equal(
      remat().apply(variables, X, rngs=RNGS),
      TwoMethods().apply(variables, X, rngs=RNGS),
  )
  for mode in ('tanh', 'relu'):
    np.testing.assert_array_equal(
        remat().apply(variables, X, mode=mode, method='encode'),
        TwoMethods().apply(variables, X, mode=mode, method='encode'),
    )
  np.testing.assert_array_equal(
      remat().apply(variables, X, method='encode'),
      TwoMethods().apply(variables, X, method='encode'),
  )


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_methods_dict_gives_each_method_its_arguments(entry, first_index):
  remat = entry(
      TwoMethods,
      methods={
          '__call__': {'static_argnames': 'deterministic'},
          'encode': {'static_argnames': ['mode'], 'prevent_cse': False},
      },
  )
  variables = TwoMethods().init(jax.random.key(0), X, True)
  np.testing.assert_array_equal(
      remat().apply(variables, X, rngs=RNGS),
      TwoMethods().apply(variables, X, rngs=RNGS),
  )
  np.testing.assert_array_equal(
      remat().apply(variables, X, mode='relu', method='encode'),
      TwoMethods().apply(variables, X, mode='relu', method='encode'),
  )


@pytest.mark.parametrize('methods', [[], ()])
@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_empty_methods_lift_no_method(entry, first_index, methods):
  # As Flax's lift_transform: an empty list lifts no method, with static
  # arguments too (it once lifted __call__, as methods=None does).
  traced = []

  class Probe(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic=False):
      traced.append(isinstance(x, jax.core.Tracer))
      return nn.Dense(4)(x)

  def seen(module):
    traced.clear()
    module.init(jax.random.key(0), X, True)
    return traced[:]

  static = {'static_argnums': first_index + 1}
  assert seen(entry(Probe, **static, methods=methods)()) == seen(Probe())
  assert seen(entry(Probe, **static)()) == [True]  # __call__, lifted


class KeywordOnly(nn.Module):

  @nn.compact
  def __call__(self, x, *, deterministic=False, activation='relu'):
    x = nn.Dense(4)(x)
    x = jax.nn.relu(x) if activation == 'relu' else jnp.tanh(x)
    return nn.Dropout(0.5, deterministic=deterministic)(x)


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_keyword_only_parameters_can_be_static(entry, first_index):
  remat = entry(KeywordOnly, static_argnames=('deterministic', 'activation'))
  variables = KeywordOnly().init(jax.random.key(0), X, deterministic=True)
  for kwargs in (
      {},
      {'deterministic': True},
      {'activation': 'tanh'},
      {'deterministic': True, 'activation': 'tanh'},
  ):
    np.testing.assert_array_equal(
        remat().apply(variables, X, rngs=RNGS, **kwargs),
        KeywordOnly().apply(variables, X, rngs=RNGS, **kwargs),
    )


class Scaled(nn.Module):

  @nn.compact
  def __call__(self, x, scale=1.0, *, shift=0.0):
    return nn.Dense(4)(x) * scale + shift


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_keyword_arguments_reach_the_method(entry, first_index):
  # Field failure: nn.partitioning.remat dropped keyword arguments with a
  # RuntimeWarning (setup.cfg turns warnings into errors).
  remat = entry(Scaled)
  variables = Scaled().init(jax.random.key(0), X)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    got = remat().apply(variables, X, scale=2.0, shift=1.0)
  np.testing.assert_array_equal(
      got, Scaled().apply(variables, X, scale=2.0, shift=1.0)
  )


class Sized(nn.Module):
  """A static argument whose default, a list, is not hashable."""

  @nn.compact
  def __call__(self, x, sizes=[4, 2]):  # pylint: disable=dangerous-default-value
    for size in sizes:
      x = nn.Dense(size)(x)
    return x


def _jax_checkpoint_static(value):
  """What ``jax.checkpoint`` does with ``value`` as a static argument."""
  return jax.checkpoint(lambda x, sizes: x * len(sizes), static_argnums=1)(
      jnp.ones(()), value)


@pytest.mark.parametrize('args', [pytest.param((), id='default'),
                                  pytest.param(([3, 1],), id='passed')])
@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_unhashable_static_value_follows_jax_checkpoint(entry, first_index, args):
  # Field failure: static_argnames='sizes' failed with "received a value of
  # type list" on the default, which works without static_argnames. Now
  # static values are what jax.checkpoint takes; a default is never passed.
  remat = entry(Sized, static_argnames='sizes')
  variables = Sized().init(jax.random.key(0), X, *args)
  try:
    if args:  # a default is not handed to jax.checkpoint
      _jax_checkpoint_static(*args)
  except Exception as e:  # pylint: disable=broad-except
    with pytest.raises(type(e)):
      remat().apply(variables, X, *args)
    return
  np.testing.assert_array_equal(
      remat().apply(variables, X, *args), Sized().apply(variables, X, *args))


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_policy_and_prevent_cse_pass_through(entry, first_index):
  policy = jax.checkpoint_policies.everything_saveable
  remat = entry(
      MLP, static_argnames='deterministic', policy=policy, prevent_cse=False
  )
  variables = _variables()
  jaxpr = jax.make_jaxpr(lambda v: remat().apply(v, X, True))(variables)
  (eqn,) = _remat_eqns(jaxpr)
  assert eqn.params['policy'] is policy
  assert eqn.params['prevent_cse'] is False


@pytest.mark.parametrize('entry, first_index', LINEN_ENTRY_POINTS)
def test_concrete_true_raises_as_upstream(entry, first_index):
  remat = entry(MLP, concrete=True)
  with pytest.raises(NotImplementedError, match='concrete'):
    remat().init(jax.random.key(0), X, True)


# -- lift ----------------------------------------------------------------------


def dense(scope, x, activation='relu', *, negate=False):
  w = scope.param('w', nn.initializers.lecun_normal(), (x.shape[-1], 2))
  y = x @ w
  y = jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)
  return -y if negate else y


LIFT_CALLS = [
    pytest.param((X, 'tanh'), {'negate': True}, id='positional'),
    pytest.param((X,), {'activation': 'tanh', 'negate': True}, id='keyword'),
    pytest.param((X,), {}, id='omitted'),
]


@pytest.mark.parametrize('args, kwargs', LIFT_CALLS)
@pytest.mark.parametrize(
    'static',
    [
        {'static_argnames': ('activation', 'negate')},
        {'static_argnums': 1, 'static_argnames': 'negate'},
        {'static_argnums': -1, 'static_argnames': ['negate']},
    ],
    ids=['names', 'index+name', 'negative+name'],
)
@pytest.mark.parametrize('entry', LIFT_ENTRY_POINTS)
def test_lift_checkpoint_static_however_passed(entry, static, args, kwargs):
  rematted = entry(dense, **static)
  key = jax.random.key(0)
  y, variables = flax.core.init(rematted)(key, *args, **kwargs)
  y_ref, variables_ref = flax.core.init(dense)(key, *args, **kwargs)
  np.testing.assert_array_equal(y, y_ref)
  jax.tree_util.tree_map(np.testing.assert_array_equal, variables, variables_ref)

  def loss(fn):
    return lambda v: flax.core.apply(fn)(v, *args, **kwargs).sum()

  grads = jax.grad(loss(rematted))(variables)
  assert_trees_close(grads, jax.grad(loss(dense))(variables))
  assert _primitives(jax.make_jaxpr(jax.grad(loss(rematted)))(variables)) & (
      REMAT_PRIMITIVES
  )


@pytest.mark.parametrize('entry', LIFT_ENTRY_POINTS)
def test_lift_checkpoint_decorator_factory(entry):
  rematted = entry(static_argnames='activation')(dense)
  y, _ = flax.core.init(rematted)(jax.random.key(0), X, activation='tanh')
  y_ref, _ = flax.core.init(dense)(jax.random.key(0), X, activation='tanh')
  np.testing.assert_array_equal(y, y_ref)


def splat(scope, *args, **kwargs):
  return dense(scope, *args, **kwargs)


@pytest.mark.parametrize(
    'static, args, kwargs',
    [
        ({'static_argnums': 1}, (X, 'tanh'), {}),
        # Flax's meaning: -3 + 2 is the last of jax.checkpoint's arguments.
        ({'static_argnums': -3}, (X, 'tanh'), {}),
        ({'static_argnames': 'activation'}, (X,), {'activation': 'tanh'}),
        ({'static_argnames': 'negate'}, (X,), {'negate': True}),
        ({'static_argnames': 'negate'}, (X,), {}),
    ],
    ids=['index', 'negative', 'name', 'keyword-only name', 'name omitted'],
)
def test_lift_checkpoint_through_star_args(static, args, kwargs):
  # A function that only forwards *args/**kwargs: indices count the
  # arguments of each call, names match keyword arguments.
  rematted = ext_lift.checkpoint(splat, **static)
  y, _ = flax.core.init(rematted)(jax.random.key(0), *args, **kwargs)
  y_ref, _ = flax.core.init(dense)(jax.random.key(0), *args, **kwargs)
  np.testing.assert_array_equal(y, y_ref)

