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

"""Edge cases of ``flax_tieext.nnx`` ties: updates, conversions, pickle.

The reference is the untied model a user would write, built the same way.
"""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext
from flax_tieext import _compat

try:
  from flax import nnx  # pylint: disable=g-import-not-at-top
except ImportError as e:  # Flax 0.10.7 on its pinned jax 0.8.1
  pytest.skip(f'flax.nnx does not import on Flax {_compat.FLAX_VERSION}: {e}',
              allow_module_level=True)
import flax_tieext.nnx  # pylint: disable=g-import-not-at-top,g-bad-import-order

if not flax_tieext.nnx._TREE_MODE:  # pylint: disable=protected-access
  pytest.skip(f'Flax {_compat.FLAX_VERSION} has no NNX tree mode',
              allow_module_level=True)

tie = flax_tieext.nnx.tie
TieError = flax_tieext.TieError


class Mask(nnx.Variable):
  pass


class LM(nnx.Module):

  def __init__(self, *, rngs):
    self.embed = nnx.Embed(8, 4, rngs=rngs)
    self.head = nnx.Linear(4, 8, use_bias=False, rngs=rngs)


TiedLM = tie(LM, {'head.kernel': ('embed.embedding', jnp.transpose)})


class Pair(nnx.Module):

  def __init__(self, *, rngs):
    self.a = nnx.Linear(4, 4, rngs=rngs)
    self.b = nnx.Linear(4, 4, rngs=rngs)


TiedPair = tie(Pair, {'b.kernel': 'a.kernel'})


class Block(nnx.Module):

  def __init__(self, *, rngs):
    self.mask = Mask(jnp.ones((5, 5)))
    self.lin = nnx.Linear(5, 5, rngs=rngs)


class Stacked(nnx.Module):

  def __init__(self, *, rngs):
    self.mask = Mask(jnp.tril(jnp.ones((5, 5))))

    @nnx.vmap(graph=False)
    def make(key):
      return Block(rngs=nnx.Rngs(key))

    self.blocks = make(jax.random.split(rngs.params(), 3))


TiedStacked = tie(Stacked, {'blocks.mask': 'mask'})


# --------------------------------------------------------------------------
# nnx.update of a view target
# --------------------------------------------------------------------------
def test_update_refuses_a_view_target_that_is_not_the_view():
  model = TiedLM(rngs=nnx.Rngs(0))
  untied = nnx.state(LM(rngs=nnx.Rngs(3)), graph=False)  # head != embed.T
  with pytest.raises(TieError, match=r"'head\.kernel'.*'embed\.embedding'.*"
                     r'would be lost.*tie_state'):
    nnx.update(model, untied)


def test_update_takes_a_view_target_that_is_the_view():
  model = TiedLM(rngs=nnx.Rngs(0))
  other = TiedLM(rngs=nnx.Rngs(4))
  nnx.update(model, flax_tieext.nnx.untie_state(
      nnx.state(other, graph=False), TiedLM))
  np.testing.assert_array_equal(model.embed.embedding[...],
                                other.embed.embedding[...])
  nnx.update(model, nnx.state(model))  # graph mode: a copy of the view


def test_the_advised_tie_state_loads_an_untied_checkpoint():
  untied = LM(rngs=nnx.Rngs(3))
  untied.head.kernel[...] = untied.embed.embedding[...].T
  model = TiedLM(rngs=nnx.Rngs(0))
  nnx.update(model, flax_tieext.nnx.tie_state(
      nnx.state(untied, graph=False), TiedLM))
  np.testing.assert_array_equal(model.head.kernel[...], untied.head.kernel[...])


# --------------------------------------------------------------------------
# untie_state / tie_state of a target inside a stack
# --------------------------------------------------------------------------
def test_untie_state_refuses_an_unnamed_stack():
  state = nnx.state(TiedStacked(rngs=nnx.Rngs(0)), graph=False)
  with pytest.raises(TieError, match=r"(?s)inside 'blocks'.*stack of 3.*"
                     r"stacks=\{'blocks': 3\}"):
    flax_tieext.nnx.untie_state(state, TiedStacked)


def test_untie_state_stacks_a_target_and_tie_state_takes_it_back():
  model = TiedStacked(rngs=nnx.Rngs(0))
  untied = Stacked(rngs=nnx.Rngs(1))
  state = flax_tieext.nnx.untie_state(nnx.state(model, graph=False),
                                      TiedStacked, stacks={'blocks': 3})
  nnx.update(untied, state)
  assert untied.blocks.mask.shape == Stacked(rngs=nnx.Rngs(1)).blocks.mask.shape
  np.testing.assert_array_equal(untied.blocks.mask[...],
                                jnp.stack([model.mask[...]] * 3))
  back = TiedStacked(rngs=nnx.Rngs(2))
  nnx.update(back, flax_tieext.nnx.tie_state(nnx.state(untied, graph=False),
                                             TiedStacked))
  np.testing.assert_array_equal(back.mask[...], model.mask[...])
  untied.blocks.mask[1] = jnp.zeros((5, 5))
  with pytest.raises(TieError, match=r"'blocks\.mask' -> 'mask'.*differs"):
    flax_tieext.nnx.tie_state(nnx.state(untied, graph=False), TiedStacked)


def test_untie_state_refuses_a_wrong_number_of_layers():
  state = nnx.state(TiedStacked(rngs=nnx.Rngs(0)), graph=False)
  with pytest.raises(TieError, match=r"(?s)stacks gives 'blocks' 4 layers.*"
                     r"leading axis of 3.*stacks=\{'blocks': 3\}"):
    flax_tieext.nnx.untie_state(state, TiedStacked, stacks={'blocks': 4})


def test_untie_state_moves_sharding_names_with_a_view():
  model = TiedLM(rngs=nnx.Rngs(0))
  model.embed.embedding.set_metadata(out_sharding=('vocab', 'embed'))
  state = flax_tieext.nnx.untie_state(nnx.state(model, graph=False), TiedLM)
  assert state['head']['kernel'].get_metadata()['out_sharding'] == (
      'embed', 'vocab')


# --------------------------------------------------------------------------
# tie_state makes the checks of tie()
# --------------------------------------------------------------------------
class Kinds(nnx.Module):

  def __init__(self, dtype=jnp.float32, kind=nnx.Param):
    self.a = nnx.Param(jnp.ones((3,)))
    self.b = kind(jnp.ones((3,), dtype))


@pytest.mark.parametrize('kwargs, match', [
    (dict(dtype=jnp.int32), r"but 'b' has \(3,\):int32"),
    (dict(kind=Mask), 'the target is a Mask, the source a Param'),
])
def test_tie_state_refuses_what_tie_refuses(kwargs, match):
  with pytest.raises(TieError, match=match):
    tie(Kinds, {'b': 'a'})(**kwargs)
  with pytest.raises(TieError, match="tie 'b' -> 'a'.*" + match):
    flax_tieext.nnx.tie_state(nnx.state(Kinds(**kwargs), graph=False),
                              {'b': 'a'})


# --------------------------------------------------------------------------
# Messages and pickle
# --------------------------------------------------------------------------
def test_a_cycle_is_named_and_the_advice_is_taken():
  with pytest.raises(TieError, match=r"cycle: 'a\.kernel' -> 'b\.kernel' -> "
                     r"'a\.kernel'\. .*pick one of them as the source"):
    tie(Pair, {'a.kernel': 'b.kernel', 'b.kernel': 'a.kernel'})
  tie(Pair, {'b.kernel': 'a.kernel'})(rngs=nnx.Rngs(0))


class Three(nnx.Module):

  def __init__(self, *, rngs):
    self.a = nnx.Linear(4, 4, rngs=rngs)
    self.b = nnx.Linear(4, 4, rngs=rngs)
    self.c = nnx.Linear(4, 4, rngs=rngs)


@pytest.mark.parametrize('declare', [
    lambda cls: tie(cls, {'c.kernel': 'b.kernel', 'b.kernel': 'a.kernel'}),
    lambda cls: tie(tie(cls, {'c.kernel': 'b.kernel'}), {'b.kernel': 'a.kernel'}),
], ids=['one mapping', 'stacked declarations'])
def test_a_chain_resolves_to_its_final_source_as_in_linen(declare):
  model = declare(Three)(rngs=nnx.Rngs(0))
  assert model.c.kernel is model.b.kernel is model.a.kernel
  # The reference: the model sharing `a`'s kernel by reference (graph mode).
  shared = Three(rngs=nnx.Rngs(0))
  shared.b.kernel = shared.c.kernel = shared.a.kernel
  tree = nnx.to_pure_dict(nnx.state(model, graph=False))
  reference = nnx.to_pure_dict(nnx.state(shared, graph=True))
  assert jax.tree.structure(tree) == jax.tree.structure(reference)
  jax.tree.map(np.testing.assert_array_equal, tree, reference)


def test_views_along_a_chain_compose():
  double = lambda x: 2 * x
  model = tie(Three, {'c.kernel': ('b.kernel', jnp.transpose),
                      'b.kernel': ('a.kernel', double)})(rngs=nnx.Rngs(0))
  a = model.a.kernel[...]
  np.testing.assert_array_equal(model.b.kernel[...], 2 * a)
  np.testing.assert_array_equal(model.c.kernel[...], (2 * a).T)
  assert sorted(nnx.to_pure_dict(nnx.state(model, nnx.Param, graph=False))
                ['c']) == ['bias']


@pytest.mark.parametrize('cls', [TiedPair, TiedLM])
def test_a_tied_module_pickles(cls):
  model = cls(rngs=nnx.Rngs(0))
  loaded = pickle.loads(pickle.dumps(model))
  assert type(loaded) is cls
  assert jax.tree.structure(loaded) == jax.tree.structure(model)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(model)):
    np.testing.assert_array_equal(a, b)
  if cls is TiedPair:
    assert loaded.b.kernel is loaded.a.kernel
  else:
    loaded.embed.embedding[...] = 2 * loaded.embed.embedding[...]
    np.testing.assert_array_equal(loaded.head.kernel[...],
                                  loaded.embed.embedding[...].T)


# --------------------------------------------------------------------------
# A view target copied apart from its source
# --------------------------------------------------------------------------
@pytest.mark.parametrize('graph', [False, True])
def test_a_view_passed_without_its_source_names_the_tie(graph):
  """It named no path, and said "pass graph=False" where it was passed."""
  model = TiedLM(rngs=nnx.Rngs(0))
  head = lambda h, x: h.kernel.get_value() @ x
  with pytest.raises(TieError) as info:
    nnx.jit(head, graph=graph)(model.head, jnp.ones((8,)))
  message = str(info.value)
  assert "'head.kernel' -> 'embed.embedding'" in message
  assert 'pass the tied module itself' in message
  # The tied module passed whole is the fix the message gives.
  np.testing.assert_allclose(
      nnx.jit(lambda m, x: head(m.head, x), graph=False)(model,
                                                         jnp.ones((8,))),
      model.embed.embedding.get_value().T @ jnp.ones((8,)), rtol=1e-6)


@pytest.mark.parametrize('ties,fix', [
    ([('head.kernel', 'embed.embedding')], 'dict(pairs)'),
    ({'head.kernel'}, 'map each target to its source'),
    (None, '{} ties nothing'),
    ({'head.kernel': ('embed.embedding', 2.0)}, 'float 2.0, is not callable'),
], ids=['a list of pairs', 'a set', 'None', 'a view that is not callable'])
def test_tie_refuses_ties_it_cannot_read(ties, fix):
  with pytest.raises(TieError) as info:
    tie(LM, ties)
  assert 'flax_tieext.nnx.tie(..., ties)' in str(info.value)
  assert fix in str(info.value)


def test_a_view_that_cannot_be_hashed_is_one_view():
  """A dataclass view (eq=True: no hash) failed in the tied-class cache."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass
  class Transposed:
    scale: float = 1.0

    def __call__(self, x):
      return self.scale * jnp.transpose(x)

  tied = tie(LM, {'head.kernel': ('embed.embedding', Transposed())})(
      rngs=nnx.Rngs(0))
  reference = TiedLM(rngs=nnx.Rngs(0))
  loss = lambda m: jnp.sum(m.head(m.embed(jnp.arange(3))) ** 2)
  for transform in (nnx.jit, nnx.remat, lambda f, **kw: f):
    np.testing.assert_allclose(transform(loss, graph=False)(tied),
                               loss(reference), rtol=1e-6)
  grads = nnx.grad(loss, graph=False)(tied)
  np.testing.assert_allclose(grads.embed.embedding[...],
                             nnx.grad(loss, graph=False)(reference)
                             .embed.embedding[...], rtol=1e-6)


def test_a_tie_of_what_is_not_an_nnx_module_class_names_the_argument():
  """It named neither the argument nor what was given; it is a TypeError too."""
  class One(nnx.Module):

    def __init__(self):
      self.w = nnx.Param(jnp.ones(2))

  for given, got in [(One(), 'an instance of One: pass its class, One'),
                     (len, 'builtin_function_or_method'), (3, 'int 3')]:
    with pytest.raises(TieError, match=r'flax_tieext\.nnx\.tie\(module_class,'
                       r' ties\): module_class must be an nnx\.Module class.*'
                       + got) as info:
      tie(given, {'w': 'v'})
    assert isinstance(info.value, TypeError)
