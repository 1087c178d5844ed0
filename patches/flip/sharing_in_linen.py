"""Sharing variables between modules in Linen today: what each pattern does.

Run: python sharing_in_linen.py   (Flax 0.12.8 or main, any backend)

Each case prints what it measured. A shared module should hold one copy of
its variables, and a write through any use should land in that one copy.
"""
import jax
import jax.numpy as jnp
import flax.linen as nn

N = 3
shape = lambda tree: jax.tree.map(jnp.shape, tree)


class Counter(nn.Module):  # state that every use updates: 0 -> 1 -> 3 -> 7 -> 15
  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    count.value = 2 * count.value + 1
    return x


class Layer(nn.Module):
  shared: nn.Module  # one instance, created by the caller

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(4, name='own')(x) + self.shared(x), None


class OuterInstance(nn.Module):  # 1, 2: a module passed into nn.scan / nn.vmap
  how: str

  @nn.compact
  def __call__(self, x):
    shared = nn.Dense(4, name='shared')
    kw = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    if self.how == 'scan':
      return nn.scan(Layer, length=N, **kw)(shared, name='layers')(x)[0]
    return nn.vmap(Layer, in_axes=None, axis_size=N, **kw)(shared, name='layers')(x)[0]


class Shared(nn.Module):  # 3: a weight kept in a collection of its own
  @nn.compact
  def __call__(self, x):
    return x @ self.variable('shared', 'kernel', jnp.eye, 4).value


class Broadcast(nn.Module):
  @nn.compact
  def __call__(self, x):
    Stack = nn.scan(Layer, variable_axes={'params': 0}, variable_broadcast='shared',
                    split_rngs={'params': True}, length=N)
    return Stack(Shared(name='shared'), name='layers')(x)[0]


class CountingLayer(nn.Module):
  counter: nn.Module

  @nn.compact
  def __call__(self, x):
    return self.counter(x), None


class Carry(nn.Module):  # 4: an outer counter written in every step of nn.scan
  @nn.compact
  def __call__(self, x):
    counter = Counter(name='counter')
    x = counter(x)  # created before the scan
    return nn.scan(CountingLayer, variable_carry='state', length=N)(counter, name='layers')(x)[0]


class User(nn.Module):  # 5: a second use of `source` at its own path, written back
  source: nn.Module

  @nn.compact
  def __call__(self, x):
    a = self.source
    return nn.map_variables(
        Counter, 'state', mutable=True,
        trans_in_fn=lambda _: {'state': a.variables['state']},  # read a's count
        trans_out_fn=lambda v: a.put_variable('state', 'count', v['state']['count']) or {},
    )(name='b')(x)


class WriteBack(nn.Module):
  remat: bool

  @nn.compact
  def __call__(self, x):
    a = Counter(name='a')
    return (nn.remat(User) if self.remat else User)(a, name='user')(a(x))


class Attention(nn.Module):  # 6-8: one mask for every block
  @nn.compact
  def __call__(self, x):
    mask = self.variable('graph', 'mask', lambda: jnp.tril(jnp.ones((4, 4))))
    return nn.Dense(8)(mask.value @ x)


class Block(nn.Module):
  attn: nn.Module | None = None  # 6: the encoder's one Attention

  @nn.compact
  def __call__(self, x):
    return x + (self.attn or Attention(name='attn'))(x)


class Encoder(nn.Module):
  how: str  # 'own' (each block its own mask), 'one instance' or 'read block_0'

  @nn.compact
  def __call__(self, x):
    attn = Attention(name='attn') if self.how == 'one instance' else None
    block_0 = nn.remat(Block)(attn, name='block_0')
    x = block_0(x)
    for i in range(1, N):
      cls = Block
      if self.how == 'read block_0':  # 7: a block reads its sibling's mask
        cls = nn.map_variables(Block, 'graph', trans_out_fn=lambda _: {},
                               trans_in_fn=lambda _: {'graph': block_0.variables['graph']})
      x = nn.remat(cls)(attn, name=f'block_{i}')(x)
    return x


def run(name, fn):
  try:
    print(f'{name}: {fn()}')
  except Exception as e:  # pylint: disable=broad-except
    print(f'{name}: {type(e).__name__}: {str(e).splitlines()[0][:90]}')


key, x = jax.random.key(0), jnp.ones((2, 4))
for how in ('scan', 'vmap'):
  run(f'1-2 outer instance in nn.{how}: shared kernel',
      lambda: shape(OuterInstance(how).init(key, x)['params']['shared']['kernel']))
run('3 variable_broadcast: shared / own kernel', lambda: (
    lambda v: (shape(v['shared']['shared']['kernel']),
               shape(v['params']['layers']['own']['kernel'])))(Broadcast().init(key, x)))
run('4 variable_carry: count after 1 + 3 calls', lambda: float(Carry().apply(
    {'state': {'counter': {'count': 0.0}}}, 0.0, mutable='state')[1]['state']['counter']['count']))
for remat in (False, True):
  run(f'5 map_variables write-back{" under nn.remat" if remat else ""}: count after 2 calls',
      lambda: float(WriteBack(remat).apply({'state': {'a': {'count': 1.0}}}, 0.0,
                                           mutable='state')[1]['state']['a']['count']))
x = jnp.ones((2, 4, 8))
for how in ('one instance', 'read block_0'):
  run(f'{6 if how == "one instance" else 7} nn.remat blocks, {how}: graph stored',
      lambda: shape(Encoder(how).init(key, x)['graph']))
run('8 nn.remat blocks, 1 and 2 tied to block_0 by nn.tie: graph stored', lambda: shape(
    nn.tie(Encoder, {f'block_{i}/attn': 'block_0/attn' for i in range(1, N)},
           collections='graph')('own').init(key, x)['graph']) if hasattr(nn, 'tie')
    else 'this Flax has no nn.tie')
