"""Shared fixtures of the tie tests: small models, checks, hand-made references.

The models here are ``D`` (3) wide; ``tie_blocks`` holds the wider blocks,
encoders and the language model.

``Leaf`` is a module with one child (``d``, a Dense), ``Chain`` calls three
leaves ``a``, ``b``, ``c`` in turn (each of a class it is given). The
reference for a tied ``Chain`` is the untied one whose Dense layers hold, by
hand, the values of the path each reads (``reads``): one variable at several
paths, as a user shares it without ties.

``Linear`` (one Dense ``dense``) and ``Blocks`` (``block_0`` then ``block_1``)
are what the message tests tie, initialized on ``ONES`` by :func:`init`.
"""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_tieext import TieError

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


def error(model, x=X) -> str:
  """The message of the ``TieError`` that ``model``'s init raises."""
  with pytest.raises(TieError) as info:
    model.init(jax.random.key(0), x)
  return str(info.value)


# ---------------------------------------------------------------------------
# The models of the message tests.
# ---------------------------------------------------------------------------

ONES = jnp.ones((1, D))


class Linear(nn.Module):
  features: int = D

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features, name='dense')(x)


class Blocks(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = Linear(name='block_0')(x)
    return Linear(name='block_1')(x)


def init(cls, **kwargs):
  return cls(**kwargs).init(jax.random.key(0), ONES)


# ---------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------

assert_close = functools.partial(np.testing.assert_allclose, rtol=1e-5,
                                 atol=1e-6)


def assert_trees(check, actual, expected):
  assert (jax.tree_util.tree_structure(actual)
          == jax.tree_util.tree_structure(expected))
  jax.tree_util.tree_map(check, actual, expected)


def assert_trees_equal(actual, expected):
  assert_trees(np.testing.assert_array_equal, actual, expected)


def assert_trees_close(actual, expected):
  assert_trees(assert_close, actual, expected)


def assert_message_names(message, *fragments):
  for fragment in fragments:
    assert fragment in message, f'{fragment!r} missing from: {message}'


def assert_says_how_to_fix(message):
  assert re.search(r'\bfix\b|did you mean|option|instead', message,
                   re.IGNORECASE), f'no advice in: {message}'


def outputs_and_grads(model, variables, *args, rngs=None):
  """The outputs, and the gradient of a loss on them w.r.t. ``params``."""

  def loss(params):
    y = model.apply({**variables, 'params': params}, *args, rngs=rngs)
    return jnp.sum(jnp.sin(y)), y

  (_, y), grads = jax.value_and_grad(loss, has_aux=True)(variables['params'])
  return y, grads
