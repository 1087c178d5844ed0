"""Alternative: NNX graph mode shares by reference (plain Flax, runs).

One `Mask` variable object is held by every block; one `nnx.Linear` is
called as `up` and as `down`. `nnx.state` holds each once, gradients sum
over the uses, and the sharing holds under `nnx.remat` and `nnx.jit`, in
graph mode (`graph=True`, the default of Flax 0.12.12).
"""

import jax
import jax.numpy as jnp
from flax import nnx


class Mask(nnx.Variable):
  pass


class Block(nnx.Module):

  def __init__(self, mask, *, rngs):
    self.mask = mask  # the same object in every block
    self.ff = nnx.Linear(6, 6, rngs=rngs)

  def __call__(self, x):
    return x + self.ff(self.mask[...] @ x)


class Encoder(nnx.Module):

  def __init__(self, *, rngs):
    mask = Mask(jnp.tril(jnp.ones((4, 4))))
    self.blocks = nnx.List([Block(mask, rngs=rngs) for _ in range(3)])
    self.up = nnx.Linear(6, 6, rngs=rngs)
    self.down = self.up  # one module, two places

  def __call__(self, x):
    for block in self.blocks:
      x = nnx.remat(lambda block, x: block(x), graph=True)(block, x)
    return self.down(jnp.tanh(self.up(x)))


model = Encoder(rngs=nnx.Rngs(0))
x = jax.random.normal(jax.random.key(1), (2, 4, 6))
assert len(jax.tree.leaves(nnx.state(model, Mask, graph=True))) == 1
params = nnx.state(model, nnx.Param, graph=True)
assert len(jax.tree.leaves(params)) == 3 * 2 + 2, 'the shared Linear is stored once'
grads = nnx.jit(nnx.grad(lambda m: m(x).sum(), graph=True), graph=True)(model)
