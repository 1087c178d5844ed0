"""Alternative: pass the shared value down as an argument (plain Flax, runs).

The encoder owns the mask and the relative-position bias and hands their
values to every block: in a plain loop, to `nn.remat` blocks, and to an
`nn.scan` stack with `nn.broadcast`. The bias's gradient sums over the layers.
Every module between the owner and the users takes the value as an argument,
the owner runs first, and a block cannot write it (it would return it).
"""

import jax
import jax.numpy as jnp
import flax.linen as nn

HEADS, LAYERS, LENGTH, WIDTH = 2, 4, 6, 8


class Block(nn.Module):

  @nn.compact
  def __call__(self, x, mask, bias):
    logits = jnp.einsum('bqd,bkd->bqk', x, x)[:, None] + bias
    logits = jnp.where(mask > 0, logits, -1e9)
    y = jnp.einsum('bhqk,bkd->bqd', jax.nn.softmax(logits), x) / HEADS
    return x + nn.Dense(WIDTH, name='ff')(y)


class ScanBlock(Block):

  def __call__(self, x, mask, bias):
    return super().__call__(x, mask, bias), None


class Encoder(nn.Module):
  how: str  # 'loop', 'remat' or 'scan'

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.tril(jnp.ones((LENGTH, LENGTH))))
    table = self.param('bias', nn.initializers.normal(0.02), (HEADS, LENGTH, LENGTH))
    if self.how == 'scan':
      stack = nn.scan(ScanBlock, variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=(nn.broadcast, nn.broadcast), length=LAYERS)
      return stack(name='layers')(x, mask.value, table)[0]
    block = nn.remat(Block) if self.how == 'remat' else Block
    for i in range(LAYERS):
      x = block(name=f'block_{i}')(x, mask.value, table)
    return x


x = jax.random.normal(jax.random.key(1), (2, LENGTH, WIDTH))
for how in ('loop', 'remat', 'scan'):
  variables = Encoder(how).init(jax.random.key(0), x)
  assert list(variables['graph']) == ['mask'] and variables['params']['bias'].shape == (
      HEADS, LENGTH, LENGTH), 'stored once, at the encoder'
  loss = lambda params: Encoder(how).apply({**variables, 'params': params}, x).sum()
  grads = jax.grad(loss)(variables['params'])
  assert jnp.abs(grads['bias']).sum() > 0, 'the gradient reaches the shared bias'
