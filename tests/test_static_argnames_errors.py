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

"""Static-argument mistakes fail with messages in the user's own terms.

What still has to fail does so with the parameter names of the user's
signature, the nearest match, and the signature numbered the way the entry
point that was called counts.
"""

import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from flax_tieext import lift as ext_lift
from flax_tieext import linen as ext_nn
from flax_tieext import _static_args_diagnostics as diagnostics
from flax_tieext.core._static_args import StaticArgs
from static_models import ENTRIES, MLP, X, Configured, Star, raised
from tie_models import assert_message_names

# The messages are the patch's (install() binds the diagnostics), also for
# the transforms under the package's own names.
pytestmark = pytest.mark.installs_patch

# The entry points by how they count: with `self` as 0, or from after it.
COUNTS_SELF = [pytest.param(ext_nn.checkpoint, id='nn.checkpoint')]
SKIPS_SELF = [pytest.param(ext_nn.partitioning.remat, id='nn.partitioning.remat')]


def _assert_numbered(message, rows):
  """Asserts the numbered signature listing shows ``rows`` (index, text)."""
  for index, text in rows:
    assert re.search(rf'^\s+{re.escape(index)}\s.*{re.escape(text)}', message, re.M), (
        index, text, message)


# -- mistakes in the arguments: at the first call, as jax.checkpoint's -------
# Wrapping fails only where plain Flax's does (nn.checkpoint shifts the
# indices when it wraps); the first call raises, naming the parameter.


def _init(remat, *args, **kwargs):
  return remat().init(jax.random.key(0), X, *args, **kwargs)


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_unknown_name_lists_parameters_and_nearest_match(entry):
  remat = entry(MLP, static_argnames='determinstic')  # wrapping works
  message = raised(ValueError, _init, remat)
  assert_message_names(message, "'determinstic'",
                       'MLP.__call__(self, x, deterministic=False)',
                       "Did you mean static_argnames='deterministic'?",
                       'x, deterministic')


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_unknown_name_in_decorator_form_fails_at_the_first_call(entry):

  class Decorated(nn.Module):  # defining the class works, as on plain Flax

    @entry(static_argnames='determinstc')
    @nn.compact
    def __call__(self, x, deterministic=False):
      return x

  with pytest.raises(ValueError, match="Did you mean static_argnames='deterministic'"):
    Decorated().init(jax.random.key(0), X)


@pytest.mark.parametrize('entry, first_index', ENTRIES)
def test_index_out_of_range_shows_the_entry_points_numbering(entry, first_index):
  index = first_index + 2  # one past `deterministic`
  message = raised(ValueError, _init, entry(MLP, static_argnums=index))
  assert f'index {index} is out of range' in message
  if first_index:
    assert 'nn.checkpoint (nn.remat) counts `self` as 0' in message
  else:
    assert 'nn.partitioning.remat does not count `self`' in message
  _assert_numbered(message, [('0' if first_index else '-', 'self'),
                             (f'{first_index}', 'x'),
                             (f'{first_index + 1}', 'deterministic=False')])
  assert "static_argnames='deterministic'" in message


@pytest.mark.parametrize('entry', COUNTS_SELF)
def test_index_of_self_makes_nothing_static_as_in_flax(entry):
  # nn.remat counts `self` as 0; Flax accepts static_argnums=0 (the module is
  # passed on by the transform anyway), and so do we: the same results.
  variables = nn.Dense(4).init(jax.random.key(0), X)
  remat = entry(nn.Dense, static_argnums=0)
  assert jnp.array_equal(remat(4).apply(variables, X),
                         nn.Dense(4).apply(variables, X))


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_self_cannot_be_named(entry):
  remat = entry(MLP, static_argnames='self')
  with pytest.raises(ValueError, match="contains 'self'"):
    _init(remat)


@pytest.mark.parametrize('entry', COUNTS_SELF)
def test_static_argnums_of_wrong_type(entry):
  for kwargs, error in (
      ({'static_argnums': 'deterministic'}, 'static_argnums must be an int'),
      ({'static_argnums': None}, 'static_argnums must be an int'),
      ({'static_argnames': 2}, 'static_argnames must be a str'),
  ):
    # Where Flax raises: nn.checkpoint shifts static_argnums when it wraps
    # (a str fails there), the rest fails at the first call; the message (or
    # its note) says what was expected.
    with pytest.raises(TypeError, match=error):
      _init(entry(MLP, **kwargs))


class TwoMethods(nn.Module):

  @nn.compact
  def __call__(self, x, deterministic=False):
    return x

  def encode(self, x, *, mode='tanh'):
    return x


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_methods_list_name_must_exist_in_some_method(entry):
  remat = entry(TwoMethods, static_argnames='mode', methods=['__call__', 'encode'])
  remat().init(jax.random.key(0), X)  # `mode` is a parameter of encode
  remat = entry(TwoMethods, static_argnames='mdoe', methods=['__call__', 'encode'])
  for _ in range(2):  # at every call, never ignored after the first
    with pytest.raises(ValueError, match="Did you mean static_argnames='mode'"):
      remat().init(jax.random.key(0), X)


def test_lift_unknown_name_lists_parameters():
  def fn(scope, x, *, train=False):
    return x

  rematted = ext_lift.checkpoint(fn, static_argnames='trian')
  message = raised(ValueError, flax.core.init(rematted), jax.random.key(0), X)
  assert_message_names(message, 'lift.checkpoint',
                       "Did you mean static_argnames='train'?",
                       'x, train')


def test_lift_index_out_of_range_counts_from_after_scope():
  def fn(scope, x, train=False):
    return x

  rematted = ext_lift.checkpoint(fn, static_argnums=2)
  message = raised(ValueError, flax.core.init(rematted), jax.random.key(0), X)
  assert 'does not count `scope`' in message
  _assert_numbered(message, [('0', 'x'), ('1', 'train=False')])


@pytest.mark.parametrize('entry, index, deterministic', [
    pytest.param(ext_nn.checkpoint, -3, '2', id='nn.checkpoint-3'),
    pytest.param(ext_nn.checkpoint, 0, '2', id='nn.checkpoint0'),
    pytest.param(ext_nn.partitioning.remat, -3, '1',
                 id='nn.partitioning.remat-3'),
])
def test_index_of_self_with_names_raises(entry, index, deterministic):
  # With static_argnames (ours: plain Flax has none), an index is resolved
  # through the signature; one that lands on `self` made nothing static.
  remat = entry(MLP, static_argnums=index, static_argnames='deterministic')
  message = raised(ValueError, _init, remat, True)
  assert_message_names(
      message, f'static_argnums index {index} is `self` of MLP.__call__',
      'it cannot be static')
  _assert_numbered(message, [(deterministic, '-1  deterministic=False')])
  assert "static_argnames='" in message


@pytest.mark.parametrize('entry', SKIPS_SELF)
def test_negative_index_without_names_keeps_flax_meaning_and_says_it(entry):
  # Plain Flax's nn.partitioning.remat ignores a negative index (it matches
  # no argument): the same error as there, whose note says so.
  remat = entry(MLP, static_argnums=(-1,))
  message = raised(jax.errors.ConcretizationTypeError, _init, remat, True)
  assert 'ignores an index that matches no argument' in message
  assert 'jax.checkpoint counts it' not in message


def test_lift_index_of_scope_with_names_raises():
  def fn(scope, x, flag):
    return x if flag else -x

  rematted = ext_lift.checkpoint(fn, static_argnums=-3, static_argnames='x')
  message = raised(ValueError, flax.core.init(rematted), jax.random.key(0), X,
                   True)
  assert_message_names(
      message, 'static_argnums index -3 is `scope` of fn(scope, x, flag)',
      'it cannot be static')
  _assert_numbered(message, [('-', 'scope    (cannot be static)'),
                             ('1', '-1  flag')])


# -- at call time --------------------------------------------------------------


@pytest.mark.parametrize('entry, first_index', ENTRIES)
def test_off_by_one_index_names_hit_and_meant_parameters(entry, first_index):
  # Field failure: static_argnums=1 with nn.remat makes `x` static (self is
  # 0) and then fails with TracerBoolConversionError on `deterministic`. In
  # nn.partitioning.remat, which does not count self, the mistake is 0.
  remat = entry(MLP, static_argnums=first_index)
  message = raised(jax.errors.ConcretizationTypeError, _init, remat, True)
  assert_message_names(
      message, '`x` of MLP.__call__(self, x, deterministic=False) is static',
      'array of shape (2, 3)', 'Did you mean `deterministic`?',
      f'static_argnums={first_index + 1}', "static_argnames='deterministic'")
  _assert_numbered(
      message, [(f'{first_index}', f'x    (<- static_argnums index {first_index})')])


class Block(nn.Module):
  """openpi's block: static_argnums=(5,) was meant to be 6 (self is 0)."""

  @nn.compact
  def __call__(self, xs, kv_cache, positions, attn_mask, adarms_cond,
               deterministic=True):
    y = nn.Dropout(0.1, deterministic=deterministic)(nn.Dense(4)(xs))
    if adarms_cond is not None:
      y = y + adarms_cond
    return xs + y


def test_openpi_off_by_one_with_array_names_both_parameters():
  remat = ext_nn.remat(Block, static_argnums=(5,))
  message = raised(jax.errors.ConcretizationTypeError, remat().init,
                   jax.random.key(0), X[:, :2].repeat(2, 1), None, None, None,
                   jnp.ones((2, 4)), True)
  assert_message_names(message, '`adarms_cond`',
                       'Did you mean `deterministic`?',
                       'static_argnums=6')


def test_openpi_off_by_one_with_none_explains_traced_flag():
  # adarms_cond=None is a fine static value; then `deterministic` is traced
  # and JAX's error gets a note naming it and its index.
  remat = ext_nn.remat(Block, static_argnums=(5,))
  xs = jnp.ones((2, 4))
  message = raised(jax.errors.ConcretizationTypeError, remat().init,
                   jax.random.key(0), xs, None, None, None, None, True)
  assert_message_names(message, 'deterministic=True',
                       "static_argnames='deterministic'",
                       '`adarms_cond` (static_argnums index 5)',
                       '`deterministic` is static_argnums=6')


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_traced_python_bool_keeps_jax_error_type_and_names_parameter(entry):
  # Without static arguments this is upstream's error (TracerBoolConversionError
  # on recent JAX, its base ConcretizationTypeError on older releases); it now
  # also says which argument and how to fix it.
  remat = entry(MLP)
  for call in (
      lambda: remat().init(jax.random.key(0), X, True),
      lambda: remat().init(jax.random.key(0), X, deterministic=True),
  ):
    message = raised(jax.errors.ConcretizationTypeError, call)
    assert_message_names(message, 'deterministic=True',
                         "static_argnames='deterministic'")


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_str_to_traced_argument_names_it(entry):
  remat = entry(Configured, static_argnames='layers')
  message = raised(TypeError, _init, remat, mode='linear')
  assert_message_names(message, '`mode`',
                       "static_argnames='mode'")


def test_lift_array_in_static_slot_is_accepted_and_named_when_a_flag_fails():
  # An array is a valid static value (closed over, as Flax accepts it) ...
  def identity(scope, x, train=False):
    return x

  rematted = ext_lift.checkpoint(identity, static_argnums=0)
  y, _ = flax.core.init(rematted)(jax.random.key(0), X, True)
  assert jnp.array_equal(y, X)

  # ... and named when the traced flag it displaced fails.
  def fn(scope, x, train=False):
    return x * 2 if train else x

  rematted = ext_lift.checkpoint(fn, static_argnums=0)
  message = raised(jax.errors.ConcretizationTypeError, flax.core.init(rematted),
                   jax.random.key(0), X, True)
  assert_message_names(message, '`x` of fn(scope, x, train=False) is static',
                       'Did you mean `train`?',
                       'static_argnums=1')


def test_star_args_index_past_the_call_is_out_of_range():
  def fn(scope, *args):
    return args[0]

  rematted = ext_lift.checkpoint(fn, static_argnums=3)
  with pytest.raises(ValueError, match='index 3 is out of range for this call'):
    flax.core.init(rematted)(jax.random.key(0), X)


def test_note_is_appended_to_the_message_without_add_note():
  # Python 3.10 has no BaseException.add_note: the hint goes into the message.
  class OldStyleError(TypeError):
    add_note = property(lambda self: (_ for _ in ()).throw(AttributeError))

  def fn(scope, x, train=False):
    return x

  error = OldStyleError('Attempted boolean conversion of traced array.')
  diagnostics._explain_concretization_error(StaticArgs(fn), error, (X, True), {})
  assert str(error).startswith('Attempted boolean conversion')
  assert "static_argnames='train'" in str(error)


class Masked(nn.Module):

  @nn.compact
  def __call__(self, x, mask=None, deterministic=False):
    return nn.Dropout(0.5, deterministic=deterministic)(x)


@pytest.mark.parametrize('entry', COUNTS_SELF + SKIPS_SELF)
def test_named_static_array_works_as_in_flax_and_is_named_when_it_fails(entry):
  # A static array is accepted (Flax's remat accepts it too) ...
  remat = entry(Masked, static_argnames='mask')
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  variables = remat().init(rngs, X, X)
  dropout = {'dropout': jax.random.key(2)}
  assert jnp.array_equal(remat().apply(variables, X, X, rngs=dropout),
                         Masked().apply(variables, X, X, rngs=dropout))
  # ... and named in the note when the traced flag beside it fails.
  message = raised(jax.errors.ConcretizationTypeError, remat().init, rngs, X, X,
                   True)
  assert_message_names(message, '`mask` of Masked.__call__',
                       'Remove `mask` from static_argnames',
                       "static_argnames='deterministic'")


# -- following the advice works ------------------------------------------------
# Each message above tells the user what to write. Here every suggestion a
# message makes is applied as written, and the result must then compute what
# the plain, unrematted module computes.

def _suggestions(message):
  """Every `static_argnames=...` / `static_argnums=...` the message suggests."""
  import ast  # pylint: disable=g-import-not-at-top

  found = re.findall(
      r"\b(static_arg(?:names|nums))=('[^']*'|\([^)]*\)|\d+)(?=[.?\s,)]|$)",
      message,
  )
  assert found, f'no suggestion in:\n{message}'
  return [{kind: ast.literal_eval(code)} for kind, code in dict.fromkeys(found)]


def _assert_matches_plain(module, remat, args, kwargs):
  """remat(module) initializes and applies like module itself."""
  variables = remat().init(jax.random.key(0), X, *args, **kwargs)
  rngs = {'dropout': jax.random.key(1)}
  np_y = module().apply(variables, X, *args, rngs=rngs, **kwargs)
  y = remat().apply(variables, X, *args, rngs=rngs, **kwargs)
  assert jnp.array_equal(y, np_y)


# (id, module, wrong arguments given first_index, call args, call kwargs)
ADVICE_CASES = [
    ('misspelt name', MLP, lambda i: {'static_argnames': 'determinstic'}, (True,), {}),
    ('index out of range', MLP, lambda i: {'static_argnums': 5}, (True,), {}),
    ('off-by-one index', MLP, lambda i: {'static_argnums': i}, (True,), {}),
    ('traced python flag', MLP, lambda i: {}, (), {'deterministic': True}),
    ('named array', Masked, lambda i: {'static_argnames': 'mask'}, (X, True), {}),
    ('traced flag in *args', Star, lambda i: {}, (False,), {}),
    ("'*args[0]' as a name", Star,
     lambda i: {'static_argnames': '*args[0]'}, (False,), {}),
]


@pytest.mark.parametrize('entry, first_index', ENTRIES)
@pytest.mark.parametrize(
    'module, wrong, args, kwargs',
    [pytest.param(*case[1:], id=case[0]) for case in ADVICE_CASES],
)
def test_every_suggested_fix_works(entry, first_index, module, wrong, args, kwargs):
  message = raised((ValueError, TypeError), _init, entry(module, **wrong(first_index)),
                   *args, **kwargs)
  for fix in _suggestions(message):
    _assert_matches_plain(module, entry(module, **fix), args, kwargs)


@pytest.mark.parametrize('entry, first_index', ENTRIES)
def test_str_in_traced_argument_fix_works_next_to_existing_names(entry, first_index):
  remat = entry(Configured, static_argnames='layers')
  (fix,) = _suggestions(raised(TypeError, _init, remat, mode='linear'))
  fixed = entry(Configured, static_argnames=('layers', fix['static_argnames']))
  _assert_matches_plain(Configured, fixed, (), {'mode': 'linear'})


@pytest.mark.parametrize('entry, first_index', ENTRIES)
def test_scalar_array_in_static_slot_fix_pass_python_value_works(entry, first_index):
  # A concrete scalar array is a valid static value (Flax accepts it) ...
  remat = entry(MLP, static_argnames='deterministic')
  variables = remat().init(jax.random.key(0), X, jnp.array(True))
  assert jnp.array_equal(remat().apply(variables, X, jnp.array(True)),
                         MLP().apply(variables, X, True))
  _assert_matches_plain(MLP, remat, (True,), {})
  # ... and when it fails (traced by a jit around it), the note says to pass
  # a Python value.
  assert '`deterministic=True`' in raised(
      jax.errors.ConcretizationTypeError,
      jax.jit(lambda v, d: remat().apply(v, X, d)), variables, jnp.array(True))


@pytest.mark.parametrize('entry, first_index', ENTRIES)
def test_flag_traced_by_outer_jit_names_the_outer_jit(entry, first_index):
  remat = entry(MLP, static_argnames='deterministic')
  variables = remat().init(jax.random.key(0), X, True)

  def train_step(variables, x, deterministic):
    return remat().apply(variables, x, deterministic)

  message = raised(jax.errors.ConcretizationTypeError, jax.jit(train_step),
                   variables, X, True)
  assert_message_names(
      message, "jax.jit(train_step, static_argnames='deterministic')",
      '`deterministic=True`')
  reference = MLP().apply(variables, X, True)
  # Followed at the outer jit, by name or by position ...
  for outer in (
      jax.jit(train_step, static_argnames='deterministic'),
      jax.jit(train_step, static_argnums=2),
  ):
    assert jnp.array_equal(outer(variables, X, True), reference)
  # ... or with a Python value instead of an argument of the traced function.
  step = jax.jit(lambda variables, x: train_step(variables, x, deterministic=True))
  assert jnp.array_equal(step(variables, X), reference)


@pytest.mark.parametrize('entry, first_index', ENTRIES)
def test_compact_above_checkpoint_fails_as_upstream_and_swapped_works(
    entry, first_index):
  # @nn.compact above a lifted transform marks Flax's wrapper, not the method:
  # Flax's own AssignSubModuleError, for every lifted transform alike ...

  class CompactAbove(nn.Module):

    @nn.compact
    @entry(static_argnames='deterministic')
    def __call__(self, x, deterministic=False):
      return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))

  message = raised(flax.errors.AssignSubModuleError, _init, CompactAbove, True)
  # ... with a note that says to swap the decorators.
  assert_message_names(message, 'decorated with @nn.compact above',
                       'swap the two decorators')

  class Swapped(nn.Module):  # the documented order

    @entry(static_argnames='deterministic')
    @nn.compact
    def __call__(self, x, deterministic=False):
      return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))

  variables = Swapped().init(jax.random.key(0), X, True)
  assert jnp.array_equal(
      Swapped().apply(variables, X, True), MLP().apply(variables, X, True)
  )


def test_lift_star_args_note_suggests_an_index_that_works():
  def fn(scope, x, *args):
    (train,) = args
    return x * 2 if train else x

  (fix,) = _suggestions(raised(jax.errors.ConcretizationTypeError,
                               flax.core.init(ext_lift.checkpoint(fn)),
                               jax.random.key(0), X, True))
  assert fix == {'static_argnums': 1}
  y, _ = flax.core.init(ext_lift.checkpoint(fn, **fix))(jax.random.key(0), X, True)
  assert jnp.array_equal(y, X * 2)
