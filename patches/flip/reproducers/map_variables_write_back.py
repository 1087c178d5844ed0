"""Alternative (b): nn.map_variables that writes back to its source, emulated.

trans_out_fn writes the target's state into the source's place. Plain: works.
--remat: the user of the tie is rematted; it is given the outer scope (the
root scope is not reachable inside), reads work, the write-back leaks a tracer.
"""
import sys
import jax, jax.numpy as jnp
import flax.linen as nn
REMAT = nn.remat if '--remat' in sys.argv else (lambda m: m)


class Counter(nn.Module):

  @nn.compact
  def __call__(self, x):
    count = self.variable('state', 'count', jnp.zeros, ())
    count.value = 2 * count.value + 1
    return x


class User(nn.Module):
  outer: object  # the model's scope

  @nn.compact
  def __call__(self, x):
    outer = self.outer
    return nn.map_variables(Counter, 'state', mutable=True,
        trans_in_fn=lambda _: {'state': outer.variables()['state']['a']},
        trans_out_fn=lambda v: outer.put_variable('state', 'a', v['state']) or {})()(x)


class Model(nn.Module):

  @nn.compact
  def __call__(self, x):
    return REMAT(User)(self.scope, name='user')(Counter(name='a')(x))


_, out = Model().apply({'state': {'a': {'count': jnp.array(1.0)}}}, 0.0, mutable='state')
count = out['state']['a']['count']
if isinstance(count, jax.core.Tracer):  # under nn.remat
  print(f'fails: the count written back is a leaked {type(count).__name__}')
else:
  print('works' if count == 7 else f'fails: count {count:g}, not 7')
