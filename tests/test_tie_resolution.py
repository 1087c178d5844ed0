"""What a set of ties means, and where it holds: resolution.

Wherever ties are declared (one mapping, stacked ``nn.tie``s, a root and a
submodule's class), they mean what their normal form says
(``tie_spec.compose``): chains collapse to their final source, a cycle is a
``TieError`` naming it, a target with two sources is a ``TieError`` naming the
target and both sources, and the order of keys or declarations never matters
(issue 24). Each such model is checked against the untied model whose layers
hold, by hand, the one variable each reads
(``tie_models.assert_like_hand_shared``).

A tie is state of the tied module's scope, so a target is its source wherever
Flax reaches it (issue 16): ``bind`` and direct submodule calls,
``apply(method=...)``, submodules passed as attributes, Flax's own views of a
scope (``Module.variables``), a class that ties itself to a source outside it,
and a read-only view (a language-model head tied to the transposed embedding,
against Flax's own ``nn.Embed.attend``). The references are one module
instance used at both places, as a Flax user shares by hand.

Tests marked ``installs_patch`` keep their ``[opted-out]`` copy: a user with
``FLAX_TIEEXT_AUTOPATCH=0`` calls ``flax_tieext.install()`` to use ties, and so
does the fixture (tests/conftest.py).
"""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_models
import tie_wraps
from tie_blocks import D, HEAD_TIE, LM, X, Attn, Pair, SeesKernel
from tie_models import (Blocks, Chain, Leaf, Linear, assert_close,
                        assert_like_hand_shared, assert_trees, error, init)

import flax_tieext  # noqa: F401
from flax_tieext import TieError
from flax_tieext.core import tie_spec

needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch

WRAPS = tie_wraps.WRAPS

ALL_READ_A = {'a/d': 'a/d', 'b/d': 'a/d', 'c/d': 'a/d'}


def stacked(*mappings, cls=Chain):
  for mapping in mappings:
    cls = nn.tie(cls, mapping)
  return cls


# ---------------------------------------------------------------------------
# Chains collapse to their final source, across declarations.
# ---------------------------------------------------------------------------


@needs_patch
@pytest.mark.parametrize('order', ['c_then_b', 'b_then_c'])
def test_a_chain_over_stacked_declarations_collapses(order):
  ties = [{'c': 'b'}, {'b': 'a'}]
  model = stacked(*(ties if order == 'c_then_b' else ties[::-1]))()
  assert_like_hand_shared(model, ALL_READ_A)


@needs_patch
def test_a_chain_over_stacked_declarations_is_the_one_mapping():
  one = nn.tie(Chain, {'c': 'b', 'b': 'a'})()
  two = stacked({'c': 'b'}, {'b': 'a'})()
  v_one = one.init(jax.random.key(0), tie_models.X)
  v_two = two.init(jax.random.key(0), tie_models.X)
  jax.tree_util.tree_map(np.testing.assert_array_equal, v_one, v_two)
  np.testing.assert_allclose(two.apply(v_two, tie_models.X),
                             one.apply(v_one, tie_models.X))


@needs_patch
def test_a_chain_through_a_submodule_class_collapses():
  # The root ties b to a; the class of c ties its d to b's d, which is a's.
  c_class = nn.tie(Leaf, {'d': '../b/d'})
  model = nn.tie(Chain, {'b': 'a'})(classes=(('c', c_class),))
  assert_like_hand_shared(model, ALL_READ_A)


@needs_patch
def test_chain_resolves_to_its_end():
  class Three(nn.Module):

    @nn.compact
    def __call__(self, x):
      for name in 'abc':
        x = Linear(name=name)(x)
      return x

  variables = init(nn.tie(Three, {'a': 'b', 'b': 'c'}))
  assert set(variables['params']) == {'c'}


def chained_model(remat_inner, remat_leaves):
  leaf_cls = nn.remat(Attn) if remat_leaves else Attn

  class Inner(nn.Module):

    @nn.compact
    def __call__(self, x):
      return leaf_cls(name='leaf')(leaf_cls(name='src')(x))

  class Outer(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = Attn(name='src')(x)
      inner = nn.tie(Inner, {'leaf': 'src'})  # declared at /inner
      return (nn.remat(inner) if remat_inner else inner)(name='inner')(x)

  return nn.tie(Outer, {'inner/src': 'src'})


@needs_patch
@pytest.mark.parametrize('remat_leaves', [False, True])
@pytest.mark.parametrize('remat_inner', [False, True])
def test_chain_across_declarations_stores_one_copy(remat_inner, remat_leaves):
  x = jax.random.normal(jax.random.key(1), (2, D))
  model = chained_model(remat_inner, remat_leaves)()
  params = model.init(jax.random.key(0), x)['params']
  assert set(params) == {'src'}  # /inner/src and /inner/leaf are not stored

  def reference(p):  # one Attn called three times
    attn = lambda h: Attn().apply({'params': p['src']}, h)
    return attn(attn(attn(x)))

  loss = lambda p: jnp.sum(model.apply({'params': p}, x) ** 2)
  y, g = jax.value_and_grad(loss)(params)
  ry, rg = jax.value_and_grad(lambda p: jnp.sum(reference(p) ** 2))(params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


# ---------------------------------------------------------------------------
# Cycles and two sources, whatever the order.
# ---------------------------------------------------------------------------


@needs_patch
def test_cycle_is_refused_at_declaration():
  with pytest.raises(TieError) as info:
    init(nn.tie(Blocks, {'block_0': 'block_1', 'block_1': 'block_0'}))
  message = str(info.value)
  assert 'cycle' in message
  assert '/block_0 -> /block_1 -> /block_0' in message


@needs_patch
@pytest.mark.parametrize('ties', [
    [{'a': 'b'}, {'b': 'a'}],
    [{'b': 'a'}, {'a': 'b'}],
])
def test_a_cycle_over_stacked_declarations_is_named(ties):
  message = error(stacked(*ties)())
  assert 'form a cycle' in message
  assert '/a -> /b -> /a' in message
  assert "{'a': 'b'}" in message and "{'b': 'a'}" in message


@needs_patch
@pytest.mark.parametrize('ties', [
    [{'c': 'a'}, {'c': 'b'}],
    [{'c': 'b'}, {'c': 'a'}],
])
def test_one_target_with_two_sources_names_target_and_both(ties):
  message = error(stacked(*ties)())
  assert message.startswith('/c is given two sources: /a (')
  assert ') and /b (' in message
  # Both declarations are named: each alone is valid, their union is not.
  assert "checked as their union: {'c': " in message
  assert "{'c': 'a'}" in message and "{'c': 'b'}" in message


@installs_patch
def test_two_spellings_of_one_target_with_two_sources_are_refused():
  class Three(nn.Module):

    @nn.compact
    def __call__(self, x):
      return nn.Dense(D, name='c')(nn.Dense(D, name='b')(
          nn.Dense(D, name='a')(x)))

  with pytest.raises(TieError) as info:
    nn.tie(Three, {'c': 'a', './c': 'b'})().init(jax.random.key(0), X)
  message = str(info.value)
  assert "'c'" in message and "'./c'" in message and '/c' in message


OVERLAP = {'b/d': 'a/d', 'b': 'c'}


@needs_patch
@pytest.mark.parametrize('keys', list(itertools.permutations(OVERLAP)))
def test_overlapping_module_and_child_ties_mean_one_thing_in_any_order(keys):
  one_mapping = error(nn.tie(Chain, {k: OVERLAP[k] for k in keys})())
  two_declarations = error(stacked(*({k: OVERLAP[k]} for k in keys))())
  # b/d would come from a/d by its own tie, and from c/d through b -> c.
  for message in (one_mapping, two_declarations):
    assert message.startswith('/b/d is given two sources: /a/d (')
    assert '/c/d (through the tie /b -> /c' in message
  assert one_mapping == error(nn.tie(Chain, OVERLAP)())


@needs_patch
def test_a_child_tie_that_agrees_with_its_module_tie_is_redundant():
  model = nn.tie(Chain, {'b': 'c', 'b/d': 'c/d'})()
  assert_like_hand_shared(model, {'a/d': 'a/d', 'b/d': 'c/d', 'c/d': 'c/d'})


MODULE_TO_TIED_CHILD = {'b/d': 'a/d', 'c': 'b'}


@needs_patch
@pytest.mark.parametrize('keys',
                         list(itertools.permutations(MODULE_TO_TIED_CHILD)))
def test_a_module_tied_to_a_module_whose_child_is_tied(keys):
  # c is b, and b's d is a's d: so c's d is a's d too.
  mapping = {k: MODULE_TO_TIED_CHILD[k] for k in keys}
  assert_like_hand_shared(nn.tie(Chain, mapping)(), ALL_READ_A)
  assert_like_hand_shared(stacked(*({k: v} for k, v in mapping.items()))(),
                          ALL_READ_A)


@needs_patch
def test_a_module_tied_to_a_module_whose_variable_is_tied():
  # c/d is b/d, whose kernel is a's: c/d's kernel is a's, its bias b's.
  model = nn.tie(Chain, {'b/d/kernel': 'a/d/kernel', 'c/d': 'b/d'})()
  assert_like_hand_shared(model, {
      'a/d/kernel': 'a/d/kernel', 'a/d/bias': 'a/d/bias',
      'b/d/kernel': 'a/d/kernel', 'b/d/bias': 'b/d/bias',
      'c/d/kernel': 'a/d/kernel', 'c/d/bias': 'b/d/bias'})


@needs_patch
def test_the_normal_form_does_not_depend_on_key_order():
  ties = {'c': 'b', 'b/d': 'a/d', 'e': 'c', 'f/d': 'e/d'}
  forms = {tie_spec.normalize(dict(p), 'params', ())
           for p in itertools.permutations(ties.items())}
  assert len(forms) == 1
  (form,) = forms
  assert {t.target: t.source for t in form} == {
      ('b', 'd'): ('a', 'd'), ('c',): ('b',), ('c', 'd'): ('a', 'd'),
      ('e',): ('b',), ('e', 'd'): ('a', 'd'), ('f', 'd'): ('a', 'd')}


@needs_patch
def test_collections_may_be_any_flax_filter():
  deny = nn.DenyList(['graph', 'cache'])  # a filter holding a list
  variables = init(nn.tie(Blocks, {'block_1': 'block_0'}, collections=deny))
  assert set(variables['params']) == {'block_0'}


# ---------------------------------------------------------------------------
# Stacked declarations are their union in one mapping (issue 34).
# ---------------------------------------------------------------------------


class Wrap(nn.Module):

  @nn.compact
  def __call__(self, x):
    d = tie_models.D  # (tie_models.X's width: every Dense alike)
    return nn.Dense(d, name='q')(nn.Dense(d, name='p')(x))


class Root(nn.Module):

  @nn.compact
  def __call__(self, x):
    for name in 'abcd':
      x = Wrap(name=name)(x)
    return x


def root_reads(tied):
  """Each Dense variable of ``Root`` -> the one it reads.

  ``tied``: path -> the stored path it reads; a variable below reads what
  its longest tied prefix reads (``a -> c``: ``a/p/bias`` reads ``c/p/bias``).
  """
  reads = {}
  for path in (f'{w}/{d}/{v}' for w in 'abcd' for d in 'pq'
               for v in ('kernel', 'bias')):
    prefix = max([p for p in tied if f'{path}/'.startswith(f'{p}/')],
                 key=len, default=None)
    reads[path] = path if prefix is None else tied[prefix] + path[len(prefix):]
  return reads


def assert_reads(model, reads):
  """Only the sources are stored; ``apply`` is the untied ``Root``'s by hand.

  For ties whose ``init`` output is not ``apply``'s (a variable target that
  runs before its source, docs/design.md, *Init*), where
  ``assert_like_hand_shared`` does not apply.
  """
  x = tie_models.X
  params = model.init(jax.random.key(0), x)['params']
  assert tie_models.flat_paths(params) == set(reads.values())
  by_hand = {}
  for path, source in reads.items():
    tie_models.put(by_hand, path, tie_models.get(params, source))
  np.testing.assert_allclose(model.apply({'params': params}, x),
                             Root().apply({'params': by_hand}, x), rtol=1e-6)


def assert_like_one_mapping(model, one):
  key = jax.random.key(0)
  x = tie_models.X
  y, variables = model.init_with_output(key, x)
  y_one, v_one = one.init_with_output(key, x)
  jax.tree_util.tree_map(np.testing.assert_array_equal, variables, v_one)
  np.testing.assert_array_equal(y, y_one)
  np.testing.assert_array_equal(model.apply(variables, x),
                                one.apply(v_one, x))


UNION_CASES = {  # declarations, what is tied, whether init's output is apply's
    # b/p -> a/q -> b/q, and a/q -> b/q inside a -> b: a's p and q are b/q.
    'tie_inside_a_tied_module': (
        [{'a': 'b', 'b/p': 'a/q'}, {'a/q': 'b/q'}],
        {'a/p': 'b/q', 'a/q': 'b/q', 'b/p': 'b/q'}, True),
    # a/p/kernel -> a/q/kernel -> c/q/kernel, and through a -> c:
    # c/p/kernel -> c/q/kernel: both routes end at c/q/kernel.
    'two_routes_to_one_final_source': (
        [{'a/p/kernel': 'a/q/kernel'},
         {'c/p/kernel': 'c/q/kernel', 'a/q': 'c/q', 'a': 'c'}],
        {'a': 'c', 'a/p/kernel': 'c/q/kernel', 'c/p/kernel': 'c/q/kernel'},
        False),  # a/p/kernel and c/p/kernel run before c/q/kernel
    # The same ties split so that the first declaration alone gives
    # a/p/kernel two sources (c/q/kernel and, through a -> c, c/p/kernel);
    # the second reconciles them: stacked, they are their union.
    'a_part_invalid_alone': (
        [{'a/p/kernel': 'a/q/kernel', 'a': 'c'},
         {'c/p/kernel': 'c/q/kernel', 'a/q': 'c/q'}],
        {'a': 'c', 'a/p/kernel': 'c/q/kernel', 'c/p/kernel': 'c/q/kernel'},
        False),
}


@needs_patch
@pytest.mark.end_to_end  # each case inits and applies deep stacks: left to --end-to-end
@pytest.mark.parametrize('case', list(UNION_CASES))
def test_stacked_declarations_are_their_union_in_one_mapping(case):
  declarations, tied, init_is_apply = UNION_CASES[case]
  union = {k: v for d in declarations for k, v in d.items()}
  model = stacked(*declarations, cls=Root)()
  if init_is_apply:
    assert_like_hand_shared(model, root_reads(tied), untied=Root())
  assert_reads(model, root_reads(tied))
  for keys in itertools.permutations(union):
    assert_like_one_mapping(model, nn.tie(Root, {k: union[k] for k in keys})())


def core_root(scope, x):
  """``Root`` as a scope function: a stacked ``lift.tie`` ties its paths."""
  def dense(scope, x):
    d = x.shape[-1]
    kernel = scope.param('kernel', nn.initializers.lecun_normal(), (d, d))
    return x @ kernel + scope.param('bias', nn.initializers.normal(), (d,))

  def wrap(scope, x):
    return scope.child(dense, 'q')(scope.child(dense, 'p')(x))

  for name in 'abcd':
    x = scope.child(wrap, name)(x)
  return x


@needs_patch
@pytest.mark.parametrize('case', list(UNION_CASES))
@pytest.mark.parametrize('order', ['as_listed', 'reversed'])
def test_stacked_lift_ties_are_their_union_in_one_mapping(case, order):
  from flax.core import apply as core_apply  # pylint: disable=g-import-not-at-top
  from flax.core import init as core_init  # pylint: disable=g-import-not-at-top
  from flax_tieext.core import lift  # pylint: disable=g-import-not-at-top
  declarations, _, _ = UNION_CASES[case]
  union = {k: v for d in declarations for k, v in d.items()}
  fn = core_root
  for ties in (declarations if order == 'as_listed' else declarations[::-1]):
    fn = lift.tie(fn, ties)
  one = lift.tie(core_root, union)
  key, x = jax.random.key(0), tie_models.X
  y, variables = core_init(fn)(key, x)
  y_one, v_one = core_init(one)(key, x)
  jax.tree_util.tree_map(np.testing.assert_array_equal, variables, v_one)
  np.testing.assert_array_equal(y, y_one)
  np.testing.assert_array_equal(core_apply(fn)(variables, x),
                                core_apply(one)(v_one, x))


@needs_patch
def test_two_declared_sources_of_one_target_ending_at_one_path_agree():
  # a -> b -> c, and a -> c: one final source, in either order.
  for declarations in ([{'a': 'b'}, {'b': 'c', 'a': 'c'}],
                       [{'b': 'c', 'a': 'c'}, {'a': 'b'}]):
    assert_like_hand_shared(stacked(*declarations, cls=Root)(),
                            root_reads({'a': 'c', 'b': 'c'}), untied=Root())


def test_two_declared_viewed_routes_to_one_source_agree():
  double, shift = (lambda v: 2 * v), (lambda v: v + 1)
  x = np.arange(3.0)
  declared = [*tie_spec.normalize({'c': ('b', double), 'b': ('a', shift)},
                                  'params', ()),
              *tie_spec.normalize({'c': ('d', double), 'd': ('a', shift)},
                                  'params', ())]
  for order in itertools.permutations(declared):
    resolved = {t.target: t for t in tie_spec.compose(order)}
    assert {t.source for t in resolved.values()} == {('a',)}
    np.testing.assert_array_equal(resolved[('c',)].view(x), double(shift(x)))


NO_CYCLE = {'a': 'b', 'b/p': 'a/q', 'c/q': 'a/p'}


@needs_patch
@pytest.mark.parametrize('keys', list(itertools.permutations(NO_CYCLE)))
def test_a_chain_through_one_tie_at_two_paths_is_no_cycle(keys):
  # c/q -> a/p -> b/p (through a -> b) -> a/q -> b/q (through a -> b again):
  # no path is passed twice.
  model = nn.tie(Root, {k: NO_CYCLE[k] for k in keys})()
  assert_like_hand_shared(model, root_reads(
      {'a/p': 'b/q', 'a/q': 'b/q', 'b/p': 'b/q', 'c/q': 'b/q'}),
                          untied=Root())


@needs_patch
@pytest.mark.parametrize('ties, cycle', [
    ({'a/p': 'b/p', 'b': 'a'}, '/a/p -> /b/p -> /a/p'),
    # a is b/p and b is a/q: a would be inside itself (a/q/p).
    ({'a': 'b/p', 'b': 'a/q'}, '/a -> /b/p -> /a/q/p'),
    ({'c/q': 'a/p', 'a': 'b', 'b/p': 'c/q'}, '/b/p -> /c/q -> /a/p -> /b/p'),
])
def test_a_chain_back_at_a_path_it_passed_is_a_cycle(ties, cycle):
  message = error(nn.tie(Root, ties)())
  assert f'form a cycle: {cycle}.' in message


# ---------------------------------------------------------------------------
# One module at two places, wherever Flax reaches the target.
# ---------------------------------------------------------------------------


def pair_variables(wrap):
  return Pair(wrap, shared=True).init(jax.random.key(0), X)


@installs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_bind_then_direct_submodule_call_is_the_shared_module(wrap):
  """It raised Flax's ScopeParamNotFoundError for the target."""
  tied = nn.tie(Pair, {'b': 'a'})(wrap)
  variables = tied.init(jax.random.key(0), X)
  assert list(variables['params']) == ['a']
  assert_close(tied.bind(variables).b(X), Pair(wrap, True).bind(variables).b(X))


@installs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_apply_with_any_method_is_the_shared_module(wrap):
  tied = nn.tie(Pair, {'b': 'a'})(wrap)
  variables = pair_variables(wrap)
  method = lambda m, x: m.b(x)
  assert_close(tied.apply(variables, X, method=method),
        Pair(wrap, True).apply(variables, X, method=method))

  def loss(model, params):
    return jnp.sum(model.apply({'params': params}, X, method=method) ** 2)

  assert_trees(assert_close, jax.grad(functools.partial(loss, tied))(
      variables['params']), jax.grad(functools.partial(
          loss, Pair(wrap, True)))(variables['params']))


class WithAttributes(nn.Module):
  a: nn.Module
  b: nn.Module

  def __call__(self, x):
    return self.b(jnp.tanh(self.a(x)))


@installs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_submodules_passed_as_attributes(wrap):
  """They initialized right (the source only), then failed at apply."""
  dense = WRAPS[wrap](nn.Dense)
  tied = nn.tie(WithAttributes, {'b': 'a'})(a=dense(D), b=dense(D))
  one = dense(D)
  ref = WithAttributes(a=one, b=one)
  variables = tied.init(jax.random.key(0), X)
  assert list(variables['params']) == ['a']
  assert_trees(np.testing.assert_array_equal, variables,
               ref.init(jax.random.key(0), X))
  assert_close(tied.apply(variables, X), ref.apply(variables, X))


class Reader(nn.Module):
  """Reads its own variables through ``self.variables`` after using them."""

  def setup(self):
    self.dense = nn.Dense(D)

  def __call__(self, x):
    y = self.dense(x)
    return y, self.variables['params']['dense']['kernel']


class ReadsVariables(nn.Module):
  wrap: str = 'none'
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    reader = WRAPS[self.wrap](Reader)
    a = reader(name='a')
    b = a if self.shared else reader(name='b')
    x, _ = a(x)
    return b(x)


@installs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_target_sees_its_variables_as_the_shared_module(wrap):
  """self.variables was {} in a target (KeyError under nn.remat)."""
  tied = nn.tie(ReadsVariables, {'b': 'a'})(wrap)
  ref = ReadsVariables(wrap, shared=True)
  variables = ref.init(jax.random.key(0), X)
  (y, kernel), (ry, rkernel) = tied.apply(variables, X), ref.apply(variables, X)
  assert_close(y, ry)
  np.testing.assert_array_equal(kernel, rkernel)


@installs_patch
def test_scope_views_agree_with_membership():
  """Module.variables, has_variable and iteration see the tied storage."""

  class Views(nn.Module):
    shared: bool = False

    @nn.compact
    def __call__(self, x):
      a = nn.Dense(D, name='a')
      b = a if self.shared else nn.Dense(D, name='b')
      b(a(x))
      return (jax.tree_util.tree_map(jnp.shape, b.variables),
              b.has_variable('params', 'kernel'),
              sorted(b.variables['params']), len(b.variables['params']))

  tied = nn.tie(Views, {'b': 'a'})()
  variables = Views(True).init(jax.random.key(0), X)
  assert tied.apply(variables, X) == Views(True).apply(variables, X)


@installs_patch
def test_variables_of_a_variable_target_hold_the_tied_variable():
  """b.variables showed only b's bias under {'b/kernel': 'a/kernel'}."""
  tied = nn.tie(SeesKernel, {'b/kernel': 'a/kernel'})()
  variables = tied.init(jax.random.key(0), X)
  _, seen = tied.apply(variables, X)
  _, expected = SeesKernel().apply(
      SeesKernel().init(jax.random.key(0), X), X)
  assert seen == expected


class Inner(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(D, name='dense')(x)


class OwnTie(nn.Module):
  """A submodule that declares itself the target of a tie to ``/src``."""

  wrap: str = 'none'
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    src = Inner(name='src')
    x = src(x)
    if self.shared:
      return src(x)
    return WRAPS[self.wrap](nn.tie(Inner, {'.': '/src'}))(name='t')(x)


@installs_patch
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_a_module_tied_to_a_source_outside_it(wrap):
  """Under nn.remat the target was stored at init, then refused at apply."""
  tied = OwnTie(wrap)
  variables = tied.init(jax.random.key(0), X)
  assert list(variables['params']) == ['src']
  assert_close(tied.apply(variables, X),
               OwnTie(wrap, shared=True).apply(variables, X))


# ---------------------------------------------------------------------------
# A read-only view: the head tied to the transposed embedding.
# ---------------------------------------------------------------------------


@needs_patch
@pytest.mark.parametrize('remat_head', [False, True])
def test_transposed_view_matches_embed_attend(remat_head):
  tokens = jnp.array([[1, 2, 3], [4, 5, 10]])
  tied = nn.tie(LM, HEAD_TIE)(remat_head=remat_head)
  params = tied.init(jax.random.key(0), tokens)['params']
  assert set(params) == {'embed', 'mid'}
  loss = lambda m, p: jnp.sum(jnp.sin(m.apply({'params': p}, tokens)))
  y, g = jax.value_and_grad(functools.partial(loss, tied))(params)
  ry, rg = jax.value_and_grad(functools.partial(loss, LM(attend=True)))(
      params)
  np.testing.assert_allclose(y, ry, rtol=1e-5)
  jax.tree_util.tree_map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6),
      g, rg)
