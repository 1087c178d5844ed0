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

"""The plugin's static-argument diagnostics in ``nnx.remat`` (Flax's test style).

See tests/test_static_argnames_diagnostics.py: these messages stay in the plugin.
"""

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from flax_tieext import _compat  # importing flax_tieext installs the features
import pytest
import static_models

nnx = pytest.importorskip('flax.nnx', reason='flax.nnx does not import here',
                          exc_type=ImportError)
if not _compat.NNX_REMAT_MODES:
  pytest.skip(f'Flax {_compat.FLAX_VERSION}: nnx.remat has no graph and tree'
              ' modes, which these cases run (tests/test_nnx_remat.py covers its'
              ' static_argnames)', allow_module_level=True)


class RematStaticArgsDiagnosticsTest(parameterized.TestCase):

  class MLP(nnx.Module):

    def __init__(self, rngs):
      self.linear = nnx.Linear(3, 3, rngs=rngs)
      self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x, deterministic=False):
      return self.dropout(self.linear(x), deterministic=deterministic)

  # (test name, graph, graph_updates): the modes of nnx.remat.
  MODES = (
    ('graph', True, True),
    ('graph_without_updates', True, False),
    ('tree', False, False),
  )

  @staticmethod
  def forward(m, x, deterministic=False, mode='relu'):
    y = m(x, deterministic=deterministic)
    return jax.nn.relu(y) if mode == 'relu' else jnp.tanh(y)

  message = staticmethod(static_models.shown)

  def assert_matches_plain(self, rematted, *args, **kwargs):
    """``rematted(m, x, ...)`` computes and differentiates as ``forward``."""
    x = jnp.ones((2, 3))
    loss, grads = nnx.value_and_grad(
      lambda m: rematted(m, x, *args, **kwargs).sum()
    )(self.MLP(nnx.Rngs(0)))
    expected_loss, expected_grads = nnx.value_and_grad(
      lambda m: self.forward(m, x, *args, **kwargs).sum()
    )(self.MLP(nnx.Rngs(0)))
    np.testing.assert_allclose(loss, expected_loss)
    jax.tree.map(np.testing.assert_allclose, grads, expected_grads)

  def test_unknown_name_suggests_parameter(self):
    rematted = nnx.remat(self.MLP.__call__, static_argnames='determinstic')
    with self.assertRaisesRegex(
      ValueError, "nnx.remat(.|\n)*'determinstic'(.|\n)*'deterministic'"
    ):
      rematted(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)))

  def test_out_of_range_index_shows_numbering(self):
    rematted = nnx.remat(self.MLP.__call__, static_argnums=3)
    with self.assertRaisesRegex(
      ValueError, 'static_argnums index 3(.|\n)*0 \\| -3  self'
    ):
      rematted(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)))

  def test_array_for_static_argument_works_and_is_named_when_it_fails(self):
    # A concrete array is a valid static value (closed over, as Flax accepts
    # it): the result is the unrematted method's.
    rematted = nnx.remat(self.MLP.__call__, static_argnames='deterministic')
    x = jnp.ones((2, 3))
    np.testing.assert_allclose(
      rematted(self.MLP(nnx.Rngs(0)), x, jnp.array(True)),
      self.MLP(nnx.Rngs(0))(x, jnp.array(True)),
    )
    # Traced (by a jit around it), it fails as without remat, and the note
    # names it.
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      jax.jit(lambda d: rematted(self.MLP(nnx.Rngs(0)), x, d))(
        jnp.array(True)
      )
    self.assertRegex(self.message(e.exception), '`deterministic`.*array')

  @parameterized.named_parameters(*MODES)
  def test_unknown_name_lists_what_can_be_static(self, graph, graph_updates):
    with self.assertRaisesRegex(
      ValueError,
      r"^nnx\.remat: static_argnames contains 'mdoe', which is not a"
      r" parameter of \S*forward\(m, x, deterministic=False, mode='relu'\)\."
      r"\nDid you mean static_argnames='mode'\?\n"
      r'The parameters that can be static are: m, x, deterministic, mode\.$',
    ):
      nnx.remat(
        self.forward, static_argnames='mdoe', graph=graph,
        graph_updates=graph_updates,
      )(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)))

  @parameterized.named_parameters(*MODES)
  def test_out_of_range_index_numbers_every_parameter(
    self, graph, graph_updates
  ):
    # nnx.remat passes nothing on by itself: the module `m` is 0.
    rows = ('m', 'x', 'deterministic=False', "mode='relu'")
    n = len(rows)
    # (-n - 1 is JAX's to refuse, as in Flax: tests/test_differential.py.)
    for index in (n,):
      with self.assertRaisesRegex(
        ValueError,
        f'^nnx\\.remat: static_argnums index {index} is out of range for'
        '(.|\n)*nnx\\.remat numbers the arguments of \\S*forward so:\n'
        + ''.join(f' +{i} \\| {i - n}  {row}\n' for i, row in enumerate(rows))
        + 'Name the argument instead of counting(.|\n)*'
        "static_argnames='deterministic'\\.$",
      ):
        nnx.remat(
          self.forward, static_argnums=index, graph=graph,
          graph_updates=graph_updates,
        )(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)))

  @parameterized.named_parameters(*MODES)
  def test_off_by_one_index_names_the_flag(self, graph, graph_updates):
    # `x` static is accepted; the flag it displaced is traced and fails in
    # JAX, whose error gets the note.
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      nnx.remat(
        self.forward, static_argnums=1, graph=graph,
        graph_updates=graph_updates,
      )(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)), True)
    self.assertRegex(
      self.message(e.exception),
      r'(?m)^nnx\.remat: `x` of \S*forward\(.*\) is static \(static_argnums'
      r' index 1\), but it received an array(.|\n)*'
      r' +1 \| -3  x    \(<- static_argnums index 1\)\n(.|\n)*'
      r'Did you mean `deterministic`\? In the numbering of nnx\.remat that'
      r" is static_argnums=2\. Naming it avoids counting: static_argnames="
      r"'deterministic'\.$",
    )
    self.assert_matches_plain(
      nnx.remat(
        self.forward, static_argnums=2, graph=graph,
        graph_updates=graph_updates,
      ),
      True,
    )

  def test_decorated_method_off_by_one_counts_self(self):
    def block(index):
      class Block(self.MLP):

        @nnx.remat(static_argnums=index)
        def __call__(self, x, deterministic=False):
          return super().__call__(x, deterministic=deterministic)

      return Block

    x = jnp.ones((2, 3))
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      block(1)(nnx.Rngs(0))(x, True)
    self.assertRegex(
      self.message(e.exception),
      r'(?m)^nnx\.remat: `x` of Block\.__call__\(self, x, deterministic=False\)'
      r' is static \(static_argnums index 1\)(.|\n)*'
      r' +0 \| -3  self\n +1 \| -2  x    \(<- static_argnums index 1\)\n'
      r'(.|\n)*Did you mean `deterministic`\?(.|\n)* static_argnums=2\.',
    )
    np.testing.assert_allclose(
      block(2)(nnx.Rngs(0))(x, True), self.MLP(nnx.Rngs(0))(x, True)
    )

  @parameterized.named_parameters(*MODES)
  def test_scalar_array_says_pass_a_python_value(self, graph, graph_updates):
    modes = dict(graph=graph, graph_updates=graph_updates)
    rematted = nnx.remat(
      self.forward, static_argnames='deterministic', **modes
    )
    # A concrete scalar array is a valid static value (Flax accepts it) ...
    model, x = self.MLP(nnx.Rngs(0)), jnp.ones((2, 3))
    np.testing.assert_allclose(
      rematted(model, x, jnp.array(True)), self.forward(model, x, True)
    )

    # ... and named, with the Python value to pass, when a traced flag beside
    # it fails.
    def forward(m, x, deterministic=False, relu=True):
      return self.forward(m, x, deterministic, 'relu' if relu else 'tanh')

    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      nnx.remat(forward, static_argnames='deterministic', **modes)(
        self.MLP(nnx.Rngs(0)), x, jnp.array(True), True
      )
    self.assertRegex(
      self.message(e.exception),
      r'received an array of shape \(\) and dtype bool(.|\n)*Pass a Python'
      r' value \(`deterministic=True`, not `jnp\.array\(True\)`\)',
    )
    self.assert_matches_plain(rematted, True)

  @parameterized.named_parameters(*MODES)
  def test_str_for_traced_argument_names_the_fix(self, graph, graph_updates):
    def rematted(static_argnames):
      return nnx.remat(
        self.forward, static_argnames=static_argnames, graph=graph,
        graph_updates=graph_updates,
      )

    # JAX's own TypeError (not a valid JAX type), with the note.
    with self.assertRaisesRegex(TypeError, 'is not a valid JAX type') as e:
      rematted('deterministic')(
        self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)), True, 'tanh'
      )
    self.assertRegex(
      self.message(e.exception),
      r'(?m)^nnx\.remat: `mode` of \S*forward\(.*\) received a str, which JAX'
      r" cannot trace\. Make it static: static_argnames='mode'\.$",
    )
    self.assert_matches_plain(
      rematted(('deterministic', 'mode')), True, 'tanh'
    )

  @parameterized.named_parameters(*MODES)
  def test_traced_flag_note_keeps_the_error_type(self, graph, graph_updates):
    # Without forward's str default, which graph mode traces (and refuses
    # with a TypeError, as plain Flax does: tests/test_transparency_hooks.py).
    def forward(m, x, deterministic=False):
      return self.forward(m, x, deterministic)

    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      nnx.remat(forward, graph=graph, graph_updates=graph_updates)(
        self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)), deterministic=True
      )
    self.assertRegex(
      self.message(e.exception),
      r'nnx\.remat: \S*forward was called with the Python value'
      ' deterministic=True, but `deterministic` is not static(.|\n)*'
      "make it static: static_argnames='deterministic'\\.",
    )
    self.assert_matches_plain(
      nnx.remat(
        self.forward, static_argnames='deterministic', graph=graph,
        graph_updates=graph_updates,
      ),
      deterministic=True,
    )

  @parameterized.named_parameters(*MODES)
  def test_extra_positional_flag_is_static_by_index(
    self, graph, graph_updates
  ):
    def forward(m, x, *flags):
      (deterministic,) = flags
      return self.forward(m, x, deterministic)

    modes = dict(graph=graph, graph_updates=graph_updates)
    with self.assertRaisesRegex(
      ValueError,
      r"'\*flags\[0\]', which is not a parameter name of forward\(m, x,"
      r' \*flags\)\. An extra positional argument that \*flags collects has'
      r' no name: make it static by position with static_argnums=2\.',
    ):
      nnx.remat(forward, static_argnames='*flags[0]', **modes)(
        self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)), True
      )
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      nnx.remat(forward, **modes)(self.MLP(nnx.Rngs(0)), jnp.ones((2, 3)), True)
    self.assertRegex(
      self.message(e.exception),
      r'the Python value \*flags\[0\]=True, but `\*flags\[0\]` is not'
      '(.|\n)*make it static: static_argnums=2\\.',
    )
    self.assert_matches_plain(
      nnx.remat(forward, static_argnums=2, **modes), True
    )

  @parameterized.named_parameters(*MODES)
  def test_flag_traced_by_outer_jit(self, graph, graph_updates):
    rematted = nnx.remat(
      self.forward, static_argnames='deterministic', graph=graph,
      graph_updates=graph_updates,
    )

    def train_step(m, x, deterministic):
      return rematted(m, x, deterministic)

    model, x = self.MLP(nnx.Rngs(0)), jnp.ones((2, 3))
    with self.assertRaises(jax.errors.ConcretizationTypeError) as e:
      nnx.jit(train_step)(model, x, True)
    self.assertRegex(
      self.message(e.exception),
      r'`deterministic` of \S*forward\(.*\) is static \(static_argnames\),'
      r' but it received an array of shape \(\)(.|\n)*`deterministic` is a'
      r' traced scalar(.|\n)*'
      r"`jax\.jit\(train_step, static_argnames='deterministic'\)`",
    )
    np.testing.assert_allclose(
      nnx.jit(train_step, static_argnames='deterministic')(model, x, True),
      self.forward(model, x, True),
    )

  def test_arguments_of_the_wrong_type(self):
    # Wrapping works; the first call raises.
    model, x = self.MLP(nnx.Rngs(0)), jnp.ones((2, 3))
    rematted = nnx.remat(self.forward, static_argnums='deterministic')
    with self.assertRaises(TypeError) as e:  # JAX's, with a note
      rematted(model, x)
    self.assertRegex(
      '\n'.join(e.exception.__notes__),
      "\nnnx\\.remat: static_argnums must be an int or a sequence of ints,"
      " got 'deterministic'. To make arguments static by name, use"
      ' static_argnames.$',
    )
    rematted = nnx.remat(self.forward, static_argnames=2)
    with self.assertRaisesRegex(
      TypeError,
      r'^nnx\.remat: static_argnames must be a str or a sequence of str,'
      r' got 2\.$',
    ):
      rematted(model, x)
