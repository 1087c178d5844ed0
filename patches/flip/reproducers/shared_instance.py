"""Workaround (d): one module instance, created by the encoder, passed to every block.

Works under nn.remat (Flax lifts a module attribute with the block): the mask is
stored once, at the encoder (`graph/attn`, not `graph/block_0/attn`), and every
block must take the instance as an attribute. (Under nn.scan / nn.vmap the same
code is scan_outer_instance.py / vmap_outer_instance.py.)
--write: one Counter instance called twice keeps both writes (count 1 -> 3 -> 7).
"""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn


class Attention(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.tril(jnp.ones((4, 4))))
    return nn.Dense(8)(mask.value @ x)


class Block(nn.Module):
  attn: nn.Module

  @nn.compact
  def __call__(self, x):
    return x + self.attn(x)


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    attn = Attention(name='attn')
    for i in range(3):
      x = nn.remat(Block)(attn, name=f'block_{i}')(x)
    return x


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    count.value = 2 * count.value + 1
    return x


if '--write' in sys.argv:
  a = Counter()
  _, out = nn.Module.apply(a, {'state': {'count': jnp.array(1.0)}}, 0.0, mutable='state',
                           method=lambda m, x: m(m(x)))
  count = out['state']['count']
  print('works' if count == 7 else f'fails: count {count:g}, not 7')
else:
  variables = Encoder().init(jax.random.key(0), jnp.ones((2, 4, 8)))
  grads = jax.grad(lambda p: Encoder().apply({**variables, 'params': p}, jnp.ones((2, 4, 8))).sum())(
      variables['params'])
  print('works' if list(variables['graph']) == ['attn'] else f"fails: {list(variables['graph'])}")
