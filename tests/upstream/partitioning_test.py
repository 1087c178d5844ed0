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

"""``nn.partitioning.remat``'s static arguments, in the style of Flax's tests/linen/partitioning_test.py.

They run on Flax with the plugin installed (``import flax_tieext``). What
upstream gets is ``patches/flax/``, a smaller change with tests of its own.
"""

from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax import random
import numpy as np

from flax import linen as nn
from flax.linen import partitioning


class RematStaticArgnamesTest(parameterized.TestCase):

  class Block(nn.Module):

    @nn.compact
    def __call__(self, x, deterministic=False):
      x = nn.Dense(3)(x)
      return nn.Dropout(0.5, deterministic=deterministic)(x), None

  @parameterized.named_parameters(
      ('argnums_positional', {'static_argnums': (1,)}, (True,), {}),
      ('argnames_positional', {'static_argnames': 'deterministic'}, (True,), {}),
      ('argnames_default', {'static_argnames': 'deterministic'}, (), {}),
  )
  def test_scan_of_remat_matches_plain_scan(self, remat_kwargs, args, kwargs):
    def stack(block):
      return nn.scan(
          block, variable_axes={'params': 0}, split_rngs={'params': True,
                                                          'dropout': True},
          length=2, in_axes=nn.broadcast,
      )()

    remat_block = partitioning.remat(self.Block, **remat_kwargs)
    x = random.normal(random.key(0), (2, 3))
    rngs = {'params': random.key(1), 'dropout': random.key(2)}
    variables = stack(self.Block).init(rngs, x, True)
    apply = lambda block, v: stack(block).apply(
        v, x, *args, rngs={'dropout': random.key(3)}, **kwargs)[0]
    np.testing.assert_allclose(
        apply(remat_block, variables), apply(self.Block, variables))
    grad = jax.grad(lambda v: apply(remat_block, v).sum())(variables)
    expected = jax.grad(lambda v: apply(self.Block, v).sum())(variables)
    jax.tree.map(np.testing.assert_allclose, grad, expected)

  def test_keyword_arguments_reach_the_method(self):
    class Scaled(nn.Module):

      @nn.compact
      def __call__(self, x, *, scale=1.0):
        return nn.Dense(3)(x) * scale

    x = jnp.ones((1, 3))
    variables = Scaled().init(random.key(0), x)
    np.testing.assert_allclose(
        partitioning.remat(Scaled)().apply(variables, x, scale=2.0),
        Scaled().apply(variables, x, scale=2.0))

  def test_unknown_name_is_refused_at_the_first_call(self):
    # As jax.checkpoint's own checks: wrapping works, the call raises.
    remat_block = partitioning.remat(self.Block, static_argnames='determnistic')
    with self.assertRaisesRegex(ValueError, "'determnistic', which is not a"):
      remat_block().init(random.key(0), jnp.ones((2, 3)))
