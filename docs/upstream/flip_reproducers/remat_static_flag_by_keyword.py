"""A static flag of a rematted Linen module is traced when passed by keyword.

The module branches on a Python flag, so `nn.remat` must treat it as static.
`static_argnums` counts `self` as 0, so the flag is argument 2; passed
positionally it is static, passed by keyword it is not there to count
(#3630, #3946).

Plain Flax 0.12.12: `init` with `train=False` raises JAX's `ValueError`
(`static_argnums` ... got (3,), while `len(args)` = 3).
With the flax-tieext plugin (PRs 02 to 04 of the series, not this FLIP):
`static_argnums` is resolved through the signature, so the keyword call works
and equals the positional one; `static_argnames='train'` says the same by name.
"""

import jax
import jax.numpy as jnp
import flax.linen as nn

try:
  import flax_tieext  # noqa: F401  installs static_argnames into Flax
except ImportError:
  pass


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x, train):
    x = nn.Dense(8)(x)
    return nn.Dropout(0.5, deterministic=not train)(x)


RematMLP = nn.remat(MLP, static_argnums=(2,))
x = jnp.ones((2, 4))
positional = RematMLP().init(jax.random.key(0), x, False)
keyword = RematMLP().init(jax.random.key(0), x, train=False)  # plain: ValueError
assert jax.tree.all(jax.tree.map(jnp.array_equal, positional, keyword))
