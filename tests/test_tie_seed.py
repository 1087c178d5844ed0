"""The seed scenario of issue 3, end to end.

A T5-style encoder shares one attention mask (collection ``graph``) between
all its blocks. The blocks are rematted (``nn.partitioning.remat`` as HF
transformers does it, or ``nn.remat``). The reference is the same encoder
without the tie, with the mask copied into every block: outputs must be equal,
the gradient of the one stored mask must be the sum of the per-block
gradients, and parameter gradients must be equal -- eagerly and under jit.
"""

import functools

import flax.linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext  # noqa: F401  (installs nn.tie)

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
# end_to_end: the seed scenario end to end, under every remat and jit; the README's test run leaves it to --end-to-end.
pytestmark = [pytest.mark.needs_patch, pytest.mark.end_to_end]

N_BLOCKS = 3
D = 8
SEQ = 5
MASK_PATH = ('layer', '0', 'SelfAttention')


class SelfAttention(nn.Module):
  d: int

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, (x.shape[-2], x.shape[-2]))
    q = nn.Dense(self.d, name='q')(x)
    k = nn.Dense(self.d, name='k')(x)
    v = nn.Dense(self.d, name='v')(x)
    logits = jnp.einsum('...qd,...kd->...qk', q, k) * mask.value
    return x + jnp.einsum('...qk,...kd->...qd', jax.nn.softmax(logits), v)


class Layer(nn.Module):
  """``layer/0`` of a T5 block: holds the self-attention."""

  d: int

  @nn.compact
  def __call__(self, x):
    return SelfAttention(self.d, name='SelfAttention')(x)


class LayerList(nn.Module):
  d: int

  @nn.compact
  def __call__(self, x):
    return Layer(self.d, name='0')(x)


class Block(nn.Module):
  """A T5 block; ``deterministic`` is passed positionally, as HF does."""

  d: int

  @nn.compact
  def __call__(self, x, deterministic=True):
    x = LayerList(self.d, name='layer')(x)
    x = x + nn.Dense(self.d, name='ff')(x)
    return nn.Dropout(0.1, deterministic=deterministic)(x)


REMATS = {
    'none': lambda cls: cls,
    # HF transformers: counts static_argnums without self.
    'partitioning.remat': lambda cls: nn_partitioning.remat(
        cls, static_argnums=(1,)),
    # recurrentgemma style: counts static_argnums with self.
    'nn.remat': lambda cls: nn.remat(cls, static_argnums=(2,)),
}


def make_encoder(remat):
  block_cls = REMATS[remat](Block)

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x, deterministic=True):
      for i in range(N_BLOCKS):
        x = block_cls(D, name=f'block_{i}')(x, deterministic)
      return x

  return Encoder


def tie_all_to_block_0():
  return {
      f'block_{i}/' + '/'.join(MASK_PATH): 'block_0/' + '/'.join(MASK_PATH)
      for i in range(1, N_BLOCKS)
  }


def mask_tree(mask, blocks):
  node = {'mask': mask}
  for name in reversed(MASK_PATH):
    node = {name: node}
  return {f'block_{i}': node for i in blocks}


def setup_case(remat):
  tied_cls = nn.tie(make_encoder(remat), tie_all_to_block_0(),
                    collections='graph')
  untied_cls = make_encoder(remat)
  x = jax.random.normal(jax.random.key(1), (2, SEQ, D))
  variables = tied_cls().init(jax.random.key(0), x)
  mask = jax.random.uniform(jax.random.key(2), (SEQ, SEQ))
  tied_vars = {'params': variables['params'], 'graph': mask_tree(mask, [0])}
  untied_vars = {'params': variables['params'],
                 'graph': mask_tree(mask, range(N_BLOCKS))}
  return tied_cls, untied_cls, x, tied_vars, untied_vars


def losses(tied_cls, untied_cls, x):
  tied_loss = lambda v: jnp.sum(tied_cls().apply(v, x) ** 2)
  untied_loss = lambda v: jnp.sum(untied_cls().apply(v, x) ** 2)
  return tied_loss, untied_loss


def get_mask(tree, i):
  node = tree['graph'][f'block_{i}']
  for name in MASK_PATH:
    node = node[name]
  return node['mask']


@pytest.mark.parametrize('remat', sorted(REMATS))
def test_mask_is_stored_once(remat):
  tied_cls, _, x, _, _ = setup_case(remat)
  variables = tied_cls().init(jax.random.key(0), x)
  assert list(variables['graph']) == ['block_0']
  # Parameters are untouched by a graph tie: every block has its own.
  assert sorted(variables['params']) == [f'block_{i}' for i in range(N_BLOCKS)]


@pytest.mark.parametrize('jit', [False, True], ids=['eager', 'jit'])
@pytest.mark.parametrize('remat', sorted(REMATS))
def test_tied_mask_matches_copied_mask_reference(remat, jit):
  tied_cls, untied_cls, x, tied_vars, untied_vars = setup_case(remat)
  tied_loss, untied_loss = losses(tied_cls, untied_cls, x)
  grad_fn = jax.value_and_grad
  if jit:
    tied_vg, untied_vg = jax.jit(grad_fn(tied_loss)), jax.jit(
        grad_fn(untied_loss))
  else:
    tied_vg, untied_vg = grad_fn(tied_loss), grad_fn(untied_loss)

  loss, grads = tied_vg(tied_vars)
  ref_loss, ref_grads = untied_vg(untied_vars)

  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  jax.tree_util.tree_map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6),
      grads['params'], ref_grads['params'])
  summed = sum(get_mask(ref_grads, i) for i in range(N_BLOCKS))
  np.testing.assert_allclose(get_mask(grads, 0), summed, rtol=1e-5, atol=1e-6)
  assert list(grads['graph']) == ['block_0']


@pytest.mark.parametrize('remat', ['partitioning.remat', 'nn.remat'])
def test_rematerialisation_really_happens(remat):
  tied_cls, untied_cls, x, tied_vars, _ = setup_case(remat)
  tied_loss, _ = losses(tied_cls, untied_cls, x)
  jaxpr = str(jax.make_jaxpr(jax.grad(tied_loss))(tied_vars))
  assert 'checkpoint' in jaxpr or 'remat' in jaxpr


def test_train_mode_with_dropout_matches_reference():
  tied_cls, untied_cls, x, tied_vars, untied_vars = setup_case(
      'partitioning.remat')
  rngs = {'dropout': jax.random.key(3)}
  y = tied_cls().apply(tied_vars, x, False, rngs=rngs)
  ref = untied_cls().apply(untied_vars, x, False, rngs=rngs)
  np.testing.assert_allclose(y, ref, rtol=1e-6)
