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

"""Test classes that `tools/upstream.py` moves into Flax's tests/linen/linen_transforms_test.py.

Written once, in Flax's names: here they run on Flax with the plugin installed
(`import flax_tieext`), upstream on Flax with the series applied. Only this
import block stays behind.
"""

import functools

from absl.testing import parameterized
from flax import linen as nn
from flax.core import freeze
from flax.linen import partitioning
import jax
from jax import random
import jax.numpy as jnp
import numpy as np

from flax_tieext import errors
from flax_tieext.core import tie_convert


class CheckpointStaticArgnamesTest(parameterized.TestCase):

  class MLP(nn.Module):

    @nn.compact
    def __call__(self, x, deterministic=False, *, scale=1.0):
      x = scale * nn.Dense(4)(x)
      return nn.Dropout(0.5, deterministic=deterministic)(x)

  @parameterized.named_parameters(
      ('default', (), {}),
      ('positional', (True,), {}),
      ('keyword', (), {'deterministic': True}),
      ('keyword_only', (), {'scale': 2.0}),
  )
  def test_matches_plain_module(self, args, kwargs):
    remat_mlp = nn.remat(self.MLP, static_argnames=('deterministic', 'scale'))
    x = random.normal(random.key(0), (2, 3))
    rngs = {'params': random.key(1), 'dropout': random.key(2)}
    variables = self.MLP().init(rngs, x, True)
    self.assertEqual(
        jax.tree.structure(remat_mlp().init(rngs, x, True)),
        jax.tree.structure(variables),
    )
    def loss(module, params):
      y = module.apply(
          {'params': params}, x, *args, rngs={'dropout': random.key(3)},
          **kwargs,
      )
      return y.sum(), y
    (_, y), grad = jax.value_and_grad(
        lambda p: loss(remat_mlp(), p), has_aux=True)(variables['params'])
    (_, expected), expected_grad = jax.value_and_grad(
        lambda p: loss(self.MLP(), p), has_aux=True)(variables['params'])
    np.testing.assert_allclose(y, expected)
    jax.tree.map(np.testing.assert_allclose, grad, expected_grad)

  def test_decorator_on_compact_method(self):
    class Model(nn.Module):

      @nn.checkpoint(static_argnames='deterministic')
      @nn.compact
      def __call__(self, x, deterministic=False):
        return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(2)(x))

    x = jnp.ones((1, 3))
    variables = Model().init(random.key(0), x, deterministic=True)
    y = Model().apply(variables, x, deterministic=True)
    expected = nn.Dense(2).apply(
        {'params': variables['params']['Dense_0']}, x)
    np.testing.assert_allclose(y, expected)

  def test_static_argnums_counts_self(self):
    by_name = nn.remat(self.MLP, static_argnames='deterministic')
    by_index = nn.remat(self.MLP, static_argnums=2)
    x = jnp.ones((2, 3))
    variables = by_name().init(random.key(0), x, True)
    np.testing.assert_allclose(
        by_index().apply(variables, x, deterministic=True),
        by_name().apply(variables, x, True),
    )

  def test_unknown_name_is_refused_at_the_first_call(self):
    # As jax.checkpoint's own checks: wrapping works, the call raises.
    rematted = nn.remat(self.MLP, static_argnames='determinstic')
    with self.assertRaisesRegex(
        ValueError, r"'determinstic', which is not a parameter of \S*MLP.__call__\("):
      rematted().init(random.key(0), jnp.ones((2, 3)))

  @parameterized.named_parameters(
      ('checkpoint', nn.checkpoint), ('partitioning', partitioning.remat))
  def test_static_list_of_methods(self, remat):
    class Model(nn.Module):

      @nn.compact
      def __call__(self, x, deterministic=False):
        return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(2)(x))

      def encode(self, x, *, mode='relu'):
        return jax.nn.relu(x) if mode == 'relu' else jnp.tanh(x)

    rematted = remat(Model, static_argnames=('deterministic', 'mode'),
                     methods=['__call__', 'encode'])
    x = jnp.ones((1, 3))
    variables = rematted().init(random.key(0), x, True)
    np.testing.assert_allclose(
        rematted().apply(variables, x, mode='tanh', method='encode'),
        jnp.tanh(x))
    rematted = remat(Model, static_argnames='mdoe',
                     methods=['__call__', 'encode'])
    with self.assertRaisesRegex(ValueError, "'mdoe'"):
      rematted().init(random.key(0), x)


class CheckpointStaticArgsDiagnosticsTest(parameterized.TestCase):

  class MLP(nn.Module):

    @nn.compact
    def __call__(self, x, deterministic=False):
      return nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(4)(x))

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

  class Star(nn.Module):

    @nn.compact
    def __call__(self, x, *args, **kwargs):
      (train,) = args
      return nn.Dropout(0.5, deterministic=not train)(nn.Dense(4)(x))

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
  def message(error):
    """What the user sees: the message and the notes added to it."""
    return '\n'.join([str(error), *getattr(error, '__notes__', ())])

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
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      rematted().init(random.key(0), jnp.ones((2, 3)), True)
    self.assertRegex(
        self.message(e.exception),
        f'`x` of .* is static(.|\n)*static_argnums={first_index + 1}'
        "(.|\n)*static_argnames='deterministic'")

  def test_flag_traced_by_outer_jit(self):
    rematted = nn.remat(self.MLP, static_argnames='deterministic')
    x = jnp.ones((2, 3))
    variables = rematted().init(random.key(0), x, True)
    step = jax.jit(lambda v, x, deterministic: rematted().apply(
        v, x, deterministic))
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      step(variables, x, True)
    self.assertRegex(
        self.message(e.exception),
        "jax.jit\\(train_step, static_argnames='deterministic'\\)")

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_unknown_name_lists_what_can_be_static(self, remat, name, first):
    del first
    with self.assertRaisesRegex(
        ValueError,
        f"^{name}: static_argnames contains 'mdoe', which is not a parameter"
        r' of \S*Configured\.__call__\(self, x, layers=\[4\], train=False, \*,'
        r" mode='relu'\)\.\nDid you mean static_argnames='mode'\?\n"
        r'The parameters that can be static are: x, layers, train, mode\.$'):
      remat(self.Configured, static_argnames='mdoe')().init(
          random.key(0), jnp.ones((2, 3)))

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
        f' +{first} \\| -3  x\n'
        f' +{first + 1} \\| -2  layers=\\[4\\]\n'
        f' +{first + 2} \\| -1  train=False\n'
        r" +- +mode='relu' +\(by name only\)\n"
        'Name the argument instead of counting, which also covers keyword'
        " and omitted calls: static_argnames='train'\\.$"):
      remat(self.Configured, static_argnums=first + 3)().init(
          random.key(0), jnp.ones((2, 3)))

  @parameterized.named_parameters(
      ('checkpoint_self', nn.checkpoint, r'nn\.checkpoint \(nn\.remat\)', 0),
      ('checkpoint_negative', nn.checkpoint,
       r'nn\.checkpoint \(nn\.remat\)', -3),
      ('partitioning_negative', partitioning.remat, r'nn\.partitioning\.remat',
       -3),
  )
  def test_index_of_self_makes_nothing_static_as_in_flax(
      self, remat, name, index):
    # `self` is passed on by the transform anyway: Flax accepts its index,
    # and it makes nothing static. The results are the plain module's ...
    rematted = remat(self.MLP, static_argnums=index)
    self.assert_matches_plain(self.MLP, rematted)
    # ... and the flag meant to be static is traced, as in Flax; JAX's error
    # says to name it.
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      rematted().init(random.key(0), jnp.ones((2, 3)), True)
    self.assertRegex(
        self.message(e.exception),
        f'{name}: \\S*MLP\\.__call__ was called with the Python value'
        ' deterministic=True, but `deterministic` is not static(.|\n)*'
        "static_argnames='deterministic'")

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_self_cannot_be_named(self, remat, name, first):
    del first
    with self.assertRaisesRegex(
        ValueError,
        f"^{name}: static_argnames contains 'self', the first parameter of"
        r' \S*MLP\.__call__\(self, x, deterministic=False\)\. The transform'
        ' passes it on by itself; it cannot be static. Remove it from'
        ' static_argnames.$'):
      remat(self.MLP, static_argnames='self')().init(
          random.key(0), jnp.ones((2, 3)))

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
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      remat(self.Star)().init(random.key(0), jnp.ones((2, 3)), False)
    self.assertRegex(
        self.message(e.exception),
        r'the Python value \*args\[0\]=False, but `\*args\[0\]` is not'
        f'(.|\n)*make it static: static_argnums={index}\\.')
    self.assert_matches_plain(
        self.Star, remat(self.Star, static_argnums=index), True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_arguments_of_the_wrong_type(self, remat, name, first):
    del first
    x = jnp.ones((2, 3))
    rematted = remat(self.MLP, static_argnums='deterministic')  # wrapping works
    with self.assertRaisesRegex(
        TypeError,
        f'^{name}: static_argnums must be an int or a sequence of ints, got'
        " 'deterministic'. To make arguments static by name, use"
        ' static_argnames.$'):
      rematted().init(random.key(0), x)
    rematted = remat(self.MLP, static_argnames=('deterministic', 2))
    with self.assertRaisesRegex(
        TypeError,
        f'^{name}: static_argnames must be a str or a sequence of str, got'
        r" \('deterministic', 2\)\.$"):
      rematted().init(random.key(0), x)

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

    x = jnp.ones((2, 3))
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      model(first)().init(random.key(0), x, True)
    self.assertRegex(
        self.message(e.exception),
        f'(?m)^{name}: `x` of Model\\.__call__.* is static \\(static_argnums'
        f' index {first}\\), but it received an array of shape(.|\n)*'
        f'  {first} \\| -2  x    \\(<- static_argnums index {first}\\)\n'
        '(.|\n)*Did you mean `deterministic`\\? In the numbering of'
        f' {name} that is static_argnums={first + 1}\\.')
    self.assert_matches_plain(self.MLP, model(first + 1), True)

  @parameterized.named_parameters(*ENTRY_POINTS)
  def test_name_in_no_wrapped_method_lists_them_all(self, remat, name, first):
    del first
    with self.assertRaisesRegex(
        ValueError,
        f"^{name}: static_argnames contains 'mdoe', which is not a parameter"
        ' of any of the wrapped methods:\n'
        r'  \S*TwoMethods\.__call__\(self, x, deterministic=False\)\n'
        r"  \S*TwoMethods\.encode\(self, x, \*, mode='relu'\)\n"
        r"Did you mean static_argnames='mode'\?\n"
        r'The parameters that can be static are: x, deterministic, mode\.$'):
      remat(self.TwoMethods, static_argnames='mdoe',
            methods=['__call__', 'encode'])().init(
                random.key(0), jnp.ones((2, 3)))

  def test_methods_dict_numbers_without_self(self):
    # As upstream, the arguments of each method in a dict do not count self.
    def rematted(index):
      return nn.remat(
          self.TwoMethods, methods={'__call__': {'static_argnums': index}})

    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      rematted(0)().init(random.key(0), jnp.ones((2, 3)), True)
    self.assertRegex(
        self.message(e.exception),
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
      with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
        remat(self.Masked, static_argnames='masks')().init(
            random.key(0), jnp.ones((2, 3)), masks, True)
      message = self.message(e.exception)
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
      with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
        gated().init(random.key(0), jnp.ones((2, 3)), flag, True)
      self.assertRegex(
          self.message(e.exception),
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
        self.message(e.exception),
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
      with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
        remat(self.MLP)().init(random.key(0), jnp.ones((2, 3)), *args,
                               **kwargs)
      self.assertRegex(
          self.message(e.exception),
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
    with self.assertRaises(jax.errors.TracerIntegerConversionError) as e:
      remat(self.Repeated)().init(random.key(0), jnp.ones((2, 3)), 2)
    self.assertRegex(
        self.message(e.exception),
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
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      remat(self.Configured, static_argnums=layers)().init(
          random.key(0), jnp.ones((2, 3)), [4], True)
    self.assertRegex(
        self.message(e.exception),
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

    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      jax.jit(train_step)(variables, x, True)
    self.assertRegex(
        self.message(e.exception),
        f'(?m)^{name}: `deterministic` of \\S*MLP\\.__call__.* is static'
        f' \\(static_argnums index {first + 1}\\), but it received an array'
        r' of shape \(\)(.|\n)*'
        f'  {first + 1} \\| -1  deterministic=False    \\(<- static_argnums'
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


class TieTest(parameterized.TestCase):

  # The transforms a tied target runs under.
  WRAPS = {
      'plain': lambda module: module,
      'remat': nn.remat,
      'jit': nn.jit,
      'partitioning_remat': partitioning.remat,
  }

  class Stack(nn.Module):
    """Two Dense layers; the second may be tied to the first."""
    wrap: str = 'plain'
    features: tuple[int, int] = (3, 3)

    @nn.compact
    def __call__(self, x):
      dense = TieTest.WRAPS[self.wrap](nn.Dense)
      x = jnp.tanh(dense(self.features[0], name='a')(x))
      return dense(self.features[1], name='b')(x)

  class Shared(nn.Module):
    """The reference: one Dense instance called at two places."""

    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(3, name='a')
      return dense(jnp.tanh(dense(x)))

  class Counter(nn.Module):
    """Counts its calls in the 'state' collection."""

    @nn.compact
    def __call__(self, x):
      count = self.variable('state', 'count', jnp.zeros, ())
      count.value += 1
      return x * count.value

  class Counters(nn.Module):
    wrap: str = 'plain'

    @nn.compact
    def __call__(self, x):
      counter = TieTest.WRAPS[self.wrap](TieTest.Counter)
      return counter(name='b')(counter(name='a')(x))

  class SharedCounter(nn.Module):

    @nn.compact
    def __call__(self, x):
      counter = TieTest.Counter(name='a')
      return counter(counter(x))

  @parameterized.parameters(*WRAPS)
  def test_module_tie_is_one_shared_module(self, wrap):
    tied = nn.tie(self.Stack, {'b': 'a'})(wrap=wrap)
    x = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), x)
    expected_variables = self.Shared().init(random.key(1), x)
    self.assertEqual(
        jax.tree.structure(variables), jax.tree.structure(expected_variables))
    loss = lambda m, p: m.apply({'params': p}, x).sum()
    grad = jax.grad(lambda p: loss(tied, p))(variables['params'])
    expected_grad = jax.grad(lambda p: loss(self.Shared(), p))(
        variables['params'])
    np.testing.assert_allclose(
        tied.apply(variables, x), self.Shared().apply(variables, x))
    jax.tree.map(np.testing.assert_allclose, grad, expected_grad)

  @parameterized.parameters(*WRAPS)
  def test_writes_land_in_program_order(self, wrap):
    tied = nn.tie(self.Counters, {'b': 'a'}, collections='state')(wrap=wrap)
    x = jnp.ones(2)
    y, variables = tied.init_with_output(random.key(0), x)
    expected_y, expected = self.SharedCounter().init_with_output(
        random.key(0), x)
    np.testing.assert_allclose(y, expected_y)
    jax.tree.map(np.testing.assert_allclose, variables, expected)
    y, updates = tied.apply(variables, x, mutable=['state'])
    expected_y, expected = self.SharedCounter().apply(
        expected, x, mutable=['state'])
    np.testing.assert_allclose(y, expected_y)
    jax.tree.map(np.testing.assert_allclose, updates, expected)

  @parameterized.parameters(*WRAPS)
  def test_missing_source_names_nearest(self, wrap):
    tied = nn.tie(self.Stack, {'b': 'aa'})(wrap=wrap)
    with self.assertRaisesRegex(
        errors.TieError, r'(?i)/aa(.|\n)*nearest(.|\n)*: a\.'):
      tied.init(random.key(0), jnp.ones((1, 3)))

  @parameterized.parameters(*WRAPS)
  def test_shape_mismatch_names_both_paths(self, wrap):
    tied = nn.tie(self.Stack, {'b': 'a'})(wrap=wrap, features=(3, 4))
    with self.assertRaisesRegex(errors.TieError, "/a(.|\n)*/b|/b(.|\n)*/a"):
      tied.init(random.key(0), jnp.ones((1, 3)))

  def test_collection_typo_names_the_collection(self):
    tied = nn.tie(self.Counters, {'b': 'a'}, collections='stat')()
    with self.assertRaisesRegex(errors.TieError, "'stat'(.|\n)*'state'"):
      tied.init(random.key(0), jnp.ones(2))

  @parameterized.parameters(*WRAPS)
  def test_partitioning_metadata_is_kept(self, wrap):

    class Model(nn.Module):

      @nn.compact
      def __call__(self, x):
        dense = functools.partial(
            TieTest.WRAPS[wrap](nn.Dense), 3, kernel_init=nn.with_partitioning(
                nn.initializers.lecun_normal(), ('embed', 'mlp')))
        return dense(name='b')(dense(name='a')(x))

    x = jnp.ones((1, 3))
    variables = nn.tie(Model, {'b': 'a'})().init(random.key(0), x)
    untied = Model().init(random.key(0), x)
    self.assertEqual(
        nn.get_partition_spec(variables)['params']['a'],
        nn.get_partition_spec(untied)['params']['a'])


  class Layer(nn.Module):
    """One step of a stack: calls ``shared`` or its own ``attn``."""
    shared: nn.Module | None = None

    @nn.compact
    def __call__(self, c, x):
      attn = self.shared if self.shared is not None else nn.Dense(3, name='attn')
      return c, jnp.tanh(attn(x)) * x

  class Stacked(nn.Module):
    """A source, then a stack whose every step uses it."""
    kind: str
    shared: bool = False

    @nn.compact
    def __call__(self, xs):
      src = nn.Dense(3, name='src')
      src(xs[0])
      split = {'params': True}
      if self.kind == 'scan':
        stack = nn.scan(TieTest.Layer, variable_broadcast='params',
                        split_rngs=split, length=xs.shape[0])
      else:
        stack = nn.vmap(TieTest.Layer, in_axes=(None, 0), out_axes=(None, 0),
                        variable_axes={'params': None}, split_rngs=split)
      _, ys = stack(src if self.shared else None, name='stack')(None, xs)
      return ys

  @parameterized.parameters('scan', 'vmap')
  def test_source_outside_a_stack_is_broadcast(self, kind):
    tied = nn.tie(self.Stacked, {'stack/attn': 'src'})(kind)
    xs = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), xs)
    # The reference broadcasts the one shared module over the stack.
    expected = self.Stacked(kind, shared=True).init(random.key(1), xs)
    self.assertEqual(list(variables['params']), ['src'])
    self.assertEqual(
        jax.tree.structure(variables), jax.tree.structure(expected))
    loss = lambda m, p: m.apply({'params': p}, xs).sum()
    grad = jax.grad(lambda p: loss(tied, p))(variables['params'])
    expected_grad = jax.grad(
        lambda p: loss(self.Stacked(kind, shared=True), p))(
            variables['params'])
    np.testing.assert_allclose(
        tied.apply(variables, xs),
        self.Stacked(kind, shared=True).apply(variables, xs), rtol=1e-6)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6),
                 grad, expected_grad)

  class Branches(nn.Module):
    """A branch or loop body that calls the target twice."""
    kind: str
    shared: bool = False

    @nn.compact
    def __call__(self, x):
      a = TieTest.Counter(name='a')
      b = a if self.shared else TieTest.Counter(name='b')
      x = a(x)
      body = lambda m, h: m(m(h))
      if self.kind == 'cond':
        return nn.cond(True, body, body, b, x)
      if self.kind == 'while_loop':
        return nn.while_loop(
            lambda m, c: c[0] < 2, lambda m, c: (c[0] + 1, body(m, c[1])), b,
            (0, x), carry_variables='state')[1]
      return nn.switch(1, [body, body], b, x)

  @parameterized.parameters('cond', 'switch', 'while_loop')
  def test_branch_body_calls_the_target_twice(self, kind):
    tied = nn.tie(self.Branches, {'b': 'a'}, collections='state')(kind)
    x = jnp.ones(2)
    y, variables = tied.init_with_output(random.key(0), x)
    expected_y, expected = self.Branches(kind, shared=True).init_with_output(
        random.key(0), x)
    np.testing.assert_allclose(y, expected_y)
    jax.tree.map(np.testing.assert_allclose, variables, expected)
    y, updates = tied.apply(variables, x, mutable=['state'])
    expected_y, expected = self.Branches(kind, shared=True).apply(
        expected, x, mutable=['state'])
    np.testing.assert_allclose(y, expected_y)
    jax.tree.map(np.testing.assert_allclose, updates, expected)

  def test_bind_and_any_method_see_the_tie(self):

    class Pair(nn.Module):
      shared: bool = False

      def setup(self):
        self.a = nn.Dense(3)
        self.b = self.a if self.shared else nn.Dense(3)

      def __call__(self, x):
        return self.b(self.a(x))

    tied = nn.tie(Pair, {'b': 'a'})()
    x = jnp.ones((1, 3))
    variables = tied.init(random.key(0), x)
    self.assertEqual(list(variables['params']), ['a'])
    np.testing.assert_allclose(
        tied.bind(variables).b(x), Pair(shared=True).bind(variables).b(x))
    np.testing.assert_allclose(
        tied.apply(variables, x, method=lambda m, x: m.b(x)),
        Pair(shared=True).apply(variables, x, method=lambda m, x: m.b(x)))

  class WithAttributes(nn.Module):
    a: nn.Module
    b: nn.Module

    def __call__(self, x):
      return self.b(jnp.tanh(self.a(x)))

  @parameterized.parameters(*WRAPS)
  def test_submodules_passed_as_attributes(self, wrap):
    dense = TieTest.WRAPS[wrap](nn.Dense)
    tied = nn.tie(self.WithAttributes, {'b': 'a'})(a=dense(3), b=dense(3))
    one = dense(3)
    shared = self.WithAttributes(a=one, b=one)
    x = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), x)
    jax.tree.map(np.testing.assert_array_equal, variables,
                 shared.init(random.key(1), x))
    np.testing.assert_allclose(
        tied.apply(variables, x), shared.apply(variables, x))

  class Reader(nn.Module):
    """Returns its output and its kernel as ``self.variables`` shows it."""

    @nn.compact
    def __call__(self, x):
      y = nn.Dense(3, name='dense')(x)
      return jnp.tanh(y), self.variables['params']['dense']['kernel']

  class Readers(nn.Module):
    wrap: str = 'plain'
    shared: bool = False

    @nn.compact
    def __call__(self, x):
      reader = TieTest.WRAPS[self.wrap](TieTest.Reader)
      a = reader(name='a')
      b = a if self.shared else reader(name='b')
      return b(a(x)[0])

  @parameterized.parameters(*WRAPS)
  def test_target_sees_the_source_variables(self, wrap):
    tied = nn.tie(self.Readers, {'b': 'a'})(wrap)
    shared = self.Readers(wrap, shared=True)
    x = random.normal(random.key(0), (2, 3))
    variables = shared.init(random.key(1), x)
    (y, kernel), (expected_y, expected_kernel) = (
        tied.apply(variables, x), shared.apply(variables, x))
    np.testing.assert_allclose(y, expected_y)
    np.testing.assert_array_equal(kernel, expected_kernel)
    np.testing.assert_array_equal(
        kernel, variables['params']['a']['dense']['kernel'])

  def test_tabulate_counts_the_source_once(self):
    x = jnp.ones((2, 3))

    def total(module):
      table = nn.tabulate(module, random.key(0),
                          console_kwargs={'force_terminal': False})(x)
      return next(line.strip() for line in table.splitlines()
                  if 'Total Parameters' in line)

    self.assertEqual(total(nn.tie(self.Stack, {'b': 'a'})()),
                     total(self.Shared()))
    self.assertNotEqual(total(self.Stack()), total(self.Shared()))

  class TargetFirst(nn.Module):
    """Calls ``b`` before ``a``."""
    wrap: str = 'plain'

    @nn.compact
    def __call__(self, x):
      dense = TieTest.WRAPS[self.wrap](nn.Dense)
      a, b = dense(3, name='a'), dense(3, name='b')
      return a(jnp.tanh(b(x)))

  @parameterized.parameters(*WRAPS)
  def test_init_does_not_depend_on_which_use_runs_first(self, wrap):
    tied = nn.tie(self.TargetFirst, {'b': 'a'})(wrap)
    x = random.normal(random.key(0), (2, 3))
    y, variables = tied.init_with_output(random.key(1), x)
    np.testing.assert_allclose(y, tied.apply(variables, x))
    # The stored values are the source's own, as when the source runs first.
    source_first = nn.tie(self.Stack, {'b': 'a'})(wrap=wrap)
    jax.tree.map(np.testing.assert_array_equal, variables,
                 source_first.init(random.key(1), x))
    untied = self.TargetFirst(wrap).init(random.key(1), x)
    jax.tree.map(np.testing.assert_array_equal, variables['params']['a'],
                 untied['params']['a'])

  class Mapped(nn.Module):
    """The target runs inside ``nn.map_variables``, which doubles params."""
    shared: bool = False

    @nn.compact
    def __call__(self, x):
      a = nn.Dense(3, name='a')
      b = a if self.shared else nn.Dense(3, name='b')
      double = lambda v: jax.tree.map(lambda p: 2 * p, v)
      return nn.map_variables(lambda m, h: m(h), 'params', double)(
          b, jnp.tanh(a(x)))

  def test_map_variables_maps_the_source(self):
    tied = nn.tie(self.Mapped, {'b': 'a'})()
    shared = self.Mapped(shared=True)
    x = random.normal(random.key(0), (2, 3))
    y, variables = tied.init_with_output(random.key(1), x)
    expected_y, expected = shared.init_with_output(random.key(1), x)
    np.testing.assert_allclose(y, expected_y)
    jax.tree.map(np.testing.assert_array_equal, variables, expected)
    loss = lambda m, v: m.apply(v, x).sum()
    jax.tree.map(np.testing.assert_allclose,
                 jax.grad(lambda v: loss(tied, v))(variables),
                 jax.grad(lambda v: loss(shared, v))(variables))

  class ClosedOver(nn.Module):
    """The target runs inside a transform that closes over its source."""
    kind: str
    shared: bool = False

    @nn.compact
    def __call__(self, x):
      a = nn.Dense(3, name='a')
      b = a if self.shared else nn.Dense(3, name='b')
      x = jnp.tanh(a(x))
      if self.kind == 'value_and_grad':
        y, (x_grad,) = nn.value_and_grad(
            lambda m, h: jnp.sum(m(h) ** 2), b, x)
        return y + x_grad, {}
      y, backward = nn.vjp(lambda m, h: m(h), b, x)
      params_grad, x_grad = backward(jnp.ones_like(y))
      return y + x_grad, params_grad

  @parameterized.parameters('value_and_grad', 'vjp')
  def test_closed_over_source_reads_and_differentiates(self, kind):
    tied = nn.tie(self.ClosedOver, {'b': 'a'})(kind)
    shared = self.ClosedOver(kind, shared=True)
    x = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), x)
    self.assertEqual(list(variables['params']), ['a'])
    jax.tree.map(np.testing.assert_allclose, tied.apply(variables, x),
                 shared.apply(variables, x))
    loss = lambda m, v: m.apply(v, x)[0].sum()
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6),
                 jax.grad(lambda v: loss(tied, v))(variables),
                 jax.grad(lambda v: loss(shared, v))(variables))

  TRACES = []

  class Traced(nn.Module):
    """Records each trace of its body."""

    @nn.compact
    def __call__(self, x):
      TieTest.TRACES.append(self.scope.path)
      return jnp.tanh(nn.Dense(3, name='dense')(x))

  class TracedPair(nn.Module):
    wrap: str = 'plain'
    shared: bool = False

    @nn.compact
    def __call__(self, x):
      traced = TieTest.WRAPS[self.wrap](TieTest.Traced)
      a = traced(name='a')
      b = a if self.shared else traced(name='b')
      return b(a(x))

  @parameterized.parameters(*WRAPS)
  def test_each_call_site_is_traced_once(self, wrap):
    x = jnp.ones((2, 3))

    def traces(module):
      del self.TRACES[:]
      variables = module.init(random.key(0), x)
      module.apply(variables, x)
      jax.grad(lambda v: module.apply(v, x).sum())(variables)
      return list(self.TRACES)

    tied = traces(nn.tie(self.TracedPair, {'b': 'a'})(wrap))
    self.assertEqual(tied, [('a',), ('b',)] * 3)
    self.assertLen(tied, len(traces(self.TracedPair(wrap, shared=True))))


class TieVariablesTest(parameterized.TestCase):

  class LM(nn.Module):
    """An embedding and an output head, optionally tied through a transpose."""

    @nn.compact
    def __call__(self, tokens):
      x = nn.Embed(5, 3, name='embed')(tokens)
      return nn.Dense(5, use_bias=False, name='head')(x)

  @parameterized.parameters(*TieTest.WRAPS)
  def test_variable_tie_sums_gradients(self, wrap):
    ties_ = {'b/kernel': 'a/kernel'}
    tied = nn.tie(TieTest.Stack, ties_)(wrap=wrap)
    untied_model = TieTest.Stack(wrap=wrap)
    x = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), x)
    self.assertEqual(sorted(variables['params']['b']), ['bias'])
    untied = tie_convert.untie_variables(variables, ties_)
    np.testing.assert_allclose(
        tied.apply(variables, x), untied_model.apply(untied, x))
    grad = jax.grad(lambda v: tied.apply(v, x).sum())(variables)['params']
    expected = jax.grad(
        lambda v: untied_model.apply(v, x).sum())(untied)['params']
    np.testing.assert_allclose(
        grad['a']['kernel'],
        expected['a']['kernel'] + expected['b']['kernel'], rtol=1e-6)

  def test_conversion_skips_collections_without_either_path(self):
    variables = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.ones(2)}},
                 'batch_stats': {'c': {'mean': jnp.zeros(2)}}}
    tied = tie_convert.tie_variables(variables, {'b': 'a'}, collections=True)
    self.assertEqual(list(tied['params']), ['a'])
    self.assertEqual(tied['batch_stats'], variables['batch_stats'])
    untied = tie_convert.untie_variables(tied, {'b': 'a'}, collections=True)
    jax.tree.map(np.testing.assert_allclose, untied, variables)

  def test_stack_conversion_has_a_copy_per_layer(self):
    ties_ = {'stack/attn': 'src'}
    tied = nn.tie(TieTest.Stacked, ties_)('scan')
    xs = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), xs)
    untied = tie_convert.untie_variables(variables, ties_, stacks={'stack': 2})
    kernel = untied['params']['stack']['attn']['kernel']
    self.assertEqual(kernel.shape, (2, 3, 3))
    np.testing.assert_allclose(kernel[1], variables['params']['src']['kernel'])
    retied = tie_convert.tie_variables(untied, ties_, stacks={'stack': 2})
    jax.tree.map(np.testing.assert_allclose, retied, variables)
    untied['params']['stack']['attn']['kernel'] = kernel.at[1].add(1.0)
    with self.assertRaisesRegex(errors.TieError, r'layer 1 \(axis 0\)'):
      tie_convert.tie_variables(untied, ties_, stacks={'stack': 2})

  def test_viewed_tie_and_conversion(self):
    ties_ = {'head/kernel': ('embed/embedding', jnp.transpose)}
    tied = nn.tie(self.LM, ties_)()
    tokens = jnp.array([[0, 3, 4]])
    variables = tied.init(random.key(0), tokens)
    self.assertEqual(list(variables['params']), ['embed'])
    untied = tie_convert.untie_variables(variables, ties_)
    embedding = variables['params']['embed']['embedding']
    np.testing.assert_allclose(
        untied['params']['head']['kernel'], embedding.T)
    np.testing.assert_allclose(
        tied.apply(variables, tokens), self.LM().apply(untied, tokens))
    retied = tie_convert.tie_variables(untied, ties_)
    jax.tree.map(np.testing.assert_allclose, retied, variables)
    grad = jax.grad(lambda v: tied.apply(v, tokens).sum())(variables)
    expected = jax.grad(lambda v: self.LM().apply(v, tokens).sum())(untied)
    np.testing.assert_allclose(
        grad['params']['embed']['embedding'],
        expected['params']['embed']['embedding']
        + expected['params']['head']['kernel'].T,
        rtol=1e-6,
    )

  @parameterized.named_parameters(
      ('module', {'b': 'a'}), ('variable', {'b/kernel': 'a/kernel'}))
  def test_untie_then_tie_is_the_identity(self, ties_):
    tied = nn.tie(TieTest.Stack, ties_)()
    x = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), x)
    untied = tie_convert.untie_variables(variables, ties_)
    self.assertEqual(jax.tree.structure(untied),
                     jax.tree.structure(TieTest.Stack().init(random.key(1), x)))
    np.testing.assert_allclose(
        TieTest.Stack().apply(untied, x), tied.apply(variables, x))
    retied = tie_convert.tie_variables(untied, ties_)
    self.assertEqual(jax.tree.structure(retied), jax.tree.structure(variables))
    jax.tree.map(np.testing.assert_array_equal, retied, variables)

  def test_frozen_variables_convert_to_plain_dicts(self):
    ties_ = {'b': 'a'}
    tied = nn.tie(TieTest.Stack, ties_)()
    x = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), x)
    untied = tie_convert.untie_variables(freeze(variables), ties_)
    self.assertIsInstance(untied['params']['b'], dict)
    retied = tie_convert.tie_variables(freeze(untied), ties_)
    self.assertIsInstance(retied['params'], dict)
    jax.tree.map(np.testing.assert_array_equal, retied, variables)
    np.testing.assert_allclose(
        TieTest.Stack().apply(freeze(untied), x),
        tied.apply(freeze(retied), x))

  @parameterized.parameters(*TieTest.WRAPS)
  def test_checkpoint_of_the_untied_model_loads_tied(self, wrap):
    x = random.normal(random.key(0), (2, 3))
    untied_model = TieTest.Stack(wrap=wrap)
    # A checkpoint of the untied model, trained with ``b`` kept equal to ``a``.
    checkpoint = untied_model.init(random.key(1), x)
    checkpoint['params']['b'] = checkpoint['params']['a']
    variables = tie_convert.tie_variables(checkpoint, {'b': 'a'})
    self.assertEqual(list(variables['params']), ['a'])
    tied = nn.tie(TieTest.Stack, {'b': 'a'})(wrap=wrap)
    np.testing.assert_allclose(
        tied.apply(variables, x), untied_model.apply(checkpoint, x))
    grad = jax.grad(lambda v: tied.apply(v, x).sum())(variables)['params']
    expected = jax.grad(
        lambda v: untied_model.apply(v, x).sum())(checkpoint)['params']
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6),
                 grad['a'], jax.tree.map(jnp.add, expected['a'], expected['b']))

  def test_a_target_that_differs_from_its_source_is_refused(self):
    x = random.normal(random.key(0), (2, 3))
    checkpoint = TieTest.Stack().init(random.key(1), x)
    with self.assertRaisesRegex(
        errors.TieError,
        r"/b/kernel to /a/kernel in collection 'params': /b/kernel differs"):
      tie_convert.tie_variables(checkpoint, {'b/kernel': 'a/kernel'})
    self.assertEqual(sorted(checkpoint['params']), ['a', 'b'])  # untouched
    tokens = jnp.array([[0, 3, 4]])
    lm = self.LM().init(random.key(1), tokens)
    with self.assertRaisesRegex(
        errors.TieError, '/head/kernel differs from its source'):
      tie_convert.tie_variables(
          lm, {'head/kernel': ('embed/embedding', jnp.transpose)})

  @parameterized.named_parameters(
      ('first', 'first', lambda a, b: a),
      ('mean', 'mean', lambda a, b: jnp.mean(jnp.stack([a, b]), axis=0)),
      ('function', lambda s, copies: jnp.maximum(s, *copies), jnp.maximum),
  )
  def test_merge_combines_copies_that_differ(self, merge, by_hand):
    x = random.normal(random.key(0), (2, 3))
    checkpoint = TieTest.Stack().init(random.key(1), x)
    with self.assertRaisesRegex(errors.TieError, "merge='mean'"):
      tie_convert.tie_variables(checkpoint, {'b': 'a'})
    tied = tie_convert.tie_variables(checkpoint, {'b': 'a'}, merge=merge)
    self.assertEqual(sorted(tied['params']), ['a'])
    params = checkpoint['params']
    jax.tree.map(np.testing.assert_allclose, tied['params']['a'],
                 jax.tree.map(by_hand, params['a'], params['b']))

  def test_merge_mean_refuses_a_viewed_copy(self):
    tokens = jnp.array([[0, 3, 4]])
    lm = self.LM().init(random.key(1), tokens)
    with self.assertRaisesRegex(errors.TieError, 'does not invert'):
      tie_convert.tie_variables(
          lm, {'head/kernel': ('embed/embedding', jnp.transpose)},
          merge='mean')

  class Normed(nn.Module):

    @nn.compact
    def __call__(self, x):
      return nn.BatchNorm(use_running_average=False)(nn.Dense(3)(x))

  class TwoNormed(nn.Module):

    @nn.compact
    def __call__(self, x):
      normed = TieVariablesTest.Normed
      return normed(name='b')(normed(name='a')(x))

  def test_collections_filter(self):
    ties_ = {'b': 'a'}
    x = random.normal(random.key(0), (4, 3))
    # The untied model's batch stats start equal, its params do not.
    checkpoint = self.TwoNormed().init(random.key(1), x)
    stats = tie_convert.tie_variables(checkpoint, ties_, 'batch_stats')
    self.assertEqual(sorted(stats['params']), ['a', 'b'])
    self.assertEqual(list(stats['batch_stats']), ['a'])
    with self.assertRaisesRegex(errors.TieError, "collection 'params'"):
      tie_convert.tie_variables(checkpoint, ties_, collections=True)
    tied = nn.tie(self.TwoNormed, ties_, ['params', 'batch_stats'])()
    variables = tied.init(random.key(1), x)
    untied = tie_convert.untie_variables(variables, ties_, collections=True)
    jax.tree.map(
        np.testing.assert_array_equal, untied, tie_convert.untie_variables(
            variables, ties_, collections=['params', 'batch_stats']))
    self.assertEqual(jax.tree.structure(untied), jax.tree.structure(checkpoint))
    params_only = tie_convert.untie_variables(variables, ties_)
    self.assertEqual(list(params_only['batch_stats']), ['a'])
    np.testing.assert_allclose(
        tied.apply(variables, x, mutable=['batch_stats'])[0],
        self.TwoNormed().apply(untied, x, mutable=['batch_stats'])[0])

  DENSE = functools.partial(nn.Dense, 3, kernel_init=nn.with_partitioning(
      nn.initializers.lecun_normal(), ('embed', 'mlp')))

  class EncoderLayer(nn.Module):

    @nn.compact
    def __call__(self, c, x):
      x = jnp.tanh(TieVariablesTest.DENSE(name='attn')(x))
      return c, x + TieVariablesTest.DENSE(name='ff')(x)

  class Encoder(nn.Module):
    """A source, then a stack whose layers each have ``attn`` and ``ff``."""

    @nn.compact
    def __call__(self, xs):
      TieVariablesTest.DENSE(name='src')(xs[0])
      stack = nn.scan(
          TieVariablesTest.EncoderLayer, variable_axes={'params': 0},
          split_rngs={'params': True}, length=xs.shape[0],
          metadata_params={nn.PARTITION_NAME: None})
      return stack(name='stack')(None, xs)[1]

  def test_partitioned_stack_conversion(self):
    ties_ = {'stack/attn': 'src'}
    tied = nn.tie(self.Encoder, ties_)()
    xs = random.normal(random.key(0), (2, 3))
    variables = tied.init(random.key(1), xs)
    untied = tie_convert.untie_variables(variables, ties_, stacks={'stack': 2})
    # Each layer's copy keeps the source's names; the stack's axis has none.
    self.assertEqual(nn.get_partition_spec(untied), nn.get_partition_spec(
        self.Encoder().init(random.key(1), xs)))
    np.testing.assert_allclose(
        self.Encoder().apply(untied, xs), tied.apply(variables, xs))
    retied = tie_convert.tie_variables(untied, ties_, stacks={'stack': 2})
    self.assertEqual(jax.tree.structure(retied), jax.tree.structure(variables))
    jax.tree.map(np.testing.assert_array_equal, nn.unbox(retied),
                 nn.unbox(variables))

  def test_a_stack_not_named_in_stacks_is_refused(self):
    ties_ = {'stack/attn': 'src'}
    xs = random.normal(random.key(0), (2, 3))
    variables = nn.tie(self.Encoder, ties_)().init(random.key(1), xs)
    with self.assertRaisesRegex(
        errors.TieError, r"/stack/attn(.|\n)*stacks=\{'stack': 2\}"):
      tie_convert.untie_variables(variables, ties_)
    untied = tie_convert.untie_variables(variables, ties_, stacks={'stack': 2})
    with self.assertRaisesRegex(
        errors.TieError, r"one more leading axis(.|\n)*stacks=\{'stack': 2\}"):
      tie_convert.tie_variables(untied, ties_)

  def test_a_view_moves_partitioning_names_with_the_axes(self):

    class LM(nn.Module):

      @nn.compact
      def __call__(self, tokens):
        x = nn.Embed(5, 3, name='embed', embedding_init=nn.with_partitioning(
            nn.initializers.normal(), ('vocab', 'embed')))(tokens)
        return nn.Dense(
            5, use_bias=False, name='head', kernel_init=nn.with_partitioning(
                nn.initializers.lecun_normal(), ('embed', 'vocab')))(x)

    ties_ = {'head/kernel': ('embed/embedding', jnp.transpose)}
    tokens = jnp.array([[0, 3, 4]])
    tied = nn.tie(LM, ties_)()
    variables = tied.init(random.key(0), tokens)
    untied = tie_convert.untie_variables(variables, ties_)
    self.assertEqual(nn.get_partition_spec(untied),
                     nn.get_partition_spec(LM().init(random.key(0), tokens)))
    np.testing.assert_allclose(
        LM().apply(untied, tokens), tied.apply(variables, tokens))
    retied = tie_convert.tie_variables(untied, ties_)
    self.assertEqual(jax.tree.structure(retied), jax.tree.structure(variables))
