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

"""Tests for nn.tie under Linen's lifted transforms, and tie_variables."""

# In the style of Flax's own tests: they run on Flax with the plugin installed.
# Upstream, ties are a design question first (patches/flip/).

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

  @parameterized.named_parameters(('equal', None), ('mean', 'mean'))
  def test_conversion_stays_on_the_devices_and_keeps_each_sharding(
      self, merge):
    # Each leaf split over every device there is. The conversions compute on
    # the devices: each leaf keeps its sharding, and no array goes through
    # the host (the transfer guard refuses its way back to the devices, and
    # on an accelerator its way out; it does not watch reads of CPU arrays).
    n = jax.device_count()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ('model',))
    model = TieTest.Stack(features=(2 * n, 2 * n))
    x = random.normal(random.key(0), (2, 2 * n))
    checkpoint = model.init(random.key(1), x)
    if merge is None:  # an untied checkpoint trained with b kept equal to a
      checkpoint['params']['b'] = checkpoint['params']['a']
    spec = lambda v: jax.sharding.PartitionSpec(*[None] * (v.ndim - 1), 'model')
    checkpoint = jax.tree.map(
        lambda v: jax.device_put(v, jax.sharding.NamedSharding(mesh, spec(v))),
        checkpoint)
    with jax.transfer_guard('disallow'):
      tied = tie_convert.tie_variables(checkpoint, {'b': 'a'}, merge=merge)
      untied = tie_convert.untie_variables(tied, {'b': 'a'})
    of = lambda tree: jax.tree.map(lambda v: v.sharding, tree)
    self.assertEqual(of(tied['params']['a']), of(checkpoint['params']['a']))
    self.assertEqual(of(untied), of(checkpoint))
    params = checkpoint['params']
    expected = params['a'] if merge is None else jax.tree.map(
        lambda a, b: (a + b) / 2, params['a'], params['b'])
    jax.tree.map(np.testing.assert_allclose, tied['params']['a'], expected)
    jax.tree.map(np.testing.assert_allclose, untied['params']['b'], expected)

  def test_a_stacks_copies_gain_an_unsharded_leading_axis(self):
    ties_ = {'stack/attn': 'src'}
    tied = nn.tie(TieTest.Stacked, ties_)('scan')
    xs = random.normal(random.key(0), (2, 3))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ('model',))
    sharding = lambda *spec: jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(*spec))
    variables = jax.device_put(tied.init(random.key(1), xs), sharding())
    stacks = {'stack': 2}
    with jax.transfer_guard('disallow'):
      untied = tie_convert.untie_variables(variables, ties_, stacks=stacks)
      retied = tie_convert.tie_variables(untied, ties_, stacks=stacks)
    for leaf in jax.tree.leaves(untied['params']['stack']['attn']):
      self.assertEqual(leaf.sharding, sharding(None))
    of = lambda tree: jax.tree.map(lambda v: v.sharding, tree)
    self.assertEqual(of(retied), of(variables))
    jax.tree.map(np.testing.assert_array_equal, retied, variables)

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
