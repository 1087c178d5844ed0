"""A tied (ALBERT-style) BERT converts to transformers' FlaxBert and back.

ALBERT shares one encoder layer across all depths. Built from FlaxBert's own
modules, with ``nn.tie`` tying ``encoder/layer/<i>`` to ``encoder/layer/0``
and FlaxBert's gradient checkpointing on (its ``nn.partitioning.remat`` with
``static_argnums``), the tied model stores one layer. Trained a few steps and
checkpointed with Orbax, its restored state exported by ``untie_variables`` is
exactly the parameter tree of an untied ``FlaxBertModel`` of the same config,
which computes the same outputs; ``tie_variables`` imports it back, and
refuses it once the untied copies have been trained apart.

Needs transformers (``nox -s clients``).
"""

# Before transformers, which binds nn.partitioning.remat at import time.
import flax_tieext  # pylint: disable=g-bad-import-order

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from transformers import BertConfig
from transformers import FlaxBertModel
from transformers.models.bert.modeling_flax_bert import FlaxBertModule

LAYERS = 4
CONFIG = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=LAYERS,
                    num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=32)
TIES = {f'encoder/layer/{i}': 'encoder/layer/0' for i in range(1, LAYERS)}


def _inputs(seed):
  ids = jax.random.randint(jax.random.key(seed), (4, 16), 1, CONFIG.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  return ids, jnp.ones_like(ids), jnp.zeros_like(ids), positions


def _max_abs_difference(a, b):
  return max(float(np.max(np.abs(x - y))) for x, y in
             zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.fixture(scope='module')
def tied_model():
  return nn.tie(FlaxBertModule, TIES)(config=CONFIG, gradient_checkpointing=True)


@pytest.fixture(scope='module')
def restored(tied_model, tmp_path_factory):
  """The tied model's variables after 3 adamw steps, through Orbax."""
  inputs = _inputs(0)
  params = tied_model.init(jax.random.key(0), *inputs)['params']
  tx = optax.adamw(1e-2)
  target = jax.random.normal(jax.random.key(1), (4, 16, CONFIG.hidden_size))

  @jax.jit
  def step(params, opt_state):
    def loss(params):
      hidden = tied_model.apply({'params': params}, *inputs)[0]
      return jnp.mean((hidden - target) ** 2)
    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = tx.init(params)
  for _ in range(3):
    params, opt_state = step(params, opt_state)
  path = tmp_path_factory.mktemp('tied') / 'checkpoint'
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, {'params': params})
  checkpointer.wait_until_finished()
  return checkpointer.restore(path)


def test_tied_model_stores_one_layer(restored):
  assert list(restored['params']['encoder']['layer']) == ['0']


def test_untied_export_is_flax_berts_layout_and_computes_the_same(
    tied_model, restored):
  untied = flax_tieext.untie_variables(restored, TIES)
  bert = FlaxBertModel(CONFIG, seed=0)  # its own freshly initialized params
  shapes = lambda tree: jax.tree_util.tree_map(jnp.shape, tree)
  assert shapes(untied['params']) == shapes(bert.params)

  inputs = _inputs(2)
  expected = tied_model.apply(restored, *inputs)
  got = bert(*inputs, params=untied['params'])
  np.testing.assert_allclose(got.last_hidden_state, expected[0], rtol=1e-6,
                             atol=1e-6)
  np.testing.assert_allclose(got.pooler_output, expected[1], rtol=1e-6,
                             atol=1e-6)
  # The trained layer differs from a fresh one: the export carries it.
  assert _max_abs_difference(untied['params']['encoder'],
                             bert.params['encoder']) > 0


def test_tie_variables_imports_the_export_back(restored):
  untied = flax_tieext.untie_variables(restored, TIES)
  back = flax_tieext.tie_variables(untied, TIES)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, restored)


def test_untied_copies_trained_apart_are_refused(restored):
  untied = flax_tieext.untie_variables(restored, TIES)
  layer = untied['params']['encoder']['layer']['3']
  dense = layer['intermediate']['dense']
  layer['intermediate']['dense'] = {**dense, 'bias': dense['bias'] + 1e-3}
  with pytest.raises(flax_tieext.TieError, match='encoder/layer/3') as refused:
    flax_tieext.tie_variables(untied, TIES)
  assert 'encoder/layer/0' in str(refused.value)
