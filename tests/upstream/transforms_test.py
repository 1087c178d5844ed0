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

"""Test classes that `tools/upstream.py` moves into Flax's tests/nnx/transforms_test.py.

Written once, in Flax's names: here they run on Flax with the plugin installed
(`import flax_tieext`), upstream on Flax with the series applied. Only this
import block stays behind.
"""

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import flax_tieext  # noqa: F401  (installs the features into Flax)
import pytest

# On Flax 0.10.7 with its pinned JAX, flax.nnx itself does not import.
nnx = pytest.importorskip('flax.nnx', reason='flax.nnx does not import here',
                          exc_type=ImportError)


class RematStaticArgnamesTest(parameterized.TestCase):

  class MLP(nnx.Module):

    def __init__(self, rngs):
      self.linear = nnx.Linear(3, 3, rngs=rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x, deterministic=False):
      return self.dropout(self.linear(x), deterministic=deterministic)

  @parameterized.named_parameters(
      ('positional', (True,), {}),
      ('keyword', (), {'deterministic': True}),
      ('default', (), {}),
  )
  def test_matches_plain_call(self, args, kwargs):
    x = jnp.ones((2, 3))
    model = self.MLP(nnx.Rngs(0, dropout=1))
    reference = self.MLP(nnx.Rngs(0, dropout=1))
    def call(m, x, deterministic=False):
      return m(x, deterministic=deterministic)

    rematted = nnx.remat(call, static_argnames='deterministic')
    loss = lambda m: rematted(m, x, *args, **kwargs).sum()
    expected_loss = lambda m: m(x, *args, **kwargs).sum()
    grad = nnx.grad(loss)(model)
    expected_grad = nnx.grad(expected_loss)(reference)
    jax.tree.map(np.testing.assert_allclose, nnx.state(grad), nnx.state(expected_grad))

  def test_unknown_name_suggests_parameter(self):
    with self.assertRaisesRegex(ValueError, "'determinstic'(.|\n)*'deterministic'"):
      nnx.remat(self.MLP.__call__, static_argnames='determinstic')
