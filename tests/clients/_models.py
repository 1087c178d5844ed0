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


"""Builds small random-initialised real-client models; saves loss and gradients.

Run in a fresh interpreter, once per mode::

  python tests/clients/_models.py reference OUTDIR   # never imports flax_tieext
  python tests/clients/_models.py patched OUTDIR     # imports it first

A fresh interpreter per mode is the honest comparison: HF transformers binds
``remat = nn_partitioning.remat`` when its modelling modules are imported, so
the patch only reaches a library that is imported after ``flax_tieext``.

Every model runs with gradient checkpointing on (that is where the patched
transforms sit: ``nn.partitioning.remat`` in transformers, ``nn.remat`` with
``static_argnums`` in recurrentgemma) and in training mode with a fixed dropout
key, so that the static ``deterministic`` flag takes the dropout path. For each
model ``OUTDIR/<name>.npz`` holds ``loss`` and one array per gradient leaf, or
``OUTDIR/<name>.error`` holds the traceback. No file is downloaded: the models
are built from configs with ``HF_HUB_OFFLINE=1``.
"""

import os
import sys

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

MODE, OUTDIR = sys.argv[1], sys.argv[2]
if MODE == 'patched':
  # Before any client library: they bind the Flax transforms at import time.
  import flax_tieext  # pylint: disable=g-import-not-at-top,unused-import

  if not flax_tieext.is_installed():
    raise SystemExit('flax_tieext did not install its patch')
elif MODE != 'reference':
  raise SystemExit(f'unknown mode {MODE!r}; use reference or patched')

import traceback  # pylint: disable=g-import-not-at-top

from flax import traverse_util  # pylint: disable=g-import-not-at-top
from flax.linen import partitioning as nn_partitioning  # pylint: disable=g-import-not-at-top
import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import optax  # pylint: disable=g-import-not-at-top

BATCH, LENGTH, VOCAB = 2, 8, 64


def _clip_accepting_a_min_a_max():
  """Lets HF's T5 call ``jnp.clip(x, a_max=...)`` on JAX releases without it."""
  clip = jnp.clip

  def shim(x, min=None, max=None, *, a_min=None, a_max=None, **kwargs):  # pylint: disable=redefined-builtin
    return clip(
        x,
        min if a_min is None else a_min,
        max if a_max is None else a_max,
        **kwargs,
    )

  return shim


jnp.clip = _clip_accepting_a_min_a_max()


def _tokens(seed, shape=(BATCH, LENGTH)):
  # Ids >= 3 stay clear of pad / bos / eos ids.
  return jax.random.randint(jax.random.PRNGKey(seed), shape, 3, VOCAB)


def _xent(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _hf_loss_and_grad(model, **inputs):
  """Loss and gradients of an HF Flax model in training mode."""
  from transformers import modeling_flax_utils  # pylint: disable=g-import-not-at-top

  del modeling_flax_utils
  module = sys.modules[type(model.module).__module__]
  # The library must have bound the transform that is current in Flax (the
  # patched one when flax_tieext was imported first).
  assert module.remat is nn_partitioning.remat, (module.remat, nn_partitioning.remat)
  assert model.module.gradient_checkpointing
  labels = inputs.pop('labels')

  def loss_fn(params):
    out = model(**inputs, params=params, train=True, dropout_rng=jax.random.PRNGKey(7))
    return _xent(out.logits, labels)

  return jax.jit(jax.value_and_grad(loss_fn))(model.params)


def bert():
  from transformers import BertConfig, FlaxBertForMaskedLM  # pylint: disable=g-import-not-at-top

  config = BertConfig(
      vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=32, max_position_embeddings=32,
  )
  model = FlaxBertForMaskedLM(config, seed=0, gradient_checkpointing=True)
  ids = _tokens(1)
  return _hf_loss_and_grad(model, input_ids=ids, labels=ids)


def roberta():
  from transformers import FlaxRobertaForMaskedLM, RobertaConfig  # pylint: disable=g-import-not-at-top

  config = RobertaConfig(
      vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=32, max_position_embeddings=32,
  )
  model = FlaxRobertaForMaskedLM(config, seed=0, gradient_checkpointing=True)
  ids = _tokens(2)
  return _hf_loss_and_grad(model, input_ids=ids, labels=ids)


def t5():
  from transformers import FlaxT5ForConditionalGeneration, T5Config  # pylint: disable=g-import-not-at-top

  config = T5Config(
      vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
      num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
      decoder_start_token_id=0,
  )
  model = FlaxT5ForConditionalGeneration(config, seed=0, gradient_checkpointing=True)
  ids, labels = _tokens(3), _tokens(4)
  decoder_ids = jnp.concatenate([jnp.zeros((BATCH, 1), labels.dtype), labels[:, :-1]], axis=1)
  return _hf_loss_and_grad(model, input_ids=ids, decoder_input_ids=decoder_ids, labels=labels)


def whisper():
  from transformers import FlaxWhisperForConditionalGeneration, WhisperConfig  # pylint: disable=g-import-not-at-top

  config = WhisperConfig(
      vocab_size=VOCAB, num_mel_bins=8, d_model=16, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
      decoder_ffn_dim=32, max_source_positions=8, max_target_positions=16,
      decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
      suppress_tokens=[], begin_suppress_tokens=[],
  )
  model = FlaxWhisperForConditionalGeneration(config, seed=0, gradient_checkpointing=True)
  features = jax.random.normal(jax.random.PRNGKey(5), (BATCH, 8, 16))
  labels = _tokens(6)
  decoder_ids = jnp.concatenate([jnp.ones((BATCH, 1), labels.dtype), labels[:, :-1]], axis=1)
  return _hf_loss_and_grad(
      model, input_features=features, decoder_input_ids=decoder_ids, labels=labels
  )


def griffin():
  import recurrentgemma.jax as rg  # pylint: disable=g-import-not-at-top

  config = rg.GriffinConfig(
      vocab_size=VOCAB, width=16, mlp_expanded_width=32, num_heads=2,
      block_types=(rg.TemporalBlockType.RECURRENT, rg.TemporalBlockType.ATTENTION),
      embeddings_scale_by_sqrt_dim=True, attention_window_size=4, logits_soft_cap=30.0,
      lru_width=16,
  )
  model = rg.Griffin(config, gradient_checkpointing=True)
  tokens = _tokens(8)
  segment_pos = jnp.broadcast_to(jnp.arange(LENGTH), (BATCH, LENGTH))
  params = model.init(jax.random.PRNGKey(0), tokens, segment_pos)

  def loss_fn(params):
    logits, _ = model.apply(params, tokens, segment_pos, return_cache=False)
    return _xent(logits[:, :-1], tokens[:, 1:])

  return jax.jit(jax.value_and_grad(loss_fn))(params)


MODELS = {f.__name__: f for f in (bert, roberta, t5, whisper, griffin)}


def main():
  os.makedirs(OUTDIR, exist_ok=True)
  names = sys.argv[3:] or list(MODELS)
  for name in names:
    try:
      loss, grads = MODELS[name]()
      flat = traverse_util.flatten_dict(grads, sep='/')
      arrays = {f'grad:{k}': np.asarray(v) for k, v in flat.items()}
      np.savez(os.path.join(OUTDIR, f'{name}.npz'), loss=np.asarray(loss), **arrays)
      print(f'{MODE} {name}: loss={float(loss):.6f}, {len(flat)} gradient leaves', flush=True)
    except Exception:  # pylint: disable=broad-except
      with open(os.path.join(OUTDIR, f'{name}.error'), 'w') as f:
        f.write(traceback.format_exc())
      print(f'{MODE} {name}: FAILED\n{traceback.format_exc()}', flush=True)


if __name__ == '__main__':
  main()
