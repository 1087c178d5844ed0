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

"""The caches of ties read nothing their keys leave out (issue 47).

docs/design.md ("Caches") lists every cache the package keeps, its key and
the test that would catch it going stale. The tied class of ``nn.tie``
(Linen) and of ``flax_tieext.nnx.tie`` is cached by its ties, which hold a
view function as the object it is: here the view's own state changes between
calls, and the tie must read it as one module that applies the same view by
hand reads it, under every wrap (where that module's transform reuses a
trace, ``nn.jit``, both keep the first reading alike).
"""

import dataclasses
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tie_blocks import D, LM, VOCAB, X, Pair
from tie_wraps import WRAPS

import flax_tieext  # noqa: F401  pylint: disable=unused-import

pytestmark = pytest.mark.installs_patch


@dataclasses.dataclass
class Scaled:
  """A view whose output depends on its own state (eq=True: unhashable)."""
  scale: float = 1.0

  def __call__(self, embedding):
    return self.scale * jnp.transpose(embedding)


VIEW = Scaled()


class ByHand(nn.Module):
  """``LM`` with its head written by hand: the embedding through ``VIEW``."""

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, D, name='embed')
    x = nn.Dense(D, name='mid')(jnp.tanh(embed(tokens)))
    return x @ VIEW(embed.embedding)


@pytest.fixture
def view():
  VIEW.scale = 1.0
  yield VIEW
  VIEW.scale = 1.0


@pytest.mark.parametrize('wrap', list(WRAPS))
def test_a_view_changed_between_calls_is_read_as_by_one_module(view, wrap):
  tokens = jnp.arange(5) % VOCAB
  tied = WRAPS[wrap](nn.tie(LM, {'head/kernel': ('embed/embedding', view)}))()
  by_hand = WRAPS[wrap](ByHand)()
  variables = by_hand.init(jax.random.key(0), tokens)
  assert (jax.tree_util.tree_map(jnp.shape, tied.init(jax.random.key(0), tokens))
          == jax.tree_util.tree_map(jnp.shape, variables))
  outputs = []
  for scale in (1.0, 3.0, 1.0):
    view.scale = scale
    got = tied.apply(variables, tokens)
    np.testing.assert_allclose(got, by_hand.apply(variables, tokens),
                               rtol=1e-6)
    outputs.append(got)
  if wrap != 'jit':  # read anew at each call, by the tie as by hand
    assert not np.allclose(outputs[0], outputs[1])
  np.testing.assert_allclose(outputs[0], outputs[2], rtol=1e-6)


def test_an_nnx_view_changed_between_calls_is_read_at_each_call(view):
  try:
    from flax import nnx  # pylint: disable=g-import-not-at-top
    import flax_tieext.nnx  # pylint: disable=g-import-not-at-top,redefined-outer-name
  except ImportError as e:  # Flax 0.10.7 on its pinned jax 0.8.1
    pytest.skip(f'flax.nnx does not import here: {e}')
  if not flax_tieext.nnx._TREE_MODE:  # pylint: disable=protected-access
    pytest.skip('this Flax has no NNX tree mode')

  class Head(nnx.Module):

    def __init__(self, *, rngs):
      self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
      self.head = nnx.Linear(D, VOCAB, use_bias=False, rngs=rngs)

  tied = flax_tieext.nnx.tie(Head, {'head.kernel': ('embed.embedding', view)})(
      rngs=nnx.Rngs(0))
  tokens = jnp.arange(5) % VOCAB
  by_hand = lambda m: m.embed(tokens) @ VIEW(m.embed.embedding[...])
  for scale in (1.0, 3.0):
    view.scale = scale
    np.testing.assert_allclose(tied.head(tied.embed(tokens)), by_hand(tied),
                               rtol=1e-6)


@pytest.mark.needs_patch
@pytest.mark.parametrize('make', [
    lambda: flax_tieext.linen.tie(Pair, {'b': 'a'})(),
    lambda: flax_tieext.linen.tie(Pair, {'b': 'a'}, in_scan='scanned')(
        wrap='remat'),
    lambda: flax_tieext.linen.tie(flax_tieext.linen.tie(
        Pair, {'b/bias': 'a/bias'}), {'b/kernel': ('a/kernel', jnp.transpose)},
                                  collections=['params'])(),
], ids=['tie', 'in_scan', 'stacked with a view'])
def test_a_tied_linen_module_pickles_by_reference_as_nnx_ones_do(make):
  # The tied class has its class's name: pickle finds it by its ties.
  module = make()
  back = pickle.loads(pickle.dumps(module))
  assert type(back) is type(module) and back == module
  variables = module.init(jax.random.key(0), X)
  np.testing.assert_array_equal(back.apply(variables, X),
                                module.apply(variables, X))
