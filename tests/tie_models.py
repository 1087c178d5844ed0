"""Shared fixtures of the tie tests: small models and the hand-shared reference.

``Leaf`` is a module with one child (``d``, a Dense), ``Chain`` calls three
leaves ``a``, ``b``, ``c`` in turn (each of a class it is given). The
reference for a tied ``Chain`` is the untied one whose Dense layers hold, by
hand, the values of the path each reads (``reads``): one variable at several
paths, as a user shares it without ties.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

D = 3
X = jnp.linspace(-1.0, 1.0, 2 * D).reshape(2, D)


class Leaf(nn.Module):
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(D, name='d', param_dtype=self.param_dtype)(x))


class Chain(nn.Module):
  """``a``, ``b`` then ``c`` (or ``names``); ``classes``: name -> class."""

  classes: tuple = ()
  names: tuple = ('a', 'b', 'c')

  @nn.compact
  def __call__(self, x):
    classes = dict(self.classes)
    for name in self.names:
      x = classes.get(name, Leaf)(name=name)(x)
    return x


def get(tree, path: str):
  for name in path.split('/'):
    tree = tree[name]
  return tree


def put(tree, path: str, value):
  *parents, last = path.split('/')
  for name in parents:
    tree = tree.setdefault(name, {})
  tree[last] = value


def flat_paths(tree, prefix=''):
  if not isinstance(tree, dict) and not hasattr(tree, 'items'):
    return {prefix}
  return set().union(*(flat_paths(v, f'{prefix}/{k}'.lstrip('/'))
                       for k, v in tree.items()))


def assert_like_hand_shared(tied, reads, untied=None, x=X):
  """``tied`` behaves as ``untied`` with each Dense holding what it reads.

  Args:
    tied: the tied model.
    reads: each Dense path of the untied model -> the stored path it reads.
    untied: the untied model (a plain ``Chain``).
    x: the input.

  Checks that only the sources are stored, with their own initial values;
  that init returns what apply returns; and that outputs and gradients are
  those of the untied model given the shared values by hand (a source's
  gradient is the sum over the paths that read it).
  """
  untied = untied or Chain()
  key = jax.random.key(0)
  y_init, variables = tied.init_with_output(key, x)
  own = untied.init(key, x)['params']
  params = variables['params']
  sources = sorted(set(reads.values()))
  assert flat_paths(params) == set().union(
      *(flat_paths(get(own, s), s) for s in sources))
  for s in sources:  # the source's own values, whichever use ran first
    jax.tree_util.tree_map(np.testing.assert_array_equal, get(params, s),
                           get(own, s))
  np.testing.assert_allclose(y_init, tied.apply(variables, x), rtol=1e-6)

  def by_hand(p):
    shared = {}
    for path, source in reads.items():
      put(shared, path, get(p, source))
    return shared

  np.testing.assert_allclose(
      tied.apply(variables, x),
      untied.apply({'params': by_hand(params)}, x), rtol=1e-6)
  grads = jax.grad(lambda p: tied.apply({'params': p}, x).sum())(params)
  hand = jax.grad(lambda p: untied.apply({'params': p}, x).sum())(
      by_hand(params))
  expected = jax.tree_util.tree_map(jnp.zeros_like, params)
  for path, source in reads.items():
    put(expected, source, jax.tree_util.tree_map(
        jnp.add, get(expected, source), get(hand, path)))
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
      grads,
      expected)
