"""Alternative: `nn.Embed.attend`, Linen's answer to tied embeddings (#1263).

The output layer is the embedding's `attend` (a product with the embedding's
transpose): one variable, read at two places, with gradients from both. The
module that computes the logits must hold the `Embed` instance; passed into a
rematted head it is lifted with it. Runs on plain Flax.
"""

import jax
import jax.numpy as jnp
import flax.linen as nn

VOCAB, WIDTH = 32, 16


class Head(nn.Module):
  embed: nn.Embed

  @nn.compact
  def __call__(self, h):
    return self.embed.attend(nn.gelu(nn.Dense(WIDTH)(h)))


class LM(nn.Module):

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, WIDTH, name='embed')
    return nn.remat(Head)(embed, name='head')(embed(tokens))


tokens = jax.random.randint(jax.random.key(1), (4, 8), 0, VOCAB)
params = LM().init(jax.random.key(0), tokens)['params']
assert sorted(params) == ['embed', 'head'] and list(params['head']) == ['Dense_0']
grads = jax.grad(lambda p: LM().apply({'params': p}, tokens).sum())(params)
assert grads['embed']['embedding'].shape == (VOCAB, WIDTH)
