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

"""``nn.checkpoint``'s static arguments, in the style of Flax's tests/linen/linen_transforms_test.py.

They run on Flax with the plugin installed (``import flax_tieext``). What
upstream gets is ``patches/flax/``, a smaller change with tests of its own.
"""

import gc
import weakref

from absl.testing import parameterized
from flax import linen as nn
from flax.linen import partitioning
import jax
from jax import random
import jax.numpy as jnp
import numpy as np



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

  def test_eager_calls_keep_nothing_alive(self):
    # A rematted module called eagerly N times with a static argument leaves
    # as many live arrays as one call, and no static value outlives its call.
    class Config:  # hashable by identity, as a user's config object
      deterministic = True

    class Model(nn.Module):

      @nn.remat(static_argnames='config')
      @nn.compact
      def __call__(self, x, config):
        return nn.Dropout(0.5, deterministic=config.deterministic)(
            nn.Dense(4)(x))

    x = jnp.ones((2, 3))
    variables = Model().init(random.key(0), x, Config())

    def call():
      config = Config()
      Model().apply(variables, x, config)
      return weakref.ref(config)

    refs = [call()]
    gc.collect()
    # Held, so that arrays other tests left cannot be freed meanwhile.
    live = jax.live_arrays()
    refs += [call() for _ in range(5)]
    gc.collect()
    held = {id(a) for a in live}
    self.assertEqual([a.shape for a in jax.live_arrays() if id(a) not in held], [])
    self.assertEqual([ref() for ref in refs], [None] * 6)

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


class ScanOfCheckpointStaticKeywordsTest(parameterized.TestCase):
  """nn.scan over a remat: the keywords the remat makes static reach every layer."""

  class Layer(nn.Module):

    @nn.compact
    def __call__(self, c, x, deterministic=False):
      y = nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(3)(c))
      return c + y, None

  class DecoratedLayer(nn.Module):

    @nn.remat(static_argnames='deterministic')
    @nn.compact
    def __call__(self, c, x, deterministic=False):
      y = nn.Dropout(0.5, deterministic=deterministic)(nn.Dense(3)(c))
      return c + y, None

  def stack(self, layer, **kwargs):
    return nn.scan(layer, variable_axes={'params': 0},
                   split_rngs={'params': True, 'dropout': True},
                   in_axes=nn.broadcast, length=3, **kwargs)()

  @parameterized.named_parameters(
      ('remat_class', lambda layer, _: nn.remat(
          layer, static_argnames='deterministic'), True),
      ('remat_class_dropout', lambda layer, _: nn.remat(
          layer, static_argnames='deterministic'), False),
      ('partitioning_remat', lambda layer, _: partitioning.remat(
          layer, static_argnames='deterministic'), True),
      ('decorated_method', lambda _, decorated: decorated, True),
  )
  def test_static_keyword_reaches_every_layer(self, wrap, deterministic):
    # The reference: the plain layers, the flag passed positionally
    # (broadcast, as Flax's nn.scan can pass it).
    rematted = self.stack(wrap(self.Layer, self.DecoratedLayer))
    plain = self.stack(self.Layer)
    c = random.normal(random.key(0), (2, 3))
    rngs = {'dropout': random.key(2)}
    variables = plain.init(random.key(1), c, None, True)
    self.assertEqual(
        jax.tree.structure(
            rematted.init(random.key(1), c, None, deterministic=True)),
        jax.tree.structure(variables))

    def loss(apply, params):
      (y, _) = apply({'params': params})
      return y.sum(), y

    (_, y), grad = jax.value_and_grad(lambda p: loss(lambda v: rematted.apply(
        v, c, None, deterministic=deterministic, rngs=rngs), p), has_aux=True)(
            variables['params'])
    (_, expected), expected_grad = jax.value_and_grad(
        lambda p: loss(lambda v: plain.apply(v, c, None, deterministic,
                                             rngs=rngs), p),
        has_aux=True)(variables['params'])
    np.testing.assert_allclose(y, expected)
    jax.tree.map(np.testing.assert_allclose, grad, expected_grad)

  def test_other_keyword_is_refused_before_tracing(self):
    traced = []

    class Layer(nn.Module):

      @nn.compact
      def __call__(self, c, x, scale=1.0, deterministic=False):
        traced.append(scale)
        return c * scale, None

    stack = self.stack(nn.remat(Layer, static_argnames='deterministic'))
    c = jnp.ones((2, 3))
    with self.assertRaisesRegex(
        TypeError, r'`scale` was passed by keyword to Layer\.__call__\(self, c,'
        r" x, scale=1\.0, deterministic=False\).*static_argnames='deterministic'"
        r'.*Pass it positionally, with in_axes'):
      stack.init(random.key(0), c, None, scale=2.0, deterministic=True)
    self.assertEqual(traced, [])

  def test_misspelt_static_argname_is_the_remat_error(self):
    # The error the same typo gets outside nn.scan, not nn.scan's keyword
    # error (which would blame the correctly spelt keyword).
    stack = self.stack(nn.remat(self.Layer, static_argnames='determinstic'))
    c = jnp.ones((2, 3))
    with self.assertRaisesRegex(
        ValueError, r"static_argnames contains 'determinstic'.*\n"
        r"Did you mean static_argnames='deterministic'\?"):
      stack.init(random.key(0), c, None, deterministic=True)
    with self.assertRaisesRegex(
        ValueError, r"Did you mean static_argnames='deterministic'\?"):
      nn.remat(self.Layer, static_argnames='determinstic')().init(
          random.key(0), c, None, deterministic=True)

  @parameterized.named_parameters(
      ('plain', lambda layer: layer),
      ('remat', nn.remat),
      ('remat_static_argnums', lambda layer: nn.remat(layer, static_argnums=3)),
  )
  def test_without_static_argnames_keeps_flax_warning(self, wrap):
    # A program written for plain Flax: its keyword is dropped, as Flax says.
    stack = self.stack(wrap(self.Layer))
    with self.assertWarnsRegex(
        RuntimeWarning,
        r'^kwargs are not supported in scan, so "deterministic" is\(are\)'
        r' ignored$'):
      stack.init(random.key(0), jnp.ones((2, 3)), None, deterministic=True)
