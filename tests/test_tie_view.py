"""A language-model head tied to the embedding through a transposed view.

The reference is Flax's own idiom for tied embeddings, ``nn.Embed.attend``.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
pytestmark = pytest.mark.needs_patch
from flax_tieext import TieError

VOCAB, D = 11, 4


class LM(nn.Module):
  attend: bool = False
  remat_head: bool = False

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, D, name='embed')
    x = jnp.tanh(embed(tokens))
    x = nn.Dense(D, name='mid')(x)
    if self.attend:
      return embed.attend(x)
    head_cls = nn.remat(nn.Dense) if self.remat_head else nn.Dense
    return head_cls(VOCAB, use_bias=False, name='head')(x)


HEAD_TIE = {'head/kernel': ('embed/embedding', jnp.transpose)}


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


class WritesHead(nn.Module):

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(VOCAB, D, name='embed')(tokens)
    head = Writer(name='head')
    return head(x)


class Writer(nn.Module):

  @nn.compact
  def __call__(self, x):
    kernel = self.param('kernel', nn.initializers.zeros, (D, VOCAB))
    self.put_variable('params', 'kernel', kernel + 1)
    return x @ kernel


def test_write_through_a_view_is_refused():
  tokens = jnp.array([[1, 2]])
  model = nn.tie(WritesHead, HEAD_TIE)()
  variables = nn.tie(LM, HEAD_TIE)().init(jax.random.key(0), tokens)
  params = {'embed': variables['params']['embed']}
  with pytest.raises(TieError) as info:
    model.apply({'params': params}, tokens, mutable=['params'])
  message = str(info.value)
  assert '/head/kernel' in message and '/embed/embedding' in message
  assert 'read-only view' in message
  assert "'params'" in message


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
