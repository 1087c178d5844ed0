import jax


def f(x, flag):
  return x * 3.0 if flag else x  # Python control flow on the static argument


print('jax', jax.__version__)
for label, static, call in [
    ('static_argnums=(1,), f(x, True)', {'static_argnums': (1,)}, lambda g, x: g(x, True)),
    ("static_argnames=('flag',), f(x, flag=True)", {'static_argnames': ('flag',)},
     lambda g, x: g(x, flag=True)),
    ("static_argnames=('flag',), f(x, True)", {'static_argnames': ('flag',)},
     lambda g, x: g(x, True)),
]:
  grad = jax.grad(lambda x: call(jax.checkpoint(f, **static), x))
  for how, fn in [('grad', grad), ('jit(grad)', jax.jit(grad))]:
    try:
      print(f'{label}: {how}: {fn(1.0)}')
    except Exception as e:
      print(f'{label}: {how}: {type(e).__name__}')
