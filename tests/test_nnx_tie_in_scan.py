"""``flax_tieext.nnx.tie(..., in_scan=...)``: a tied source in ``nnx.scan``.

A target inside a stack of modules (made by ``nnx.vmap``) tied to a source
outside it reads the source in every layer; the user gives the source
``None`` in the scan's prefix. ``in_scan`` says how the patched ``nnx.scan``
reads it, as ``nn.tie``'s does: ``'broadcast'``, the scan's broadcast input
(a loop invariant); ``'scanned'``, broadcast to the stack's length and
scanned over like the stack's own Variables; the default (None) scans an
``nnx.Param`` and reads other Variables as loop invariants. Reference: the
same stack written by hand with ``jax.lax.scan``, the shared kernel closed
over: the same outputs and gradients every way.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_tieext import _compat
from flax_tieext import TieError

try:
  from flax import nnx  # pylint: disable=g-import-not-at-top
except ImportError as e:  # Flax 0.10.7 on its pinned jax 0.8.1
  pytest.skip(f'flax.nnx does not import on Flax {_compat.FLAX_VERSION}: {e}',
              allow_module_level=True)
import flax_tieext.nnx  # pylint: disable=g-import-not-at-top,g-bad-import-order

if not flax_tieext.nnx._TREE_MODE:  # pylint: disable=protected-access
  pytest.skip(f'Flax {_compat.FLAX_VERSION} has no NNX tree mode (graph=False)',
              allow_module_level=True)

from test_tie_in_scan import scan_inputs  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.needs_patch  # the patched nnx.scan scans the source

LAYERS, F = 3, 4
X = jnp.linspace(-1.0, 1.0, 2 * F).reshape(2, F)


class Count(nnx.Variable):
  """Not a parameter: a layer may write it."""


class Layer(nnx.Module):

  def __init__(self, *, rngs):
    self.shared = nnx.Linear(F, F, rngs=rngs)  # the tie's target
    self.ff = nnx.Linear(F, F, rngs=rngs)
    self.count = Count(jnp.zeros(()))

  def __call__(self, x, write=False):
    if write:
      self.count[...] = self.count[...] + 1.0
    return x + self.ff(jnp.tanh(self.shared(x))) + self.count[...]


class Stack(nnx.Module):
  """``shared`` and ``count`` outside, every layer of ``layers`` reads them."""

  def __init__(self, *, rngs):
    self.shared = nnx.Linear(F, F, rngs=rngs)
    self.count = Count(jnp.zeros(()))

    @nnx.vmap(graph=False)
    def make(key):
      return Layer(rngs=nnx.Rngs(key))

    self.layers = make(jax.random.split(rngs.params(), LAYERS))

  def __call__(self, x, write=False):
    axes = nnx.prefix(self, lambda path, _: None if path[0] != 'layers' else 0,
                      graph=False)

    @nnx.scan(in_axes=(nnx.Carry, axes), out_axes=nnx.Carry, graph=False)
    def step(x, model):
      return model.layers(x, write)

    return step(x, self)


TIES = {'layers.shared.kernel': 'shared.kernel', 'layers.shared.bias': 'shared.bias',
        'layers.count': 'count'}


def tied(in_scan):
  kwargs = {} if in_scan == 'default' else {'in_scan': in_scan}
  return flax_tieext.nnx.tie(Stack, TIES, **kwargs)(rngs=nnx.Rngs(0))


def by_hand(kernel, bias, ff_kernels, ff_biases, count, x):
  """The stack with ``jax.lax.scan``, the shared Linear closed over."""
  def body(x, ff):
    k, b = ff
    return x + jnp.tanh(x @ kernel + bias) @ k + b + count, None
  return jax.lax.scan(body, x, (ff_kernels, ff_biases))[0]


def arrays(model):
  return (model.shared.kernel[...], model.shared.bias[...], model.layers.ff.kernel[...],
          model.layers.ff.bias[...], model.count[...])


@pytest.mark.parametrize('in_scan', ['default', 'scanned', 'broadcast'])
def test_each_way_in_computes_the_stack_written_by_hand(in_scan):
  model = tied(in_scan)
  assert model.layers.shared.kernel is model.shared.kernel
  np.testing.assert_allclose(model(X), by_hand(*arrays(model), X), rtol=1e-6)
  grads = nnx.grad(lambda m: m(X).sum(), graph=False)(model)
  expected = jax.grad(lambda *a: by_hand(*a, X).sum(), argnums=(0, 1, 2, 3))(
      *arrays(model))
  for got, want in zip(arrays(grads)[:4], expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _scan_inputs(model):
  leaves, treedef = jax.tree.flatten(model)  # a tree-mode module is a pytree
  return scan_inputs(lambda v, x: jax.tree.unflatten(treedef, v)(x), leaves, X)


def test_a_param_source_is_scanned_by_default_or_a_loop_invariant_as_in_scan_says():
  default = _scan_inputs(tied('default'))
  scanned, invariant = _scan_inputs(tied('scanned')), _scan_inputs(tied('broadcast'))
  # The shared kernel: sliced from a stack of LAYERS, or read whole.
  assert (F, F) not in scanned and (F, F) in invariant and (F, F) not in default
  assert scanned.count((LAYERS, F, F)) == 2 * invariant.count((LAYERS, F, F))
  assert default.count((LAYERS, F, F)) == scanned.count((LAYERS, F, F))
  # The counter (not a Param): a loop invariant by default, scanned if asked.
  assert (LAYERS,) in scanned and (LAYERS,) not in default


def test_the_default_reads_another_variable_as_a_loop_invariant_that_takes_writes():
  model = tied('default')
  model(X, write=True)
  assert float(model.count[...]) == LAYERS  # every layer's write landed


def test_a_write_to_a_scanned_source_is_refused():
  model = flax_tieext.nnx.tie(Stack, TIES, in_scan='scanned')(rngs=nnx.Rngs(0))
  np.testing.assert_allclose(model(X), tied('broadcast')(X), rtol=1e-6)
  with pytest.raises(TieError, match=r"count.*in_scan='broadcast'"):
    model(X, write=True)
  assert float(model.count[...]) == 0.0  # nothing landed


def test_in_scan_is_checked_at_the_declaration():
  with pytest.raises(TieError, match=r"in_scan='stacked'.*'broadcast'.*'scanned'"):
    flax_tieext.nnx.tie(Stack, TIES, in_scan='stacked')
