"""Blocks share one mask (collection 'graph'); under nn.remat block_0 is out of reach."""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

REMAT = (lambda m: m) if '--no-remat' in sys.argv else nn.remat


class Attention(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.tril(jnp.ones((4, 4))))
    return nn.Dense(8)(mask.value @ x)


class Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    attn, root = Attention, self.scope.root  # blocks 1, 2 borrow block_0's mask:
    if self.name != 'block_0':
      attn = nn.map_variables(Attention, 'graph', mutable=True, trans_out_fn=lambda _: {},
          trans_in_fn=lambda _: {'graph': root.variables()['graph']['block_0']['attn']})
    return x + attn(name='attn')(x)


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    for i in range(3):
      x = REMAT(Block)(name=f'block_{i}')(x)
    return x


try:
  graph = Encoder().init(jax.random.key(0), jnp.ones((2, 4, 8)))['graph']
  print('works' if list(graph) == ['block_0'] else f'fails: masks stored at {list(graph)}')
except Exception as e:
  print(f'fails: {type(e).__name__} {e}')
