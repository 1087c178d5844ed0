"""Property: any tied model equals its hand-shared twin.

Hypothesis draws a model: groups of call sites, each group and each site
wrapped in a random lifted transform (``nn.remat``, ``nn.partitioning.remat``,
``nn.jit``, ``nn.fold_rngs`` where this Flax has it, or none) and each site
possibly a stack (``nn.scan`` / ``nn.vmap`` over a few steps, splitting the
``params`` and ``dropout`` rngs), and each site assigned to one of a few
"instances". Every site calls its own ``leaf``: a module with a ``params``
kernel, a ``graph`` mask drawn from ``make_rng('params')`` and an
order-sensitive ``state`` write (skipped in stacks, where upstream Flax cannot
write a broadcast variable). Each instance is tied at the root (so ties cross
transform boundaries in every direction) in one of three ways:

* ``module``: a module-level tie of each site's ``leaf`` to the first site's,
  in ``params``, ``graph`` and ``state``. The reference creates one ``Leaf``
  per instance at the root and passes it into every site that uses it, as a
  Flax user shares a module by hand;
* ``kernel``: a variable-level tie of only ``leaf/dense/kernel`` to the first
  site's. The reference is the untied model whose target kernels are the
  source kernel: one variable at two paths;
* ``rooted``: a module-level tie of every site's ``leaf`` to ``shared_k``, a
  ``Leaf`` with active dropout called at the root first; the reference passes
  that module into the sites (into a stack with its variables broadcast, as
  upstream Flax accepts it there). Dropout rngs depend on the module's path,
  so only here do both models draw the same masks. Stack sites always use a
  fourth, rooted instance: a shared module first used inside ``nn.vmap``
  would be batched.

A site may also call its leaf twice in the body of an ``nn.cond`` or
``nn.switch`` (the reference passes the shared leaf itself, as upstream Flax
accepts a module argument there). With ``attribute`` drawn, the tied model's
groups make each plain site's leaf themselves (``group_g/leaf_i``) and pass
it to the site as a constructor attribute, and the ties name those paths.

With the same variable values and the same dropout rngs, both must agree in
outputs, in the updated ``state`` collection (order-sensitive writes) and in
gradients (with respect to the tied model's params, so a source's gradient is
the sum over its uses), called as drawn: ``apply``, ``apply(method=...)`` of
one group, or ``bind`` then a direct call of that group (the groups are built
in ``setup``). The tied model must store each source once, initialize the
same variables when its sites run in the reverse order, and, without dropout
and writes, return from ``init_with_output`` what ``apply`` returns, in
reverse order too (where a target that runs first computed with values its
source does not store, init computes its output again; see docs/design.md).

``TIE_PROPERTY_EXAMPLES`` sets the number of examples (8; the newest
release's ``nox -s matrix`` session draws 20).
"""

import functools
import os

import flax.linen as nn
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_wraps
from tie_models import assert_trees

import flax_tieext  # noqa: F401

# nn.tie is a Flax name: it exists once flax_tieext is installed into Flax.
pytestmark = [pytest.mark.needs_patch, pytest.mark.end_to_end]

D = 3
N = 2  # steps of a stack
EXAMPLES = int(os.environ.get('TIE_PROPERTY_EXAMPLES', '8'))
COLLECTIONS = ('params', 'graph', 'state')

# map_variables is covered by test_tie_lifting.py: here the reference
# cannot use it, because upstream Flax raises ScopeCollectionNotFound for a
# module shared as an attribute into nn.map_variables while a collection is
# mutable (with or without flax_tieext).
WRAPS = dict(tie_wraps.WRAPS)
if hasattr(nn, 'fold_rngs'):  # Flax >= 0.10
  WRAPS['fold_rngs'] = nn.fold_rngs
# A stack's sites run in a loop: a shared module's variables are broadcast
# into it (read-only), its params and dropout rngs split per step.
SPLIT = {'params': True, 'dropout': True}
STACKS = {
    'scan': lambda cls: nn.scan(cls, variable_broadcast=list(COLLECTIONS),
                                split_rngs=SPLIT, length=N),
    'vmap': lambda cls: nn.vmap(cls, in_axes=(None, 0), out_axes=(None, 0),
                                variable_axes=dict.fromkeys(COLLECTIONS),
                                split_rngs=SPLIT),
}


class Leaf(nn.Module):
  dropout: bool = False

  @nn.compact
  def __call__(self, x, write=True):
    mask = self.variable('graph', 'mask', lambda: jax.random.uniform(
        self.make_rng('params'), (D,), minval=0.5, maxval=1.5))
    h = nn.Dense(D, name='dense')(x * mask.value)
    if self.dropout:
      h = nn.Dropout(0.5, deterministic=False)(h)
    count = self.variable('state', 'count', jnp.zeros, ())
    # A broadcast variable cannot be written in a stack (upstream Flax).
    if write and not self.is_initializing():
      count.value = count.value * 0.5 + jnp.mean(x)  # order-sensitive
    return jnp.tanh(h) + count.value


class Site(nn.Module):
  """Calls its own ``leaf`` (tied model) or a shared instance (reference)."""

  shared: nn.Module | None = None
  dropout: bool = False
  pure: bool = False  # no writes

  @nn.compact
  def __call__(self, x, write=True):
    leaf = self.shared if self.shared is not None else Leaf(
        self.dropout, name='leaf')
    return leaf(x, write and not self.pure)


class Step(Site):
  """A site as one step of a stack: ``(carry, x) -> (carry, site(x))``."""

  def __call__(self, carry, x):  # pylint: disable=arguments-differ
    return carry, super().__call__(x, write=False)


class Branch(nn.Module):
  """Calls its leaf twice in the body of an ``nn.cond`` or ``nn.switch``."""

  kind: str
  shared: nn.Module | None = None
  dropout: bool = False
  write: bool = True

  @nn.compact
  def __call__(self, x):
    leaf = self.shared if self.shared is not None else Leaf(
        self.dropout, name='leaf')
    body = lambda m, h: m(m(h, self.write), self.write)
    if self.kind == 'cond':
      return nn.cond(True, body, body, leaf, x)
    return nn.switch(1, [body, body], leaf, x)


BRANCHES = ('cond', 'switch')


def call_site(wrap, shared, dropout, name, x, write=True):
  if wrap in STACKS:
    site = STACKS[wrap](Step)(shared, dropout, name=name)
    _, ys = site(None, jnp.broadcast_to(x, (N, *x.shape)))
    return jnp.mean(ys, axis=0)
  if wrap in BRANCHES:
    return Branch(wrap, shared, dropout, write, name=name)(x)
  return WRAPS[wrap](Site)(shared, dropout, not write, name=name)(x)


class Group(nn.Module):
  sites: tuple  # ((site_wrap, instance), ...)
  levels: tuple  # per instance: 'module', 'kernel' or 'rooted'
  shared: tuple = ()  # per instance: a shared Leaf or None
  reverse: bool = False
  pure: bool = False  # no dropout, no writes
  attribute: bool = False  # a site's own leaf is made here, passed to it

  @nn.compact
  def __call__(self, x):
    order = range(len(self.sites))
    for i in reversed(order) if self.reverse else order:
      wrap, instance = self.sites[i]
      shared = self.shared[instance] if self.shared else None
      dropout = self.levels[instance] == 'rooted' and not self.pure
      if shared is None and self.attribute and passes_leaf(wrap):
        shared = Leaf(dropout, name=f'leaf_{i}')
      x = call_site(wrap, shared, dropout, f'site_{i}', x, not self.pure)
    return x


def passes_leaf(wrap):
  """Whether a site of this wrap gets its leaf as an attribute, if drawn."""
  return wrap not in STACKS and wrap not in BRANCHES


def leaf_path(g, i, wrap, attribute):
  if attribute and passes_leaf(wrap):
    return f'group_{g}/leaf_{i}'
  return f'group_{g}/site_{i}/leaf'


def build(layout, levels, reference, reverse=False, pure=False,
          attribute=False):
  """The tied model, or (``reference``) its hand-shared twin.

  Its groups (and the shared leaves) are built in ``setup``, so that a
  group can be called directly. With ``attribute``, the tied model's groups
  make each site's leaf and pass it to the site as an attribute.
  """
  n_instances = len(levels)

  class Model(nn.Module):

    def setup(self):
      self.roots = [Leaf(not pure, name=f'shared_{k}')
                    for k in range(n_instances) if levels[k] == 'rooted']
      rooted = dict(zip((k for k in range(n_instances)
                         if levels[k] == 'rooted'), self.roots))
      shared = tuple(
          rooted.get(k) or (Leaf(name=f'shared_{k}')
                            if levels[k] == 'module' else None)
          for k in range(n_instances)) if reference else ()
      self.groups = [
          WRAPS[group_wrap](Group)(tuple(sites), tuple(levels), shared,
                                   reverse, pure, attribute and not reference,
                                   name=f'group_{g}')
          for g, (group_wrap, sites) in enumerate(layout)]

    def __call__(self, x):
      for root in self.roots:  # called first, outside every transform
        x = root(x, not pure)
      groups = reversed(self.groups) if reverse else self.groups
      for group in groups:
        x = group(x)
      return x

  if reference:
    return Model
  module_ties, kernel_ties = ties_of(layout, levels, attribute)
  if module_ties:
    Model = nn.tie(Model, module_ties, collections=list(COLLECTIONS))
  if kernel_ties:
    Model = nn.tie(Model, kernel_ties, collections='params')
  return Model


def site_paths(layout, levels, attribute=False):
  """Maps each instance to its source's path, then its sites' leaf paths."""
  paths = {k: [f'shared_{k}'] for k, level in enumerate(levels)
           if level == 'rooted'}
  for g, (_, sites) in enumerate(layout):
    for i, (wrap, inst) in enumerate(sites):
      paths.setdefault(inst, []).append(leaf_path(g, i, wrap, attribute))
  return paths


def source_sites(layout):
  """(site wrap, instance) of the first site of each instance."""
  first = {}
  for _, sites in layout:
    for wrap, inst in sites:
      first.setdefault(inst, (wrap, inst))
  return first.values()


KERNEL = 'dense/kernel'


def ties_of(layout, levels, attribute=False):
  """(module-level ties, variable-level ties): target -> source."""
  module_ties, kernel_ties = {}, {}
  for inst, paths in site_paths(layout, levels, attribute).items():
    for target in paths[1:]:
      if levels[inst] != 'kernel':
        module_ties[target] = paths[0]
      else:
        kernel_ties[f'{target}/{KERNEL}'] = f'{paths[0]}/{KERNEL}'
  return module_ties, kernel_ties


def get(tree, path):
  for name in path.split('/'):
    tree = tree[name]
  return tree


def find(tree, path):
  """The node at ``path``, or None."""
  for name in path.split('/'):
    if not isinstance(tree, dict) or name not in tree:
      return None
    tree = tree[name]
  return tree


def to_reference(tree, layout, levels, col, attribute=False):
  """Tied layout -> reference layout (differentiable in the leaves).

  A module-level source moves to ``shared_k``; a variable-level target gets
  the source's kernel; a leaf passed as an attribute moves into its site.
  """
  out = {}
  all_paths = site_paths(layout, levels, attribute)
  module_paths = {inst: paths for inst, paths in all_paths.items()
                  if levels[inst] != 'kernel'}
  for g, (_, sites) in enumerate(layout):
    group = {}
    for i, (wrap, inst) in enumerate(sites):
      site = dict(tree.get(f'group_{g}', {}).get(f'site_{i}', {}))
      leaf = leaf_path(g, i, wrap, attribute)
      if leaf != f'group_{g}/site_{i}/leaf' and find(tree, leaf) is not None:
        site['leaf'] = find(tree, leaf)
      if inst in module_paths:
        site.pop('leaf', None)
      elif col == 'params':
        paths = all_paths[inst]
        if leaf != paths[0]:
          source = get(tree, f'{paths[0]}/{KERNEL}')
          site['leaf'] = {**site['leaf'],
                          'dense': {**site['leaf']['dense'], 'kernel': source}}
      if site:
        group[f'site_{i}'] = site
    if group:
      out[f'group_{g}'] = group
  for inst, paths in module_paths.items():
    source = find(tree, paths[0])
    if source is not None:
      out[f'shared_{inst}'] = source
  return out


wrap_names = sorted(WRAPS)
sites_strategy = st.lists(
    st.tuples(st.sampled_from(wrap_names + sorted(STACKS) + list(BRANCHES)),
              st.integers(0, 2)),
    min_size=1, max_size=3)
layout_strategy = st.lists(
    st.tuples(st.sampled_from(wrap_names), sites_strategy),
    min_size=1, max_size=2)
levels_strategy = st.lists(st.sampled_from(['module', 'kernel', 'rooted']),
                           min_size=3, max_size=3)

close = functools.partial(np.testing.assert_allclose, rtol=2e-5, atol=1e-6)


@settings(max_examples=EXAMPLES, deadline=None)
@given(layout=layout_strategy, levels=levels_strategy,
       call=st.sampled_from(['apply', 'method', 'bind']),
       group=st.integers(0, 1), attribute=st.booleans())
def test_tied_model_equals_hand_shared_reference(layout, levels, call, group,
                                                 attribute):
  # Stack sites use a fourth instance, tied to a source outside every stack
  # (a shared module first used inside nn.vmap would be batched).
  layout = [(w, [(s, 3 if s in STACKS else inst) for s, inst in sites])
            for w, sites in layout]
  levels = (*levels, 'rooted')
  tied = build(layout, levels, False, attribute=attribute)()
  ref = build(layout, levels, True)()
  x = jax.random.normal(jax.random.key(1), (2, D))
  variables = tied.init(jax.random.key(0), x)

  # Stored once: no module-level target appears in any collection, no
  # variable-level target kernel in params.
  module_ties, kernel_ties = ties_of(layout, levels, attribute)
  for target in module_ties:
    for col in variables:
      assert not find(variables[col], target), f'{target} stored in {col}'
  for target in kernel_ties:
    assert find(variables['params'], target) is None, f'{target} stored'

  # Init order: the sites run in reverse, the same variables are stored.
  reverse = build(layout, levels, False, reverse=True, attribute=attribute)()
  assert_trees(np.testing.assert_array_equal,
               reverse.init(jax.random.key(0), x), variables)

  # init_with_output returns what apply of its variables returns, in both
  # orders: a target that runs first computes with a copy, and where the copy
  # is not its source's values (a single variable, a source under nn.jit /
  # nn.fold_rngs or in a branch) init computes its output again from the
  # variables it stores (docs/design.md, "Init").
  for order in [False, True]:
    pure = build(layout, levels, False, reverse=order, pure=True,
                 attribute=attribute)()
    y, pure_variables = pure.init_with_output(jax.random.key(0), x)
    close(y, pure.apply(pure_variables, x))

  state = jax.tree_util.tree_map(lambda a: a + 1.0, variables['state'])
  rngs = {'dropout': jax.random.key(2)}
  group = min(group, len(layout) - 1)

  def run(model, variables):
    """The model called as drawn: (output, updated state)."""
    if call == 'bind':
      bound = model.bind(variables, rngs=rngs, mutable=['state'])
      return bound.groups[group](x), bound.variables['state']
    method = (lambda m, x: m.groups[group](x)) if call == 'method' else None
    y, updates = model.apply(variables, x, rngs=rngs, mutable=['state'],
                             method=method)
    return y, updates['state']

  def loss(model, params, state, convert=lambda tree, col: tree):
    y, new_state = run(model, {'params': convert(params, 'params'),
                               'graph': convert(variables['graph'], 'graph'),
                               'state': convert(state, 'state')})
    return jnp.sum(y ** 2), new_state

  convert = functools.partial(to_reference, layout=layout, levels=levels,
                              attribute=attribute)
  (l, new_state), g = jax.value_and_grad(
      functools.partial(loss, tied), has_aux=True)(variables['params'], state)
  (rl, ref_new_state), rg = jax.value_and_grad(
      functools.partial(loss, ref, convert=lambda t, c: convert(t, col=c)),
      has_aux=True)(variables['params'], state)
  close(l, rl)
  assert_trees(close, convert(new_state, col='state'), ref_new_state)
  assert_trees(close, g, rg)
