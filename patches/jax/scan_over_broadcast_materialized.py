import re
import jax
import jax.numpy as jnp

L, D, B = 12, 1024, 2048
def closed_over(w, x):  # the weight a loop invariant of the scan
  body = lambda c, _: (jnp.tanh(c @ w.astype(jnp.bfloat16)), None)
  return jax.lax.scan(body, x, None, length=L)[0].astype(jnp.float32).sum()
def scanned(w, x):  # the same weight broadcast to the stack and scanned over
  body = lambda c, wi: (jnp.tanh(c @ wi.astype(jnp.bfloat16)), None)
  return jax.lax.scan(body, x, jnp.broadcast_to(w, (L, D, D)))[0].astype(jnp.float32).sum()
args = (jnp.ones((D, D), jnp.float32), jnp.ones((B, D), jnp.bfloat16))
print('jax', jax.__version__, jax.devices()[0].device_kind)
for f in (closed_over, scanned):
  c = jax.jit(jax.grad(f)).lower(*args).compile()
  stacks = re.findall(r'= bf16\[12,1024,1024\]\{[^}]*\} ([\w-]+)\(', c.as_text())
  print(f'{f.__name__}: temp {c.memory_analysis().temp_size_in_bytes // 2**20} MiB,'
        f' bf16[12,1024,1024] values: {sorted(stacks)}')
