"""Ties in collections other than ``params``, against one shared instance.

A tie behaves as one module instance called at two places: ``init_with_output``
returns what ``apply`` of the variables it returned returns, and both are what
plain Flax gives with one shared instance passed to the blocks. Here the
shared module creates a non-``params`` variable at init, drawn from an rng (a
random projection) or computed from its input (ActNorm-style statistics);
later blocks tie their own copy of it to the first block's, declaring the tie
inside themselves, under ``nn.remat``, ``nn.jit`` and
``nn.partitioning.remat``; and a root-declared tie whose target block runs
through ``nn.vjp`` / ``nn.jvp`` (issue 52).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_wraps

import flax_tieext

D = 3
X = jnp.linspace(-1.0, 2.0, 2 * D).reshape(2, D)


class Projection(nn.Module):
  """A random projection drawn at init into ``graph``."""

  @nn.compact
  def __call__(self, x):
    p = self.variable('graph', 'proj', lambda: jax.random.normal(
        self.make_rng('params'), (D, D)))
    return x @ p.value


class ActNorm(nn.Module):
  """Statistics of its first input, kept in ``batch_stats``."""

  @nn.compact
  def __call__(self, x):
    mean = self.variable('batch_stats', 'mean', lambda: jnp.mean(x, 0))
    return x - mean.value


KINDS = {'projection': (Projection, 'graph'), 'actnorm': (ActNorm, 'batch_stats')}


class Block(nn.Module):
  """Block 0 owns the shared module; later ones tie theirs to it."""

  kind: str
  first: bool
  shared: nn.Module | None = None  # the reference's one shared instance

  @nn.compact
  def __call__(self, x):
    cls, col = KINDS[self.kind]
    if self.shared is not None:
      s = self.shared
    elif self.first:
      s = cls(name='shared')
    else:
      s = flax_tieext.linen.tie(cls, {'.': '/block_0/shared'},
                                collections=col)(name='shared')
    return jnp.tanh(nn.Dense(D)(s(x)))


class Model(nn.Module):
  kind: str
  wrap: str
  reference: bool = False

  @nn.compact
  def __call__(self, x):
    cls, _ = KINDS[self.kind]
    shared = cls(name='shared') if self.reference else None
    block = tie_wraps.WRAPS[self.wrap](Block)
    for i in range(3):
      x = block(self.kind, i == 0, shared, name=f'block_{i}')(x)
    return x


def as_reference(variables, col):
  """The tied model's variables as the reference stores them."""
  out = jax.tree_util.tree_map(lambda v: v, dict(variables))
  out = {k: dict(v) for k, v in out.items()}
  shared = dict(out[col]['block_0'])
  out[col] = {'shared': shared.pop('shared')}
  return out


@pytest.mark.needs_patch
# nn.partitioning.remat and nn.jit (the longest to compile) with --end-to-end
# and in CI.
@pytest.mark.parametrize('wrap', [
    pytest.param(w, marks=pytest.mark.end_to_end if w in ('partitioning.remat', 'jit') else ())
    for w in sorted(tie_wraps.WRAPS)])
@pytest.mark.parametrize('kind', sorted(KINDS))
def test_inner_tie_in_another_collection_matches_one_shared_instance(kind, wrap):
  _, col = KINDS[kind]
  y, variables = Model(kind, wrap).init_with_output(jax.random.key(0), X)
  assert set(variables[col]) == {'block_0'}, 'only the source is stored'
  np.testing.assert_allclose(y, Model(kind, wrap).apply(variables, X),
                             rtol=1e-6, atol=1e-6)
  reference = Model(kind, wrap, reference=True)
  ref_y, ref_variables = reference.init_with_output(jax.random.key(0), X)
  np.testing.assert_allclose(ref_y, reference.apply(ref_variables, X),
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
      y, reference.apply(as_reference(variables, col), X), rtol=1e-6,
      atol=1e-6)


class Inner(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x):
    return KINDS[self.kind][0](name='shared')(x)


class Root(nn.Module):
  """Block 1 runs through ``nn.vjp`` or ``nn.jvp``."""

  kind: str
  through: str

  @nn.compact
  def __call__(self, x):
    x = Inner(self.kind, name='block_0')(x)
    block = Inner(self.kind, name='block_1')
    f = lambda mdl, x: mdl(x)
    if self.through == 'vjp':
      y, bwd = nn.vjp(f, block, x)
      return y + bwd(jnp.ones_like(y))[1]
    y, t = nn.jvp(f, block, (x,), (jnp.ones_like(x),), {})
    return y + t


@pytest.mark.needs_patch
@pytest.mark.parametrize('through', ['vjp', 'jvp'])
@pytest.mark.parametrize('kind', sorted(KINDS))
def test_root_tie_through_vjp_jvp_init_output_is_apply(kind, through):
  _, col = KINDS[kind]
  tied = flax_tieext.linen.tie(Root, {'block_1/shared': 'block_0/shared'},
                               collections=col)(kind, through)
  y, variables = tied.init_with_output(jax.random.key(0), X)
  assert set(variables[col]) == {'block_0'}
  np.testing.assert_allclose(y, tied.apply(variables, X), rtol=1e-6, atol=1e-6)
