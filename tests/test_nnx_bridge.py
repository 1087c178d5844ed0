# Copyright 2026 The flax-tieext Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Tied Linen models inside NNX (``nnx.bridge``), and NNX sharing inside Linen.

* Linen -> NNX: the example encoders with ``nn.tie`` (a ``graph`` collection
  tied across rematted blocks; ALBERT-style tied attention parameters),
  wrapped in ``nnx.bridge.ToNNX`` and trained with ``nnx.Optimizer`` under
  ``nnx.jit`` and ``nnx.remat``. Reference: the same Linen model trained with
  optax directly, from the same variables.
* NNX -> Linen: an NNX module that uses one submodule at two places, inside a
  Linen model under ``nn.remat`` through ``nnx.bridge.to_linen``. Reference:
  the NNX module itself.
"""

import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_tieext import _compat
from flax_tieext.examples import albert
from flax_tieext.examples import t5
from flax_tieext.examples import task

try:
  from flax import nnx  # pylint: disable=g-import-not-at-top
except ImportError as e:  # Flax 0.10.7 on its pinned jax 0.8.1
  pytest.skip(
      f'flax.nnx does not import on Flax {_compat.FLAX_VERSION} / jax'
      f' {_compat.JAX_VERSION}: {e}', allow_module_level=True)

_NEEDED = {
    'nnx.bridge.ToNNX / lazy_init / to_linen': lambda: (
        nnx.bridge.ToNNX, nnx.bridge.lazy_init, nnx.bridge.to_linen),
    'nnx.remat': lambda: nnx.remat,
    'nnx.to_pure_dict / replace_by_pure_dict / variable_type_from_name': lambda: (
        nnx.to_pure_dict, nnx.replace_by_pure_dict, nnx.variable_type_from_name),
}


def _missing():
  missing = []
  for name, get in _NEEDED.items():
    try:
      get()
    except AttributeError:
      missing.append(name)
  return missing


pytestmark = [
    # The examples declare their ties with nn.tie, which the patch installs.
    pytest.mark.needs_patch,
    pytest.mark.skipif(
        bool(_missing()),
        reason=f'Flax {_compat.FLAX_VERSION} lacks {", ".join(_missing())}',
    ),
]

STEPS = 3


def assert_close(a, b):
  # The NNX side adds an nnx.remat around the call: recomputed gradients may
  # differ by float rounding (they are bitwise equal on recent JAX).
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b
  )


# -- moving variables between Linen and NNX, through public nnx API ----------


def linen_variables(model, collections):
  """The Linen variables of a ``ToNNX`` model: its state, by collection."""
  return {
      col: nnx.to_pure_dict(nnx.state(model, nnx.variable_type_from_name(col)))
      for col in collections
  }


def load_linen_variables(model, variables):
  """Puts Linen variables (a checkpoint) into a ``ToNNX`` model."""
  for col, tree in variables.items():
    state = nnx.state(model, nnx.variable_type_from_name(col))
    nnx.replace_by_pure_dict(state, tree)
    nnx.update(model, state)


def make_optimizer(model, tx):
  if 'wrt' in inspect.signature(nnx.Optimizer.__init__).parameters:
    return nnx.Optimizer(model, tx, wrt=nnx.Param)
  return nnx.Optimizer(model, tx)


def optimizer_update(optimizer, model, grads):
  if 'model' in inspect.signature(nnx.Optimizer.update).parameters:
    optimizer.update(model, grads)
  else:  # Flax < 0.11: the optimizer holds the model
    optimizer.update(grads)


# -- Linen -> NNX -------------------------------------------------------------


def _t5():
  config = t5.T5Config(
      vocab_size=16, num_layers=2, d_model=16, num_heads=2, d_ff=32, length=8)
  model = t5.make_encoder(config, tied=True, remat=True)
  absent = [('graph', f'{target}/mask') for target in t5.mask_ties(2)]
  return model, config, {'deterministic': True}, absent


def _albert():
  config = albert.AlbertConfig(
      vocab_size=16, num_layers=2, d_model=16, num_heads=2, d_ff=32, length=8)
  model = albert.make_encoder(config, sharing='tie', remat=True)
  absent = [('params', target) for target in albert.attention_ties(2)]
  return model, config, {}, absent


@pytest.mark.end_to_end  # trains whole models: left to --end-to-end and CI
@pytest.mark.parametrize('example', [_t5, _albert], ids=['t5-graph', 'albert-params'])
def test_tied_linen_model_trains_in_nnx_as_in_linen(example):
  linen_model, config, kwargs, absent = example()
  tokens, targets = task.synthetic_batch(
      jax.random.key(1), 2, config.length, config.vocab_size)
  variables = linen_model.init(jax.random.key(0), tokens, **kwargs)
  variables = jax.tree.map(jnp.asarray, dict(variables))

  model = nnx.bridge.ToNNX(linen_model, rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(model, tokens, **kwargs)
  # One variable per tied source: the NNX state has the Linen layout, in
  # which a tied target is not stored.
  state = linen_variables(model, variables)
  assert jax.tree.structure(state) == jax.tree.structure(variables)
  for col, path in absent:
    tree = state[col]
    for key in path.split('/')[:-1]:
      tree = tree.get(key, {})
    assert path.split('/')[-1] not in tree, f'{col}/{path} is stored'

  # The Linen checkpoint, into NNX.
  load_linen_variables(model, variables)
  tx = optax.adam(1e-2)
  optimizer = make_optimizer(model, tx)
  forward = nnx.remat(
      lambda m, tokens, **kwargs: m(tokens, **kwargs),
      static_argnames=tuple(kwargs),
  )

  @nnx.jit
  def nnx_step(model, optimizer, tokens, targets):
    def loss_fn(model):
      return task.cross_entropy(forward(model, tokens, **kwargs), targets)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer_update(optimizer, model, grads)
    return loss, grads

  # The reference: the Linen model, trained with optax directly.
  params = variables['params']
  others = {col: tree for col, tree in variables.items() if col != 'params'}
  opt_state = tx.init(params)

  @jax.jit
  def linen_step(params, opt_state, tokens, targets):
    def loss_fn(params):
      logits = linen_model.apply({'params': params, **others}, tokens, **kwargs)
      return task.cross_entropy(logits, targets)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  for _ in range(STEPS):
    loss, grads = nnx_step(model, optimizer, tokens, targets)
    params, opt_state, linen_loss, linen_grads = linen_step(
        params, opt_state, tokens, targets)
    assert_close(loss, linen_loss)
    assert_close(nnx.to_pure_dict(grads), linen_grads)
  # And back: the NNX model's variables are the Linen-trained ones.
  assert_close(linen_variables(model, variables), {'params': params, **others})


# -- NNX -> Linen -------------------------------------------------------------


class SharedMLP(nnx.Module):
  """One ``Linear`` used twice: a shared reference, stored once."""

  def __init__(self, features, *, rngs):
    self.up = nnx.Linear(features, features, rngs=rngs)
    self.down = self.up

  def __call__(self, x):
    return self.down(jax.nn.relu(self.up(x)))


class Block(nn.Module):

  @nn.compact
  def __call__(self, x):
    return x + nnx.bridge.to_linen(SharedMLP, x.shape[-1], name='mlp')(x)


class Model(nn.Module):
  remat: bool = True

  @nn.compact
  def __call__(self, x):
    block = nn.remat(Block) if self.remat else Block
    for i in range(2):
      x = block(name=f'block_{i}')(x)
    return x


def test_nnx_shared_submodule_in_rematted_linen_blocks():
  x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
  params = Model().init(jax.random.key(0), x)['params']
  for i in range(2):  # the shared Linear is stored once per block
    (name,) = params[f'block_{i}']['mlp']
    assert set(params[f'block_{i}']['mlp'][name]) == {'kernel', 'bias'}

  loss, grads = jax.value_and_grad(
      lambda p: (Model().apply({'params': p}, x) ** 2).sum())(params)

  # The reference: the NNX modules themselves, holding the same parameters.
  modules = []
  for i in range(2):
    module = SharedMLP(4, rngs=nnx.Rngs(i))
    state = nnx.state(module, nnx.Param)
    nnx.replace_by_pure_dict(state, params[f'block_{i}']['mlp'])
    nnx.update(module, state)
    modules.append(module)

  def nnx_loss(modules):
    y = x
    for module in modules:
      y = y + module(y)
    return (y ** 2).sum()

  nnx_value, nnx_grads = nnx.value_and_grad(nnx_loss)(modules)
  assert_close(loss, nnx_value)
  assert_close(
      grads, {f'block_{i}': {'mlp': nnx.to_pure_dict(g)}
              for i, g in enumerate(nnx_grads)})
