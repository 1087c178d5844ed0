import inspect
import jax


def f(x, flag):
  return x * 2.0 if flag else x  # Python control flow on the static argument


if 'static_argnames' not in inspect.signature(jax.checkpoint).parameters:
  print('not-applicable')  # this jax.checkpoint has no static_argnames parameter at all
else:
  try:
    g = jax.grad(lambda x: jax.checkpoint(f, static_argnames=('flag',))(x, flag=True))(1.0)
    print('fixed' if g == 2.0 else f'wrong gradient: {g}')
  except jax.errors.TracerBoolConversionError:
    print('reproduces')
