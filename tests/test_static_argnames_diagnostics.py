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

"""The plugin's static-argument diagnostics in Linen and the functional core.

Flax's test style (the classes were PR 10 of the second edition of the
upstream series); the third edition keeps only the "did you mean" of PR 02
upstream, and these messages stay in the plugin
(``flax_tieext/_static_args_diagnostics.py``).
"""

import itertools
import re

from absl.testing import parameterized
from flax import linen as nn
from flax.core import init, lift
from flax.linen import partitioning

import jax
from jax import random
import jax.numpy as jnp
import numpy as np

import flax_tieext  # noqa: F401  (installs the features into Flax)
import static_models


class LiftCheckpointDiagnosticsTest(parameterized.TestCase):

  @staticmethod
  def dense(scope, x, activation='relu'):
    w = scope.param('w', jax.nn.initializers.normal(), (x.shape[-1], 2))
    y = x @ w
    return jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)

  def test_unknown_name_suggests_parameter(self):
    rematted = lift.checkpoint(self.dense, static_argnames='activaton')
    with self.assertRaisesRegex(
        ValueError, "'activaton'(.|\n)*Did you mean static_argnames='activation'"
    ):
      init(rematted)(random.key(0), jnp.ones((1, 3)))

  def test_out_of_range_index_shows_numbering(self):
    rematted = lift.checkpoint(self.dense, static_argnums=2)
    with self.assertRaisesRegex(
        ValueError, 'index 2 is out of range(.|\n)*  1 +activation'
    ):
      init(rematted)(random.key(0), jnp.ones((1, 3)))

  def test_out_of_range_index_numbering_marks_the_names_given_too(self):
    def dense(scope, x, activation='relu', mode=None):
      return self.dense(scope, x, activation)

    rematted = lift.checkpoint(
        dense, static_argnums=5, static_argnames='activation')
    with self.assertRaisesRegex(
        ValueError, "activation='relu' +\\(static\\)(.|\n)*"
        "static_argnames='mode'"):
      init(rematted)(random.key(0), jnp.ones((1, 3)))

  def test_array_for_static_argument_works_and_is_named_when_it_fails(self):
    # An array is a valid static value (closed over, as Flax accepts it): the
    # result is the unrematted function's.
    rematted = lift.checkpoint(self.dense, static_argnames='activation')
    x = jnp.ones((1, 3))
    y, variables = init(rematted)(random.key(0), x, activation=x)
    expected, expected_variables = init(self.dense)(
        random.key(0), x, activation=x)
    np.testing.assert_allclose(y, expected)
    np.testing.assert_allclose(
        variables['params']['w'], expected_variables['params']['w'])

    # Used as a flag it fails as without remat, and the note names it.
    def gate(scope, x, activation='relu'):
      del scope
      return jax.nn.relu(x) if activation else x

    x = jnp.ones((2, 3))
    with self.assertRaises(ValueError) as plain:
      init(gate)(random.key(0), x, activation=x)
    with self.assertRaises(ValueError) as e:
      init(lift.checkpoint(gate, static_argnames='activation'))(
          random.key(0), x, activation=x)
    self.assertEqual(str(e.exception).split('\n')[0],
                     str(plain.exception).split('\n')[0])
    self.assertRegex(
        static_models.shown(e.exception),
        '`activation`.* received an array')

  def test_traced_python_flag_gets_a_note(self):
    def dense(scope, x, relu=True):
      return jax.nn.relu(x) if relu else x

    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      init(lift.checkpoint(dense))(random.key(0), jnp.ones(2), True)
    self.assertIn("static_argnames='relu'", '\n'.join(e.exception.__notes__))


class LinenCheckpointDiagnosticsTest(parameterized.TestCase):

  MLP = static_models.MLP
  Star = static_models.Star

  class Configured(nn.Module):
    # pylint: disable=dangerous-default-value

    @nn.compact
    def __call__(self, x, layers=[4], train=False, *, mode='relu'):
      for width in layers:
        x = nn.Dense(width)(x)
      x = jax.nn.relu(x) if mode == 'relu' else jnp.tanh(x)
      return nn.Dropout(0.5, deterministic=not train)(x)

  class Masked(nn.Module):

    @nn.compact
    def __call__(self, x, masks=(), deterministic=False):
      x = nn.Dense(4)(x)
      for mask in masks:
        x = x * mask
      return nn.Dropout(0.5, deterministic=deterministic)(x)

  class TwoMethods(nn.Module):

    @nn.compact
    def __call__(self, x, deterministic=False):
      return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))

    def encode(self, x, *, mode='relu'):
      return jax.nn.relu(x) if mode == 'relu' else jnp.tanh(x)

  # (test name, remat, its name in messages, the static_argnums index of the
  # first argument after `self`: nn.checkpoint counts `self`, partitioning
  # does not)
  ENTRY_POINTS = (
      ('checkpoint', nn.checkpoint, r'nn\.checkpoint \(nn\.remat\)', 1),
      ('partitioning', partitioning.remat, r'nn\.partitioning\.remat', 0),
  )

  @staticmethod
  def init_error(error_type, module, *args, **kwargs):
    """What is shown of the ``error_type`` that ``module().init`` raises."""
    return static_models.raised(error_type, module().init, random.key(0),
                                jnp.ones((2, 3)), *args, **kwargs)

  def assert_matches_plain(self, module, rematted, *args, **kwargs):
    """``rematted`` initializes and applies as ``module`` does."""
    x = jnp.ones((2, 3))
    rngs = {'params': random.key(0), 'dropout': random.key(1)}
    variables = rematted().init(rngs, x, *args, **kwargs)
    jax.tree.map(
        np.testing.assert_array_equal,
        variables,
        module().init(rngs, x, *args, **kwargs),
    )
    rngs = {'dropout': random.key(2)}
    np.testing.assert_allclose(
        rematted().apply(variables, x, *args, rngs=rngs, **kwargs),
        module().apply(variables, x, *args, rngs=rngs, **kwargs),
    )

  def test_unknown_name_suggests_parameter(self):
    rematted = nn.remat(self.MLP, static_argnames='determinstic')
    with self.assertRaisesRegex(
        ValueError, "'determinstic'(.|\n)*'deterministic'"):
      rematted().init(random.key(0), jnp.ones((2, 3)))

  @parameterized.named_parameters(
      ('checkpoint', nn.checkpoint, 1), ('partitioning', partitioning.remat, 0))
  def test_off_by_one_index_names_the_flag(self, remat, first_index):
    # `x` static is accepted; the flag it displaced is traced and fails in
    # JAX, whose error gets the note.
    rematted = remat(self.MLP, static_argnums=first_index)
    self.assertRegex(
        self.init_error(jax.errors.ConcretizationTypeError, rematted, True),
        f'`x` of .* is static(.|\n)*static_argnums={first_index + 1}'
        "(.|\n)*static_argnames='deterministic'")

  def test_flag_traced_by_outer_jit(self):
    rematted = nn.remat(self.MLP, static_argnames='deterministic')
    x = jnp.ones((2, 3))
    variables = rematted().init(random.key(0), x, True)
    step = jax.jit(lambda v, x, deterministic: rematted().apply(
        v, x, deterministic))
    self.assertRegex(
        static_models.raised(jax.errors.ConcretizationTypeError, step,
                             variables, x, True),
        "jax.jit\\(train_step, static_argnames='deterministic'\\)")

  # (test name, module, static_argnames, methods, the message after
  # "<entry point>: static_argnames contains ")
  REFUSED_NAMES = (
      ('unknown_name_lists_what_can_be_static', 'Configured', 'mdoe', None,
       r"'mdoe', which is not a parameter of \S*Configured\.__call__\(self, x,"
       r" layers=\[4\], train=False, \*, mode='relu'\)\.\n"
       r"Did you mean static_argnames='mode'\?\n"
       r'The parameters that can be static are: x, layers, train, mode\.$'),
      ('self_cannot_be_named', 'MLP', 'self', None,
       r"'self', the first parameter of \S*MLP\.__call__\(self, x,"
       r' deterministic=False\)\. The transform passes it on by itself; it'
       r' cannot be static\. Remove it from static_argnames\.$'),
      ('name_in_no_wrapped_method_lists_them_all', 'TwoMethods', 'mdoe',
       ['__call__', 'encode'],
       r"'mdoe', which is not a parameter of any of the wrapped methods:\n"
       r'  \S*TwoMethods\.__call__\(self, x, deterministic=False\)\n'
       r"  \S*TwoMethods\.encode\(self, x, \*, mode='relu'\)\n"
       r"Did you mean static_argnames='mode'\?\n"
       r'The parameters that can be static are: x, deterministic, mode\.$'),
  )

  @parameterized.named_parameters(
      (f'{case[0]}_{entry[0]}', *entry[1:3], *case[1:])
      for case, entry in itertools.product(REFUSED_NAMES, ENTRY_POINTS))
  def test_refused_name(self, remat, name, module, names, methods, message):
    with self.assertRaisesRegex(
        ValueError, f'^{name}: static_argnames contains {message}'):
      remat(getattr(self, module), static_argnames=names, methods=methods)(
          ).init(random.key(0), jnp.ones((2, 3)))

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_out_of_range_index_numbers_the_signature(self, remat, name, first):
    # One past `train`, the last positional parameter.
    head = ('counts `self` as 0 in static_argnums' if first else
            'does not count `self` in static_argnums; the first argument'
            ' after it is 0')
    with self.assertRaisesRegex(
        ValueError,
        f'^{name}: static_argnums index {first + 3} is out of range for'
        r' \S*Configured\.__call__\(.*\)\.\n'
        f'{name} {head}:\n'
        f' +{"0" if first else "-"} +self +\\(cannot be static\\)\n'
        f' +{first} +x\n'
        f' +{first + 1} +layers=\\[4\\]\n'
        f' +{first + 2} +train=False\n'
        r" +- +mode='relu' +\(by name only\)\n"
        'Name the argument instead of counting, which also covers keyword'
        " and omitted calls: static_argnames='train'\\.$"):
      remat(self.Configured, static_argnums=first + 3)().init(
          random.key(0), jnp.ones((2, 3)))

  @parameterized.named_parameters(
      ('checkpoint_self', nn.checkpoint, r'nn\.checkpoint \(nn\.remat\)', 0),
      ('checkpoint_negative', nn.checkpoint,
       r'nn\.checkpoint \(nn\.remat\)', -3),
      # The last parameter counted from the end, as jax.jit would count it.
      ('checkpoint_last', nn.checkpoint, r'nn\.checkpoint \(nn\.remat\)',
       -1),
      # A bare int is Flax's TypeError in nn.partitioning.remat: a tuple.
      ('partitioning_negative', partitioning.remat, r'nn\.partitioning\.remat',
       (-3,)),
  )
  def test_index_of_self_makes_nothing_static_as_in_flax(
      self, remat, name, index):
    # An index of `self`, or a negative one, keeps Flax's meaning: it makes
    # no parameter static. The results are the plain module's ...
    rematted = remat(self.MLP, static_argnums=index)
    self.assert_matches_plain(self.MLP, rematted)
    # ... and the flag meant to be static is traced, as in Flax; the notes
    # on JAX's error name it, passed positionally or by keyword.
    for args, kwargs in (((True,), {}), ((), {'deterministic': True})):
      self.assertRegex(
          self.init_error(jax.errors.ConcretizationTypeError, rematted, *args,
                          **kwargs),
          f'(?m)^{name}: static_argnums={re.escape(repr(index))} names no'
          " parameter here(.|\n)*Flax's own meaning(.|\n)*Name the argument"
          ' instead of counting, which also covers keyword and omitted'
          " calls: static_argnames='deterministic'\\.\n"
          f'{name}: \\S*MLP\\.__call__ was called with the Python value'
          ' deterministic=True, but `deterministic` is not static, so it was'
          ' traced like an array\\.(.|\n)* make it static:'
          " static_argnames='deterministic'\\. A named argument is static"
          ' however it is passed: positionally, by keyword, or left to its'
          ' default\\.$')

  @parameterized.named_parameters(
      ('args', 'args', r'the \*args parameter(.|\n)*or use static_argnums'),
      ('kwargs', 'kwargs',
       r'the \*\*kwargs parameter(.|\n)*name the individual keyword'
       r' arguments instead\.$'),
  )
  def test_star_parameter_cannot_be_static_as_a_whole(self, param, what):
    rematted = nn.remat(self.Star, static_argnames=param)
    with self.assertRaisesRegex(ValueError, f"'{param}', {what}"):
      rematted().init(random.key(0), jnp.ones((2, 3)), False)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_extra_positional_flag_is_static_by_index(self, remat, name, first):
    # `x` is `first`; what *args collects comes after it.
    index = first + 1
    with self.assertRaisesRegex(
        ValueError,
        r"'\*args\[0\]', which is not a parameter name of \S*Star\.__call__"
        '(.|\n)* make it static by position with'
        f' static_argnums={index}\\.\n{name}'):
      remat(self.Star, static_argnames='*args[0]')().init(
          random.key(0), jnp.ones((2, 3)), False)
    self.assertRegex(
        self.init_error(
            jax.errors.ConcretizationTypeError, remat(self.Star), False),
        r'the Python value \*args\[0\]=False, but `\*args\[0\]` is not'
        f'(.|\n)*make it static: static_argnums={index}\\.')
    self.assert_matches_plain(
        self.Star, remat(self.Star, static_argnums=index), True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_arguments_of_the_wrong_type(self, remat, name, first):
    x = jnp.ones((2, 3))
    if first == 0:
      # nn.partitioning.remat sorts the str and finds no index in it: the
      # call works, as in Flax, with nothing static.
      self.assert_matches_plain(
          self.MLP, remat(self.MLP, static_argnums='deterministic'))
    else:
      self.assert_wrong_static_argnums_type_explained(remat, name, x)
    rematted = remat(self.MLP, static_argnames=('deterministic', 2))
    with self.assertRaisesRegex(
        TypeError,
        f'^{name}: static_argnames must be a str or a sequence of str, got'
        r" \('deterministic', 2\)\.$"):
      rematted().init(random.key(0), x)

  def assert_wrong_static_argnums_type_explained(self, remat, name, x):
    # Flax's own TypeError, where Flax raises it (nn.checkpoint shifts the
    # indices when it wraps), with a note that names the fix.
    with self.assertRaises(TypeError) as e:
      remat(self.MLP, static_argnums='deterministic')().init(
          random.key(0), x)
    self.assertRegex(
        static_models.shown(e.exception),
        f'\n{name}: static_argnums must be an int or a sequence of ints, got'
        " 'deterministic'. To make arguments static by name, use"
        ' static_argnames.$')

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_decorator_typo_fails_at_the_first_call(self, remat, name, first):
    del first

    class Model(nn.Module):  # defining the class works, as on plain Flax

      @remat(static_argnames='determinstic')
      @nn.compact
      def __call__(self, x, deterministic=False):
        return x

    with self.assertRaisesRegex(
        ValueError,
        f"^{name}: static_argnames contains 'determinstic', which is not a"
        r' parameter of Model\.__call__\(self, x, deterministic=False\)\.\n'
        "Did you mean static_argnames='deterministic'"):
      Model().init(random.key(0), jnp.ones((2, 3)))

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_decorated_method_off_by_one_names_the_flag(
      self, remat, name, first):
    def model(index):
      class Model(nn.Module):

        @remat(static_argnums=index)
        @nn.compact
        def __call__(self, x, deterministic=False):
          return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))

      return Model

    self.assertRegex(
        self.init_error(jax.errors.ConcretizationTypeError, model(first), True),
        f'(?m)^{name}: `x` of Model\\.__call__.* is static \\(static_argnums'
        f' index {first}\\), but it received an array of shape(.|\n)*'
        f'  {first} +x    \\(<- static_argnums index {first}\\)\n'
        '(.|\n)*Did you mean `deterministic`\\? In the numbering of'
        f' {name} that is static_argnums={first + 1}\\.')
    self.assert_matches_plain(self.MLP, model(first + 1), True)

  def test_methods_dict_numbers_without_self(self):
    # As upstream, the arguments of each method in a dict do not count self.
    def rematted(index):
      return nn.remat(
          self.TwoMethods, methods={'__call__': {'static_argnums': index}})

    self.assertRegex(
        self.init_error(jax.errors.ConcretizationTypeError, rematted(0), True),
        r"(?m)^nn\.checkpoint \(nn\.remat\) methods\['__call__'\]: `x` of"
        r' \S*TwoMethods\.__call__(.|\n)*does not count `self`(.|\n)*'
        r'Did you mean `deterministic`\? In the numbering of'
        r" nn\.checkpoint \(nn\.remat\) methods\['__call__'\] that is"
        ' static_argnums=1.')
    self.assert_matches_plain(self.TwoMethods, rematted(1), True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_array_for_named_static_argument(self, remat, name, first):
    del first
    mask = jnp.ones((2, 4))
    for masks in (mask, (mask,)):  # an array, or one inside a static tuple
      # A static array is accepted (closed over, as Flax accepts it) ...
      self.assert_matches_plain(
          self.Masked, remat(self.Masked, static_argnames='masks'), masks)
      # ... and named in the note when the traced flag beside it fails.
      message = self.init_error(jax.errors.ConcretizationTypeError,
                                remat(self.Masked, static_argnames='masks'),
                                masks, True)
      self.assertRegex(
          message,
          f'(?m)^{name}: `masks` of \\S*Masked\\.__call__\\(self, x,'
          r' masks=\(\), deterministic=False\) is static \(static_argnames\),'
          ' but it received an array')
      self.assertIn(
          f'an array of shape {mask.shape} and dtype {mask.dtype}', message)
      self.assertRegex(
          message,
          '(?m)Remove `masks` from static_argnames: arrays are traced. If you'
          " meant `deterministic`: static_argnames='deterministic'.$")
      self.assert_matches_plain(
          self.Masked, remat(self.Masked, static_argnames='deterministic'),
          masks, True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_scalar_array_says_pass_a_python_value(self, remat, name, first):
    del first

    class Gated(nn.Module):

      @nn.compact
      def __call__(self, x, deterministic=False, relu=True):
        x = nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))
        return jax.nn.relu(x) if relu else x

    rematted = remat(self.MLP, static_argnames='deterministic')
    gated = remat(Gated, static_argnames='deterministic')
    for flag in (jnp.array(True), np.array(True)):
      # A concrete scalar array is a valid static value (Flax accepts it) ...
      self.assert_matches_plain(self.MLP, rematted, flag)
      # ... and named, with the Python value to pass, when a traced flag
      # beside it fails.
      self.assertRegex(
          self.init_error(
              jax.errors.ConcretizationTypeError, gated, flag, True),
          f'(?m)^{name}: `deterministic` of \\S*Gated\\.__call__.* is static'
          r' \(static_argnames\), but it received an array of shape \(\) and'
          r' dtype bool(.|\n)*Pass a Python value \(`deterministic=True`,'
          r' not `jnp\.array\(True\)`\)')
    self.assert_matches_plain(self.MLP, rematted, True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_str_for_traced_argument_names_the_fix(self, remat, name, first):
    del first
    # JAX's own TypeError (not a valid JAX type), with the note.
    with self.assertRaisesRegex(TypeError, 'is not a valid JAX type') as e:
      remat(self.Configured, static_argnames='layers')().init(
          random.key(0), jnp.ones((2, 3)), mode='tanh')
    self.assertRegex(
        static_models.shown(e.exception),
        f'(?m)^{name}: `mode` of \\S*Configured\\.__call__\\(.*\\) received a'
        ' str, which JAX cannot trace. Make it static:'
        " static_argnames='mode'.$")
    self.assert_matches_plain(
        self.Configured,
        remat(self.Configured, static_argnames=('layers', 'mode')),
        mode='tanh')

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_traced_flag_note_keeps_the_error_type(self, remat, name, first):
    del first
    for args, kwargs in (((True,), {}), ((), {'deterministic': True})):
      self.assertRegex(
          self.init_error(jax.errors.ConcretizationTypeError, remat(self.MLP),
                          *args, **kwargs),
          f'{name}: \\S*MLP\\.__call__ was called with the Python value'
          ' deterministic=True, but `deterministic` is not static, so it was'
          ' traced like an array.(.|\n)* make it static:'
          " static_argnames='deterministic'. A named argument is static"
          ' however it is passed')
    self.assert_matches_plain(
        self.MLP, remat(self.MLP, static_argnames='deterministic'),
        deterministic=True)

  class Repeated(nn.Module):

    @nn.compact
    def __call__(self, x, num_layers=1):
      for _ in range(num_layers):
        x = nn.Dense(3)(x)
      return x

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_traced_count_note(self, remat, name, first):
    del first
    self.assertRegex(
        self.init_error(
            jax.errors.TracerIntegerConversionError, remat(self.Repeated), 2),
        f'{name}: \\S*Repeated\\.__call__ was called with the Python value'
        ' num_layers=2, but `num_layers` is not static(.|\n)*'
        " static_argnames='num_layers'")
    self.assert_matches_plain(
        self.Repeated, remat(self.Repeated, static_argnames='num_layers'),
        num_layers=2)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_traced_flag_note_counts_as_the_entry_point(self, remat, name, first):
    # `layers` is static by index, `train` after it is not.
    layers = first + 1
    self.assertRegex(
        self.init_error(jax.errors.ConcretizationTypeError,
                        remat(self.Configured, static_argnums=layers), [4],
                        True),
        f"static_argnames='train'.(.|\n)* Currently static: `layers`"
        f' \\(static_argnums index {layers}\\). In the numbering of {name},'
        f' `train` is static_argnums={layers + 1}\\.')
    self.assert_matches_plain(
        self.Configured,
        remat(self.Configured, static_argnums=(layers, layers + 1)),
        [4], True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_unhashable_static_value_is_not_an_array(self, remat, name, first):
    # A list is what jax.checkpoint takes as a static value; a list default
    # is not handed to it at all.
    del name, first
    rematted = remat(self.Configured, static_argnames='layers')
    self.assert_matches_plain(self.Configured, rematted)
    self.assert_matches_plain(self.Configured, rematted, [3, 2])
    self.assert_matches_plain(self.Configured, rematted, layers=[2])

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_flag_static_by_index_traced_by_outer_jit(self, remat, name, first):
    rematted = remat(self.MLP, static_argnums=first + 1)
    x = jnp.ones((2, 3))
    variables = rematted().init(random.key(0), x, True)

    def train_step(variables, x, deterministic):
      return rematted().apply(variables, x, deterministic)

    self.assertRegex(
        static_models.raised(jax.errors.ConcretizationTypeError,
                             jax.jit(train_step), variables, x, True),
        f'(?m)^{name}: `deterministic` of \\S*MLP\\.__call__.* is static'
        f' \\(static_argnums index {first + 1}\\), but it received an array'
        r' of shape \(\)(.|\n)*'
        f'  {first + 1} +deterministic=False    \\(<- static_argnums'
        f' index {first + 1}\\)\n'
        '`deterministic` is a traced scalar: a transform around this call,'
        ' such as `jax.jit`, traced it before it got here.(.|\n)*'
        r"`jax\.jit\(train_step, static_argnames='deterministic'\)`")
    np.testing.assert_allclose(
        jax.jit(train_step, static_argnames='deterministic')(
            variables, x, True),
        self.MLP().apply(variables, x, True))

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_correct_calls_match_the_plain_module(self, remat, name, first):
    # Every value passes the checks: a list, a str, a NumPy bool, None.
    del name
    rematted = remat(self.Configured, static_argnums=first + 2,
                     static_argnames=('layers', 'mode'))
    x = jnp.ones((2, 3))
    rngs = {'params': random.key(0), 'dropout': random.key(1)}
    variables = self.Configured().init(rngs, x, [4, 2])
    for args, kwargs in (
        (([4, 2], True), {'mode': 'tanh'}),
        (([4, 2],), {'train': np.bool_(True)}),
        (([4, 2], False), {'mode': None}),
    ):
      def loss(module, params, args=args, kwargs=kwargs):
        y = module.apply({'params': params}, x, *args,
                         rngs={'dropout': random.key(2)}, **kwargs)
        return y.sum(), y

      (_, y), grad = jax.value_and_grad(
          lambda p: loss(rematted(), p), has_aux=True)(variables['params'])
      (_, expected), expected_grad = jax.value_and_grad(
          lambda p: loss(self.Configured(), p),
          has_aux=True)(variables['params'])
      np.testing.assert_allclose(y, expected)
      jax.tree.map(np.testing.assert_allclose, grad, expected_grad)
