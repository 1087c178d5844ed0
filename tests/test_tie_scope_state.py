"""A tie is state of the tied module's scope: one module at two places everywhere.

Regression tests for issue 16. Each builds the reference the way a Flax user
shares by hand, one module instance used at both places, and compares what
every Flax API that can observe a module sees: ``bind`` and direct submodule
calls, ``apply(method=...)``, submodules passed as attributes, Flax's own views
of a scope (``Module.variables``), ``init_with_output``, and the bodies of
``nn.cond`` / ``nn.switch`` / ``nn.while_loop``. The module is marked
``installs_patch``, not ``needs_patch``: in the opted-out run, a user with
``FLAX_TIEEXT_AUTOPATCH=0`` calls ``flax_tieext.install()`` to use ties, and so
does the fixture of that marker (tests/conftest.py).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_wraps

import flax_tieext
from flax_tieext import TieError

D = 4
X = jax.random.normal(jax.random.key(1), (2, D))
WRAPS = tie_wraps.WRAPS

close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)

# Ties live in Flax's scopes: the patch is installed for each test.
pytestmark = pytest.mark.installs_patch


def assert_trees(check, actual, expected):
  assert (jax.tree_util.tree_structure(actual)
          == jax.tree_util.tree_structure(expected))
  jax.tree_util.tree_map(check, actual, expected)


class Pair(nn.Module):
  """Two Dense layers built in setup; ``shared`` makes them one instance."""

  wrap: str = 'none'
  shared: bool = False

  def setup(self):
    dense = WRAPS[self.wrap](nn.Dense)
    self.a = dense(D)
    self.b = self.a if self.shared else dense(D)

  def __call__(self, x):
    return self.b(jnp.tanh(self.a(x)))


def pair_variables(wrap):
  return Pair(wrap, shared=True).init(jax.random.key(0), X)


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_bind_then_direct_submodule_call_is_the_shared_module(wrap):
  """It raised Flax's ScopeParamNotFoundError for the target."""
  tied = nn.tie(Pair, {'b': 'a'})(wrap)
  variables = tied.init(jax.random.key(0), X)
  assert list(variables['params']) == ['a']
  close(tied.bind(variables).b(X), Pair(wrap, True).bind(variables).b(X))


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_apply_with_any_method_is_the_shared_module(wrap):
  tied = nn.tie(Pair, {'b': 'a'})(wrap)
  variables = pair_variables(wrap)
  method = lambda m, x: m.b(x)
  close(tied.apply(variables, X, method=method),
        Pair(wrap, True).apply(variables, X, method=method))

  def loss(model, params):
    return jnp.sum(model.apply({'params': params}, X, method=method) ** 2)

  assert_trees(close, jax.grad(functools.partial(loss, tied))(
      variables['params']), jax.grad(functools.partial(
          loss, Pair(wrap, True)))(variables['params']))


class WithAttributes(nn.Module):
  a: nn.Module
  b: nn.Module

  def __call__(self, x):
    return self.b(jnp.tanh(self.a(x)))


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
  close(tied.apply(variables, X), ref.apply(variables, X))


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


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_target_sees_its_variables_as_the_shared_module(wrap):
  """self.variables was {} in a target (KeyError under nn.remat)."""
  tied = nn.tie(ReadsVariables, {'b': 'a'})(wrap)
  ref = ReadsVariables(wrap, shared=True)
  variables = ref.init(jax.random.key(0), X)
  (y, kernel), (ry, rkernel) = tied.apply(variables, X), ref.apply(variables, X)
  close(y, ry)
  np.testing.assert_array_equal(kernel, rkernel)


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


class TwoWays(nn.Module):
  """The target runs before or after its source."""

  target_first: bool = False
  wrap: str = 'none'

  @nn.compact
  def __call__(self, x):
    dense = WRAPS[self.wrap](nn.Dense)
    a, b = dense(D, name='a'), dense(D, name='b')
    if self.target_first:
      return a(jnp.tanh(b(x)))
    return b(jnp.tanh(a(x)))


@pytest.mark.parametrize('target_first', [False, True],
                         ids=['source_first', 'target_first'])
@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_init_with_output_equals_apply(wrap, target_first):
  """init's output used the target's throw-away parameters."""
  tied = nn.tie(TwoWays, {'b': 'a'})(target_first, wrap)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  assert list(variables['params']) == ['a']
  close(y, tied.apply(variables, X))
  # The stored values are the untied model's source values.
  untied = TwoWays(target_first, wrap).init(jax.random.key(0), X)
  assert_trees(np.testing.assert_array_equal, variables['params']['a'],
               untied['params']['a'])


class Counter(nn.Module):
  """A Dense whose output is scaled by an order-sensitive call counter."""

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = count.value * 2 + 1
    return nn.Dense(D, name='dense')(x) * count.value


class Branches(nn.Module):
  kind: str
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    a = Counter(name='a')
    b = a if self.shared else Counter(name='b')
    x = a(x)
    body = lambda m, h: m(jnp.tanh(m(h)))  # the target twice
    if self.kind == 'cond':
      return nn.cond(True, body, body, b, x)
    if self.kind == 'switch':
      return nn.switch(1, [body, body, body], b, x)
    return nn.while_loop(lambda m, c: c[0] < 2,
                         lambda m, c: (c[0] + 1, body(m, c[1])), b, (0, x),
                         carry_variables='state')[1]


@pytest.mark.parametrize('kind', ['cond', 'switch', 'while_loop'])
def test_branch_body_using_a_target_twice_is_the_shared_module(kind):
  """init crashed: "Cannot reach the source ... from /switch(b)"."""
  tied = nn.tie(Branches, {'b': 'a'}, collections=['params', 'state'])(kind)
  ref = Branches(kind, shared=True)
  variables = tied.init(jax.random.key(0), X)
  assert_trees(np.testing.assert_array_equal, variables,
               ref.init(jax.random.key(0), X))
  y, updates = tied.apply(variables, X, mutable=['state'])
  ry, ref_updates = ref.apply(variables, X, mutable=['state'])
  close(y, ry)
  assert_trees(close, updates, ref_updates)


class Masked(nn.Module):
  """A Dense behind a mask of another collection, drawn from 'params'."""

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jax.random.uniform(
        self.make_rng('params'), (D,)))
    return nn.Dense(D, name='dense')(x * mask.value)


class BranchFirst(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x):
    a, b = Masked(name='a'), Masked(name='b')
    body = lambda m, h: m(jnp.tanh(m(h)))
    if self.kind == 'cond':
      x = nn.cond(False, body, body, b, x)
    else:
      x = nn.switch(2, [body, body, body], b, x)
    return a(x)


@pytest.mark.parametrize('kind', ['cond', 'switch'])
def test_target_in_a_branch_before_its_source_draws_the_source_values(kind):
  """Every branch but the first drew its copy from an advanced counter."""
  tied = nn.tie(BranchFirst, {'b': 'a'}, collections=['params', 'graph'])(kind)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  close(y, tied.apply(variables, X))


class SometimesCached(nn.Module):
  @nn.compact
  def __call__(self, x, decode=False):
    a, b = nn.Dense(D, name='a'), nn.Dense(D, name='b')
    if decode:
      cache = self.variable('cache', 'step', jnp.zeros, ())
      x = x + cache.value
    return b(a(x))


def test_a_tied_collection_is_checked_when_it_is_used():
  """A plain apply that never touches 'cache' raised for the missing one."""
  tied = nn.tie(SometimesCached, {'b': 'a'}, collections=['params', 'cache'])()
  variables = tied.init(jax.random.key(0), X)
  assert set(variables) == {'params'}
  untied = {'params': {'a': variables['params']['a'],
                       'b': variables['params']['a']}}
  close(tied.apply(variables, X), SometimesCached().apply(untied, X))
  with pytest.raises(TieError, match="'cache'"):
    tied.apply(variables, X, decode=True)


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


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_a_module_tied_to_a_source_outside_it(wrap):
  """Under nn.remat the target was stored at init, then refused at apply."""
  tied = OwnTie(wrap)
  variables = tied.init(jax.random.key(0), X)
  assert list(variables['params']) == ['src']
  close(tied.apply(variables, X), OwnTie(wrap, shared=True).apply(variables, X))


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


def test_nn_tie_takes_a_module_class_and_no_methods():
  with pytest.raises(TypeError, match='Module class'):
    nn.tie(lambda self, x: x, {'b': 'a'})
  with pytest.raises(TypeError, match='methods'):
    nn.tie(Pair, {'b': 'a'}, methods=['__call__'])  # pylint: disable=unexpected-keyword-arg


# ---------------------------------------------------------------------------
# What each transform declares about a source outside it.
# ---------------------------------------------------------------------------


def test_a_transform_that_declares_nothing_is_refused_by_name():
  """A pack name that is on no list used to be lifted like an attribute."""
  from flax.core import lift  # pylint: disable=g-import-not-at-top

  def undeclared(fn):
    def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
      scope = scope_fn(variable_groups, rng_groups)
      return fn(scope, *args), repack_fn(scope)
    return lift.pack(inner, (True,), (True,), (True,), name='my_transform')

  class Custom(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = nn.Dense(D, name='a')(x)
      b = nn.Dense(D, name='b')
      return undeclared(lambda scope, h: b.clone(parent=scope)(h))(
          b.scope if b.scope is not None else self.scope.push('b'), x)

  with pytest.raises(TieError, match="'my_transform'"):
    nn.tie(Custom, {'b': 'a'})().init(jax.random.key(0), X)


# ---------------------------------------------------------------------------
# Errors that teach.
# ---------------------------------------------------------------------------


def test_init_whose_method_never_runs_the_source_says_so():
  tied = nn.tie(Pair, {'b': 'a'})()
  with pytest.raises(TieError) as info:
    tied.init(jax.random.key(0), X, method=lambda m, x: m.b(x))
  message = str(info.value)
  assert '/a' in message and 'also runs the source' in message


def test_typo_in_a_source_seen_from_inside_a_stack_names_the_nearest():

  class Layer(nn.Module):

    @nn.compact
    def __call__(self, x, _):
      return nn.Dense(D, name='leaf')(x), None

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = nn.Dense(D, name='src')(x)
      stack = nn.scan(Layer, variable_axes={'params': 0},
                      split_rngs={'params': True}, length=2)
      return stack(name='stack')(x, None)[0]

  with pytest.raises(TieError) as info:
    nn.tie(Model, {'stack/leaf': 'sr'})().init(jax.random.key(0), X)
  message = str(info.value)
  assert 'Nearest existing names under /: src' in message
  assert 'Fix the source path' in message


class Masked(nn.Module):
  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return nn.Dense(D, name='dense')(x * mask.value)


class TwoMasked(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Masked(name='b')(Masked(name='a')(x))


def test_variable_tie_in_the_wrong_collection_names_the_right_one():
  with pytest.raises(TieError) as info:
    nn.tie(TwoMasked, {'b/mask': 'a/mask'})().init(jax.random.key(0), X)
  assert "stored in collection 'graph'" in str(info.value)
  assert "collections='graph'" in str(info.value)


def test_dotted_path_suggests_slashes():
  with pytest.raises(TieError) as info:
    nn.tie(TwoMasked, {'b.dense': 'a/dense'})().init(jax.random.key(0), X)
  assert "for 'b.dense' write 'b/dense'" in str(info.value)


def test_tied_class_used_after_uninstall_names_install():
  tied = nn.tie(Pair, {'b': 'a'})()
  variables = tied.init(jax.random.key(0), X)
  flax_tieext.uninstall()
  try:
    with pytest.raises(TieError, match=r'flax_tieext\.install\(\)'):
      tied.apply(variables, X)
  finally:
    flax_tieext.install()
  close(tied.apply(variables, X), Pair(shared=True).apply(variables, X))


def test_tie_error_points_at_its_own_documentation():
  with pytest.raises(TieError) as info:
    nn.tie(Pair, {'b': 'aa'})().init(jax.random.key(0), X)
  message = str(info.value)
  assert 'help(flax_tieext.TieError)' in message
  assert 'flax.readthedocs.io' not in message
  assert 'Scope machinery' in flax_tieext.TieError.__doc__ or (
      'source' in flax_tieext.TieError.__doc__)


# ---------------------------------------------------------------------------
# Conversions that know stacks.
# ---------------------------------------------------------------------------

N = 3


class Attn(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='proj')(x))


class StackLayer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return x + nn.Dense(D, name='ff')(Attn(name='attn')(x)), None


class Stacked(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = Attn(name='src')(x)
    stack = nn.scan(StackLayer, variable_axes={'params': 0},
                    split_rngs={'params': True}, length=N)
    return stack(name='stack')(x, None)[0]


STACK_TIES = {'stack/attn': 'src'}


def test_untie_a_target_in_a_stack_gives_one_copy_per_layer():
  tied = nn.tie(Stacked, STACK_TIES)()
  variables = tied.init(jax.random.key(0), X)
  untied = flax_tieext.untie_variables(variables, STACK_TIES,
                                       stacks={'stack': N})
  kernel = untied['params']['stack']['attn']['proj']['kernel']
  assert kernel.shape == (N, D, D)
  for layer in kernel:
    np.testing.assert_array_equal(layer,
                                  variables['params']['src']['proj']['kernel'])
  close(Stacked().apply(untied, X), tied.apply(variables, X))
  assert_trees(np.testing.assert_array_equal, flax_tieext.tie_variables(
      untied, STACK_TIES, stacks={'stack': N}), variables)


def test_untie_into_a_stack_it_was_not_told_of_is_refused():
  variables = nn.tie(Stacked, STACK_TIES)().init(jax.random.key(0), X)
  with pytest.raises(TieError) as info:
    flax_tieext.untie_variables(variables, STACK_TIES)
  message = str(info.value)
  assert '/stack/attn' in message and "stacks={'stack': 3}" in message


def test_tie_back_names_leaf_stack_and_layer_that_differ():
  variables = nn.tie(Stacked, STACK_TIES)().init(jax.random.key(0), X)
  untied = flax_tieext.untie_variables(variables, STACK_TIES,
                                       stacks={'stack': N})
  kernel = untied['params']['stack']['attn']['proj']['kernel']
  untied['params']['stack']['attn']['proj']['kernel'] = kernel.at[2].add(1.0)
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(untied, STACK_TIES, stacks={'stack': N})
  message = str(info.value)
  assert '/stack/attn/proj/kernel' in message
  assert 'layer 2 (axis 0) of the stack /stack' in message
  with pytest.raises(TieError, match=r"stacks=\{'stack': 3\}"):
    flax_tieext.tie_variables(untied, STACK_TIES)


@pytest.mark.parametrize('differs', ['kernel', 'bias'])
def test_tie_back_names_the_leaf_that_differs_in_init_order(differs):
  """Leaf names came in insertion order (kernel, bias), values sorted."""
  untied = TwoWays().init(jax.random.key(0), X)
  params = untied['params']
  params['b'] = {'kernel': params['a']['kernel'], 'bias': params['a']['bias']}
  params['b'][differs] = params['b'][differs] + 1.0
  assert list(params['b']) == ['kernel', 'bias']  # as Flax's init orders them
  with pytest.raises(TieError, match=f'/b/{differs} differs from its source'):
    flax_tieext.tie_variables(untied, {'b': 'a'})


class SeesKernel(nn.Module):
  @nn.compact
  def __call__(self, x):
    a, b = nn.Dense(D, name='a'), nn.Dense(D, name='b')
    y = b(a(x))
    return y, jax.tree_util.tree_map(jnp.shape, b.variables)


def test_variables_of_a_variable_target_hold_the_tied_variable():
  """b.variables showed only b's bias under {'b/kernel': 'a/kernel'}."""
  tied = nn.tie(SeesKernel, {'b/kernel': 'a/kernel'})()
  variables = tied.init(jax.random.key(0), X)
  _, seen = tied.apply(variables, X)
  _, expected = SeesKernel().apply(
      SeesKernel().init(jax.random.key(0), X), X)
  assert seen == expected


def test_values_given_for_a_tied_variable_are_refused():
  """They were silently ignored (the source's kernel was used)."""
  untied = SeesKernel().init(jax.random.key(0), X)
  with pytest.raises(TieError, match='Values were given for /b/kernel'):
    nn.tie(SeesKernel, {'b/kernel': 'a/kernel'})().apply(untied, X)


def test_a_module_tied_to_a_variable_is_a_tie_error():
  """It was a bare ValueError (the truth value of an array)."""
  with pytest.raises(TieError, match='"b/kernel": "a/kernel"'):
    nn.tie(SeesKernel, {'b': 'a/kernel'})().init(jax.random.key(0), X)
