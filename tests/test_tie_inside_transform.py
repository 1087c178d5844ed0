# Copyright 2026 The flax-tieext Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""The original pattern: a tie declared inside the rematted layer, its source a sibling outside.

The user's report: an attention mask in a custom collection (``graph``), made
by the first block and tied in every later one, stops being reachable once
the blocks are rematted. Each block declares its own tie (``nn.tie`` of its
``SelfAttention`` class) with the source ``/block_0/SelfAttention`` outside
its transform. The reference is what Flax offers a user: one
``SelfAttention`` instance passed into every block (remat family, ``cond``,
``map_variables``), or, where Flax cannot lift an outer instance
(``nn.scan``, ``nn.vmap``), the mask passed in as a value. The tied model
must equal it in outputs, stored tree and gradients; a write to the source
is refused. Under ``nn.jit``, which reuses its trace, every apply still reads
the current source, and a later apply traces nothing.
"""

import functools

import flax.linen as nn
import flax.linen.partitioning  # pylint: disable=unused-import
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tie_blocks

import flax_tieext  # pylint: disable=unused-import
from flax_tieext import TieError

pytestmark = pytest.mark.needs_patch

D = 4
X = jax.random.normal(jax.random.key(1), (2, D))
SOURCE = '/block_0/SelfAttention'


class SelfAttention(nn.Module):
  """Reads a mask from ``graph`` (``col='graph'``) or has parameters."""

  col: str = 'graph'

  @nn.compact
  def __call__(self, x, mask=None):
    if self.col == 'graph':
      if mask is None:
        mask = self.variable('graph', 'mask',
                             lambda: jnp.tril(jnp.ones((D, D)))).value
      return x @ (0.5 * mask)
    return jnp.tanh(nn.Dense(D, name='q')(x))


class TiedBlock(nn.Module):
  """The user's block: block 0 owns the attention, the others tie to it."""

  idx: int
  col: str = 'graph'
  source: str = SOURCE

  @nn.compact
  def __call__(self, x):
    attn = SelfAttention if self.idx == 0 else nn.tie(
        SelfAttention, {'.': self.source}, collections=self.col)
    return x + nn.Dense(D, name='ff')(attn(self.col, name='SelfAttention')(x))


class SharedBlock(nn.Module):
  """The reference's block: calls the one attention instance it is given."""

  attn: nn.Module

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(D, name='ff')(self.attn(x))


def nested_remat(cls):
  return nn.remat(nn.remat(cls))


def through_cond(cls):
  """``cls`` called inside ``nn.cond`` (both branches call it)."""

  class Cond(nn.Module):
    args: tuple = ()

    @nn.compact
    def __call__(self, x):
      block = cls(*self.args, name='m')
      return nn.cond(True, lambda m, x: m(x), lambda m, x: m(x), block, x)

  return lambda *args, name: Cond(args, name=name)


def through_map_variables(cls):
  return nn.map_variables(cls, ['params', 'graph'], lambda t: t, lambda t: t,
                          mutable=True)


WRAPS = {  # the wrap, and where block 0's attention sits under it
    'no transform': (lambda cls: cls, SOURCE),
    'nn.remat': (nn.remat, SOURCE),
    'nn.checkpoint': (nn.checkpoint, SOURCE),
    'nn.partitioning.remat': (nn.partitioning.remat, SOURCE),
    'nested nn.remat': (nested_remat, SOURCE),
    'nn.jit': (nn.jit, SOURCE),
    'nn.jit of nn.remat': (lambda cls: nn.jit(nn.remat(cls)), SOURCE),
    'nn.remat of nn.jit': (lambda cls: nn.remat(nn.jit(cls)), SOURCE),
    'nn.cond': (through_cond, '/block_0/m/SelfAttention'),
    'nn.map_variables': (through_map_variables, SOURCE),
}


def encoders(wrap, col, source=SOURCE):
  """(tied, reference) encoders of three blocks, each block wrapped."""

  class Tied(nn.Module):

    @nn.compact
    def __call__(self, x):
      for i in range(3):
        x = wrap(TiedBlock)(i, col, source, name=f'block_{i}')(x)
      return x

  class Reference(nn.Module):

    @nn.compact
    def __call__(self, x):
      attn = SelfAttention(col, name='SelfAttention')
      for i in range(3):
        x = wrap(SharedBlock)(attn, name=f'block_{i}')(x)
      return x

  return Tied(), Reference()


def to_reference(tree):
  """The tied layout in the reference's: the source moves to the root."""
  out = {}
  for col, node in tree.items():
    node = dict(node)
    owner = node['block_0'] = dict(node['block_0'])
    if 'm' in owner:  # nn.cond nests the block under 'm'
      owner['m'] = dict(owner['m'])
      owner = owner['m']
    if 'SelfAttention' in owner:
      node['SelfAttention'] = owner.pop('SelfAttention')
    out[col] = pruned(node)
  return out


def pruned(node):
  """``node`` without the empty dicts that moving the source leaves."""
  if not isinstance(node, dict):
    return node
  node = {k: pruned(v) for k, v in node.items()}
  return {k: v for k, v in node.items() if not isinstance(v, dict) or v}


def perturbed(tree):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  return treedef.unflatten(
      [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def assert_trees_close(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  jax.tree_util.tree_map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6), a, b)


# The quick run keeps no transform, nn.remat and nn.jit; the other wraps
# (nn.checkpoint is nn.remat, nn.partitioning.remat closes over as it does,
# compositions with nn.jit and nn.cond compile the most) run with --end-to-end
# and in CI (with the deeper nestings of tests/test_tie_nesting.py).
LONG_WRAPS = ('nn.checkpoint', 'nn.partitioning.remat', 'nested nn.remat',
              'nn.jit of nn.remat', 'nn.remat of nn.jit', 'nn.cond',
              'nn.map_variables')


@pytest.mark.parametrize('col', ['graph', 'params'])
@pytest.mark.parametrize('wrap', [
    pytest.param(w, marks=pytest.mark.end_to_end if w in LONG_WRAPS else ())
    for w in WRAPS])
def test_tie_inside_the_transform_equals_one_shared_instance(wrap, col):
  tied, reference = encoders(*WRAPS[wrap][:1], col, WRAPS[wrap][1])
  variables = tied.init(jax.random.key(0), X)
  # Stored once: the same tree as the reference's, in the tied layout.
  assert_trees_close(jax.tree_util.tree_map(jnp.shape, to_reference(variables)),
                     jax.tree_util.tree_map(jnp.shape,
                                            reference.init(jax.random.key(0), X)))
  variables = perturbed(variables)  # every use reads the current value
  np.testing.assert_allclose(tied.apply(variables, X),
                             reference.apply(to_reference(variables), X),
                             rtol=1e-6)
  loss = lambda model, v: jnp.sum(model.apply(v, X) ** 2)
  grads = jax.grad(functools.partial(loss, tied))(variables)
  ref_grads = jax.grad(functools.partial(loss, reference))(to_reference(variables))
  assert_trees_close(to_reference(grads), ref_grads)  # summed over all uses
  jitted = jax.jit(jax.grad(functools.partial(loss, tied)))(variables)
  assert_trees_close(to_reference(jitted), ref_grads)


class MaskLayer(nn.Module):
  """A stacked layer: its attention ties to the mask outside, or is given it."""

  tied: bool = True

  @nn.compact
  def __call__(self, x, mask=None):
    attn = nn.tie(SelfAttention, {'.': '/mask_owner'},
                  collections='graph') if self.tied else SelfAttention
    y = x + nn.Dense(D, name='ff')(attn(name='SelfAttention')(x, mask))
    return y, None


def stacked(kind, cls):
  common = dict(variable_axes={'params': 0}, split_rngs={'params': True})
  if kind == 'nn.scan':
    return nn.scan(cls, length=3, in_axes=nn.broadcast, **common)
  if kind == 'nn.scan of nn.remat':
    return nn.scan(nn.remat(cls), length=3, in_axes=nn.broadcast, **common)
  if kind == 'nn.scan of nn.jit':
    return nn.scan(nn.jit(cls), length=3, in_axes=nn.broadcast, **common)
  return nn.vmap(cls, in_axes=(0, None), out_axes=0, **common)


# The quick run keeps nn.scan; the others run with --end-to-end and in CI.
@pytest.mark.parametrize('kind', ['nn.scan', *(
    pytest.param(k, marks=pytest.mark.end_to_end)
    for k in ('nn.scan of nn.remat', 'nn.scan of nn.jit', 'nn.vmap'))])
def test_tie_inside_a_stack_reads_the_mask_outside(kind):
  x = X if kind != 'nn.vmap' else jnp.stack([X[0]] * 3)

  class Tied(nn.Module):

    @nn.compact
    def __call__(self, x):
      SelfAttention(name='mask_owner')(x)
      y, _ = stacked(kind, MaskLayer)(name='layers')(x, None)
      return y

  class Reference(nn.Module):  # the mask passed in as a value

    @nn.compact
    def __call__(self, x):
      owner = SelfAttention(name='mask_owner')
      owner(x)
      mask = owner.variables['graph']['mask']
      y, _ = stacked(kind, functools.partial(MaskLayer, False))(
          name='layers')(x, mask)
      return y

  variables = Tied().init(jax.random.key(0), x)
  assert list(variables['graph']) == ['mask_owner']  # stored once
  variables = perturbed(variables)
  np.testing.assert_allclose(Tied().apply(variables, x),
                             Reference().apply(variables, x), rtol=1e-6)
  loss = lambda model, v: jnp.sum(model.apply(v, x) ** 2)
  assert_trees_close(jax.grad(functools.partial(loss, Tied()))(variables),
                     jax.grad(functools.partial(loss, Reference()))(variables))


class Counted(TiedBlock):
  """``TiedBlock`` that counts its traces (``nn.jit`` runs it only then)."""

  traces = []

  @nn.compact
  def __call__(self, x):
    self.traces.append(self.name)
    return super().__call__(x)


def hoisted_jit_encoders(idx=(0, 1, 1, 1)):
  """(tied, reference): one ``nn.jit`` class for every block, as users hoist it.

  Blocks 1 to 3 are equal (the same fields), so ``nn.jit`` may share a trace
  between them: a trace that read its source as a closed-over value must not
  be reused by a block that did not make it.
  """
  jit_tied, jit_shared = nn.jit(Counted), nn.jit(SharedBlock)

  class Tied(nn.Module):

    @nn.compact
    def __call__(self, x):
      for n, i in enumerate(idx):
        x = jit_tied(i, name=f'block_{n}')(x)
      return x

  class Reference(nn.Module):

    @nn.compact
    def __call__(self, x):
      attn = SelfAttention(name='SelfAttention')
      for n in range(len(idx)):
        x = jit_shared(attn, name=f'block_{n}')(x)
      return x

  return Tied(), Reference()


@pytest.mark.end_to_end  # nn.jit traced and retraced: left to --end-to-end and CI
@pytest.mark.parametrize('init_first', [True, False],
                         ids=['after init', 'apply only'])
def test_tie_inside_nn_jit_reads_the_current_source_and_traces_once(init_first):
  tied, reference = hoisted_jit_encoders()
  other, _ = hoisted_jit_encoders()
  variables = other.init(jax.random.key(0), X)
  if init_first:
    tied.init(jax.random.key(0), X)
  Counted.traces.clear()
  for _ in range(4):  # each apply reads the values it is given, none stale
    variables = perturbed(variables)
    np.testing.assert_allclose(tied.apply(variables, X),
                               reference.apply(to_reference(variables), X),
                               rtol=1e-6)
  warm_up = Counted.traces.copy()
  # After init, the first apply traces each call site at most once; with no
  # init in the process, the first apply meets the ties and the second lifts
  # their sources (each call site at most twice). Later applies trace nothing.
  assert len(warm_up) <= 4 * (1 if init_first else 2), warm_up
  Counted.traces.clear()
  for _ in range(2):
    variables = perturbed(variables)
    np.testing.assert_allclose(tied.apply(variables, X),
                               reference.apply(to_reference(variables), X),
                               rtol=1e-6)
  assert not Counted.traces
  loss = lambda model, v: jnp.sum(model.apply(v, X) ** 2)
  assert_trees_close(
      to_reference(jax.jit(jax.grad(functools.partial(loss, tied)))(variables)),
      jax.grad(functools.partial(loss, reference))(to_reference(variables)))




class DecoratedBlock(nn.Module):
  """The user's block with ``nn.jit`` as a method decorator."""

  idx: int

  @nn.jit
  @nn.compact
  def __call__(self, x):
    attn = SelfAttention if self.idx == 0 else nn.tie(
        SelfAttention, {'.': SOURCE}, collections='graph')
    return x + nn.Dense(D, name='ff')(attn(name='SelfAttention')(x))


class DecoratedEncoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    for i in range(3):
      x = DecoratedBlock(i, name=f'block_{i}')(x)
    return x


@pytest.mark.parametrize('root_tie', [False, True],
                         ids=['alone', 'with a tie in force at the root'])
def test_tie_inside_a_jitted_method_reads_the_current_source(root_tie):
  # With a tie in force at the root, nn.jit packs with ties (and records its
  # outer scopes): the tie declared inside is met there just the same.
  root_ties = {'block_2/ff': 'block_1/ff'} if root_tie else {}
  tied = nn.tie(DecoratedEncoder, root_ties)() if root_tie else (
      DecoratedEncoder())
  variables = tied.init(jax.random.key(0), X)

  def by_hand(v):  # one mask, each block's (or its source's) ff
    y, mask = X, v['graph']['block_0']['SelfAttention']['mask']
    for i in range(3):
      ff = v['params'][root_ties.get(f'block_{i}/ff', f'block_{i}/ff')
                       .split('/')[0]]['ff']
      y = y + (y @ (0.5 * mask)) @ ff['kernel'] + ff['bias']
    return y

  for _ in range(3):
    variables = perturbed(variables)
    np.testing.assert_allclose(tied.apply(variables, X), by_hand(variables),
                               rtol=1e-5, atol=1e-6)


class SharingBlock(nn.Module):
  """A block of one Dense: its own (``dense``: None), or one passed in.

  ``source``, the index of the block that owns the Dense, makes an inner tie
  (declared inside the block) when it is not ``idx``; the root ties leave
  both None, so that every call site has the same fields.
  """

  dense: nn.Module | None = None
  idx: int | None = None
  source: int | None = None

  @nn.compact
  def __call__(self, x):
    dense = self.dense
    if dense is None:
      cls = nn.Dense if self.idx == self.source else nn.tie(
          nn.Dense, {'.': f'/block_{self.source}/dense'})
      dense = cls(D, use_bias=False, name='dense')
    return jnp.tanh(x + dense(x))


# Four call sites (a replay of a replay), and the source first, with
# --end-to-end and in CI.
@pytest.mark.parametrize('n', [3, pytest.param(4, marks=pytest.mark.end_to_end)])
@pytest.mark.parametrize('first', [
    pytest.param('source_first', marks=pytest.mark.end_to_end), 'target_first'])
@pytest.mark.parametrize('kind',
                         ['variable', 'module', 'inner', 'inner_one_trace'])
def test_ties_into_call_sites_of_one_nn_jit_class_share_one_instance(
    kind, first, n):
  """A third tied block of a module-level nn.jit class replayed the second's
  trace, which recorded the tie's use for the second's path only: init
  raised "the target /block_2/dense/kernel ... does not exist" (and a second
  init, replaying every trace, did so for the second block). An inner tie
  whose source runs later is checked when init returns; a replay (a second
  init, or, with ``inner_one_trace``, every target block after the first:
  they have the same fields) made no such check, and stored the copies.

  One nn.jit class for every call site, as users hoist it to module level,
  made anew in each test: a class shared by the tests keeps its traces from
  one test to the next, and had let a case pass in order that failed alone.
  """
  jitted_sharing_block = nn.jit(SharingBlock)  # call sites share traces
  source = 0 if first == 'source_first' else n - 1
  others = [i for i in range(n) if i != source]
  ties = {'variable': {f'block_{i}/dense/kernel': f'block_{source}/dense/kernel'
                       for i in others},
          'module': {f'block_{i}': f'block_{source}' for i in others},
          'inner': {}, 'inner_one_trace': {}}[kind]

  class Tied(nn.Module):

    @nn.compact
    def __call__(self, x):
      for i in range(n):
        idx = i if kind == 'inner' or i == source else None
        block = (jitted_sharing_block(idx=idx, source=source,
                                      name=f'block_{i}')
                 if kind.startswith('inner') else
                 jitted_sharing_block(name=f'block_{i}'))
        x = block(x)
      return x

  class Shared(nn.Module):  # plain Flax: one Dense passed into every block

    @nn.compact
    def __call__(self, x):
      shared = nn.Dense(D, use_bias=False, name='shared')
      for i in range(n):
        x = jitted_sharing_block(shared, name=f'block_{i}')(x)
      return x

  tied, reference = nn.tie(Tied, ties)(), Shared()
  to_reference = lambda v: {'params': {
      'shared': v['params'][f'block_{source}']['dense']}}
  for seed in range(2):  # the second init replays every trace
    y, variables = tied.init_with_output(jax.random.key(seed), X)
    assert jax.tree_util.tree_structure(variables) == (
        jax.tree_util.tree_structure(
            {'params': {f'block_{source}': {'dense': {'kernel': 0}}}}))
    np.testing.assert_allclose(
        y, reference.apply(to_reference(variables), X), rtol=1e-6)
  variables = perturbed(variables)
  np.testing.assert_allclose(tied.apply(variables, X),
                             reference.apply(to_reference(variables), X),
                             rtol=1e-6)
  loss = lambda model, v: jnp.sum(model.apply(v, X) ** 2)
  assert_trees_close(
      to_reference(jax.grad(functools.partial(loss, tied))(variables)),
      jax.grad(functools.partial(loss, reference))(to_reference(variables)))


# ---------------------------------------------------------------------------
# Random streams: a tied use draws what one shared instance draws there.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('declared', ['at_the_root', 'inside'])
def test_one_nn_jit_class_at_several_call_sites_draws_fresh_masks(declared):
  """Every tied block of one nn.jit class replayed the first one's trace,
  whose key held none of the source's rng counters it read: each drew the
  same dropout mask (a separate nn.jit class per block was right)."""
  jitted = nn.jit(tie_blocks.DropBlock)  # one class: the call sites share traces
  n = 3

  class Model(nn.Module):
    shared: bool

    @nn.compact
    def __call__(self, x):
      src = tie_blocks.Dropped(name='src')
      ys = [src(x)]
      for i in range(n):
        ys.append(jitted(src if self.shared else None,
                         inner=not self.shared and declared == 'inside',
                         name=f'block_{i}')(x))
      return ys

  tied = Model(False)
  if declared == 'at_the_root':
    tied = nn.tie(Model, {f'block_{i}/use': 'src' for i in range(n)})(False)
  tie_blocks.assert_draws_as_one_shared_instance(tied, Model(True), X)


@pytest.mark.parametrize('wrap', tie_blocks.RNG_LIFTING_WRAPS)
@pytest.mark.parametrize('declared', ['at_the_root', 'inside'])
def test_a_tie_in_a_jitted_or_folded_block_draws_as_one_shared_instance(
    wrap, declared):
  """Declared inside the block, the tie read its source's streams as they
  are outside: not as nn.jit and nn.fold_rngs lift a module passed in (its
  streams without their path), as a tie declared at the root does."""
  block = getattr(nn, wrap)(tie_blocks.DropBlock)

  class Model(nn.Module):
    shared: bool

    @nn.compact
    def __call__(self, x):
      src = tie_blocks.Dropped(name='src')
      use = block(src if self.shared else None,
                  inner=not self.shared and declared == 'inside', name='block')
      return src(x), use(x), use(x)

  tied = Model(False)
  if declared == 'at_the_root':
    tied = nn.tie(Model, {'block/use': 'src'})(False)
  tie_blocks.assert_draws_as_one_shared_instance(tied, Model(True), X)


class DropLayer(nn.Module):
  """A stacked layer around ``tie_blocks.DropBlock``."""

  shared: nn.Module | None = None
  inner: bool = False

  @nn.compact
  def __call__(self, c, x):
    return c, tie_blocks.DropBlock(self.shared, self.inner, name='block')(x)


@pytest.mark.parametrize('kind', ['scan', 'vmap'])
@pytest.mark.parametrize('declared', ['at_the_root', 'inside'])
def test_a_tie_in_a_stack_splits_dropout_as_one_shared_instance(kind,
                                                                declared):
  """Declared inside the scan or vmap body, the tie read its source's
  unsplit streams: one mask for every layer, where split_rngs gives one
  shared instance passed into the stack a mask per layer."""
  split = {'params': True, 'dropout': True}
  if kind == 'scan':
    stack = nn.scan(DropLayer, variable_broadcast='params', split_rngs=split,
                    length=3)
  else:
    stack = nn.vmap(DropLayer, in_axes=(None, 0), out_axes=(None, 0),
                    variable_axes={'params': None}, split_rngs=split)

  class Model(nn.Module):
    shared: bool

    @nn.compact
    def __call__(self, xs):
      src = tie_blocks.Dropped(name='src')
      y = src(xs[0])
      _, ys = stack(src if self.shared else None,
                    not self.shared and declared == 'inside', name='stack')(
                        None, xs)
      return (y, *ys)

  xs = jnp.broadcast_to(X, (3, *X.shape))  # the same input in every layer
  tied = Model(False)
  if declared == 'at_the_root':
    tied = nn.tie(Model, {'stack/block/use': 'src'})(False)
  tie_blocks.assert_draws_as_one_shared_instance(tied, Model(True), xs)
