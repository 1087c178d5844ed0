"""Ties of mutable collections: every write lands in the one variable, in order.

References are one module instance called at several places (Flax's own
sharing). A snapshot-based tie (``map_variables``) would lose or double-apply
one of the writes; these tests use order-sensitive updates to catch that.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_wraps

import flax_tieext  # noqa: F401

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
pytestmark = pytest.mark.needs_patch

WRAPS = {**tie_wraps.WRAPS, **tie_wraps.MAP_VARIABLES}


class Counter(nn.Module):
  """count <- 2 * count + 1: the result depends on the order of the writes."""

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = count.value * 2 + 1
    return x * 3 + count.value


def counter_model(wrap, shared):
  counter_cls = WRAPS[wrap](Counter)

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      a = counter_cls(name='a')
      b = a if shared else counter_cls(name='b')
      c = a if shared else Counter(name='c')  # one use outside the transform
      return c(b(a(x)))

  if shared:
    return Model
  return nn.tie(Model, {'b': 'a', 'c': 'a'}, collections='state')


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_sequential_writes_land_in_program_order(wrap):
  x = jnp.ones(())
  tied, ref = counter_model(wrap, False)(), counter_model(wrap, True)()
  variables = tied.init(jax.random.key(0), x)
  assert list(variables['state']) == ['a']
  start = {'state': {'a': {'count': jnp.array(1.0)}}}
  y, updates = tied.apply(start, x, mutable=['state'])
  ref_y, ref_updates = ref.apply(start, x, mutable=['state'])
  np.testing.assert_allclose(y, ref_y)
  assert list(updates['state']) == ['a']
  np.testing.assert_allclose(updates['state']['a']['count'],
                             ref_updates['state']['a']['count'])
  # 1 -> 3 -> 7 -> 15: three writes, none lost, none applied twice.
  np.testing.assert_allclose(updates['state']['a']['count'], 15.0)


class BNBlock(nn.Module):
  train: bool
  bn: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    train = self.train
    bn = self.bn if self.bn is not None else nn.BatchNorm(
        momentum=0.5, name='bn')
    x = nn.Dense(3, name='dense')(x)
    return bn(x, use_running_average=not train)


def bn_model(wrap, shared):
  block_cls = WRAPS[wrap](BNBlock)

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x, train=True):
      bn = nn.BatchNorm(momentum=0.5, name='bn') if shared else None
      for i in range(3):
        x = block_cls(train, bn=bn, name=f'block_{i}')(x)
      return x

  if shared:
    return Model
  ties = {f'block_{i}/bn': 'block_0/bn' for i in (1, 2)}
  return nn.tie(Model, ties, collections=['params', 'batch_stats'])


def to_shared_layout(variables):
  out = {}
  for col, tree in variables.items():
    out[col] = {k: {kk: vv for kk, vv in v.items() if kk != 'bn'}
                for k, v in tree.items()}
    out[col] = {k: v for k, v in out[col].items() if v}
    if 'bn' in tree.get('block_0', {}):
      out[col]['bn'] = tree['block_0']['bn']
  return out


# The quick run keeps none and remat; the others run with --end-to-end and in CI.
@pytest.mark.parametrize('wrap', ['none', 'remat', *(
    pytest.param(w, marks=pytest.mark.end_to_end)
    for w in ('partitioning.remat', 'jit'))])
def test_shared_batchnorm_matches_one_module_called_three_times(wrap):
  x = jax.random.normal(jax.random.key(1), (4, 3))
  tied, ref = bn_model(wrap, False)(), bn_model(wrap, True)()
  variables = tied.init(jax.random.key(0), x)
  assert set(variables['batch_stats']) == {'block_0'}
  ref_variables = to_shared_layout(variables)

  def loss(model, params, stats):
    y, updates = model.apply({'params': params, 'batch_stats': stats}, x,
                             mutable=['batch_stats'])
    return jnp.sum(y ** 2), updates['batch_stats']

  (l, stats), g = jax.value_and_grad(
      functools.partial(loss, tied), has_aux=True)(
          variables['params'], variables['batch_stats'])
  (rl, ref_stats), rg = jax.value_and_grad(
      functools.partial(loss, ref), has_aux=True)(
          ref_variables['params'], ref_variables['batch_stats'])
  np.testing.assert_allclose(l, rl, rtol=1e-5)
  close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
  jax.tree_util.tree_map(close, to_shared_layout({'p': g})['p'], rg)
  jax.tree_util.tree_map(
      close, to_shared_layout({'s': stats})['s'], ref_stats)
  # The running statistics moved three times from their initial value.
  assert not np.allclose(stats['block_0']['bn']['mean'],
                         variables['batch_stats']['block_0']['bn']['mean'])
