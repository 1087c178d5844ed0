import gc
import jax

def step(x, static_argnums):  # a fresh closure over a fresh array each step
  w = x * 2.0
  return jax.checkpoint(lambda y, n: w * y * n, static_argnums=static_argnums)(x, 3.0)
print('jax', jax.__version__)
for static_argnums in [(), (1,)]:
  x = jax.numpy.ones(3)
  gc.collect()
  before = len(jax.live_arrays())
  for _ in range(30):
    step(x, static_argnums).block_until_ready()
  gc.collect()
  print(f'static_argnums={static_argnums}: eager, 30 steps:',
        len(jax.live_arrays()) - before, 'arrays still alive')
  try:
    with jax.checking_leaks():
      jax.jit(step, static_argnums=1)(x, static_argnums)
    print(f'static_argnums={static_argnums}: jit under checking_leaks: ok')
  except Exception as e:
    print(f'static_argnums={static_argnums}: jit under checking_leaks:', str(e).splitlines()[0])
