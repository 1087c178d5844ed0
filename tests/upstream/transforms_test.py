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

"""``nnx.remat``'s static arguments, in the style of Flax's tests/nnx/transforms_test.py.

They run on Flax with the plugin installed (``import flax_tieext``). Upstream,
``nnx.remat`` gets ``static_argnames`` once ``jax.checkpoint`` honours it
(``patches/README.md``).
"""

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from flax_tieext import _compat  # importing flax_tieext installs the features
import pytest

# On Flax 0.10.7 with its pinned JAX, flax.nnx itself does not import.
nnx = pytest.importorskip('flax.nnx', reason='flax.nnx does not import here',
                          exc_type=ImportError)
if not _compat.NNX_REMAT_MODES:
  pytest.skip(f'Flax {_compat.FLAX_VERSION}: nnx.remat has no graph and tree'
              ' modes, which these cases of Flax main run (tests/test_nnx_remat.py'
              ' covers its static_argnames)', allow_module_level=True)


class RematStaticArgnamesTest(parameterized.TestCase):

  class MLP(nnx.Module):

    def __init__(self, rngs):
      self.linear = nnx.Linear(3, 3, rngs=rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x, deterministic=False):
      return self.dropout(self.linear(x), deterministic=deterministic)

  CALLS = {
    'positional': ((True,), {}),
    'keyword': ((), {'deterministic': True}),
    'default': ((), {}),
  }

  @parameterized.product(
    call=tuple(CALLS),
    static=({'static_argnames': 'deterministic'}, {'static_argnums': 2}),
    modes=((True, True), (True, False), (False, False)),
  )
  def test_matches_plain_call(self, call, static, modes):
    args, kwargs = self.CALLS[call]
    graph, graph_updates = modes
    x = jnp.ones((2, 3))
    model = self.MLP(nnx.Rngs(0, dropout=1))
    reference = self.MLP(nnx.Rngs(0, dropout=1))

    def forward(m, x, deterministic=False):
      return m(x, deterministic=deterministic)

    rematted = nnx.remat(
      forward, **static, graph=graph, graph_updates=graph_updates
    )
    loss, grads = nnx.value_and_grad(
      lambda m: rematted(m, x, *args, **kwargs).sum()
    )(model)
    expected_loss, expected_grads = nnx.value_and_grad(
      lambda m: forward(m, x, *args, **kwargs).sum()
    )(reference)
    np.testing.assert_allclose(loss, expected_loss)
    jax.tree.map(np.testing.assert_allclose, grads, expected_grads)
    # The same dropout keys were drawn, and the RNG streams moved on alike.
    jax.tree.map(
      np.testing.assert_array_equal,
      jax.tree.map(jax.random.key_data, nnx.state(model, nnx.RngKey)),
      jax.tree.map(jax.random.key_data, nnx.state(reference, nnx.RngKey)),
    )
    jax.tree.map(
      np.testing.assert_array_equal,
      nnx.state(model, nnx.RngCount),
      nnx.state(reference, nnx.RngCount),
    )

  def test_decorated_method_counts_self_as_zero(self):
    class Block(self.MLP):

      @nnx.remat(static_argnums=2)
      def __call__(self, x, deterministic=False):
        return super().__call__(x, deterministic=deterministic)

    x = jnp.ones((2, 3))
    model = Block(nnx.Rngs(0))
    reference = self.MLP(nnx.Rngs(0))
    np.testing.assert_allclose(
      model(x, deterministic=True), reference(x, deterministic=True)
    )
    np.testing.assert_allclose(model(x, True), reference(x, True))
    np.testing.assert_allclose(model(x), reference(x))  # dropout on

  def test_static_values_are_closed_over_per_call(self):
    traces = []

    @nnx.remat(static_argnames='activation')
    def f(x, activation):
      traces.append(activation)
      return jnp.tanh(x) if activation == 'tanh' else jax.nn.relu(x)

    x = jnp.linspace(-1.0, 1.0, 4)
    np.testing.assert_allclose(f(x, 'tanh'), jnp.tanh(x))
    np.testing.assert_allclose(f(x, activation='relu'), jax.nn.relu(x))
    self.assertEqual(traces, ['tanh', 'relu'])

  def test_unknown_name_is_refused_at_the_first_call(self):
    # As jax.checkpoint's own checks: wrapping works, the call raises.
    rematted = nnx.remat(self.MLP.__call__, static_argnames='determinstic')
    with self.assertRaisesRegex(
      ValueError, r"nnx.remat: static_argnames contains 'determinstic', which"
    ):
      rematted(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)))

