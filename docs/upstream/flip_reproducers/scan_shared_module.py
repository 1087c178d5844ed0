"""A module passed into every layer of `nn.scan` is not shared.

Every layer of a scanned stack adds one relative-position bias, as in T5.
Sharing it by hand means creating one bias module at the encoder and passing
it to the stack, as one would outside a transform. `nn.scan` lifts a module
passed in with the layer, and maps its variables along `variable_axes` like
the layer's own:

* ``python scan_shared_module.py inside``: the bias is first used inside the
  scan. Plain Flax 0.12.12 silently initializes one table per layer (shape
  ``(4, 11, 2)``, an `AssertionError` here): nothing is shared.
* ``python scan_shared_module.py outside``: the encoder uses the bias before
  the scan. Plain Flax 0.12.12 raises `ScopeParamShapeError`: the scan slices
  the one table along axis 0.

With `nn.tie` (the flax-tieext plugin, or Flax with this FLIP) each layer keeps
its own `rel_bias` path, tied to the encoder's: the table is stored once, and
loss and gradients are those of the plain-Flax model that computes the bias
outside the scan and passes it in with `nn.broadcast`.
"""

import sys

import jax
import jax.numpy as jnp
import flax.linen as nn

try:
  import flax_tieext  # noqa: F401  installs nn.tie into Flax
except ImportError:
  pass

HEADS, LAYERS, LENGTH, WIDTH = 2, 4, 6, 8


class RelativeBias(nn.Module):

  @nn.compact
  def __call__(self, length):
    table = self.param('table', nn.initializers.normal(0.02), (2 * length - 1, HEADS))
    pos = jnp.arange(length)
    return table[pos[:, None] - pos[None, :] + length - 1].transpose(2, 0, 1)


class Layer(nn.Module):
  shared_bias: nn.Module | None = None  # a module shared by hand, or None

  @nn.compact
  def __call__(self, x, bias):
    if bias is None:  # no bias passed in: the layer computes it
      bias_module = self.shared_bias or RelativeBias(name='rel_bias')
      bias = bias_module(x.shape[-2])
    logits = jnp.einsum('bqd,bkd->bqk', x, x)[:, None] + bias
    y = jnp.einsum('bhqk,bkd->bqd', jax.nn.softmax(logits), x) / HEADS
    return x + nn.Dense(WIDTH, name='ff')(y), None


def stack(*args, **kwargs):
  return nn.scan(Layer, variable_axes={'params': 0}, split_rngs={'params': True},
                 in_axes=nn.broadcast, length=LAYERS)(*args, **kwargs)


class HandShared(nn.Module):
  """One bias module, passed into the stack."""
  use_outside: bool

  @nn.compact
  def __call__(self, x):
    bias = RelativeBias(name='rel_bias')
    if self.use_outside:
      bias(x.shape[-2])
    return stack(bias, name='layers')(x, None)[0]


class Untied(nn.Module):
  """Every layer its own `rel_bias`; the encoder's is the tie's source."""

  @nn.compact
  def __call__(self, x):
    RelativeBias(name='rel_bias')(x.shape[-2])
    return stack(name='layers')(x, None)[0]


class PassedIn(nn.Module):
  """The reference: the bias computed once and passed in with nn.broadcast."""

  @nn.compact
  def __call__(self, x):
    bias = RelativeBias(name='rel_bias')(x.shape[-2])
    return stack(name='layers')(x, bias)[0]


x = jax.random.normal(jax.random.key(1), (2, LENGTH, WIDTH))
if hasattr(nn, 'tie'):
  model = nn.tie(Untied, {'layers/rel_bias': 'rel_bias'})()
else:
  model = HandShared(use_outside=sys.argv[1:] == ['outside'])
params = model.init(jax.random.key(0), x)['params']  # outside: ScopeParamShapeError
table = params['rel_bias']['table'].shape
assert table == (2 * LENGTH - 1, HEADS), f'one table per layer: {table}'
assert sorted(params['layers']) == ['ff'], 'the layers store no bias of their own'

loss = lambda model: lambda params: jnp.mean(model.apply({'params': params}, x) ** 2)
assert jnp.allclose(loss(model)(params), loss(PassedIn())(params))
grads, reference = jax.grad(loss(model))(params), jax.grad(loss(PassedIn()))(params)
assert jax.tree.all(jax.tree.map(jnp.allclose, grads, reference))
