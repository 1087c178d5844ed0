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

"""``lift.checkpoint``'s static arguments, in the style of Flax's tests/core/core_lift_test.py.

They run on Flax with the plugin installed (``import flax_tieext``). What
upstream gets is ``patches/flax/``, a smaller change with tests of its own.
"""

import gc
import weakref

from absl.testing import parameterized
import jax
from jax import numpy as jnp
from jax import random
import numpy as np

from flax.core import apply, init, lift, nn
import flax_tieext  # noqa: F401  (installs the features into Flax)


class CheckpointStaticArgnamesTest(parameterized.TestCase):

  @staticmethod
  def dense(scope, x, activation='relu', *, scale=1.0):
    w = scope.param('w', jax.nn.initializers.normal(), (x.shape[-1], 2))
    y = scale * (x @ w)
    return jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)

  @parameterized.named_parameters(
      ('default', (), {}),
      ('positional', ('tanh',), {}),
      ('keyword', (), {'activation': 'tanh'}),
      ('keyword_only', (), {'scale': 2.0}),
  )
  def test_matches_plain_call(self, args, kwargs):
    rematted = lift.checkpoint(
        self.dense, static_argnames=('activation', 'scale')
    )
    x = random.normal(random.key(0), (4, 3))
    y, variables = init(rematted)(random.key(1), x, *args, **kwargs)
    expected, expected_variables = init(self.dense)(
        random.key(1), x, *args, **kwargs
    )
    np.testing.assert_allclose(y, expected)
    grad = jax.grad(
        lambda v: apply(rematted)(v, x, *args, **kwargs).sum()
    )(variables)
    expected_grad = jax.grad(
        lambda v: apply(self.dense)(v, x, *args, **kwargs).sum()
    )(expected_variables)
    np.testing.assert_allclose(grad['params']['w'], expected_grad['params']['w'])

  @parameterized.named_parameters(
      ('positional', 0, ('tanh', random.normal(random.key(0), (4, 3))), {}),
      ('keyword', 0, (), {'activation': 'tanh',
                          'x': random.normal(random.key(0), (4, 3))}),
  )
  def test_static_argnums_covers_keyword_calls(self, index, args, kwargs):
    def dense(scope, activation, x):
      return self.dense(scope, x, activation)

    rematted = lift.checkpoint(dense, static_argnums=index)
    y, _ = init(rematted)(random.key(1), *args, **kwargs)
    expected, _ = init(dense)(random.key(1), *args, **kwargs)
    np.testing.assert_allclose(y, expected)

  @parameterized.named_parameters(
      ('index', {'static_argnums': 1}, ('tanh',), {}),
      # A negative index keeps JAX's meaning over (variables, rngs, *args).
      ('negative_index', {'static_argnums': -3}, ('tanh',), {}),
      ('keyword', {'static_argnames': 'activation'}, (), {'activation': 'tanh'}),
  )
  def test_star_args(self, static, args, kwargs):
    # Indices count the arguments of each call; names match keywords.
    def splat(scope, *args, **kwargs):
      return self.dense(scope, *args, **kwargs)

    x = random.normal(random.key(0), (4, 3))
    y, _ = init(lift.checkpoint(splat, **static))(random.key(1), x, *args,
                                                  **kwargs)
    expected, _ = init(self.dense)(random.key(1), x, *args, **kwargs)
    np.testing.assert_allclose(y, expected)

  def test_traced_once_per_static_value_under_jit(self):
    traces = []

    def dense(scope, x, activation):
      traces.append(activation)
      return self.dense(scope, x, activation)

    rematted = lift.checkpoint(dense, static_argnames='activation')
    x = jnp.ones((1, 3))
    _, variables = init(rematted)(random.key(0), x, 'relu')
    f = jax.jit(apply(rematted), static_argnames='activation')
    for activation in ('tanh', 'relu', 'tanh'):
      np.testing.assert_allclose(
          f(variables, x, activation=activation),
          apply(self.dense)(variables, x, activation))
    self.assertEqual(traces, ['relu', 'tanh', 'relu'])

  @parameterized.named_parameters(('default', ()), ('passed', ([3, 1],)))
  def test_unhashable_static_value_is_what_jax_checkpoint_takes(self, args):
    def stack(scope, x, sizes=[2, 2]):  # pylint: disable=dangerous-default-value
      for i, size in enumerate(sizes):
        x = scope.child(nn.dense, str(i))(x, size)
      return x

    x = jnp.ones((1, 3))
    y, variables = init(lift.checkpoint(stack, static_argnames='sizes'))(
        random.key(0), x, *args)
    np.testing.assert_allclose(y, apply(stack)(variables, x, *args))

  def test_name_and_index_give_the_same_program(self):
    x = jnp.ones((2, 3))
    _, variables = init(self.dense)(random.key(0), x)

    def jaxpr(static, *args, **kwargs):
      rematted = lift.checkpoint(self.dense, **static)
      loss = lambda v: apply(rematted)(v, x, *args, **kwargs).sum()
      return str(jax.make_jaxpr(jax.grad(loss))(variables))

    by_index = jaxpr({'static_argnums': 1}, 'tanh')
    self.assertIn('remat', by_index)
    self.assertEqual(jaxpr({'static_argnames': 'activation'}, 'tanh'), by_index)
    self.assertEqual(
        jaxpr({'static_argnames': 'activation'}, activation='tanh'), by_index)

  @parameterized.parameters((3,))
  def test_out_of_range_index_is_refused_at_the_first_call(self, index):
    # As jax.checkpoint's own checks: wrapping works, the call raises.
    rematted = lift.checkpoint(self.dense, static_argnums=index)
    with self.assertRaisesRegex(ValueError, f'index {index} is out of range'):
      init(rematted)(random.key(0), jnp.ones((1, 3)))

  def test_index_of_the_scope_makes_nothing_static(self):
    # -3 counts back to `scope`, which the transform passes itself: as
    # nn.remat's static_argnums=0 (`self`), it makes nothing static.
    x = random.normal(random.key(0), (4, 3))
    rematted = lift.checkpoint(self.dense, static_argnums=-3)
    y, variables = init(rematted)(random.key(1), x)
    expected, expected_variables = init(self.dense)(random.key(1), x)
    np.testing.assert_allclose(y, expected)
    np.testing.assert_allclose(
        variables['params']['w'], expected_variables['params']['w'])

  def test_unknown_name_is_refused_at_the_first_call(self):
    rematted = lift.checkpoint(self.dense, static_argnames='activaton')
    with self.assertRaisesRegex(
        ValueError, r"'activaton', which is not a parameter of \S*dense\("
        r"(.|\n)*Did you mean static_argnames='activation'\?"
    ):
      init(rematted)(random.key(0), jnp.ones((1, 3)))

  def test_eager_calls_keep_nothing_alive(self):
    # Static values are closed over by each call's own function: JAX caches
    # nothing of a call, so N eager calls leave what one call leaves.
    class Activation:  # hashable by identity, as a user's config object

      def __init__(self, name):
        self.name = name

    def dense(scope, x, activation):
      return self.dense(scope, x, activation.name)

    rematted = lift.checkpoint(dense, static_argnames='activation')
    x = jnp.ones((1, 3))
    _, variables = init(rematted)(random.key(0), x, Activation('tanh'))

    def call():
      activation = Activation('tanh')
      apply(rematted)(variables, x, activation=activation)
      return weakref.ref(activation)

    refs = [call()]
    gc.collect()
    # Held, so that arrays other tests left cannot be freed meanwhile.
    live = jax.live_arrays()
    refs += [call() for _ in range(5)]
    gc.collect()
    held = {id(a) for a in live}
    self.assertEqual([a.shape for a in jax.live_arrays() if id(a) not in held], [])
    self.assertEqual([ref() for ref in refs], [None] * 6)
