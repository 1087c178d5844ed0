"""A mask shared by hand between blocks fails once the blocks are rematted.

Twelve blocks of an encoder attend through one mask, a variable of the
`graph` collection. Shared by hand, the other blocks borrow block 0's mask
with `nn.map_variables`, reaching it through `self.scope.root`. Under
`nn.remat` the block's scope is rebuilt as a root inside the transform, so
block 0 is out of reach.

Plain Flax 0.12.12: `init` raises `KeyError: 'graph'`. With
``--no-remat`` the same hand-made sharing works: stored once, same output.
With `nn.tie` (the flax-tieext plugin, or Flax with this FLIP): the mask is
stored once and the encoder computes what the untied encoder computes.
"""

import sys

import jax
import jax.numpy as jnp
import flax.linen as nn

try:
  import flax_tieext  # noqa: F401  installs nn.tie into Flax
except ImportError:
  pass

BLOCKS, LENGTH, WIDTH = 3, 6, 8
REMAT = nn.remat if sys.argv[1:] != ['--no-remat'] else lambda module: module


class Attention(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.tril(jnp.ones((LENGTH, LENGTH))))
    return nn.Dense(WIDTH)(mask.value @ x)


def borrow_block_0_mask(root):
  return lambda variables: {'graph': root.variables()['graph']['block_0']['attn']}


class Block(nn.Module):
  hand_shared: bool = False

  @nn.compact
  def __call__(self, x):
    if self.hand_shared and self.name != 'block_0':
      attn = nn.map_variables(
          Attention, 'graph', trans_in_fn=borrow_block_0_mask(self.scope.root),
          trans_out_fn=lambda variables: {}, mutable=True)(name='attn')
    else:
      attn = Attention(name='attn')
    return x + attn(x)


class Encoder(nn.Module):
  hand_shared: bool = False

  @nn.compact
  def __call__(self, x):
    for i in range(BLOCKS):
      x = REMAT(Block)(self.hand_shared, name=f'block_{i}')(x)
    return x


x = jax.random.normal(jax.random.key(1), (2, LENGTH, WIDTH))
if hasattr(nn, 'tie'):
  model = nn.tie(Encoder, {f'block_{i}/attn': 'block_0/attn' for i in range(1, BLOCKS)},
                 collections='graph')()
else:
  model = Encoder(hand_shared=True)
variables = model.init(jax.random.key(0), x)  # plain Flax: KeyError: 'graph'
assert list(variables['graph']) == ['block_0'], 'the mask is stored once'
untied = Encoder()  # every block its own (equal) mask: the reference
untied_variables = untied.init(jax.random.key(0), x)
assert jnp.allclose(model.apply(variables, x), untied.apply(untied_variables, x))
