"""Sharing variables between modules in Linen today: what each pattern does.

Run: python sharing_in_linen.py   (Flax 0.12.8 or main, any backend)

It prints the versions it ran on, then what each case measured. A shared
module should hold one copy of its variables, and a write through any use
should land in that one copy.
"""
import sys

import flax
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


class Attention(nn.Module):  # 6, 7: one mask for every block
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


class DenseWrapper(nn.Module):  # 8: a wrapper that stores its child's variables
  def setup(self):
    self.dense = nn.Dense(4)
    nn.share_scope(self, self.dense)

  def __call__(self, x):
    return self.dense(x)


class Wrapped(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.remat(DenseWrapper)(name='layer')(x)


class Head(nn.Module):  # 9: the output layer is the input embedding
  embed: nn.Module

  @nn.compact
  def __call__(self, x):
    return self.embed.attend(x)


class TiedLM(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(16, 4, name='embed')
    return nn.remat(Head)(embed, name='head')(embed(tokens))


def rows_with_gradient(tokens):
  params = TiedLM().init(key, tokens)['params']
  grads = jax.grad(lambda p: TiedLM().apply({'params': p}, tokens).sum())(params)
  rows = jnp.abs(grads['embed']['embedding']).sum(axis=1) > 0
  return f'{int(rows.sum())} of {rows.size}'


def run(name, fn):
  try:
    print(f'{name}: {fn()}')
  except Exception as e:  # pylint: disable=broad-except
    print(f'{name}: {type(e).__name__}: {str(e).splitlines()[0][:90]}')


print(f'flax {flax.__version__}, jax {jax.__version__}, python {sys.version.split()[0]}')
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
for how in ('one instance', 'read block_0'):
  run(f'{6 if how == "one instance" else 7} nn.remat blocks, {how}: graph stored',
      lambda: shape(Encoder(how).init(key, jnp.ones((2, 4, 8)))['graph']))
run('8 nn.share_scope under nn.remat: params stored',
    lambda: shape(Wrapped().init(key, x)['params']))
tokens = jnp.array([[1, 2, 3]])
run('9 nn.Embed.attend in an nn.remat head: params stored',
    lambda: shape(TiedLM().init(key, tokens)['params']))
run('9 nn.Embed.attend: embedding rows with a gradient (input uses 3)',
    lambda: rows_with_gradient(tokens))
