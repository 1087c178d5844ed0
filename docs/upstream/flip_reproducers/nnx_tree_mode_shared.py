"""NNX tree mode (FLIP 5310, `graph=False`) refuses a variable at two places.

Two layers share one kernel, the way NNX shares: the same `nnx.Param` object
assigned at both places. Graph mode stores it once and sums its gradient over
both uses. Tree mode treats a module as a pytree, and a pytree cannot alias.

Plain Flax 0.12.12: `nnx.grad(..., graph=False)` raises
`ValueError: Duplicate ...` (the shared Param found at two paths).
With `flax_tieext.nnx.tie` (the flax-tieext plugin; not part of this FLIP):
tree mode holds the kernel once and gives graph mode's loss and gradients,
also under `nnx.remat(graph=False)`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

try:
  import flax_tieext.nnx
except ImportError:
  flax_tieext = None


class TwoLayers(nnx.Module):

  def __init__(self, *, rngs):
    self.layer_0 = nnx.Linear(4, 4, rngs=rngs)
    self.layer_1 = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, x):
    forward = nnx.remat(lambda layer, x: jnp.tanh(layer(x)), graph=False)
    return forward(self.layer_1, forward(self.layer_0, x))


x = jax.random.normal(jax.random.key(1), (2, 4))
loss = lambda model: jnp.mean(model(x) ** 2)

shared = TwoLayers(rngs=nnx.Rngs(0))  # graph mode's sharing: the reference
shared.layer_1.kernel = shared.layer_0.kernel
reference = nnx.grad(loss, graph=True)(shared)

if flax_tieext is not None:
  model = flax_tieext.nnx.tie(TwoLayers, {'layer_1.kernel': 'layer_0.kernel'})(
      rngs=nnx.Rngs(0))
else:
  model = TwoLayers(rngs=nnx.Rngs(0))
  model.layer_1.kernel = model.layer_0.kernel
grads = nnx.grad(loss, graph=False)(model)  # plain Flax: ValueError: Duplicate ...
kernels = nnx.to_pure_dict(nnx.state(model, nnx.Param, graph=False))
assert 'kernel' not in kernels['layer_1'], 'stored once'
assert jnp.allclose(loss(model), loss(shared))
assert jnp.allclose(grads.layer_0.kernel[...], reference['layer_0']['kernel'][...])
