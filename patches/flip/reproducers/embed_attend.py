"""Workaround (d): nn.Embed.attend ties the output layer to the embedding, also under nn.remat."""
import jax
import flax.linen as nn


class Head(nn.Module):
  embed: nn.Embed  # the embedding instance, passed in

  @nn.compact
  def __call__(self, h):
    return self.embed.attend(nn.gelu(nn.Dense(16)(h)))  # logits = h @ embedding.T


class LM(nn.Module):

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(32, 16, name='embed')
    return nn.remat(Head)(embed, name='head')(embed(tokens))


tokens = jax.random.randint(jax.random.key(1), (4, 8), 0, 32)
params = LM().init(jax.random.key(0), tokens)['params']
grads = jax.grad(lambda p: LM().apply({'params': p}, tokens).sum())(params)
print('works' if sorted(params) == ['embed', 'head'] and list(params['head']) == ['Dense_0']
      else f'fails: {jax.tree.map(lambda a: a.shape, params)}')
