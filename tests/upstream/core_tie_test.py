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

"""Tests for ties in flax.core: the tie record, ties as scope state, lift.tie."""

# In the style of Flax's own tests: they run on Flax with the plugin installed.
# Upstream, ties are a design question first (patches/flip/).


import itertools

from absl.testing import parameterized
import jax
from jax import numpy as jnp
from jax import random
import numpy as np

from flax.core import DenyList, apply, init, lift, meta, nn
import flax_tieext  # noqa: F401  (installs the features into Flax)
from flax_tieext import errors
from flax_tieext.core import tie_errors
from flax_tieext.core import tie_spec
from flax_tieext.core import ties


class TieSpecTest(parameterized.TestCase):
  """`tie_spec.normalize`: ties as written, resolved to absolute `Tie`s."""

  TREE = {
      'encoder': {'block_0': {'kernel': 0}, 'block_1': {'kernel': 1}},
      'head': {},
  }

  @parameterized.named_parameters(
      ('sibling', {'b': 'a'}, ('m',), ('m', 'b'), ('m', 'a')),
      ('variable', {'b/kernel': 'a/kernel'}, ('m',), ('m', 'b', 'kernel'),
       ('m', 'a', 'kernel')),
      ('declaring_scope', {'.': '../src'}, ('m', 't'), ('m', 't'),
       ('m', 'src')),
      ('parent', {'b': '../a'}, ('m', 'c'), ('m', 'c', 'b'), ('m', 'a')),
      ('absolute', {'/x/b': '/y'}, ('m',), ('x', 'b'), ('y',)),
      ('dots_and_slashes', {'./b/.': 'a//./'}, ('m',), ('m', 'b'),
       ('m', 'a')),
  )
  def test_paths_resolve_from_the_declaring_scope(
      self, spec, declared_at, target, source
  ):
    (tie,) = tie_spec.normalize(spec, 'params', declared_at)
    self.assertEqual(tie.target, target)
    self.assertEqual(tie.source, source)
    self.assertEqual(tie.declared_at, declared_at)
    self.assertIsNone(tie.view)

  def test_spellings_of_one_tie_give_one_record(self):
    expected = tie_spec.normalize({'b': 'a'}, 'params', ('m',))
    for spec in ({'./b': './a'}, {'/m/b': '/m/a'}, {'b': '../m/a'},
                 {'b/': 'a/.'}, {'b': 'a', './b': '/m/a'}):
      self.assertEqual(tie_spec.normalize(spec, 'params', ('m',)), expected)

  @parameterized.named_parameters(
      ('forward', {'a': 'b', 'b': 'c', 'c': 'd'}),
      ('backward', {'c': 'd', 'b': 'c', 'a': 'b'}),
  )
  def test_chain_resolves_to_its_end(self, spec):
    resolved = tie_spec.normalize(spec, 'params', ())
    self.assertEqual({t.target: t.source for t in resolved},
                     {('a',): ('d',), ('b',): ('d',), ('c',): ('d',)})

  def test_chain_composes_its_views(self):
    double, shift = (lambda v: 2 * v), (lambda v: v + 1)
    resolved = {t.target: t for t in tie_spec.normalize(
        {'d': 'c', 'c': ('b', double), 'b': ('a', shift)}, 'params', ())}
    self.assertEqual({t.source for t in resolved.values()}, {('a',)})
    x = np.arange(3.0)
    np.testing.assert_array_equal(resolved[('c',)].view(x), double(shift(x)))
    np.testing.assert_array_equal(resolved[('d',)].view(x), double(shift(x)))
    self.assertIs(resolved[('b',)].view, shift)

  def test_stacked_declarations_compose_alike_in_every_order(self):
    # A chain over two declarations (c -> b -> a), a tied child of its end
    # (a/d), carried over to every target of the chain, and a tie into a
    # target (e/k -> c/k), which resolves through it.
    declared = [
        *tie_spec.normalize({'c': 'b'}, 'params', ()),
        *tie_spec.normalize({'b': 'a'}, 'params', ()),
        *tie_spec.normalize({'a/d': 'x/d'}, 'params', ()),
        *tie_spec.normalize({'e/k': 'c/k'}, 'params', ()),
    ]
    forms = {tuple((t.target, t.source) for t in tie_spec.compose(order))
             for order in itertools.permutations(declared)}
    self.assertLen(forms, 1)
    self.assertEqual(dict(forms.pop()), {
        ('a', 'd'): ('x', 'd'), ('b',): ('a',), ('b', 'd'): ('x', 'd'),
        ('c',): ('a',), ('c', 'd'): ('x', 'd'), ('e', 'k'): ('a', 'k')})

  def test_a_target_modules_own_tie_is_followed_first(self):
    # b -> a, and b itself declares d -> ../x: the longest prefix wins, so
    # b/d is x, and the rest of b is a's.
    resolved = tie_spec.compose((
        *tie_spec.normalize({'b': 'a'}, 'params', ()),
        *tie_spec.normalize({'d': '../x'}, 'params', ('b',))))
    self.assertEqual({t.target: t.source for t in resolved},
                     {('b',): ('a',), ('b', 'd'): ('x',)})

  def test_views_compose_alike_in_every_order_of_declaration(self):
    double, shift = (lambda v: 2 * v), (lambda v: v + 1)
    declared = [*tie_spec.normalize({'c': ('b', double)}, 'params', ()),
                *tie_spec.normalize({'b': ('a', shift)}, 'params', ())]
    x = np.arange(3.0)
    for order in itertools.permutations(declared):
      resolved = {t.target: t for t in tie_spec.compose(order)}
      self.assertEqual(resolved[('c',)].source, ('a',))
      np.testing.assert_array_equal(resolved[('c',)].view(x), double(shift(x)))

  def test_two_declared_sources_of_one_target_are_refused_in_every_order(self):
    declared = [*tie_spec.normalize({'c': 'a'}, 'params', ()),
                *tie_spec.normalize({'c': 'b'}, 'params', ())]
    for order in itertools.permutations(declared):
      with self.assertRaisesRegex(
          errors.TieError,
          r'/c is given two sources: /a \(the tie /c -> /a(.|\n)*and /b'
          r' \(the tie /c -> /b(.|\n)*whatever the order'):
        tie_spec.compose(order)

  @parameterized.named_parameters(
      ('itself', {'b': './b'},
       "'b' -> './b' declared at /m ties /m/b to itself"),
      ('cycle', {'a': 'b', 'b': 'c', 'c': 'a'},
       'form a cycle: /m/a -> /m/b -> /m/c -> /m/a'),
      ('ancestor', {'a/dense': 'a'}, '/m/a/dense lies inside /m/a'),
      ('descendant', {'a': 'a/dense'}, '/m/a/dense lies inside /m/a'),
      ('ancestor_at_end_of_chain', {'a/dense': 'b', 'b': 'a'},
       '/m/a/dense lies inside /m/a'),
      ('two_sources', {'c': 'a', './c': 'b'},
       r"'c' and './c' declared at /m both name /m/c, with different sources"
       r' \(/m/a and /m/b\)'),
      ('above_root', {'b': '../../a'},
       "'../../a' of a tie declared at /m goes above the root module"),
  )
  def test_refused_at_declaration(self, spec, message):
    with self.assertRaisesRegex(errors.TieError, message):
      tie_spec.normalize(spec, 'params', ('m',))

  @parameterized.named_parameters(
      ('not_a_mapping', [('b', 'a')], 'ties must be a mapping'),
      ('source_not_a_str', {'b': 3}, 'source path .* must be a str, got int 3'),
      ('target_not_a_str', {1: 'a'}, 'target path .* must be a str, got int 1'),
      ('pair_without_view', {'b': ('a',)},
       r"source of tie 'b' .* \(path, view_fn\) pair, got \('a',\)"),
      ('view_not_callable', {'b': ('a', 'T')},
       r"source of tie 'b' .* \(path, view_fn\) pair, got \('a', 'T'\)"),
  )
  def test_malformed_ties_are_refused(self, spec, message):
    with self.assertRaisesRegex(errors.TieError, message):
      tie_spec.normalize(spec, 'params', ())

  @parameterized.named_parameters(
      ('name', 'params', {'params'}),
      ('list', ['params', 'state'], {'params', 'state'}),
      ('all', True, {'params', 'state', 'cache'}),
      ('deny_list', DenyList(['cache']), {'params', 'state'}),
  )
  def test_collection_filter(self, collections, tied):
    (tie,) = tie_spec.normalize({'b': 'a'}, collections, ())
    for col in ('params', 'state', 'cache'):
      self.assertEqual(tie.applies_to(col), col in tied, col)
    # Recorded in hashable form: equal declarations are one record.
    (again,) = tie_spec.normalize({'./b': 'a'}, collections, ())
    self.assertLen({tie, again}, 1)

  def test_describe_names_paths_collections_and_declaring_scope(self):
    (tie,) = tie_spec.normalize(
        {'b': ('a', jnp.transpose)}, ['params', 'state'], ('m',))
    self.assertEqual(
        tie.describe(),
        "tie /m/b -> /m/a (viewed) for collections 'params', 'state',"
        ' declared at /m')
    self.assertIn("/m/a (viewed) in collection 'state',", tie.describe('state'))

  @parameterized.named_parameters(
      ('exists', ('encoder', 'block_0'), ''),
      ('typo', ('encoder', 'blok_0'),
       'Nearest existing names under /encoder: block_0, block_1.'),
      ('unlike', ('encoder', 'decoder'),
       'Names that exist under /encoder: block_0, block_1.'),
      ('empty', ('head', 'dense'), 'Names that exist under /head: none.'),
      ('dotted', ('encoder.block_0',),
       'Paths are "/"-separated: for \'encoder.block_0\' write'
       " 'encoder/block_0'."),
  )
  def test_nearest(self, path, hint):
    self.assertEqual(tie_errors.nearest(self.TREE, path).strip(), hint)

  def test_nearest_names_the_base_of_a_subtree(self):
    self.assertEqual(
        tie_errors.nearest(self.TREE['encoder'], ('blok_0',), ('encoder',)),
        tie_errors.nearest(self.TREE, ('encoder', 'blok_0')))

  def test_did_you_mean(self):
    cols = ('params', 'batch_stats')
    self.assertEqual(tie_errors.did_you_mean('parms', cols),
                     " Did you mean 'params'?")
    self.assertEqual(tie_errors.did_you_mean('cache', cols), '')

  def test_walk(self):
    self.assertIs(tie_spec.walk(self.TREE, ()), self.TREE)
    self.assertIs(tie_spec.walk(self.TREE, ('encoder', 'block_1')),
                  self.TREE['encoder']['block_1'])
    self.assertIsNone(tie_spec.walk(self.TREE, ('encoder', 'block_2')))
    self.assertIsNone(
        tie_spec.walk(self.TREE, ('encoder', 'block_0', 'kernel', 'x')))

  def test_flatten_yields_each_leaf_with_its_path(self):
    tree = {'b': {'kernel': jnp.ones((2, 3)), 'bias': jnp.zeros(3)},
            'a': {'w': jnp.ones(1)}, 'empty': {}}
    expected = {tuple(k.key for k in path): leaf for path, leaf
                in jax.tree_util.tree_leaves_with_path(tree)}
    flat = list(tie_spec.flatten(tree))
    self.assertCountEqual([path for path, _ in flat], expected)
    for path, leaf in flat:
      self.assertIs(leaf, expected[path])
      self.assertIs(tie_spec.walk(tree, path), leaf)
    self.assertEqual(list(tie_spec.flatten(7)), [((), 7)])


class TieScopeStateTest(parameterized.TestCase):
  """Ties as state of the scope that declares them, seen through its hooks."""

  @staticmethod
  def declare(scope, spec, collections='params'):
    ties.declare(scope, spec, collections)

  @staticmethod
  def dense(scope, x):
    return nn.dense(scope, x, 3)

  @staticmethod
  def counter(scope, x):
    # A dense layer scaled by a count that each call updates: the outputs
    # depend on the order of the calls.
    count = scope.variable('state', 'count', jnp.zeros, ())
    if scope.is_mutable_collection('state'):
      count.value = 2 * count.value + 1
    return nn.dense(scope, x, 3) * count.value

  @staticmethod
  def mlp(scope, x):
    x = jnp.tanh(scope.child(nn.dense, 'l0')(x, 3))
    return scope.child(nn.dense, 'l1')(x, 3)

  @classmethod
  def pair(cls, kind, layer, collections='params', target_first=False):
    """Layers 'a' then 'b', or 'b' then 'a'.

    Args:
      kind: 'tied' ('b' is tied to 'a'), 'shared' (one child called twice,
        the reference) or 'untied' (two children).
      layer: the scope function of both layers.
      collections: the tied collections.
      target_first: whether 'b' runs first.

    Returns:
      The scope function.
    """
    def fn(scope, x):
      if kind == 'tied':
        cls.declare(scope, {'b': 'a'}, collections)
      a = scope.child(layer, 'a')
      b = a if kind == 'shared' else scope.child(layer, 'b')
      first, second = (b, a) if target_first else (a, b)
      return second(jnp.tanh(first(x)))
    return fn

  def test_only_the_source_is_stored(self):
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.counter, ('params', 'state'))
    shared = self.pair('shared', self.counter)
    _, initialized = init(tied)(random.key(1), x)
    _, variables = init(shared)(random.key(1), x)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           initialized['state'], variables['state'])
    y, updates = apply(tied, mutable='state')(variables, x)
    expected, expected_updates = apply(shared, mutable='state')(variables, x)
    np.testing.assert_allclose(y, expected)
    self.assertEqual(set(updates['state']), {'a'})
    jax.tree_util.tree_map(np.testing.assert_allclose, updates,
                           expected_updates)

  @parameterized.named_parameters(('source_first', False),
                                  ('target_first', True))
  def test_writes_land_in_program_order(self, target_first):
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.counter, ('params', 'state'), target_first)
    shared = self.pair('shared', self.counter, target_first=target_first)
    _, variables = init(shared)(random.key(1), x)
    for _ in range(2):  # each step reads what the step before wrote
      y, updates = apply(tied, mutable='state')(variables, x)
      expected, expected_updates = apply(shared, mutable='state')(variables, x)
      np.testing.assert_allclose(y, expected)
      jax.tree_util.tree_map(np.testing.assert_allclose, updates,
                             expected_updates)
      variables = {**variables, **updates}
    np.testing.assert_allclose(apply(tied)(variables, x),
                               apply(shared)(variables, x))

  def test_target_reads_the_current_value_of_its_source(self):
    def fn(scope, shared=False):
      if not shared:
        self.declare(scope, {'b': 'a'}, 'state')
      a = scope.push('a')
      b = a if shared else scope.push('b')
      seen = [b.get_variable('state', 'count')]
      a.put_variable('state', 'count', seen[-1] + 1)
      seen.append(b.get_variable('state', 'count'))
      b.put_variable('state', 'count', seen[-1] * 3)
      seen.append(a.get_variable('state', 'count'))
      return seen

    variables = {'state': {'a': {'count': jnp.ones(())}}}
    seen, updates = apply(fn, mutable='state')(variables)
    expected, expected_updates = apply(fn, mutable='state')(variables, True)
    np.testing.assert_array_equal(seen, expected)
    jax.tree_util.tree_map(np.testing.assert_array_equal, updates,
                           expected_updates)

  @parameterized.named_parameters(('source_first', False),
                                  ('target_first', True))
  def test_gradients_sum_over_both_uses(self, target_first):
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.dense, target_first=target_first)
    untied = self.pair('untied', self.dense, target_first=target_first)
    _, variables = init(self.pair('shared', self.dense))(random.key(1), x)
    params = variables['params']
    grads = jax.grad(lambda p: apply(tied)({'params': p}, x).sum())(params)
    # The untied model, both layers set to the source's values.
    copies = {'a': params['a'], 'b': params['a']}
    untied_grads = jax.grad(
        lambda p: apply(untied)({'params': p}, x).sum())(copies)
    self.assertEqual(set(grads), {'a'})
    expected = jax.tree_util.tree_map(jnp.add, untied_grads['a'],
                                      untied_grads['b'])
    jax.tree_util.tree_map(np.testing.assert_allclose, grads['a'], expected)

  def test_target_scope_sees_the_source_variables(self):
    def fn(scope, x, shared=False):
      if not shared:
        self.declare(scope, {'b': 'a'})
      a = scope.push('a')
      b = a if shared else scope.push('b')
      nn.dense(a, x, 3)
      return (b.variables(), b.has_variable('params', 'kernel'),
              b.has_variable('params', 'scale'),
              b.get_variable('params', 'kernel'),
              b.get_variable('params', 'scale', 'absent'))

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(fn)(random.key(1), x, True)
    out, expected = apply(fn)(variables, x), apply(fn)(variables, x, True)
    self.assertEqual(out[1:3], (True, False))
    jax.tree_util.tree_map(np.testing.assert_array_equal, out, expected)

  def test_only_the_tied_collections_are_shared(self):
    # 'params' tied, 'state' not: the reference is two layers whose 'state'
    # is each its own, 'b' given the values of 'a' for 'params'.
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.counter, 'params')
    untied = self.pair('untied', self.counter)
    _, variables = init(untied)(random.key(1), x)
    params = variables['params']
    given = {'params': {'a': params['a']}, 'state': variables['state']}
    copies = {**variables, 'params': {'a': params['a'], 'b': params['a']}}
    y, updates = apply(tied, mutable='state')(given, x)
    expected, expected_updates = apply(untied, mutable='state')(copies, x)
    np.testing.assert_allclose(y, expected)
    self.assertEqual(set(updates['state']), {'a', 'b'})
    jax.tree_util.tree_map(np.testing.assert_allclose, updates,
                           expected_updates)

  def test_a_tie_holds_only_under_the_scope_that_declares_it(self):
    def model(shared):
      def block(scope, x, tied):
        if tied and not shared:
          self.declare(scope, {'b': 'a'})
        a = scope.child(self.dense, 'a')
        b = a if tied and shared else scope.child(self.dense, 'b')
        return b(jnp.tanh(a(x)))

      def fn(scope, x):
        # 'm' ties its 'b' to its 'a'; its sibling 'n' has two layers.
        return scope.child(block, 'n')(scope.child(block, 'm')(x, True), False)
      return fn

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(model(shared=True))(random.key(1), x)
    self.assertEqual(set(variables['params']['m']), {'a'})
    self.assertEqual(set(variables['params']['n']), {'a', 'b'})
    loss = lambda shared: lambda v: apply(model(shared))(v, x).sum()
    np.testing.assert_allclose(loss(False)(variables), loss(True)(variables))
    jax.tree_util.tree_map(np.testing.assert_allclose,
                           jax.grad(loss(False))(variables),
                           jax.grad(loss(True))(variables))

  def test_gradients_reach_the_source_through_a_view(self):
    # 'b' computes with the transpose of 'a''s kernel, as a tied embedding
    # and output head do; the reference passes the transpose by hand.
    def fn(scope, x, kernel=None):
      if kernel is None:
        self.declare(scope, {'b': ('a', jnp.transpose)})
      a = scope.push('a')
      x = jnp.tanh(x @ a.param('kernel', nn.initializers.lecun_normal(),
                               (3, 4)))
      if kernel is None:
        kernel = scope.push('b').get_variable('params', 'kernel')
      return x @ kernel

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(fn)(random.key(1), x, jnp.zeros((4, 3)))
    loss = lambda v: apply(fn)(v, x).sum()
    by_hand = lambda v: apply(fn)(v, x, v['params']['a']['kernel'].T).sum()
    np.testing.assert_allclose(loss(variables), by_hand(variables))
    jax.tree_util.tree_map(np.testing.assert_allclose,
                           jax.grad(loss)(variables),
                           jax.grad(by_hand)(variables))

  def test_a_view_of_a_partitioned_variable_moves_its_names_with_the_axes(
      self):
    def fn(scope, view):
      self.declare(scope, {'b': ('a', view)})
      scope.push('a')
      return scope.push('b').get_variable('params', 'w')

    w = meta.Partitioned(jnp.arange(6.0).reshape(2, 3), ('embed', 'vocab'))
    variables = {'params': {'a': {'w': w}}}
    # What a module holding the transposed table by hand would hold.
    expected = meta.Partitioned(w.value.T, ('vocab', 'embed'))
    seen = apply(fn)(variables, jnp.transpose)
    self.assertEqual(seen.names, expected.names)
    np.testing.assert_array_equal(seen.value, expected.value)
    with self.assertRaisesRegex(
        errors.TieError, r"tie /b -> /a \(viewed\).* moves the partitioned"
        " axis 'embed' of /a/w in a way whose axis names cannot be followed"):
      apply(fn)(variables, lambda v: v.reshape(-1))

  def test_at_apply_a_target_continues_its_sources_rng_streams(self):
    # As one module called twice: the second use draws the next values of
    # the module's streams, not the first ones again.
    def noisy(scope, x):
      noise = random.normal(scope.make_rng('noise'), (3,))
      return nn.dense(scope, x, 3) + noise

    x = random.normal(random.key(0), (2, 3))
    shared = self.pair('shared', noisy)
    _, variables = init(shared)({'params': random.key(1),
                                 'noise': random.key(2)}, x)
    rngs = {'noise': random.key(3)}
    np.testing.assert_allclose(
        apply(self.pair('tied', noisy))(variables, x, rngs=rngs),
        apply(shared)(variables, x, rngs=rngs))

  def test_a_variable_tie_shares_one_variable_of_the_module(self):
    # 'b/kernel' is 'a/kernel'; the bias of 'b' is its own. The target has
    # both, as a module with its own kernel does.
    def fn(scope, x, tied=True):
      if tied:
        self.declare(scope, {'b/kernel': 'a/kernel'})
      x = jnp.tanh(scope.child(self.dense, 'a')(x))
      b = scope.push('b')
      y = nn.dense(b, x, 3)
      return y, [b.has_variable('params', n) for n in ('kernel', 'bias')]

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(fn)(random.key(1), x, False)
    params = variables['params']
    given = {'params': {'a': params['a'], 'b': {'bias': params['b']['bias']}}}
    b_copy = {**params['b'], 'kernel': params['a']['kernel']}
    copies = {'params': {'a': params['a'], 'b': b_copy}}
    (y, names), (expected, expected_names) = (
        apply(fn)(given, x), apply(fn)(copies, x, False))
    np.testing.assert_allclose(y, expected)
    self.assertEqual(names, expected_names)
    grads = jax.grad(lambda v: apply(fn)(v, x)[0].sum())(given)['params']
    untied = jax.grad(
        lambda v: apply(fn)(v, x, False)[0].sum())(copies)['params']
    np.testing.assert_allclose(
        grads['a']['kernel'], untied['a']['kernel'] + untied['b']['kernel'])
    np.testing.assert_allclose(grads['b']['bias'], untied['b']['bias'])

  def test_tie_survives_push_and_rewound(self):
    def fn(scope, x):
      self.declare(scope, {'b': 'a'})
      nn.dense(scope.push('a'), x, 3)
      b = scope.push('b')
      views = (b, b.rewound(), b.rewound().rewound(),
               scope.rewound().push('b'))
      return [view.get_variable('params', 'kernel') for view in views]

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(self.dense)(random.key(1), x)
    for kernel in apply(fn)({'params': {'a': variables['params']}}, x):
      np.testing.assert_array_equal(kernel, variables['params']['kernel'])

  def test_tie_declared_in_a_parent_holds_in_its_children(self):
    def model(shared):
      def block(scope, x):
        a = scope.child(self.mlp, 'a')
        b = a if shared else scope.child(self.mlp, 'b')
        return b(a(x))

      def fn(scope, x):
        if not shared:
          self.declare(scope, {'m/b': 'm/a'})
        return scope.child(block, 'm')(x)
      return fn

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(model(shared=True))(random.key(1), x)
    loss = lambda fn: lambda v: apply(fn)(v, x).sum()
    np.testing.assert_allclose(apply(model(False))(variables, x),
                               apply(model(True))(variables, x))
    jax.tree_util.tree_map(np.testing.assert_allclose,
                           jax.grad(loss(model(False)))(variables),
                           jax.grad(loss(model(True)))(variables))

  def test_a_scope_can_declare_itself_the_target(self):
    def target(scope, x):
      self.declare(scope, {'.': '../a'})
      return self.mlp(scope, x)

    def fn(scope, x, shared=False):
      a = scope.child(self.mlp, 'a')
      b = a if shared else scope.child(target, 'b')
      return b(a(x))

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(fn)(random.key(1), x, True)
    loss = lambda shared: lambda v: apply(fn)(v, x, shared).sum()
    np.testing.assert_allclose(apply(fn)(variables, x),
                               apply(fn)(variables, x, True))
    jax.tree_util.tree_map(np.testing.assert_allclose,
                           jax.grad(loss(False))(variables),
                           jax.grad(loss(True))(variables))

  def test_target_used_before_its_source_draws_the_source_values(self):
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.dense, target_first=True)
    shared = self.pair('shared', self.dense, target_first=True)
    y, variables = init(tied)(random.key(1), x)
    expected, expected_variables = init(shared)(random.key(1), x)
    np.testing.assert_allclose(y, expected)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           variables['params']['a'],
                           expected_variables['params']['a'])
    np.testing.assert_allclose(apply(tied)(expected_variables, x), expected)

  def test_declaring_the_same_tie_again_changes_nothing(self):
    def fn(scope, x):
      self.declare(scope, {'b': 'a'})
      self.declare(scope, {'b': 'a'})  # the same tie again: no change
      return scope.child(self.dense, 'b')(x)

    x = random.normal(random.key(0), (2, 3))
    _, a = init(self.dense)(random.key(1), x)
    _, c = init(self.dense)(random.key(2), x)
    y = apply(fn)({'params': {'a': a['params'], 'c': c['params']}}, x)
    np.testing.assert_allclose(y, apply(self.dense)(a, x))

  def test_declaring_a_second_source_for_a_target_is_refused(self):
    # The ties in force have one normal form: a later declaration does not
    # silently replace an earlier one (which would depend on their order).
    def fn(scope, x):
      self.declare(scope, {'b': 'a'})
      self.declare(scope, {'b': 'c'})
      return scope.child(self.dense, 'b')(x)

    x = random.normal(random.key(0), (2, 3))
    _, a = init(self.dense)(random.key(1), x)
    with self.assertRaisesRegex(
        errors.TieError, r'/b is given two sources: /a \(the tie /b -> /a'
        r'.*\) and /c \(the tie /b -> /c'):
      apply(fn)({'params': {'a': a['params'], 'c': a['params']}}, x)

  def test_a_view_is_read_only(self):
    double = lambda v: 2 * v

    def fn(scope, x, write=False):
      self.declare(scope, {'b': ('a', double)}, ['params', 'state'])
      x = self.counter(scope.push('a'), x)
      b = scope.push('b')
      if write:
        b.put_variable('state', 'count', jnp.zeros(()))
      return nn.dense(b, x, 3) * b.get_variable('state', 'count')

    def untied(scope, x):
      x = self.counter(scope.push('a'), x)
      b = scope.push('b')
      return nn.dense(b, x, 3) * b.get_variable('state', 'count')

    x = random.normal(random.key(0), (2, 3))
    _, a = init(self.counter)(random.key(1), x)
    variables = {col: {'a': a[col]} for col in a}
    # The untied model, 'b' set to the view of the source's values.
    viewed = {col: {'a': a[col], 'b': jax.tree_util.tree_map(double, a[col])}
              for col in a}
    np.testing.assert_allclose(apply(fn)(variables, x),
                               apply(untied)(viewed, x))
    with self.assertRaisesRegex(
        errors.TieError,
        "Cannot write to /b in collection 'state' at /b: the tie /b -> /a"
        r' \(viewed\).* read-only view(.|\n)*Write to the source /a instead'):
      apply(fn, mutable='state')(variables, x, write=True)

  @parameterized.parameters('params', 'state')
  def test_values_given_for_a_target_are_refused(self, col):
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.counter, ('params', 'state'))
    _, variables = init(self.pair('shared', self.counter))(random.key(1), x)
    given = {**variables, col: {**variables[col], 'b': variables[col]['a']}}
    with self.assertRaisesRegex(
        errors.TieError,
        f"Values were given for /b in collection '{col}', but it is the"
        ' target of the tie /b -> /a.*: only the source /a is stored'):
      apply(tied)(given, x)

  def test_a_tied_collection_must_be_given_or_mutable(self):
    x = random.normal(random.key(0), (2, 3))
    tied = self.pair('tied', self.counter, ('params', 'state'))
    shared = self.pair('shared', self.counter)
    _, variables = init(shared)(random.key(1), x)
    params = {'params': variables['params']}
    with self.assertRaisesRegex(
        errors.TieError,
        "ties collection 'state', .* the variables have no collection"
        " 'state' and it is not mutable(.|\n)*mutable=\\['state'\\]"):
      apply(tied)(params, x)
    _, updates = apply(tied, mutable='state')(params, x)
    _, expected = apply(shared, mutable='state')(params, x)
    jax.tree_util.tree_map(np.testing.assert_allclose, updates, expected)

  def test_a_source_that_is_not_stored_is_named(self):
    def fn(scope, x):
      self.declare(scope, {'b': 'a'})
      return scope.child(self.dense, 'b')(x)

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(self.dense)(random.key(1), x)
    with self.assertRaisesRegex(
        errors.TieError,
        r'The source /a of the tie /b -> /a .* is not stored \(looked up from'
        r' /b\)\. Names that exist under /: c\.'):
      apply(fn)({'params': {'c': variables['params']}}, x)
    np.testing.assert_allclose(
        apply(fn)({'params': {'a': variables['params']}}, x),
        apply(self.dense)(variables, x))

  @parameterized.named_parameters(('init', True), ('apply', False))
  def test_shape_mismatch_names_both_paths(self, initializing):
    def fn(scope, x):
      self.declare(scope, {'b': 'a'})
      x = scope.child(nn.dense, 'a')(x, 3)
      return scope.child(nn.dense, 'b')(x, 4)

    x = random.normal(random.key(0), (2, 3))
    _, variables = init(self.pair('shared', self.dense))(random.key(1), x)
    with self.assertRaisesRegex(
        errors.TieError,
        r'tie /b/kernel -> /a/kernel in collection .params.* the source'
        r' /a/kernel has \(3, 3\):float32, but /b/kernel has \(3, 4\)'):
      if initializing:
        init(fn)(random.key(1), x)
      else:
        apply(fn)(variables, x)


class LiftTieTest(parameterized.TestCase):

  @staticmethod
  def two_layers(scope, x, target_first=False, shared=False):
    a = scope.child(nn.dense, 'a')
    b = a if shared else scope.child(nn.dense, 'b')
    first, second = (b, a) if target_first else (a, b)
    return second(jnp.tanh(first(x, 3)), 3)

  counter = staticmethod(TieScopeStateTest.counter)

  @staticmethod
  def masked(scope, x):
    mask = scope.variable('graph', 'mask', jnp.ones, x.shape[-1:])
    return nn.dense(scope, x * mask.value, 3)

  @staticmethod
  def stepper(scope, x, step_from=None):
    # 'step' counts the calls of the modules that share it, 'calls' those of
    # this one; step_from shares the step of another scope by hand.
    owner = scope if step_from is None else step_from
    step = owner.variable('state', 'step', jnp.zeros, ())
    calls = scope.variable('state', 'calls', jnp.zeros, ())
    if scope.is_mutable_collection('state'):
      step.value = 2 * step.value + 1
      calls.value = calls.value + 1
    return x * step.value + calls.value

  @parameterized.named_parameters(('source_first', False),
                                  ('target_first', True))
  def test_module_tie_is_one_module_called_twice(self, target_first):
    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(self.two_layers, {'b': 'a'})
    y, variables = init(tied)(random.key(1), x, target_first)
    expected, expected_variables = init(self.two_layers)(
        random.key(1), x, target_first, shared=True)
    np.testing.assert_allclose(y, expected)
    self.assertEqual(set(variables['params']), {'a'})
    jax.tree_util.tree_map(np.testing.assert_array_equal, variables,
                           expected_variables)
    np.testing.assert_allclose(apply(tied)(variables, x, target_first), y)
    grads = jax.grad(
        lambda v: apply(tied)(v, x, target_first).sum())(variables)
    expected_grads = jax.grad(lambda v: apply(self.two_layers)(
        v, x, target_first, shared=True).sum())(variables)
    jax.tree_util.tree_map(np.testing.assert_allclose, grads, expected_grads)

  @parameterized.named_parameters(
      ('list', ['params', 'state']),
      ('all', True),
      ('deny_list', DenyList(['cache'])),
  )
  def test_tied_collections(self, collections):
    def model(scope, x, target_first=False, shared=False):
      a = scope.child(self.counter, 'a')
      b = a if shared else scope.child(self.counter, 'b')
      first, second = (b, a) if target_first else (a, b)
      return second(jnp.tanh(first(x)))

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(model, {'b': 'a'}, collections=collections)
    y, variables = init(tied)(random.key(1), x)
    expected, expected_variables = init(model)(random.key(1), x, shared=True)
    np.testing.assert_allclose(y, expected)
    jax.tree_util.tree_map(np.testing.assert_array_equal, variables,
                           expected_variables)
    for target_first in (False, True):
      y, updates = apply(tied, mutable='state')(variables, x, target_first)
      expected, expected_updates = apply(model, mutable='state')(
          variables, x, target_first, shared=True)
      np.testing.assert_allclose(y, expected)
      jax.tree_util.tree_map(np.testing.assert_allclose, updates,
                             expected_updates)

  @parameterized.named_parameters(
      ('missing_target', {'bb': 'a'},
       ('The target /bb of the tie /bb -> /a', 'does not exist',
        'Nearest existing names under /: b.', 'Fix the target path')),
      ('missing_source', {'b': 'aa'},
       ('The source /aa of the tie /b -> /aa', 'does not exist',
        'Nearest existing names under /: a.', 'Fix the source path')),
      ('missing_target_variable', {'b/kernal': 'a/kernel'},
       ('The target /b/kernal of the tie', 'does not exist',
        'Nearest existing names under /b: kernel.')),
      ('missing_source_variable', {'b/kernel': 'a/kernal'},
       ('The source /a/kernal of the tie', 'does not exist',
        'Nearest existing names under /a: kernel.')),
      ('dotted_path', {'b.kernel': 'a/kernel'},
       ('The target /b.kernel of the tie',
        "Paths are \"/\"-separated: for 'b.kernel' write 'b/kernel'.")),
      ('variable_to_module', {'b/kernel': 'a'},
       ("In the tie /b/kernel -> /a in collection 'params', declared at /,"
        ' the target is a variable but the source is a module.',)),
  )
  def test_init_checks_each_tie(self, spec, fragments):
    x = random.normal(random.key(0), (2, 3))
    with self.assertRaises(errors.TieError) as e:
      init(lift.tie(self.two_layers, spec))(random.key(1), x)
    message = str(e.exception)
    for fragment in fragments + ("'params'", 'declared at /'):
      self.assertIn(fragment, message)

  def test_init_whose_method_never_runs_the_source(self):
    def model(scope, x, run_source=True):
      if run_source:
        x = scope.child(nn.dense, 'a')(x, 3)
      return scope.child(nn.dense, 'b')(x, 3)

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(model, {'b': 'a'})
    with self.assertRaisesRegex(
        errors.TieError,
        'The source /a of the tie /b -> /a .* does not exist(.|\n)*'
        'Initialize with a method that also runs the source'):
      init(tied)(random.key(1), x, run_source=False)
    _, variables = init(tied)(random.key(1), x)
    self.assertEqual(set(variables['params']), {'a'})

  @parameterized.named_parameters(
      ('shape_source_first', False, (4,), jnp.float32),
      ('shape_target_first', True, (4,), jnp.float32),
      ('dtype_target_first', True, (3,), jnp.bfloat16),
  )
  def test_target_must_match_its_source(self, target_first, shape, dtype):
    def scaled(scope, x, shape, dtype=jnp.float32):
      w = scope.param('w', jax.nn.initializers.ones, shape, dtype)
      return x * w.sum()

    def model(scope, x):
      a = lambda h: scope.child(scaled, 'a')(h, (3,))
      b = lambda h: scope.child(scaled, 'b')(h, shape, dtype)
      return a(b(x)) if target_first else b(a(x))

    x = random.normal(random.key(0), (2, 3))
    with self.assertRaises(errors.TieError) as e:
      init(lift.tie(model, {'b': 'a'}))(random.key(1), x)
    self.assertIn(
        "mismatch in the tie /b/w -> /a/w in collection 'params', declared at"
        f' /: the source /a/w has (3,):float32, but /b/w has {shape}:'
        f'{np.dtype(dtype)}.', str(e.exception))

  @parameterized.named_parameters(
      ('module', 'two_layers', {'b': 'a'}, 'parms',
       ("ties collection 'parms', but init created no collection 'parms'",
        "/b is stored in collection 'params'", "collections='params'")),
      ('variable', 'masked', {'b/mask': 'a/mask'}, 'params',
       ('ties nothing', "/b/mask is stored in collection 'graph'",
        "collections='graph'")),
  )
  def test_wrong_collection_names_the_one_that_holds_the_target(
      self, layer, spec, collections, fragments):
    def two_masked(scope, x):
      x = scope.child(self.masked, 'a')(x)
      return scope.child(self.masked, 'b')(x)

    model = self.two_layers if layer == 'two_layers' else two_masked
    x = random.normal(random.key(0), (2, 3))
    with self.assertRaises(errors.TieError) as e:
      init(lift.tie(model, spec, collections))(random.key(1), x)
    for fragment in fragments:
      self.assertIn(fragment, str(e.exception))

  def test_variable_tie_is_one_variable_at_two_paths(self):
    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(self.two_layers, {'b/kernel': 'a/kernel'})
    y, variables = init(tied)(random.key(1), x)
    # The target module stores only its other variables.
    _, untied = init(self.two_layers)(random.key(1), x)
    del untied['params']['b']['kernel']
    jax.tree_util.tree_map(np.testing.assert_array_equal, variables, untied)
    # The untied model with b's kernel set to a's by hand.
    params = variables['params']
    by_hand = {'a': params['a'], 'b': {**params['b'],
                                       'kernel': params['a']['kernel']}}
    expected = apply(self.two_layers)({'params': by_hand}, x)
    np.testing.assert_allclose(y, expected)
    np.testing.assert_allclose(apply(tied)(variables, x), expected)
    grads = jax.grad(lambda p: apply(tied)({'params': p}, x).sum())(params)
    by_hand_grads = jax.grad(
        lambda p: apply(self.two_layers)({'params': p}, x).sum())(by_hand)
    np.testing.assert_allclose(
        grads['a']['kernel'],
        by_hand_grads['a']['kernel'] + by_hand_grads['b']['kernel'])
    self.assertEqual(set(grads['b']), {'bias'})
    np.testing.assert_allclose(grads['b']['bias'], by_hand_grads['b']['bias'])

  @parameterized.named_parameters(('source_first', False),
                                  ('target_first', True))
  def test_variable_tie_stores_what_the_source_draws(self, target_first):
    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(self.two_layers, {'b/kernel': 'a/kernel'})
    _, variables = init(tied)(random.key(1), x, target_first)
    _, untied = init(self.two_layers)(random.key(1), x)
    del untied['params']['b']['kernel']
    jax.tree_util.tree_map(np.testing.assert_array_equal, variables, untied)

  def test_target_scope_sees_the_tied_variable(self):
    def model(scope, x):
      a, b = scope.push('a'), scope.push('b')
      nn.dense(b, nn.dense(a, x, 3), 3)
      return (b.has_variable('params', 'kernel'),
              b.get_variable('params', 'kernel'),
              b.get_variable('params', 'bias'))

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(model, {'b/kernel': 'a/kernel'})
    _, variables = init(tied)(random.key(1), x)
    self.assertNotIn('kernel', variables['params']['b'])
    has_kernel, kernel, bias = apply(tied)(variables, x)
    self.assertTrue(has_kernel)
    np.testing.assert_array_equal(kernel, variables['params']['a']['kernel'])
    np.testing.assert_array_equal(bias, variables['params']['b']['bias'])

  def test_target_scope_variables_hold_the_tied_variable(self):
    def model(scope, x):
      a, b = scope.push('a'), scope.push('b')
      nn.dense(b, nn.dense(a, x, 3), 3)
      return b.variables()

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(model, {'b/kernel': 'a/kernel'})
    _, variables = init(tied)(random.key(1), x)
    seen = apply(tied)(variables, x)
    params = variables['params']
    # What the untied model's b holds, with a's kernel at b/kernel.
    by_hand = {'a': params['a'], 'b': {**params['b'],
                                       'kernel': params['a']['kernel']}}
    expected = apply(model)({'params': by_hand}, x)
    self.assertEqual(sorted(seen['params']), sorted(expected['params']))
    jax.tree_util.tree_map(np.testing.assert_array_equal, seen, expected)

  def test_values_given_for_a_tied_variable_are_refused(self):
    x = random.normal(random.key(0), (2, 3))
    _, untied = init(self.two_layers)(random.key(1), x)
    tied = lift.tie(self.two_layers, {'b/kernel': 'a/kernel'})
    with self.assertRaisesRegex(
        errors.TieError, r'(?s)Values were given for /b/kernel.*tie_variables'):
      apply(tied)(untied, x)

  @parameterized.named_parameters(
      ('module_to_variable', {'b': 'a/kernel'}, False,
       'the target is a module but the source is a variable',
       '"b/kernel": "a/kernel"'),
      ('module_to_variable_target_first', {'b': 'a/kernel'}, True,
       'the target is a module but the source is a variable',
       '"b/kernel": "a/kernel"'),
      ('variable_to_module', {'b/kernel': 'a'}, False,
       'the target is a variable but the source is a module',
       '"b/kernel": "a/kernel"'),
  )
  def test_module_and_variable_are_not_tied(self, spec, target_first, what,
                                            fix):
    x = random.normal(random.key(0), (2, 3))
    with self.assertRaises(errors.TieError) as e:
      init(lift.tie(self.two_layers, spec))(random.key(1), x, target_first)
    self.assertIn(what, str(e.exception))
    self.assertIn(fix, str(e.exception))

  def test_writes_through_a_variable_tie_land_in_the_source(self):
    def model(scope, x, target_first=False, by_hand=False):
      a, b = scope.push('a'), scope.push('b')
      step_from = a.rewound() if by_hand else None
      if target_first:
        return self.stepper(a, self.stepper(b, x, step_from))
      return self.stepper(b, self.stepper(a, x), step_from)

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(model, {'b/step': 'a/step'}, collections='state')
    y, variables = init(tied)(random.key(1), x)
    expected, expected_variables = init(model)(random.key(1), x, by_hand=True)
    np.testing.assert_allclose(y, expected)
    self.assertEqual(set(variables['state']['b']), {'calls'})
    jax.tree_util.tree_map(np.testing.assert_array_equal, variables,
                           expected_variables)
    for target_first in (False, True, False):
      y, variables = apply(tied, mutable='state')(variables, x, target_first)
      expected, expected_variables = apply(model, mutable='state')(
          expected_variables, x, target_first, by_hand=True)
      np.testing.assert_allclose(y, expected)
      jax.tree_util.tree_map(np.testing.assert_allclose, variables,
                             expected_variables)

  def test_viewed_variable_is_read_only(self):
    def project(scope, x, features):
      kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(),
                           (x.shape[-1], features))
      return x @ kernel

    def autoencoder(scope, x, write=False):
      h = jnp.tanh(scope.child(project, 'encode')(x, 5))
      decode = scope.push('decode')
      if write:
        decode.put_variable('params', 'kernel', jnp.zeros((5, 3)))
      return project(decode, h, 3)

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(
        autoencoder, {'decode/kernel': ('encode/kernel', jnp.transpose)})
    y, variables = init(tied)(random.key(1), x)
    self.assertEqual(set(variables['params']), {'encode'})
    kernel = variables['params']['encode']['kernel']
    by_hand = {'encode': {'kernel': kernel}, 'decode': {'kernel': kernel.T}}
    np.testing.assert_allclose(y, apply(autoencoder)({'params': by_hand}, x))
    grads = jax.grad(lambda v: apply(tied)(v, x).sum())(variables)
    by_hand_grads = jax.grad(
        lambda p: apply(autoencoder)({'params': p}, x).sum())(by_hand)
    np.testing.assert_allclose(
        grads['params']['encode']['kernel'],
        by_hand_grads['encode']['kernel'] + by_hand_grads['decode']['kernel'].T,
        rtol=1e-6)
    with self.assertRaisesRegex(
        errors.TieError,
        "Cannot write to /decode/kernel in collection 'params' at /decode: the"
        r' tie /decode/kernel -> /encode/kernel \(viewed\)(.|\n)*Write to the'
        ' source /encode/kernel instead'):
      apply(tied, mutable='params')(variables, x, write=True)


class LiftedTieTest(parameterized.TestCase):
  """Ties through lifted transforms (`pack(..., tie_sources=...)`), in core."""

  dense = staticmethod(TieScopeStateTest.dense)
  counter = staticmethod(TieScopeStateTest.counter)

  @staticmethod
  def jit(f):
    # lift.jit passes its caller's hash key (Linen: the module's) to `f`.
    jitted = lift.jit(lambda scope, _, x: f(scope, x))
    return lambda scope, x: jitted(scope, 'layer', x)

  @staticmethod
  def scan(f):
    # Three steps of `f`, its variables broadcast into every step.
    scanned = lift.scan(lambda scope, c, _: (jnp.tanh(f(scope, c)), None),
                        variable_broadcast='params',
                        split_rngs={'params': False}, length=3)
    return lambda scope, x: scanned(scope, x, None)[0]

  @staticmethod
  def cond(f):
    return lambda scope, x: lift.cond(True, f, f, scope, x)

  # Each transform wraps the second use; its source, the first, is outside.
  TRANSFORMS = (
      ('remat', lambda f: lift.remat(f)),
      ('checkpoint_no_rngs', lambda f: lift.checkpoint(f, rngs=False)),
      ('jit', lambda f: LiftedTieTest.jit(f)),
      ('vmap', lambda f: lift.vmap(
          f, variable_axes={'params': None}, split_rngs={'params': False})),
      ('scan', lambda f: LiftedTieTest.scan(f)),
      ('cond', lambda f: LiftedTieTest.cond(f)),
  )

  @classmethod
  def layers(cls, scope, x, transform, layer=None, shared=False):
    # `b` is the second use of `a` (shared), or a module of its own.
    layer = layer or cls.dense
    a = scope.push('a')
    b = a if shared else scope.push('b')
    h = jnp.tanh(layer(a.rewound(), x))
    return transform(layer)(b.rewound(), h)

  def assert_trees_close(self, actual, expected):
    self.assertEqual(jax.tree_util.tree_structure(actual),
                     jax.tree_util.tree_structure(expected))
    jax.tree_util.tree_map(
        lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6), actual,
        expected)

  @parameterized.named_parameters(*TRANSFORMS)
  def test_source_outside_the_transform_is_one_module_called_twice(
      self, transform):
    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(
        lambda scope, x: self.layers(scope, x, transform), {'b': 'a'})
    shared = lambda scope, x: self.layers(scope, x, transform, shared=True)
    y, variables = init(tied)(random.key(1), x)
    expected_y, expected = init(shared)(random.key(1), x)
    self.assertEqual(set(variables['params']), {'a'})
    self.assert_trees_close(variables, expected)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)
    np.testing.assert_allclose(apply(tied)(variables, x), y, rtol=1e-6)
    grads = jax.grad(lambda v: apply(tied)(v, x).sum())(variables)
    expected_grads = jax.grad(lambda v: apply(shared)(v, x).sum())(variables)
    self.assert_trees_close(grads, expected_grads)

  @parameterized.named_parameters(
      ('remat', lambda f: lift.remat(f, variables=True)),
      ('jit', lambda f: LiftedTieTest.jit(f)),
  )
  def test_writes_inside_the_transform_land_in_the_source_in_order(
      self, transform):
    x = random.normal(random.key(0), (2, 3))

    def model(scope, x, shared=False):
      return self.layers(scope, x, transform, self.counter, shared)

    tied = lift.tie(model, {'b': 'a'}, collections=['params', 'state'])
    shared = lambda scope, x: model(scope, x, shared=True)
    _, variables = init(tied)(random.key(1), x)
    _, expected = init(shared)(random.key(1), x)
    self.assertEqual(set(variables['state']), {'a'})
    self.assert_trees_close(variables, expected)
    y, state = apply(tied, mutable='state')(variables, x)
    expected_y, expected_state = apply(shared, mutable='state')(expected, x)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)
    self.assert_trees_close(state, expected_state)
    self.assertEqual(float(state['state']['a']['count']), 15.0)  # 2 calls

  def test_source_outside_vmap_is_a_broadcast_value(self):
    x = random.normal(random.key(0), (4, 3))
    vmap = lambda f: lift.vmap(f, variable_axes={'params': None},
                               split_rngs={'params': False})
    tied = lift.tie(lambda scope, x: self.layers(scope, x, vmap), {'b': 'a'})
    _, variables = init(tied)(random.key(1), x)
    kernel = variables['params']['a']['kernel']
    self.assertEqual(kernel.shape, (3, 3))  # not mapped
    y = apply(tied)(variables, x)
    h = jnp.tanh(x @ kernel + variables['params']['a']['bias'])
    np.testing.assert_allclose(
        y, h @ kernel + variables['params']['a']['bias'], rtol=1e-6)

  def test_jit_reads_its_source_anew_at_each_call(self):
    # LIFT_CACHED: jit's trace cache never holds a stale source value.
    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(
        lambda scope, x: self.layers(scope, x, self.jit), {'b': 'a'})
    shared = lambda scope, x: self.layers(scope, x, self.jit, shared=True)
    _, variables = init(tied)(random.key(1), x)
    doubled = jax.tree_util.tree_map(lambda v: 2 * v, variables)
    for v in (variables, doubled, variables):
      np.testing.assert_allclose(
          apply(tied)(v, x), apply(shared)(v, x), rtol=1e-6)

  def test_source_outside_scan_is_broadcast_into_every_step(self):
    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(
        lambda scope, x: self.layers(scope, x, self.scan), {'b': 'a'})
    _, variables = init(tied)(random.key(1), x)
    params = variables['params']['a']
    self.assertEqual(params['kernel'].shape, (3, 3))  # not stacked
    h = jnp.tanh(x @ params['kernel'] + params['bias'])
    for _ in range(3):
      h = jnp.tanh(h @ params['kernel'] + params['bias'])
    np.testing.assert_allclose(apply(tied)(variables, x), h, rtol=1e-5)

  # A source outside vmap or scan is a read-only value: it runs first (the
  # TieError says so); one outside a transform without rngs cannot draw.
  @parameterized.named_parameters(*(t for t in TRANSFORMS if t[0] in (
      'remat', 'jit', 'cond')))
  def test_init_does_not_depend_on_which_use_runs_first(self, transform):
    x = random.normal(random.key(0), (2, 3))

    def model(scope, x, target_first):
      a, b = scope.push('a'), scope.push('b')
      if target_first:  # the target, inside the transform, runs first
        h = transform(self.dense)(b.rewound(), x)
        return self.dense(a.rewound(), jnp.tanh(h))
      h = self.dense(a.rewound(), x)
      return transform(self.dense)(b.rewound(), jnp.tanh(h))

    tied = lift.tie(model, {'b': 'a'})
    _, source_first = init(tied)(random.key(1), x, False)
    _, target_first = init(tied)(random.key(1), x, True)
    self.assertEqual(set(target_first['params']), {'a'})
    self.assert_trees_close(target_first, source_first)

  def test_a_transform_that_declares_nothing_refuses_a_crossing_tie(self):
    def declares_nothing(fn):
      def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
        scope = scope_fn(variable_groups, rng_groups)
        return fn(scope, *args), repack_fn(scope)
      return lift.pack(inner, (True,), (True,), (True,), name='my_transform')

    x = random.normal(random.key(0), (2, 3))
    tied = lift.tie(
        lambda scope, x: self.layers(scope, x, declares_nothing), {'b': 'a'})
    with self.assertRaisesRegex(
        errors.TieError,
        r"target of the tie /b -> /a(.|\n)*inside the lifted transform"
        r" 'my_transform'(.|\n)*does not declare what it does with a tie"
        r' source outside it(.|\n)*Declare the tie inside the transform'):
      init(tied)(random.key(1), x)

  def test_a_tie_declared_inside_the_transform_reaches_only_inside(self):
    x = random.normal(random.key(0), (2, 3))

    def inner(scope, x):
      return self.layers(scope, x, lambda f: f)

    def model(scope, x, shared=False):
      tied = inner if shared else lift.tie(inner, {'b': 'a'})
      wrapped = lift.remat(
          (lambda s, x: self.layers(s, x, lambda f: f, shared=True))
          if shared else tied)
      return scope.child(wrapped, 'm')(x)

    y, variables = init(model)(random.key(1), x)
    expected_y, expected = init(model)(random.key(1), x, True)
    self.assertEqual(set(variables['params']['m']), {'a'})
    self.assert_trees_close(variables, expected)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)

  def test_without_ties_pack_is_flax_own(self):
    scope_flags = []

    def probe(scope, x):
      scope_flags.append(dict(scope.flags))
      return self.dense(scope, x)

    x = random.normal(random.key(0), (2, 3))
    init(lambda scope, x: scope.child(lift.remat(probe), 'a')(x))(
        random.key(1), x)
    self.assertTrue(scope_flags)
    for flags in scope_flags:  # Flax's own: nn.jit keys its traces on them
      self.assertEqual(set(flags), {'initializing'})
