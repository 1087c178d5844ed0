"""Ties compose: one normal form for every set of ties in force (issue 24).

Wherever ties are declared (one mapping, stacked ``nn.tie``s, a root and a
submodule's class), they mean what their normal form says
(``tie_spec.compose``): chains collapse to their final source, a cycle is a
``TieError`` naming it, a target with two sources is a ``TieError`` naming the
target and both sources, and the order of keys or declarations never matters.
Each model is checked against the untied model whose layers hold, by hand,
the one variable each reads (``tie_models.assert_like_hand_shared``). Also:
the rules stated in docs/design.md checked where they can be broken (dtype,
tied collections at apply, stack counts of conversions).
"""

import itertools

from flax import errors as flax_errors
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext
from flax_tieext import TieError
from flax_tieext.core import tie_spec
from tie_models import D, Chain, Leaf, X, assert_like_hand_shared

pytestmark = pytest.mark.needs_patch

ALL_READ_A = {'a/d': 'a/d', 'b/d': 'a/d', 'c/d': 'a/d'}


def stacked(*mappings, cls=Chain):
  for mapping in mappings:
    cls = nn.tie(cls, mapping)
  return cls


def error(model, x=X) -> str:
  with pytest.raises(TieError) as info:
    model.init(jax.random.key(0), x)
  return str(info.value)


# ---------------------------------------------------------------------------
# Chains across declarations
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('order', ['c_then_b', 'b_then_c'])
def test_a_chain_over_stacked_declarations_collapses(order):
  ties = [{'c': 'b'}, {'b': 'a'}]
  model = stacked(*(ties if order == 'c_then_b' else ties[::-1]))()
  assert_like_hand_shared(model, ALL_READ_A)


def test_a_chain_over_stacked_declarations_is_the_one_mapping():
  one = nn.tie(Chain, {'c': 'b', 'b': 'a'})()
  two = stacked({'c': 'b'}, {'b': 'a'})()
  v_one = one.init(jax.random.key(0), X)
  v_two = two.init(jax.random.key(0), X)
  jax.tree_util.tree_map(np.testing.assert_array_equal, v_one, v_two)
  np.testing.assert_allclose(two.apply(v_two, X), one.apply(v_one, X))


def test_a_chain_through_a_submodule_class_collapses():
  # The root ties b to a; the class of c ties its d to b's d, which is a's.
  c_class = nn.tie(Leaf, {'d': '../b/d'})
  model = nn.tie(Chain, {'b': 'a'})(classes=(('c', c_class),))
  assert_like_hand_shared(model, ALL_READ_A)


# ---------------------------------------------------------------------------
# Cycles and two sources, whatever the order
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('ties', [
    [{'a': 'b'}, {'b': 'a'}],
    [{'b': 'a'}, {'a': 'b'}],
])
def test_a_cycle_over_stacked_declarations_is_named(ties):
  message = error(stacked(*ties)())
  assert 'form a cycle' in message
  assert '/a -> /b -> /a' in message


@pytest.mark.parametrize('ties', [
    [{'c': 'a'}, {'c': 'b'}],
    [{'c': 'b'}, {'c': 'a'}],
])
def test_one_target_with_two_sources_names_target_and_both(ties):
  message = error(stacked(*ties)())
  assert message.startswith('/c is given two sources: /a (')
  assert ') and /b (' in message


OVERLAP = {'b/d': 'a/d', 'b': 'c'}


@pytest.mark.parametrize('keys', list(itertools.permutations(OVERLAP)))
def test_overlapping_module_and_child_ties_mean_one_thing_in_any_order(keys):
  one_mapping = error(nn.tie(Chain, {k: OVERLAP[k] for k in keys})())
  two_declarations = error(stacked(*({k: OVERLAP[k]} for k in keys))())
  # b/d would come from a/d by its own tie, and from c/d through b -> c.
  for message in (one_mapping, two_declarations):
    assert message.startswith('/b/d is given two sources: /a/d (')
    assert '/c/d (through the tie /b -> /c' in message
  assert one_mapping == error(nn.tie(Chain, OVERLAP)())


def test_a_child_tie_that_agrees_with_its_module_tie_is_redundant():
  model = nn.tie(Chain, {'b': 'c', 'b/d': 'c/d'})()
  assert_like_hand_shared(model, {'a/d': 'a/d', 'b/d': 'c/d', 'c/d': 'c/d'})


MODULE_TO_TIED_CHILD = {'b/d': 'a/d', 'c': 'b'}


@pytest.mark.parametrize('keys',
                         list(itertools.permutations(MODULE_TO_TIED_CHILD)))
def test_a_module_tied_to_a_module_whose_child_is_tied(keys):
  # c is b, and b's d is a's d: so c's d is a's d too.
  mapping = {k: MODULE_TO_TIED_CHILD[k] for k in keys}
  assert_like_hand_shared(nn.tie(Chain, mapping)(), ALL_READ_A)
  assert_like_hand_shared(stacked(*({k: v} for k, v in mapping.items()))(),
                          ALL_READ_A)


def test_a_module_tied_to_a_module_whose_variable_is_tied():
  # c/d is b/d, whose kernel is a's: c/d's kernel is a's, its bias b's.
  model = nn.tie(Chain, {'b/d/kernel': 'a/d/kernel', 'c/d': 'b/d'})()
  assert_like_hand_shared(model, {
      'a/d/kernel': 'a/d/kernel', 'a/d/bias': 'a/d/bias',
      'b/d/kernel': 'a/d/kernel', 'b/d/bias': 'b/d/bias',
      'c/d/kernel': 'a/d/kernel', 'c/d/bias': 'b/d/bias'})


def test_the_normal_form_does_not_depend_on_key_order():
  ties = {'c': 'b', 'b/d': 'a/d', 'e': 'c', 'f/d': 'e/d'}
  forms = {tie_spec.normalize(dict(p), 'params', ())
           for p in itertools.permutations(ties.items())}
  assert len(forms) == 1
  (form,) = forms
  assert {t.target: t.source for t in form} == {
      ('b', 'd'): ('a', 'd'), ('c',): ('b',), ('c', 'd'): ('a', 'd'),
      ('e',): ('b',), ('e', 'd'): ('a', 'd'), ('f', 'd'): ('a', 'd')}


# ---------------------------------------------------------------------------
# dtype as well as shape
# ---------------------------------------------------------------------------

BF16_C = (('c', lambda name: Leaf(param_dtype=jnp.bfloat16, name=name)),)


@pytest.mark.parametrize('remat', [False, True], ids=['plain', 'remat'])
def test_a_target_of_another_dtype_is_refused(remat):
  leaf = nn.remat(Leaf) if remat else Leaf
  classes = (('c', lambda name: leaf(param_dtype=jnp.bfloat16, name=name)),)
  if remat:
    classes += (('a', nn.remat(Leaf)),)
  message = error(nn.tie(Chain, {'c': 'a'})(classes=classes))
  assert 'Shape or dtype mismatch in the tie /c/d/kernel -> /a/d/kernel' in message
  assert '(3, 3):float32, but /c/d/kernel has (3, 3):bfloat16' in message


def test_a_view_that_changes_the_dtype_is_refused():
  to_bf16 = lambda k: k.astype(jnp.bfloat16)
  message = error(nn.tie(Chain, {'c/d/kernel': ('a/d/kernel', to_bf16)})())
  assert 'Shape or dtype mismatch' in message
  assert 'the source /a/d/kernel has (3, 3):bfloat16' in message
  assert '/c/d/kernel has (3, 3):float32' in message


def test_a_model_cast_for_inference_still_applies():
  # At apply, as in Flax, dtypes are the caller's.
  model = nn.tie(Chain, {'b': 'a', 'c': 'a'})()
  variables = model.init(jax.random.key(0), X)
  cast = jax.tree_util.tree_map(lambda v: v.astype(jnp.bfloat16), variables)
  untied = {'params': {n: cast['params']['a'] for n in 'abc'}}
  np.testing.assert_allclose(model.apply(cast, X), Chain().apply(untied, X))


# ---------------------------------------------------------------------------
# The tied collections at apply
# ---------------------------------------------------------------------------


def test_a_misspelled_tied_collection_at_apply_is_the_ties_error():
  model = nn.tie(Chain, {'b': 'a', 'c': 'a'}, collections='parms')()
  variables = nn.tie(Chain, {'b': 'a', 'c': 'a'})().init(
      jax.random.key(0), X)
  with pytest.raises(TieError) as info:
    model.apply(variables, X)
  message = str(info.value)
  assert "ties collection 'parms'" in message
  assert "Did you mean 'params'?" in message


def test_a_tied_collection_only_some_calls_use_stays_optional():
  # 'cache' exists only while decoding: a plain apply with a missing
  # parameter is Flax's own error, not a tie's.
  model = nn.tie(Chain, {'b': 'a'}, collections=['params', 'cache'])()
  variables = model.init(jax.random.key(0), X)
  np.testing.assert_allclose(model.apply(variables, X),
                             model.apply(variables, X))
  del variables['params']['c']
  with pytest.raises(flax_errors.ScopeParamNotFoundError):
    model.apply(variables, X)


# ---------------------------------------------------------------------------
# Stack counts of the conversions
# ---------------------------------------------------------------------------


class Layer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    h = nn.Dense(D, name='attn')(x) + nn.Dense(D, name='mlp')(x)
    return jnp.tanh(h), None


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name='embed')(x)
    layers = nn.scan(Layer, variable_axes={'params': 0},
                     split_rngs={'params': True}, length=2)
    return layers(name='layers')(x, None)[0]


STACK_TIES = {'layers/attn': 'embed'}


def test_untie_with_a_stack_count_its_siblings_lack_is_refused():
  variables = nn.tie(Encoder, STACK_TIES)().init(jax.random.key(0), X)
  untied = flax_tieext.untie_variables(variables, STACK_TIES,
                                       stacks={'layers': 2})
  assert untied['params']['layers']['attn']['kernel'].shape == (2, D, D)
  with pytest.raises(TieError) as info:
    flax_tieext.untie_variables(variables, STACK_TIES, stacks={'layers': 3})
  message = str(info.value)
  assert 'stacks gives /layers 3 layers' in message
  assert '/layers/mlp/bias' in message and 'a leading axis of 2' in message
  assert "stacks={'layers': 2}" in message


def test_tie_with_a_stack_count_its_siblings_lack_is_refused():
  variables = nn.tie(Encoder, STACK_TIES)().init(jax.random.key(0), X)
  untied = flax_tieext.untie_variables(variables, STACK_TIES,
                                       stacks={'layers': 2})
  retied = flax_tieext.tie_variables(untied, STACK_TIES, stacks={'layers': 2})
  jax.tree_util.tree_map(np.testing.assert_array_equal, retied, variables)
  with pytest.raises(TieError, match="stacks gives /layers 3 layers"):
    flax_tieext.tie_variables(untied, STACK_TIES, stacks={'layers': 3})


def test_conversions_know_a_target_inside_a_targets_source():
  # c is b, whose d is a's: the untied layout holds all three.
  ties = {'b/d': 'a/d', 'c': 'b'}
  variables = nn.tie(Chain, ties)().init(jax.random.key(0), X)
  untied = flax_tieext.untie_variables(variables, ties)
  for name in 'bc':
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           untied['params'][name], untied['params']['a'])
  retied = flax_tieext.tie_variables(untied, ties)
  jax.tree_util.tree_map(np.testing.assert_array_equal, retied, variables)
