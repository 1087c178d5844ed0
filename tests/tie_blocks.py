"""Shared fixtures of the tie tests: blocks, pairs and a language model, D wide.

Each model that a reference shares by hand takes the one module to share as an
attribute (``shared``) or a flag that makes two places one instance, so a test
builds the tied model and Flax's own sharing from one class. ``WRAPS`` names
the transform a class is wrapped in (``tie_wraps``).
"""

import flax.core.scope
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import tie_wraps
from tie_models import assert_trees_close, assert_trees_equal

D = 4
X = jax.random.normal(jax.random.key(1), (2, D))

WRAPS = tie_wraps.WRAPS


class Attn(nn.Module):

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='proj')(x))


# ---------------------------------------------------------------------------
# Two blocks with a self-attention each, called in a given order.
# ---------------------------------------------------------------------------


class SelfAttention(nn.Module):

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='q')(x))


class Block(nn.Module):
  """A block; ``shared`` is the hand-made reference's one attention module."""

  shared: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    attn = self.shared if self.shared is not None else SelfAttention(
        name='SelfAttention')
    return x + nn.Dense(D, name='ff')(attn(x))


def encoder(block_cls, order=(0, 1), shared=False):
  """Two blocks called in ``order``; ``shared`` passes one module to both."""

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      attn = SelfAttention(name='SelfAttention') if shared else None
      blocks = [block_cls(shared=attn, name=f'block_{i}') for i in range(2)]
      for i in order:
        x = blocks[i](x)
      return x

  return Encoder


def to_shared_layout(params):
  """The tied encoder's params in the shared-module encoder's layout."""
  out = {name: {'ff': p['ff']} for name, p in params.items()}
  out['SelfAttention'] = params['block_0']['SelfAttention']
  return out


# ---------------------------------------------------------------------------
# Two Dense layers ``a`` and ``b``.
# ---------------------------------------------------------------------------


class Pair(nn.Module):
  """Two Dense layers built in setup; ``shared`` makes them one instance."""

  wrap: str = 'none'
  shared: bool = False

  def setup(self):
    dense = WRAPS[self.wrap](nn.Dense)
    self.a = dense(D)
    self.b = self.a if self.shared else dense(D)

  def __call__(self, x):
    return self.b(jnp.tanh(self.a(x)))


class TwoWays(nn.Module):
  """The target runs before or after its source."""

  target_first: bool = False
  wrap: str = 'none'

  @nn.compact
  def __call__(self, x):
    dense = WRAPS[self.wrap](nn.Dense)
    a, b = dense(D, name='a'), dense(D, name='b')
    if self.target_first:
      return a(jnp.tanh(b(x)))
    return b(jnp.tanh(a(x)))


class SeesKernel(nn.Module):
  @nn.compact
  def __call__(self, x):
    a, b = nn.Dense(D, name='a'), nn.Dense(D, name='b')
    y = b(a(x))
    return y, jax.tree_util.tree_map(jnp.shape, b.variables)


# ---------------------------------------------------------------------------
# A language model whose head may be tied to the transposed embedding.
# ---------------------------------------------------------------------------

VOCAB = 11


class LM(nn.Module):
  attend: bool = False
  remat_head: bool = False

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, D, name='embed')
    x = jnp.tanh(embed(tokens))
    x = nn.Dense(D, name='mid')(x)
    if self.attend:
      return embed.attend(x)
    head_cls = nn.remat(nn.Dense) if self.remat_head else nn.Dense
    return head_cls(VOCAB, use_bias=False, name='head')(x)


HEAD_TIE = {'head/kernel': ('embed/embedding', jnp.transpose)}


# ---------------------------------------------------------------------------
# Random streams: a module that draws a dropout mask at init and at apply.
# ---------------------------------------------------------------------------

RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
# The Linen transforms that lift a module's streams without its path, on
# this Flax (nn.fold_rngs from Flax 0.10).
RNG_LIFTING_WRAPS = ['jit', *(['fold_rngs'] if hasattr(nn, 'fold_rngs') else [])]
# Whether nn.jit lifts streams without their path here (Flax 0.9 on).
LIFTS_RNGS_WITHOUT_PATH = any(hasattr(flax.core.scope.LazyRng, m)
                              for m in ('clear_suffix', 'fold'))


class Dropped(nn.Module):
  """A Dense, then dropout at init and apply (``deterministic=False``)."""

  @nn.compact
  def __call__(self, x):
    return nn.Dropout(0.5, deterministic=False)(nn.Dense(D, name='dense')(x))


class DropBlock(nn.Module):
  """A block around a ``Dropped``: its own ``use``, the reference's ``shared``
  one passed in, or (``inner``) its own, tied inside it to ``/src``."""

  shared: nn.Module | None = None
  inner: bool = False

  @nn.compact
  def __call__(self, x):
    use = self.shared
    if use is None:
      cls = nn.tie(Dropped, {'.': '/src'}) if self.inner else Dropped
      use = cls(name='use')
    return x + use(x)


def assert_draws_as_one_shared_instance(tied, reference, *args):
  """``tied`` draws every mask ``reference`` (one shared instance) draws.

  At init (its output and variables) and at apply with every rng given
  (``init_with_output``'s output again) and with another dropout key. The
  reference's outputs must differ pairwise: each call draws its own mask.
  """
  y, variables = tied.init_with_output(RNGS, *args)
  want, expected = reference.init_with_output(RNGS, *args)
  assert_trees_equal(variables, expected)
  assert_trees_close(y, want)
  assert_trees_close(tied.apply(variables, *args, rngs=RNGS), y)
  rngs = {'dropout': jax.random.key(2)}
  want = reference.apply(variables, *args, rngs=rngs)
  assert_trees_close(tied.apply(variables, *args, rngs=rngs), want)
  masks = [np.asarray(w) for w in jax.tree_util.tree_leaves(want)]
  assert not any(np.allclose(a, b) for i, a in enumerate(masks)
                 for b in masks[i + 1:]), 'the reference draws no fresh masks'
