"""Converting variables between the tied and the untied layout.

``flax_tieext.tie_variables`` and ``untie_variables`` take the ties that
``nn.tie`` takes. Untying gives every target a copy of what it reads (through
a view, materialised; in a stack, one copy per layer); tying back checks that
each copy equals its source, naming the leaf (and the stack layer) that
differs, and removes it. They skip collections that hold neither path, keep or
refuse partitioning names through a view (never boxing names that do not fit
the value), and check ``stacks`` counts against the variables beside the
target.

The tests that convert variables of plain Flax models run without the patch;
every test that builds a tied model needs the Scope hooks the patch installs.
"""

import dataclasses
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_models
from tie_blocks import D, HEAD_TIE, LM, X, Attn, TwoWays
from tie_models import (Chain, assert_close, assert_message_names, assert_trees,
                        assert_trees_equal)

import flax_tieext
from flax_tieext import TieError

needs_patch = pytest.mark.needs_patch
installs_patch = pytest.mark.installs_patch

N = 3


# ---------------------------------------------------------------------------
# A view and a partitioned value.
# ---------------------------------------------------------------------------


@needs_patch
def test_untie_variables_materialises_the_view():
  tokens = jnp.array([[1, 2]])
  tied = nn.tie(LM, HEAD_TIE)()
  params = tied.init(jax.random.key(0), tokens)
  untied = flax_tieext.untie_variables(params, HEAD_TIE)
  np.testing.assert_array_equal(
      untied['params']['head']['kernel'],
      params['params']['embed']['embedding'].T)
  # The untied model computes the same function from the materialised copy.
  np.testing.assert_allclose(LM().apply(untied, tokens),
                             tied.apply(params, tokens), rtol=1e-6)
  # ... and tying it back checks the copy and removes it.
  retied = flax_tieext.tie_variables(untied, HEAD_TIE)
  assert set(retied['params']) == {'embed', 'mid'}


VOCAB = 5


class PartitionedLM(nn.Module):
  """An untied LM whose weights carry partitioning names, as a user writes it.

  The head's kernel is (D, VOCAB): its names are the embedding's, swapped.
  """

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D, name='embed', embedding_init=nn.with_partitioning(
        nn.initializers.normal(1.0), ('vocab', 'embed')))(tokens)
    x = nn.Dense(D, name='mid', kernel_init=nn.with_partitioning(
        nn.initializers.lecun_normal(), ('embed', 'mlp')))(x)
    return nn.Dense(VOCAB, use_bias=False, name='head',
                    kernel_init=nn.with_partitioning(
                        nn.initializers.lecun_normal(),
                        ('embed', 'vocab')))(x)


def partitioned_variables():
  """The untied variables, head = embedding transposed, and the tied ones."""
  untied = PartitionedLM().init(jax.random.key(0), jnp.array([[1]]))
  untied = jax.tree_util.tree_map(
      lambda a: a, untied, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  params = untied['params']
  # The user makes the head hold the transposed embedding, keeping the head's
  # own names ('embed', 'vocab').
  params['head']['kernel'] = params['head']['kernel'].replace_boxed(
      params['embed']['embedding'].unbox().T)
  tied = {'params': {k: v for k, v in params.items() if k != 'head'}}
  return untied, tied


def assert_partitioned_like(actual, expected):
  """Same values, and the same partitioning names on every boxed value."""
  assert_trees_equal(nn.unbox(actual), nn.unbox(expected))
  assert nn.get_partition_spec(actual) == nn.get_partition_spec(expected)


def assert_refusal_says_why(error):
  assert_message_names(str(error), '/head/kernel', '/embed/embedding',
                       "'params'")
  assert re.search(r'partition|names', str(error), re.IGNORECASE), str(error)


def test_untie_variables_through_a_view_swaps_partitioning_names():
  """The view transposes the value: the names must follow, or untie refuses."""
  untied, tied = partitioned_variables()
  try:
    result = flax_tieext.untie_variables(tied, HEAD_TIE)
  except TieError as e:  # refusing is right, if it says why
    assert_refusal_says_why(e)
    return
  assert_partitioned_like(result, untied)


def test_tie_variables_through_a_view_accepts_correctly_named_target():
  """The untied head carries its own, correct names; tying checks values."""
  untied, tied = partitioned_variables()
  try:
    result = flax_tieext.tie_variables(untied, HEAD_TIE)
  except TieError as e:
    assert_refusal_says_why(e)
    return
  assert_partitioned_like(result, tied)


def test_untie_variables_never_boxes_names_that_do_not_fit_the_value():
  """A view that drops an axis: the names cannot follow, so none may be wrong.

  Either each boxed value carries one name per axis, or untie refuses.
  """
  _, tied = partitioned_variables()
  ties = {'head/kernel': ('embed/embedding', jnp.ravel)}
  try:
    result = flax_tieext.untie_variables(tied, ties)
  except TieError as e:
    assert_refusal_says_why(e)
    return
  np.testing.assert_array_equal(
      nn.unbox(result)['params']['head']['kernel'],
      jnp.ravel(nn.unbox(tied)['params']['embed']['embedding']))
  is_box = lambda x: isinstance(x, nn.Partitioned)
  for box in jax.tree_util.tree_leaves(result, is_leaf=is_box):
    if is_box(box):
      assert len(box.names) == box.value.ndim, box


# ---------------------------------------------------------------------------
# Collections, and targets that differ from their source.
# ---------------------------------------------------------------------------


class WithBatchNorm(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name='b')(nn.Dense(D, name='a')(x))
    return nn.BatchNorm(use_running_average=False, name='bn')(x)


@pytest.mark.parametrize('collections', [['params', 'batch_stats'], True],
                         ids=['params+batch_stats', 'all'])
def test_conversion_skips_collections_holding_neither_path(collections):
  """batch_stats holds neither a nor b: it used to fail "source is missing"."""
  untied = WithBatchNorm().init(jax.random.key(0), X)
  # The untied model with b made equal to a, as a user ties it by hand ...
  untied['params']['b'] = untied['params']['a']
  # ... and the layout the tied model stores: without b.
  tied = {col: dict(tree) for col, tree in untied.items()}
  del tied['params']['b']
  ties = {'b': 'a'}
  assert_trees_equal(
      flax_tieext.tie_variables(untied, ties, collections=collections), tied)
  assert_trees_equal(
      flax_tieext.untie_variables(tied, ties, collections=collections),
      untied)
  assert_trees_equal(
      flax_tieext.tie_variables(
          flax_tieext.untie_variables(tied, ties, collections=collections),
          ties, collections=collections),
      tied)


@needs_patch
def test_dtype_mismatch_in_tie_variables_names_both_paths():
  variables = {'params': {'a': {'w': jnp.ones(2)},
                          'b': {'w': jnp.ones(2, jnp.int32)}}}
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(variables, {'b': 'a'})
  message = str(info.value)
  assert '/b' in message and '/a' in message and 'int32' in message


@pytest.mark.parametrize('present, missing', [
    ({'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.zeros(2)}}, None),
    ({'b': {'w': jnp.zeros(2)}, 'c': {'w': jnp.ones(2)}}, '/a'),
], ids=['untied already, trained apart', 'source missing'])
def test_untie_variables_refuses_to_write_over_or_from_nothing(present, missing):
  # Writing the source over a target that differs dropped its values.
  with pytest.raises(TieError) as info:
    flax_tieext.untie_variables({'params': present}, {'b': 'a'})
  message = str(info.value)
  if missing:
    assert_message_names(message, 'source /a is missing', ': b, c')
  else:
    assert_message_names(message, 'target /b is already in the variables',
                         'other values')


def test_untie_variables_of_variables_untied_already_keeps_them():
  untied = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.ones(2)}}}
  assert_trees_equal(flax_tieext.untie_variables(untied, {'b': 'a'}), untied)


@needs_patch
def test_tie_variables_refuses_a_target_that_differs():
  variables = {'params': {'a': {'w': jnp.ones(2)}, 'b': {'w': jnp.zeros(2)}}}
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(variables, {'b': 'a'})
  assert 'differs from its source' in str(info.value)


@installs_patch
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


@needs_patch
def test_conversions_know_a_target_inside_a_targets_source():
  # c is b, whose d is a's: the untied layout holds all three.
  ties = {'b/d': 'a/d', 'c': 'b'}
  variables = nn.tie(Chain, ties)().init(jax.random.key(0), tie_models.X)
  untied = flax_tieext.untie_variables(variables, ties)
  for name in 'bc':
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           untied['params'][name], untied['params']['a'])
  retied = flax_tieext.tie_variables(untied, ties)
  jax.tree_util.tree_map(np.testing.assert_array_equal, retied, variables)

class LMHead(nn.Module):
  """An embedding and a head with a bias: the head's kernel may be tied."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D, name='embed')(tokens)
    return nn.Dense(VOCAB, name='head')(x)


KIND_TIES = {  # a variable tied to a module, and the reverse
    'variable to module': ({'head/kernel': 'embed'},
                           'the target is a variable but the source is a'
                           ' module'),
    'module to variable': ({'head': 'embed/embedding'},
                           'the target is a module but the source is a'
                           ' variable')}


@needs_patch
@pytest.mark.parametrize('kind', KIND_TIES)
@pytest.mark.parametrize('convert', ['untie', 'tie'])
def test_a_variable_tied_to_a_module_is_refused_as_nn_tie_refuses_it(
    convert, kind):
  """Conversions refuse what nn.tie refuses, with its message, where the
  tree shows the target's kind: untie said the target was untied already
  with other values, tie that they held different variables."""
  ties, says = KIND_TIES[kind]
  tokens = jnp.array([[1, 2]])
  with pytest.raises(TieError, match=says):
    nn.tie(LMHead, ties)().init(jax.random.key(0), tokens)
  untied = LMHead().init(jax.random.key(0), tokens)
  if convert == 'untie' and kind == 'module to variable':
    # The layout of the model whose kernel is tied: head holds its bias.
    del untied['params']['head']['kernel']
  with pytest.raises(TieError) as info:
    getattr(flax_tieext, f'{convert}_variables')(untied, ties)
  assert_message_names(str(info.value), says, 'Tie a module to a module')



# ---------------------------------------------------------------------------
# Stacks.
# ---------------------------------------------------------------------------


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


@installs_patch
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
  assert_close(Stacked().apply(untied, X), tied.apply(variables, X))
  assert_trees(np.testing.assert_array_equal, flax_tieext.tie_variables(
      untied, STACK_TIES, stacks={'stack': N}), variables)


@installs_patch
def test_untie_into_a_stack_it_was_not_told_of_is_refused():
  variables = nn.tie(Stacked, STACK_TIES)().init(jax.random.key(0), X)
  with pytest.raises(TieError) as info:
    flax_tieext.untie_variables(variables, STACK_TIES)
  message = str(info.value)
  assert '/stack/attn' in message and "stacks={'stack': 3}" in message


@installs_patch
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


class Layer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    h = (nn.Dense(tie_models.D, name='attn')(x)
         + nn.Dense(tie_models.D, name='mlp')(x))
    return jnp.tanh(h), None


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(tie_models.D, name='embed')(x)
    layers = nn.scan(Layer, variable_axes={'params': 0},
                     split_rngs={'params': True}, length=2)
    return layers(name='layers')(x, None)[0]


LAYERS_TIES = {'layers/attn': 'embed'}


def _encoder_variables():
  """The tied ``Encoder``'s variables, and them untied over its 2 layers."""
  variables = nn.tie(Encoder, LAYERS_TIES)().init(jax.random.key(0),
                                                  tie_models.X)
  return variables, flax_tieext.untie_variables(variables, LAYERS_TIES,
                                                stacks={'layers': 2})


@needs_patch
def test_untie_with_a_stack_count_its_siblings_lack_is_refused():
  variables, untied = _encoder_variables()
  assert untied['params']['layers']['attn']['kernel'].shape == (
      2, tie_models.D, tie_models.D)
  with pytest.raises(TieError) as info:
    flax_tieext.untie_variables(variables, LAYERS_TIES, stacks={'layers': 3})
  message = str(info.value)
  assert 'stacks gives /layers 3 layers' in message
  assert '/layers/mlp/bias' in message and 'a leading axis of 2' in message
  assert "stacks={'layers': 2}" in message


@needs_patch
def test_tie_with_a_stack_count_its_siblings_lack_is_refused():
  variables, untied = _encoder_variables()
  retied = flax_tieext.tie_variables(untied, LAYERS_TIES, stacks={'layers': 2})
  jax.tree_util.tree_map(np.testing.assert_array_equal, retied, variables)
  with pytest.raises(TieError, match="stacks gives /layers 3 layers"):
    flax_tieext.tie_variables(untied, LAYERS_TIES, stacks={'layers': 3})


class TwoStacks(nn.Module):
  """Two scanned stacks of ``Layer``, the second applied after the first."""

  @nn.compact
  def __call__(self, x):
    for name in ('s1', 's2'):
      layers = nn.scan(Layer, variable_axes={'params': 0},
                       split_rngs={'params': True}, length=N)
      x = layers(name=name)(x, None)[0]
    return x


@pytest.mark.end_to_end  # two scanned stacks, init and apply per case: left to --end-to-end and CI
@needs_patch
@pytest.mark.parametrize('stacks', [{'s1': N, 's2': N}, {'s2': N}, None],
                         ids=['both named', 'target named', 'none named'])
def test_a_stack_tied_to_a_stack_unties_to_a_plain_copy(stacks):
  """A tied stack is scanned like its source: s2 holds s1's layers, once.

  Naming both stacks, as the docs advise, stacked s2 a second time.
  """
  ties = {'s2': 's1'}
  tied = nn.tie(TwoStacks, ties)()
  variables = tied.init(jax.random.key(0), tie_models.X)
  untied = flax_tieext.untie_variables(variables, ties, stacks=stacks)
  # The untied model, with s2 made equal to s1 as a user ties it by hand.
  reference = {'params': {**variables['params'],
                          's2': variables['params']['s1']}}
  assert_trees_equal(untied, reference)
  assert jax.tree_util.tree_map(np.shape, untied) == jax.tree_util.tree_map(
      np.shape, TwoStacks().init(jax.random.key(1), tie_models.X))
  assert_close(TwoStacks().apply(untied, tie_models.X),
               tied.apply(variables, tie_models.X))
  assert_trees_equal(
      flax_tieext.tie_variables(untied, ties, stacks=stacks), variables)


@needs_patch
@pytest.mark.parametrize('convert', ['untie', 'tie'])
def test_stacks_tied_whole_with_other_counts_are_refused(convert):
  ties = {'s2': 's1'}
  variables = nn.tie(TwoStacks, ties)().init(jax.random.key(0), tie_models.X)
  if convert == 'tie':
    variables = flax_tieext.untie_variables(variables, ties)
  with pytest.raises(TieError) as info:
    getattr(flax_tieext, f'{convert}_variables')(
        variables, ties, stacks={'s1': 2, 's2': N})
  assert_message_names(str(info.value), 'the stack /s2 3 layers',
                       'the stack /s1, 2', "stacks={'s1': 3, 's2': 3}")


class Ensemble(nn.Module):
  """An ``nn.vmap`` ensemble of 2 around an ``nn.scan`` of ``N`` ``Layer``s.

  ``Layer`` reads ``src`` (at the root, or inside each member: ``inner``).
  """
  inner: bool = False

  @nn.compact
  def __call__(self, x):
    if not self.inner:
      x = nn.Dense(tie_models.D, name='src')(x)
    members = nn.vmap(Member, variable_axes={'params': 0},
                      split_rngs={'params': True}, in_axes=None, axis_size=2)
    return members(self.inner, name='ens')(x)


class Member(nn.Module):
  inner: bool

  @nn.compact
  def __call__(self, x):
    if self.inner:
      x = nn.Dense(tie_models.D, name='src')(x)
    layers = nn.scan(Layer, variable_axes={'params': 0},
                     split_rngs={'params': True}, length=N)
    return layers(name='stack')(x, None)[0]


def assert_unties_to_the_untied_model(model, ties, stacks, x=tie_models.X):
  """Untied, the variables load into the untied model and tie back exactly."""
  tied = nn.tie(type(model), ties)(**{
      f.name: getattr(model, f.name) for f in dataclasses.fields(model)
      if f.name not in ('parent', 'name')})
  variables = tied.init(jax.random.key(0), x)
  untied = flax_tieext.untie_variables(variables, ties, stacks=stacks)
  # The layout the untied model has (boxes compare partitioning names) ...
  assert jax.tree_util.tree_map(np.shape, untied) == jax.tree_util.tree_map(
      np.shape, model.init(jax.random.key(1), x))
  # ... and the function the tied model computes.
  assert_close(model.apply(untied, x), tied.apply(variables, x))
  assert_trees_equal(
      flax_tieext.tie_variables(untied, ties, stacks=stacks), variables)
  return variables, untied


@needs_patch
@pytest.mark.parametrize('inner', [False, True],
                         ids=['source at the root', 'source in each member'])
@pytest.mark.parametrize('stacks', [{'ens': 2, 'ens/stack': N},
                                    {'ens/stack': N, 'ens': 2}],
                         ids=['outer first', 'inner first'])
def test_nested_stacks_untie_to_the_untied_model(stacks, inner):
  """Each stack around the target and not its source adds its layers' axis.

  The copy was stacked for the first stack given only: (2, 4, 4), not
  (2, 3, 4, 4); given inner first, or the source inside the ensemble, it was
  refused with a count to give that was wrong, as tie_variables refused the
  right layout.
  """
  ties = {'ens/stack/attn': 'ens/src' if inner else 'src'}
  _, untied = assert_unties_to_the_untied_model(Ensemble(inner), ties, stacks)
  assert untied['params']['ens']['stack']['attn']['kernel'].shape == (
      2, N, tie_models.D, tie_models.D)


@needs_patch
def test_tie_back_names_the_layer_of_each_nested_stack_that_differs():
  ties, stacks = {'ens/stack/attn': 'src'}, {'ens': 2, 'ens/stack': N}
  variables = nn.tie(Ensemble, ties)().init(jax.random.key(0), tie_models.X)
  untied = flax_tieext.untie_variables(variables, ties, stacks=stacks)
  attn = untied['params']['ens']['stack']['attn']
  attn['bias'] = attn['bias'].at[1, 2].add(1.0)
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(untied, ties, stacks=stacks)
  assert_message_names(str(info.value), '/ens/stack/attn/bias differs',
                       'in layer 1 (axis 0) of the stack /ens,'
                       ' in layer 2 (axis 1) of the stack /ens/stack')
  # merge='mean' counts each layer of each stack as one copy.
  source = variables['params']['src']['bias']
  merged = flax_tieext.tie_variables(untied, ties, stacks=stacks,
                                     merge='mean')
  assert_close(merged['params']['src']['bias'], jnp.mean(jnp.concatenate(
      [source[None], attn['bias'].reshape(-1, tie_models.D)]), axis=0))


@needs_patch
def test_naming_the_inner_stack_only_says_to_name_the_outer_one():
  variables = nn.tie(Ensemble, {'ens/stack/attn': 'src'})().init(
      jax.random.key(0), tie_models.X)
  with pytest.raises(TieError) as info:
    flax_tieext.untie_variables(variables, {'ens/stack/attn': 'src'},
                                stacks={'ens/stack': N})
  assert_message_names(str(info.value), 'stacks gives /ens/stack 3 layers',
                       'a leading axis of 2 (axis 0 of shape (2, 3, ',
                       'If it lies in a stack, name that one too')


class NamedLayer(nn.Module):
  """``Layer`` with partitioned kernels (``partitioning`` boxes them)."""
  partitioning: Any

  @nn.compact
  def __call__(self, x, _):
    init = self.partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    h = (nn.Dense(tie_models.D, kernel_init=init, name='attn')(x)
         + nn.Dense(tie_models.D, kernel_init=init, name='mlp')(x))
    return jnp.tanh(h), None


class NamedStack(nn.Module):
  """A scan whose layer axis is named, as MaxText names it."""
  partitioning: Any = nn.with_partitioning

  @nn.compact
  def __call__(self, x):
    init = self.partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    x = nn.Dense(tie_models.D, kernel_init=init, name='src')(x)
    layers = nn.scan(NamedLayer, variable_axes={'params': 0},
                     split_rngs={'params': True}, length=N,
                     metadata_params={nn.PARTITION_NAME: 'layers'})
    return layers(self.partitioning, name='layers')(x, None)[0]


@needs_patch
@pytest.mark.parametrize('partitioning', [nn.with_partitioning,
                                          nn.with_logical_partitioning])
def test_a_named_layer_axis_unties_with_its_name(partitioning):
  """The copy's layer axis was unnamed, (None, 'embed', 'mlp'): the untied
  model failed on a bare AssertionError in flax/core/meta.py."""
  model = NamedStack(partitioning)
  ties = {'layers/attn': 'src'}
  _, untied = assert_unties_to_the_untied_model(model, ties, {'layers': N})
  assert untied['params']['layers']['attn']['kernel'].names == (
      'layers', 'embed', 'mlp')


@needs_patch
@pytest.mark.parametrize('convert', ['untie', 'tie'])
def test_a_stacks_path_that_names_no_stack_is_refused(convert):
  """{'layer': 3} for /layers wrote the target unstacked into the stack."""
  variables, untied = _encoder_variables()
  with pytest.raises(TieError) as info:
    getattr(flax_tieext, f'{convert}_variables')(
        variables if convert == 'untie' else untied, LAYERS_TIES,
        stacks={'layer': 2})
  assert_message_names(str(info.value),
                       f"{convert}_variables(..., stacks={{'layer': 2}})",
                       "'layer' names no stack", "Did you mean 'layers'?")


class EncoderWithHead(nn.Module):
  """``Encoder`` with a head whose kernel is the embedding's, transposed."""

  @nn.compact
  def __call__(self, x):
    x = Encoder(name='enc')(x)
    return nn.Dense(tie_models.D, use_bias=False, name='head')(x)


HEAD_AND_LAYERS_TIES = {'enc/layers/attn': 'enc/embed',
                        'head/kernel': ('enc/embed/kernel', jnp.transpose)}
ENC_STACKS = {'enc/layers': 2}


def untied_with_one_layer_trained(head_moved=False):
  """The tied model's variables untied, then layer 1's copy of attn changed."""
  tied = nn.tie(EncoderWithHead, HEAD_AND_LAYERS_TIES)()
  variables = tied.init(jax.random.key(0), tie_models.X)
  untied = flax_tieext.untie_variables(variables, HEAD_AND_LAYERS_TIES,
                                       stacks=ENC_STACKS)
  attn = untied['params']['enc']['layers']['attn']
  attn['kernel'] = attn['kernel'].at[1].add(1.0)
  if head_moved:
    head = untied['params']['head']
    head['kernel'] = head['kernel'] + 1.0
  return tied, untied


@needs_patch
def test_mean_leaves_out_a_viewed_copy_equal_to_the_view_of_its_source():
  """The head equals the view of the embedding: it holds nothing to merge."""
  tied, untied = untied_with_one_layer_trained()
  params = untied['params']
  source = params['enc']['embed']['kernel']
  layers = params['enc']['layers']['attn']['kernel']
  merged = flax_tieext.tie_variables(untied, HEAD_AND_LAYERS_TIES,
                                     stacks=ENC_STACKS, merge='mean')
  mean = jnp.mean(jnp.concatenate([source[None], layers]), axis=0)
  assert_close(merged['params']['enc']['embed']['kernel'], mean)
  # It runs as the untied model holding the mean at the source and every
  # copy, the viewed one through the view.
  by_hand = jax.tree_util.tree_map(lambda x: x, params)
  by_hand['enc']['embed']['kernel'] = mean
  by_hand['enc']['layers']['attn']['kernel'] = jnp.stack([mean] * 2)
  by_hand['head']['kernel'] = mean.T
  assert_close(tied.apply(merged, tie_models.X),
               EncoderWithHead().apply({'params': by_hand}, tie_models.X))
  # A function gets the source and the unviewed copies: one per layer.
  got = []
  flax_tieext.tie_variables(
      untied, HEAD_AND_LAYERS_TIES, stacks=ENC_STACKS,
      merge=lambda s, copies: got.append(len(copies)) or s)
  assert got == [2]
  # Without merge=, the refusal offers 'mean', which now merges them.
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(untied, HEAD_AND_LAYERS_TIES, stacks=ENC_STACKS)
  message = str(info.value)
  assert "tie_variables(..., merge='mean')" in message
  assert 'cannot merge them' not in message


@needs_patch
@pytest.mark.parametrize('merge', ['mean', lambda s, copies: s])
def test_merge_refuses_a_viewed_copy_unlike_the_view_of_its_source(merge):
  _, untied = untied_with_one_layer_trained(head_moved=True)
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(untied, HEAD_AND_LAYERS_TIES, stacks=ENC_STACKS,
                              merge=merge)
  assert_message_names(
      str(info.value), "Cannot merge the copies of /enc/embed/kernel",
      '(/head/kernel first)', 'does not invert')


# ---------------------------------------------------------------------------
# Views of partitioned parameters: applied to JAX arrays, names followed.
# ---------------------------------------------------------------------------

VIEWS = {
    'scaled transpose': lambda e: jnp.transpose(e) * D ** -0.5,
    'at set then transpose': lambda e: e.at[0].set(0).T,
}


class PartitionedHeadLM(nn.Module):
  """An embedding and a head; ``view`` writes the head by hand from it."""

  view: object = None
  features: int = 11  # the head's (a slice of the table's 11 rows)
  remat: bool = False  # the head in nn.remat

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(11, D, embedding_init=nn.with_partitioning(
        nn.initializers.normal(1.0), ('vocab', 'embed')), name='embed')
    x = jnp.tanh(embed(tokens))
    if self.view is not None:  # plain Flax: the head computed from the table
      return x @ self.view(embed.embedding)
    dense = nn.remat(nn.Dense) if self.remat else nn.Dense
    return dense(self.features, use_bias=False, kernel_init=nn.with_partitioning(
        nn.initializers.normal(1.0), ('embed', 'vocab')), name='head')(x)


@pytest.mark.needs_patch
@pytest.mark.parametrize('view', sorted(VIEWS))
def test_a_view_of_a_partitioned_parameter_is_applied_to_jax_arrays(view):
  ties = {'head/kernel': ('embed/embedding', VIEWS[view])}
  tokens = jnp.array([[1, 2, 3]])
  tied = nn.tie(PartitionedHeadLM, ties)()
  y, variables = tied.init_with_output(jax.random.key(0), tokens)
  by_hand = PartitionedHeadLM(VIEWS[view])
  assert_close(y, by_hand.apply(variables, tokens))
  assert_close(tied.apply(variables, tokens), by_hand.apply(variables, tokens))
  untied = flax_tieext.untie_variables(variables, ties)
  head = untied['params']['head']['kernel']
  assert head.names == ('embed', 'vocab')  # the axes moved as a transpose
  assert_close(head.unbox(), VIEWS[view](variables['params']['embed'][
      'embedding'].unbox()))


@pytest.mark.needs_patch
def test_a_sliced_view_of_a_partitioned_parameter_keeps_the_sliced_axis_name():
  """Found by tests/test_tie_generated.py: a slice of the named axis was refused.

  Its length does not show in the view's output (``e[:8]`` of a longer
  table is as long), so where it lands is read from where its indices land.
  """
  view = lambda e: e[:8].T  # the head over the first 8 of 11 tokens
  ties = {'head/kernel': ('embed/embedding', view)}
  tokens = jnp.array([[1, 2, 3]])
  tied = nn.tie(PartitionedHeadLM, ties)(features=8, remat=True)
  y, variables = tied.init_with_output(jax.random.key(0), tokens)
  by_hand = PartitionedHeadLM(view)
  assert_close(y, by_hand.apply(variables, tokens))
  assert_close(tied.apply(variables, tokens), by_hand.apply(variables, tokens))
  head = flax_tieext.untie_variables(variables, ties)['params']['head']['kernel']
  assert head.names == ('embed', 'vocab')


@pytest.mark.needs_patch
def test_a_view_that_mixes_a_partitioned_axis_is_still_refused():
  ties = {'head/kernel': ('embed/embedding',
                          lambda e: e.reshape(-1)[:D * 11].reshape(D, 11))}
  with pytest.raises(TieError, match="partitioned axis 'vocab'"):
    nn.tie(PartitionedHeadLM, ties)().init(jax.random.key(0),
                                           jnp.array([[1, 2, 3]]))
