"""Conversions between the untied and the tied layout stay on the devices.

``tie_variables`` / ``untie_variables`` keep every array where it is: an
output leaf has the sharding of the input leaf it comes from (a stack's copies
gain an unsharded layer axis, a transposed view's follow its axes), checked
on an 8-device CPU mesh in an interpreter of its own. An untied checkpoint
whose copies differ is refused unless ``merge=`` says what the source
becomes; each choice is checked against the value computed by hand
(``jnp.mean`` of the source and its copies, a function of them).
The two-process job, with arrays no process holds whole, is
``tests/distributed/test_convert_two_processes.py``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import flax_tieext
from flax_tieext import TieError

from test_tie_sharding import passes_on_eight_devices

# end_to_end: an 8-device mesh in an interpreter of its own; the README's test
# run leaves it to --end-to-end (tests/test_tie_conversion.py runs on one).
pytestmark = pytest.mark.end_to_end

K = jax.random.split(jax.random.key(0), 4)
A, B, C = (jax.random.normal(k, (3, 4)) for k in K[:3])
LAYERS = jax.random.normal(K[3], (5, 3, 4))


def untied(**params):
  return {'params': {name: {'w': w} for name, w in params.items()}}


def source(tree, name='a'):
  return tree['params'][name]['w']


# -- merge= ------------------------------------------------------------------


def test_differing_copies_are_refused_naming_both_and_the_merge_option():
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(untied(a=A, b=A, c=C), {'b': 'a', 'c': 'a'})
  message = str(info.value)
  gap = float(jnp.max(jnp.abs(C - A)))
  assert ("Cannot tie /c to /a in collection 'params': /c/w differs from its"
          f' source /a/w (max abs difference {gap})') in message
  assert "merge='first'" in message and "merge='mean'" in message
  assert 'merge=fn' in message


def test_first_keeps_the_source():
  tied = flax_tieext.tie_variables(untied(a=A, b=B, c=C), {'b': 'a', 'c': 'a'},
                                   merge='first')
  assert tied == {'params': {'a': {'w': A}}}
  assert source(tied) is A


def test_mean_is_the_mean_of_the_source_and_every_copy():
  # The copy that equals the source counts too.
  tied = flax_tieext.tie_variables(
      untied(a=A, b=B, c=C, d=A), {'b': 'a', 'c': 'a', 'd': 'a'},
      merge='mean')
  assert list(tied['params']) == ['a']
  np.testing.assert_allclose(source(tied), jnp.mean(jnp.stack([A, B, C, A]), 0),
                             rtol=1e-6)


def test_mean_counts_each_layer_of_a_stack_as_a_copy():
  variables = {'params': {'a': {'w': A},
                          'stack': {'b': {'w': LAYERS},
                                    'own': {'w': jnp.zeros((5, 2))}}}}
  tied = flax_tieext.tie_variables(variables, {'stack/b': 'a'},
                                   stacks={'stack': 5}, merge='mean')
  assert 'b' not in tied['params']['stack']
  np.testing.assert_allclose(
      source(tied), jnp.mean(jnp.concatenate([A[None], LAYERS]), 0),
      rtol=1e-6)


def test_a_function_merges_the_source_and_its_copies():
  def largest(source, copies):
    return jnp.max(jnp.stack([source, *copies]), axis=0)

  tied = flax_tieext.tie_variables(untied(a=A, b=B, c=C), {'b': 'a', 'c': 'a'},
                                   merge=largest)
  np.testing.assert_array_equal(source(tied), jnp.maximum(jnp.maximum(A, B), C))


def test_only_the_leaves_whose_copies_differ_are_merged():
  # The mean of three equal values can round; an equal leaf is kept as is.
  third = jnp.full((3,), 0.1) / 3
  variables = {'params': {
      name: {'v': third, 'w': w} for name, w in (('a', A), ('b', B), ('c', A))}}
  tied = flax_tieext.tie_variables(variables, {'b': 'a', 'c': 'a'},
                                   merge='mean')
  assert tied['params']['a']['v'] is third
  np.testing.assert_allclose(tied['params']['a']['w'],
                             jnp.mean(jnp.stack([A, B, A]), 0), rtol=1e-6)


def test_merge_keeps_partitioning_metadata():
  box = lambda w: nn.Partitioned(w, (None, 'model'))
  variables = {'params': {'a': {'w': box(A)}, 'b': {'w': box(B)}}}
  tied = flax_tieext.tie_variables(variables, {'b': 'a'}, merge='mean')
  merged = tied['params']['a']['w']
  assert isinstance(merged, nn.Partitioned) and merged.names == (None, 'model')
  np.testing.assert_allclose(merged.value, (A + B) / 2, rtol=1e-6)


def test_mean_through_a_view_is_refused():
  ties = {'b': ('a', jnp.transpose)}
  variables = untied(a=A, b=B.T + 1.0)
  for merge in ('mean', lambda source, copies: source):
    with pytest.raises(TieError) as info:
      flax_tieext.tie_variables(variables, ties, merge=merge)
    message = str(info.value)
    assert "Cannot merge the copies of /a/w in collection 'params'" in message
    assert 'does not invert' in message and "merge='first'" in message
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(variables, ties)
  message = str(info.value)
  assert "merge='mean' or a function cannot merge them" in message
  assert "tie_variables(..., merge='mean')" not in message
  tied = flax_tieext.tie_variables(variables, ties, merge='first')
  assert source(tied) is A


def test_unknown_merge_is_refused():
  with pytest.raises(TieError, match="got 'maen'. Did you mean 'mean'?"):
    flax_tieext.tie_variables(untied(a=A, b=A), {'b': 'a'}, merge='maen')


def test_merge_result_of_another_shape_is_refused():
  with pytest.raises(TieError) as info:
    flax_tieext.tie_variables(untied(a=A, b=B), {'b': 'a'},
                              merge=lambda s, copies: jnp.sum(s))
  assert "returned ():float32 for /a/w in collection 'params'" in str(
      info.value)
  assert '(3, 4):float32' in str(info.value)


class Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(4, name='dense')(x))


class Twice(nn.Module):

  @nn.compact
  def __call__(self, x):
    return Block(name='b')(Block(name='a')(x))


@pytest.mark.needs_patch
def test_merged_checkpoint_runs_as_the_untied_model_holding_the_mean():
  """An untied model trained with two blocks, tied to their mean."""
  x = jnp.ones((2, 4))
  variables = Twice().init(jax.random.key(1), x)  # two different blocks
  tied = flax_tieext.tie_variables(variables, {'b': 'a'}, merge='mean')
  params = variables['params']
  mean = jax.tree_util.tree_map(lambda a, b: (a + b) / 2, params['a'],
                                params['b'])
  by_hand = Twice().apply({'params': {'a': mean, 'b': mean}}, x)
  np.testing.assert_allclose(nn.tie(Twice, {'b': 'a'})().apply(tied, x),
                             by_hand, rtol=1e-6)


# -- Sharding: every leaf stays where it is -----------------------------------


def _mesh():
  return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ('data', 'model'))


def test_conversions_keep_each_leafs_sharding(request):
  if jax.device_count() < 8:
    passes_on_eight_devices(request)
    return
  mesh = _mesh()
  sharding = NamedSharding(mesh, P('data', 'model'))
  a = jax.device_put(jnp.arange(32.0).reshape(4, 8), sharding)
  own = jax.device_put(jnp.zeros((3, 8)), NamedSharding(mesh, P(None, 'model')))
  ties = {'b': 'a', 'c': ('a', jnp.transpose), 'stack/t': 'a'}
  tied = {'params': {'a': {'w': a}, 'stack': {'own': own}}}

  out = flax_tieext.untie_variables(tied, ties, stacks={'stack': 3})
  params = out['params']
  assert params['b']['w'] is a  # the source's own array
  assert params['c']['w'].sharding.is_equivalent_to(
      NamedSharding(mesh, P('model', 'data')), 2)
  assert params['stack']['t']['w'].sharding == NamedSharding(
      mesh, P(None, 'data', 'model'))
  np.testing.assert_array_equal(params['stack']['t']['w'],
                                jnp.broadcast_to(a, (3, 4, 8)))

  back = flax_tieext.tie_variables(out, ties, stacks={'stack': 3})
  assert source(back) is a and back['params']['stack']['own'] is own

  # A copy that differs, merged (without the view, which 'mean' refuses):
  # the mean keeps the source's sharding.
  ties = {'b': 'a', 'stack/t': 'a'}
  del out['params']['c']
  b = jax.device_put(a * 3.0, NamedSharding(mesh, P('model', 'data')))
  out['params']['b']['w'] = b
  with pytest.raises(TieError, match=r'/b/w differs from its source /a/w \(max'
                     rf' abs difference {float(jnp.max(b - a))}\)'):
    flax_tieext.tie_variables(out, ties, stacks={'stack': 3})
  merged = flax_tieext.tie_variables(out, ties, stacks={'stack': 3},
                                     merge='mean')
  assert source(merged).sharding == sharding
  np.testing.assert_allclose(source(merged), (a * 4 + b) / 5, rtol=1e-6)
