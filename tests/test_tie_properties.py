"""Property: any tied model equals its module-sharing twin.

Hypothesis draws a model: groups of call sites, each group and each site
wrapped in a random lifted transform, and each site assigned to one of a few
"instances". The tied model gives every site its own ``leaf`` and ties each
site's leaf to the first site of the same instance (declared at the root, so
ties cross transform boundaries in every direction). The reference creates one
``Leaf`` per instance at the root and passes it into every site that uses it,
as a Flax user shares a module by hand. With the same variable values, both
must agree in outputs, in the updated ``state`` collection (order-sensitive
writes) and in gradients.
"""

import functools

import flax.linen as nn
from flax.linen import partitioning as nn_partitioning
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext  # noqa: F401

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
pytestmark = pytest.mark.needs_patch

D = 3

# map_variables is covered by test_tie_transforms.py: here the reference
# cannot use it, because upstream Flax raises ScopeCollectionNotFound for a
# module shared as an attribute into nn.map_variables while a collection is
# mutable (with or without flax_tieext).
WRAPS = {
    'none': lambda cls: cls,
    'remat': nn.remat,
    'partitioning.remat': nn_partitioning.remat,
    'jit': nn.jit,
}


class Leaf(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    if not self.is_initializing():
      count.value = count.value * 0.5 + jnp.mean(x)  # order-sensitive
    return jnp.tanh(nn.Dense(D, name='dense')(x)) + count.value


class Site(nn.Module):
  """Calls its own ``leaf`` (tied model) or a shared instance (reference)."""

  shared: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    leaf = self.shared if self.shared is not None else Leaf(name='leaf')
    return leaf(x)


class Group(nn.Module):
  sites: tuple  # ((site_wrap, instance), ...)
  shared: tuple = ()

  @nn.compact
  def __call__(self, x):
    for i, (wrap, instance) in enumerate(self.sites):
      shared = self.shared[instance] if self.shared else None
      x = WRAPS[wrap](Site)(shared=shared, name=f'site_{i}')(x)
    return x


def build(layout, reference):
  n_instances = 1 + max(inst for _, sites in layout for _, inst in sites)

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      shared = tuple(Leaf(name=f'shared_{k}') for k in range(n_instances)
                     ) if reference else ()
      for g, (group_wrap, sites) in enumerate(layout):
        x = WRAPS[group_wrap](Group)(tuple(sites), shared, name=f'group_{g}')(x)
      return x

  if reference:
    return Model
  return nn.tie(Model, ties_of(layout), collections=['params', 'state'])


def site_paths(layout):
  """Maps each instance to the leaf paths of its sites, in call order."""
  paths = {}
  for g, (_, sites) in enumerate(layout):
    for i, (_, inst) in enumerate(sites):
      paths.setdefault(inst, []).append(f'group_{g}/site_{i}/leaf')
  return paths


def ties_of(layout):
  return {target: paths[0]
          for paths in site_paths(layout).values() for target in paths[1:]}


def get(tree, path):
  for name in path.split('/'):
    tree = tree[name]
  return tree


def to_reference(tree, layout):
  """Tied layout -> reference layout (each source moves to shared_k)."""
  out = {}
  for g, (_, sites) in enumerate(layout):
    if f'group_{g}' in tree:
      group = {k: {kk: vv for kk, vv in v.items() if kk != 'leaf'}
               for k, v in tree[f'group_{g}'].items()}
      group = {k: v for k, v in group.items() if v}
      if group:
        out[f'group_{g}'] = group
  for inst, paths in site_paths(layout).items():
    out[f'shared_{inst}'] = get(tree, paths[0])
  return out


sites_strategy = st.lists(
    st.tuples(st.sampled_from(sorted(WRAPS)), st.integers(0, 2)),
    min_size=1, max_size=3)
layout_strategy = st.lists(
    st.tuples(st.sampled_from(sorted(WRAPS)), sites_strategy),
    min_size=1, max_size=2)

close = functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(layout=layout_strategy)
def test_tied_model_equals_module_sharing_reference(layout):
  layout = [(w, [tuple(s) for s in sites]) for w, sites in layout]
  tied, ref = build(layout, False)(), build(layout, True)()
  x = jax.random.normal(jax.random.key(1), (2, D))
  variables = tied.init(jax.random.key(0), x)

  # Stored once: no target appears in the variables.
  for target in ties_of(layout):
    for col in variables:
      node = variables[col]
      for name in target.split('/'):
        node = node.get(name, {}) if isinstance(node, dict) else {}
      assert not node, f'{target} stored in {col}'

  state = jax.tree_util.tree_map(lambda a: a + 1.0, variables['state'])

  def loss(model, params, state):
    y, updates = model.apply({'params': params, 'state': state}, x,
                             mutable=['state'])
    return jnp.sum(y ** 2), updates['state']

  (l, new_state), g = jax.value_and_grad(
      functools.partial(loss, tied), has_aux=True)(variables['params'], state)
  (rl, ref_new_state), rg = jax.value_and_grad(
      functools.partial(loss, ref), has_aux=True)(
          to_reference(variables['params'], layout),
          to_reference(state, layout))
  close(l, rl)
  jax.tree_util.tree_map(close, to_reference(new_state, layout),
                         ref_new_state)
  jax.tree_util.tree_map(close, to_reference(g, layout), rg)
