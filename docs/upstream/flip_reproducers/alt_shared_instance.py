"""Alternative: share by hand with one module instance (plain Flax, runs).

* One instance passed to every block works, under `nn.remat` too: Flax lifts
  a module attribute's scope with the block. The variables live where the
  instance is bound (`params['attn']`), not at the blocks' paths, so a
  checkpoint of the unshared model does not load (no `block_i/attn`).
* `nn.share_scope(a1, a0)` gives `a1` the scope of `a0`. It is made for a
  wrapper and the module it wraps (Flax's LoRA example). Two instances of one
  compact class in one scope both create `Dense_0`: `NameInUseError`.
"""

import jax
import jax.numpy as jnp
import flax.errors
import flax.linen as nn


class Attention(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(x.shape[-1])(x)


class Block(nn.Module):
  attn: nn.Module

  @nn.compact
  def __call__(self, x):
    return x + self.attn(x)


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    attn = Attention(name='attn')  # one instance, passed to every block
    for i in range(3):
      x = nn.remat(Block)(attn, name=f'block_{i}')(x)
    return x


x = jnp.ones((2, 4))
params = Encoder().init(jax.random.key(0), x)['params']
assert list(params) == ['attn'], 'stored once, at the encoder: no block_i/attn'
grads = jax.grad(lambda p: Encoder().apply({'params': p}, x).sum())(params)


class ShareScope(nn.Module):

  def setup(self):
    self.a0, self.a1 = Attention(), Attention()
    nn.share_scope(self.a1, self.a0)

  def __call__(self, x):
    return self.a1(self.a0(x))


try:
  ShareScope().init(jax.random.key(0), x)
  raise AssertionError('expected NameInUseError')
except flax.errors.NameInUseError:
  pass  # both instances create Dense_0 in the one scope
