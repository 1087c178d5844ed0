"""Params ties under each lifted transform, against Flax's own sharing.

Reference semantics: a tie behaves as one module instance called at two
places. The reference model is written the way a Flax user shares a module by
hand: one ``Attn`` instance created in the encoder and passed into every block
as an attribute. The tied model gives every block its own ``attn`` path and
ties ``block_i/attn`` to ``block_0/attn``. With the same parameter values, both
must compute the same outputs and gradients, under every transform and in
both nesting orders.
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

N = 3
D = 4


class Attn(nn.Module):

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='proj')(x))


class Block(nn.Module):
  shared: nn.Module | None = None

  @nn.compact
  def __call__(self, x):
    attn = self.shared if self.shared is not None else Attn(name='attn')
    x = attn(x)
    return x + nn.Dense(D, name='ff')(x)


WRAPS = {
    **tie_wraps.WRAPS,
    **tie_wraps.MAP_VARIABLES,
    'remat(jit)': lambda cls: nn.remat(nn.jit(cls)),
    'jit(remat)': lambda cls: nn.jit(nn.remat(cls)),
    'remat(remat)': lambda cls: nn.remat(nn.remat(cls)),
}


def make_encoder(wrap, shared, order=None):
  block_cls = WRAPS[wrap](Block)
  order = order or list(range(N))

  class Encoder(nn.Module):

    @nn.compact
    def __call__(self, x):
      attn = Attn(name='attn') if shared else None
      blocks = [block_cls(shared=attn, name=f'block_{i}') for i in range(N)]
      for i in order:
        x = blocks[i](x)
      return x

  return Encoder


TIES = {f'block_{i}/attn': 'block_0/attn' for i in range(1, N)}


def tied_encoder(wrap, order=None):
  return nn.tie(make_encoder(wrap, shared=False, order=order), TIES)


def to_reference_params(params):
  """The tied model's parameters in the shared-module model's layout."""
  ref = {f'block_{i}': {'ff': params[f'block_{i}']['ff']} for i in range(N)}
  ref['attn'] = params['block_0']['attn']
  return ref


def from_reference_params(ref):
  params = {f'block_{i}': {'ff': ref[f'block_{i}']['ff']} for i in range(N)}
  params['block_0']['attn'] = ref['attn']
  return params


assert_close = functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                 atol=1e-6)


def check_against_reference(tied_cls, ref_cls, x):
  variables = tied_cls().init(jax.random.key(0), x)
  params = variables['params']
  expected_keys = {f'block_{i}' for i in range(N)}
  assert set(params) == expected_keys
  assert 'attn' in params['block_0']
  for i in range(1, N):
    assert set(params[f'block_{i}']) == {'ff'}, 'a tied target was stored'

  def loss(cls, p):
    return jnp.sum(cls().apply({'params': p}, x) ** 2)

  ref_params = to_reference_params(params)
  y, grads = jax.value_and_grad(functools.partial(loss, tied_cls))(params)
  ref_y, ref_grads = jax.value_and_grad(functools.partial(loss, ref_cls))(
      ref_params)
  assert_close(y, ref_y)
  jax.tree_util.tree_map(assert_close, to_reference_params(grads), ref_grads)


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_tie_declared_outside_transform_matches_shared_module(wrap):
  x = jax.random.normal(jax.random.key(1), (2, D))
  check_against_reference(tied_encoder(wrap),
                          make_encoder(wrap, shared=True), x)


@pytest.mark.parametrize('outer', ['remat', 'jit', 'partitioning.remat'])
def test_transform_outside_tie_matches_shared_module(outer):
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied_cls = WRAPS[outer](tied_encoder('none'))
  ref_cls = WRAPS[outer](make_encoder('none', shared=True))
  check_against_reference(tied_cls, ref_cls, x)


@pytest.mark.parametrize('wrap', sorted(WRAPS))
def test_init_does_not_depend_on_which_use_runs_first(wrap):
  x = jax.random.normal(jax.random.key(1), (2, D))
  forward = tied_encoder(wrap)().init(jax.random.key(0), x)['params']
  backward = tied_encoder(wrap, order=[2, 1, 0])().init(
      jax.random.key(0), x)['params']
  jax.tree_util.tree_map(np.testing.assert_array_equal, forward, backward)


class PairBlock(nn.Module):
  """Calls two attention paths; the reference calls one module twice."""

  shared: bool = False

  @nn.compact
  def __call__(self, x):
    a = Attn(name='a')
    b = a if self.shared else Attn(name='b')
    return b(a(x))


@pytest.mark.parametrize('wrap', ['remat', 'jit', 'partitioning.remat'])
def test_tie_declared_inside_transform(wrap):
  """The tie is part of the rematted module: both paths live inside."""
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied_cls = WRAPS[wrap](nn.tie(PairBlock, {'b': 'a'}))
  ref_cls = WRAPS[wrap](functools.partial(PairBlock, shared=True))
  params = tied_cls().init(jax.random.key(0), x)['params']
  assert set(params) == {'a'}
  loss = lambda cls, p: jnp.sum(cls().apply({'params': p}, x) ** 2)
  y, g = jax.value_and_grad(functools.partial(loss, tied_cls))(params)
  ry, rg = jax.value_and_grad(functools.partial(loss, ref_cls))(params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


def test_tie_within_rematted_target_and_jit_train_step():
  """A jitted SGD step on the tied model equals the one on the reference."""
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied_cls = tied_encoder('remat')
  ref_cls = make_encoder('remat', shared=True)
  params = tied_cls().init(jax.random.key(0), x)['params']

  def step(cls, p):
    g = jax.grad(lambda p: jnp.sum(cls().apply({'params': p}, x) ** 2))(p)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)

  new = jax.jit(functools.partial(step, tied_cls))(params)
  ref_new = jax.jit(functools.partial(step, ref_cls))(
      to_reference_params(params))
  jax.tree_util.tree_map(assert_close, new, from_reference_params(ref_new))


# ---------------------------------------------------------------------------
# scan / vmap: a source outside the stack is broadcast, never stacked.
# ---------------------------------------------------------------------------


class StackLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    x = Attn(name='attn')(x)
    return x + nn.Dense(D, name='ff')(x), None


class StackModel(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x):
    x = Attn(name='src')(x)
    common = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    if self.kind == 'scan':
      stack = nn.scan(StackLayer, length=N, **common)
    elif self.kind == 'remat(scan)':
      stack = nn.remat(nn.scan(StackLayer, length=N, **common))
    elif self.kind == 'scan(remat)':
      stack = nn.scan(nn.remat(StackLayer), length=N, **common)
    else:
      stack = nn.vmap(StackLayer, in_axes=(0, None), **common)
    x, _ = stack(name='stack')(x, None)
    return x


def stack_reference(params, x, kind):
  """The stack written out by hand: one ``src`` applied at every step."""
  attn = lambda p, h: Attn().apply({'params': p}, h)
  dense = lambda p, h: nn.Dense(D).apply({'params': p}, h)
  x = attn(params['src'], x)
  ff = params['stack']['ff']
  if kind == 'vmap':
    outs = []
    for i in range(N):
      h = attn(params['src'], x[i])
      outs.append(h + dense(jax.tree_util.tree_map(lambda a: a[i], ff), h))
    return jnp.stack(outs)
  for i in range(N):
    x = attn(params['src'], x)
    x = x + dense(jax.tree_util.tree_map(lambda a: a[i], ff), x)
  return x


@pytest.mark.parametrize('kind', ['scan', 'vmap', 'remat(scan)',
                                  'scan(remat)'])
def test_source_outside_stack_is_broadcast_not_stacked(kind):
  model = nn.tie(StackModel, {'stack/attn': 'src'})(kind)
  x = jax.random.normal(jax.random.key(1), (N, D))
  params = model.init(jax.random.key(0), x)['params']
  assert 'attn' not in params['stack']
  assert params['src']['proj']['kernel'].shape == (D, D)  # not stacked
  assert params['stack']['ff']['kernel'].shape == (N, D, D)  # stacked

  loss = lambda p: jnp.sum(model.apply({'params': p}, x) ** 2)
  ref_loss = lambda p: jnp.sum(stack_reference(p, x, kind) ** 2)
  y, g = jax.value_and_grad(loss)(params)
  ry, rg = jax.value_and_grad(ref_loss)(params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


# ---------------------------------------------------------------------------
# cond: both branches see the one variable.
# ---------------------------------------------------------------------------


class CondModel(nn.Module):
  shared: bool = False

  @nn.compact
  def __call__(self, x, pred):
    a = Attn(name='a')
    b = a if self.shared else Attn(name='b')
    a(x)  # created outside the cond
    return nn.cond(pred, lambda mdl, h: mdl(h), lambda mdl, h: -mdl(h), b, x)


@pytest.mark.parametrize('pred', [True, False])
def test_tied_target_inside_cond(pred):
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied = nn.tie(CondModel, {'b': 'a'})()
  params = tied.init(jax.random.key(0), x, True)['params']
  assert set(params) == {'a'}
  loss = lambda m, p: jnp.sum(m.apply({'params': p}, x, pred) ** 2)
  y, g = jax.value_and_grad(functools.partial(loss, tied))(params)
  ry, rg = jax.value_and_grad(functools.partial(loss, CondModel(True)))(
      params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)


# ---------------------------------------------------------------------------
# The scanned module itself is the target, and a transform nests inside it.
# ---------------------------------------------------------------------------


class MaskedDense(nn.Module):

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    return jnp.tanh(nn.Dense(D, name='dense')(x * mask.value))


class MaskedLayer(nn.Module):

  @nn.compact
  def __call__(self, x, _):
    return nn.remat(MaskedDense)(name='m')(x), None


def masked_stack(broadcast_graph):
  scan_kwargs = dict(variable_axes={'params': 0}, split_rngs={'params': True},
                     length=N)
  if broadcast_graph:
    scan_kwargs['variable_broadcast'] = 'graph'

  class Model(nn.Module):

    @nn.compact
    def __call__(self, x):
      x, _ = MaskedLayer(name='src')(x, None)
      x, _ = nn.scan(MaskedLayer, **scan_kwargs)(name='stack')(x, None)
      return x

  return Model


def test_scanned_target_with_nested_remat_reads_broadcast_source():
  tied = nn.tie(masked_stack(False), {'stack': 'src'}, collections='graph')()
  ref = masked_stack(True)()  # the mask copied in, broadcast over the scan
  x = jax.random.normal(jax.random.key(1), (2, D))
  variables = tied.init(jax.random.key(0), x)
  assert list(variables['graph']) == ['src']
  params = variables['params']
  mask = jnp.linspace(0.5, 1.5, D)

  def tied_loss(m):
    return jnp.sum(tied.apply(
        {'params': params, 'graph': {'src': {'m': {'mask': m}}}}, x) ** 2)

  def ref_loss(m_src, m_stack):
    graph = {'src': {'m': {'mask': m_src}}, 'stack': {'m': {'mask': m_stack}}}
    return jnp.sum(ref.apply({'params': params, 'graph': graph}, x) ** 2)

  y, g = jax.value_and_grad(tied_loss)(mask)
  ry, (g_src, g_stack) = jax.value_and_grad(ref_loss, argnums=(0, 1))(
      mask, mask)
  assert_close(y, ry)
  assert_close(g, g_src + g_stack)


# ---------------------------------------------------------------------------
# switch, while_loop (lift the source), vjp (reads it as a closure).
# ---------------------------------------------------------------------------


class ControlFlowModel(nn.Module):
  kind: str
  shared: bool = False

  @nn.compact
  def __call__(self, x):
    a = Attn(name='a')
    b = a if self.shared else Attn(name='b')
    x = a(x)
    if self.kind == 'switch':
      branches = [lambda m, h: m(h), lambda m, h: -m(h), lambda m, h: 2 * m(h)]
      return nn.switch(2, branches, b, x)
    if self.kind == 'while_loop':
      body = lambda m, c: (c[0] + 1, m(c[1]))
      return nn.while_loop(lambda m, c: c[0] < 3, body, b, (0, x))[1]
    y, backward = nn.vjp(lambda m, h: m(h), b, x)
    _, x_grad = backward(jnp.ones_like(y))
    return y + x_grad


@pytest.mark.parametrize('kind', ['switch', 'while_loop', 'vjp'])
def test_tied_target_inside_control_flow_and_vjp(kind):
  x = jax.random.normal(jax.random.key(1), (2, D))
  tied = nn.tie(ControlFlowModel, {'b': 'a'})(kind)
  ref = ControlFlowModel(kind, shared=True)
  params = tied.init(jax.random.key(0), x)['params']
  assert set(params) == {'a'}
  assert_close(tied.apply({'params': params}, x),
               ref.apply({'params': params}, x))
  if kind == 'while_loop':
    return  # JAX cannot reverse-differentiate a while_loop
  loss = lambda m, p: jnp.sum(m.apply({'params': p}, x) ** 2)
  g = jax.grad(functools.partial(loss, tied))(params)
  rg = jax.grad(functools.partial(loss, ref))(params)
  jax.tree_util.tree_map(assert_close, g, rg)


# ---------------------------------------------------------------------------
# Chains across declarations: an inner tie whose source is an outer target.
# ---------------------------------------------------------------------------


def chained_model(remat_inner, remat_leaves):
  leaf_cls = nn.remat(Attn) if remat_leaves else Attn

  class Inner(nn.Module):

    @nn.compact
    def __call__(self, x):
      return leaf_cls(name='leaf')(leaf_cls(name='src')(x))

  class Outer(nn.Module):

    @nn.compact
    def __call__(self, x):
      x = Attn(name='src')(x)
      inner = nn.tie(Inner, {'leaf': 'src'})  # declared at /inner
      return (nn.remat(inner) if remat_inner else inner)(name='inner')(x)

  return nn.tie(Outer, {'inner/src': 'src'})


@pytest.mark.parametrize('remat_leaves', [False, True])
@pytest.mark.parametrize('remat_inner', [False, True])
def test_chain_across_declarations_stores_one_copy(remat_inner, remat_leaves):
  x = jax.random.normal(jax.random.key(1), (2, D))
  model = chained_model(remat_inner, remat_leaves)()
  params = model.init(jax.random.key(0), x)['params']
  assert set(params) == {'src'}  # /inner/src and /inner/leaf are not stored

  def reference(p):  # one Attn called three times
    attn = lambda h: Attn().apply({'params': p['src']}, h)
    return attn(attn(attn(x)))

  loss = lambda p: jnp.sum(model.apply({'params': p}, x) ** 2)
  y, g = jax.value_and_grad(loss)(params)
  ry, rg = jax.value_and_grad(lambda p: jnp.sum(reference(p) ** 2))(params)
  assert_close(y, ry)
  jax.tree_util.tree_map(assert_close, g, rg)
