import gc
import jax
import jax.numpy as jnp


def step(x, **static):  # a fresh closure over a fresh array each step, as a training loop makes
  w = x * 2.0
  return jax.checkpoint(lambda y, n: w * y * n, **static)(x, 3.0)


def leaked(**static):  # arrays still alive after 30 eager steps
  x = jnp.ones(3)
  gc.collect()
  before = len(jax.live_arrays())
  for _ in range(30):
    step(x, **static).block_until_ready()
  gc.collect()
  return len(jax.live_arrays()) - before


print('reproduces' if leaked(static_argnums=(1,)) > leaked() + 10 else 'fixed')
