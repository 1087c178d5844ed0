"""The proposal: the reproducers' sharing declared as ties, `nn.tie(Model, {target: source})`.

Usage: tie.py scan|vmap|remat|write|scan-write|scan-inside-only. Each case checks the tied model against
a reference Flax computes today (one module called at every use, unrolled).
Prints `works`, or `fails: <what>` (on Flax without ties: no nn.tie).
"""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn

CASE, N = sys.argv[1], 3
close = lambda a, b: jax.tree.all(jax.tree.map(jnp.allclose, a, b))


class Layer(nn.Module):  # scan, vmap: each layer has its own `shared`, tied to the model's
  shared: nn.Module | None = None  # the reference passes the one instance

  @nn.compact
  def __call__(self, x):
    shared = self.shared or nn.Dense(4, name='shared')
    return jnp.tanh(x + nn.Dense(4, name='own')(x) + shared(x)), None


class Stack(nn.Module):
  unrolled: bool = False  # the reference

  @nn.compact
  def __call__(self, x):
    shared = nn.Dense(4, name='shared')
    if CASE != 'scan-inside-only':  # the source runs before the stack
      x = shared(x)
    y = x
    if self.unrolled:
      ys = []
      for i in range(N):
        y = Layer(shared, name=f'layer_{i}')(x if CASE == 'vmap' else y)[0]
        ys.append(y)
      return jnp.stack(ys) if CASE == 'vmap' else y
    kw = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    if CASE != 'vmap':
      return nn.scan(Layer, length=N, **kw)(name='layers')(x)[0]
    return nn.vmap(Layer, in_axes=None, axis_size=N, **kw)(name='layers')(x)[0]


class Attention(nn.Module):  # remat: one mask for every block

  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.tril(jnp.ones((4, 4))))
    return nn.Dense(8)(mask.value @ x)


class Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    return x + Attention(name='attn')(x)


class Encoder(nn.Module):

  @nn.compact
  def __call__(self, x):
    for i in range(N):
      x = nn.remat(Block)(name=f'block_{i}')(x)
    return x


class Counter(nn.Module):  # write: b is a second use of a

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    count.value = 2 * count.value + 1
    return x


class Counters(nn.Module):
  one_instance: bool = False  # the reference: a called twice

  @nn.compact
  def __call__(self, x):
    a = Counter(name='a')
    return (a if self.one_instance else Counter(name='b'))(a(x))


class CountingLayer(nn.Module):  # scan-write: each layer's counter tied to the model's

  @nn.compact
  def __call__(self, x):
    return Counter(name='counter')(x), None


class CountingStack(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = Counter(name='counter')(x)
    return nn.scan(CountingLayer, variable_axes={'state': 0}, length=N)(name='layers')(x)[0]


def check():
  if CASE in ('scan', 'vmap', 'scan-inside-only'):
    model, x = nn.tie(Stack, {'layers/shared': 'shared'})(), jax.random.normal(jax.random.key(1), (2, 4))
    params = model.init(jax.random.key(0), x)['params']
    assert params['shared']['kernel'].shape == (4, 4) and list(params['layers']) == ['own'], params
    own = params['layers']['own']
    unstack = lambda p: {'shared': p['shared'], **{
        f'layer_{i}': {'own': jax.tree.map(lambda a: a[i], p['layers']['own'])} for i in range(N)}}
    loss = lambda m: jax.value_and_grad(lambda p: jnp.sum(m.apply({'params': p}, x) ** 2))
    (value, grads), (ref, ref_grads) = loss(model)(params), loss(Stack(True))(unstack(params))
    assert jnp.allclose(value, ref) and close(unstack(grads), ref_grads)
  elif CASE == 'remat':
    model, x = nn.tie(Encoder, {f'block_{i}/attn': 'block_0/attn' for i in range(1, N)},
                      collections='graph')(), jnp.ones((2, 4, 8))
    variables = model.init(jax.random.key(0), x)
    assert list(variables['graph']) == ['block_0'], list(variables['graph'])
    untied = Encoder().init(jax.random.key(0), x)
    assert jnp.allclose(model.apply(variables, x), Encoder().apply(untied, x))
  elif CASE == 'scan-write':  # one counter called 1 + N times: 0 -> 1 -> 3 -> 7 -> 15
    model = nn.tie(CountingStack, {'layers/counter': 'counter'}, collections='state')()
    _, out = model.apply({'state': {'counter': {'count': jnp.array(0.0)}}}, 0.0, mutable='state')
    assert out['state']['counter']['count'] == 15, out
  else:
    start = {'state': {'a': {'count': jnp.array(1.0)}}}
    model = nn.tie(Counters, {'b': 'a'}, collections='state')()
    _, out = model.apply(start, 0.0, mutable='state')
    _, ref = Counters(one_instance=True).apply(start, 0.0, mutable='state')
    assert out['state']['a']['count'] == ref['state']['a']['count'] == 7, out


if not hasattr(nn, 'tie'):
  print('fails: this Flax has no nn.tie')
else:
  try:
    check()
    print('works')
  except Exception as e:
    print(f'fails: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ""}')
