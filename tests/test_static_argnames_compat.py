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

"""Upstream behaviours that static_argnames must not change.

Calls written for upstream Flax (positional static_argnums in either
numbering, HF transformers' ``nn.partitioning.remat(..., static_argnums=(5,
6, 7))``, recurrentgemma's ``nn.remat(..., static_argnums=4)``, no static
arguments at all) give the plain, un-rematted result, and, where the patch is
installed, exactly what upstream's own functions give: outputs, gradients and
variable trees (whose auto-generated names come from the transform's name).
"""

import flax
import flax.linen as nn
import flax.linen.partitioning  # pylint: disable=unused-import
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_tieext
from flax_tieext import lift as ext_lift
from flax_tieext import linen as ext_nn
from static_models import MLP
from tie_models import assert_trees_close, assert_trees_equal

needs_patch = pytest.mark.needs_patch

X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
MASK = jnp.array([1.0, 0.0])
RNGS = {'dropout': jax.random.key(3)}


def _with_upstream_flax(fn):
  """Runs ``fn`` with Flax's own transforms (the patch uninstalled)."""
  assert flax_tieext.is_installed()
  flax_tieext.uninstall()
  try:
    return fn()
  finally:
    flax_tieext.install()


# -- HF transformers: partitioning.remat counting without self ------------------


class HFLayer(nn.Module):
  """FlaxBertLayer's signature; indices 5, 6, 7 without self are flags."""

  @nn.compact
  def __call__(self, hidden_states, attention_mask, layer_head_mask,
               encoder_hidden_states=None, encoder_attention_mask=None,
               init_cache=False, deterministic=True, output_attentions=False):
    h = nn.Dense(4)(hidden_states) * attention_mask[:, None]
    if init_cache:
      h = h + 1.0
    h = nn.Dropout(0.2, deterministic=deterministic)(h)
    return (h, h.sum(-1)) if output_attentions else (h,)


class HFEncoder(nn.Module):
  """FlaxBertLayerCollection: remat by partitioning.remat, called positionally."""

  gradient_checkpointing: bool
  named: bool = True

  @nn.compact
  def __call__(self, h, mask, deterministic=True, output_attentions=False):
    layer = HFLayer
    if self.gradient_checkpointing:
      layer = nn.partitioning.remat(HFLayer, static_argnums=(5, 6, 7))
    for i in range(2):
      name = str(i) if self.named else None
      outputs = layer(name=name)(
          h, mask, None, None, None, False, deterministic, output_attentions
      )
      h = outputs[0]
    return outputs


def _run_encoder(encoder, variables, deterministic, output_attentions):
  def loss(v):
    out = encoder.apply(v, X, MASK, deterministic, output_attentions, rngs=RNGS)
    return sum(o.sum() for o in out), out

  (_, out), grads = jax.value_and_grad(loss, has_aux=True)(variables)
  return out, grads


@needs_patch
@pytest.mark.parametrize('deterministic', [True, False])
@pytest.mark.parametrize('output_attentions', [True, False])
def test_hf_partitioning_remat_matches_plain_layers(deterministic, output_attentions):
  variables = HFEncoder(False).init(jax.random.key(0), X, MASK)
  expected = _run_encoder(HFEncoder(False), variables, deterministic, output_attentions)
  got = _run_encoder(HFEncoder(True), variables, deterministic, output_attentions)
  assert_trees_close(got, expected)


@needs_patch
def test_hf_partitioning_remat_matches_upstream_including_names():
  # named=False: the layers get auto names derived from the transformed class
  # (Core_remat_staticHFLayer_0 upstream), which saved checkpoints depend on.
  def run():
    encoder = HFEncoder(True, named=False)
    variables = encoder.init(jax.random.key(0), X, MASK)
    return variables, _run_encoder(encoder, variables, False, True)

  assert_trees_equal(run(), _with_upstream_flax(run))


# -- recurrentgemma: nn.remat counting with self --------------------------------


class ResidualBlock(nn.Module):

  @nn.compact
  def __call__(self, x, segment_pos, cache, return_cache=True):
    y = nn.Dense(4)(x) + segment_pos
    new_cache = (y * 2.0).sum(0) if return_cache else None
    return x + y, new_cache


class Griffin(nn.Module):
  remat: bool
  named: bool = True

  @nn.compact
  def __call__(self, x, return_cache=True):
    block = ResidualBlock
    if self.remat:
      block = nn.remat(ResidualBlock, static_argnums=4)
    cache = None
    for i in range(2):
      name = f'blocks_{i}' if self.named else None
      x, cache = block(name=name)(x, 1.0, cache, return_cache)
    return x, cache


def _run_griffin(model, variables, return_cache):
  def loss(v):
    out = model.apply(v, X, return_cache)
    return sum(o.sum() for o in jax.tree_util.tree_leaves(out)), out

  (_, out), grads = jax.value_and_grad(loss, has_aux=True)(variables)
  return out, grads


@needs_patch
@pytest.mark.parametrize('return_cache', [True, False])
def test_recurrentgemma_remat_matches_plain_blocks(return_cache):
  variables = Griffin(False).init(jax.random.key(0), X)
  assert_trees_close(
      _run_griffin(Griffin(True), variables, return_cache),
      _run_griffin(Griffin(False), variables, return_cache),
  )


@needs_patch
def test_recurrentgemma_remat_matches_upstream_including_names():
  def run():
    model = Griffin(True, named=False)
    variables = model.init(jax.random.key(0), X, False)
    return variables, _run_griffin(model, variables, False)

  assert_trees_equal(run(), _with_upstream_flax(run))


# -- positional static_argnums in both numberings, and no static arguments ----


class Plain(nn.Module):

  @nn.compact
  def __call__(self, x, scale):
    return jnp.tanh(nn.Dense(4)(x)) * scale


UPSTREAM_CALLS = {
    # id: (wrap, init args, apply args, apply kwargs)
    'nn.remat-2': (lambda: nn.remat(MLP, static_argnums=2), (X, True), (X, True), {}),
    'nn.checkpoint-(2,)': (
        lambda: nn.checkpoint(MLP, static_argnums=(2,)), (X, True), (X, False),
        {'rngs': RNGS},
    ),
    'partitioning-(1,)': (
        lambda: nn.partitioning.remat(MLP, static_argnums=(1,)), (X, True),
        (X, False), {'rngs': RNGS},
    ),
    'nn.remat-none': (lambda: nn.remat(Plain), (X, 2.0), (X, 2.0), {}),
    'partitioning-none': (
        lambda: nn.partitioning.remat(Plain), (X, 2.0), (X, 2.0), {}
    ),
    'nn.remat-policy': (
        lambda: nn.remat(
            Plain, prevent_cse=False,
            policy=jax.checkpoint_policies.nothing_saveable,
        ),
        (X, 2.0), (X, 2.0), {},
    ),
}


@needs_patch
@pytest.mark.parametrize('case', list(UPSTREAM_CALLS))
def test_upstream_calls_match_upstream(case):
  wrap, init_args, args, kwargs = UPSTREAM_CALLS[case]

  def run():
    module = wrap()()
    variables = module.init(jax.random.key(0), *init_args)
    loss = lambda v: module.apply(v, *args, **kwargs).sum()
    return (
        type(module).__name__,
        variables,
        module.apply(variables, *args, **kwargs),
        jax.grad(loss)(variables),
    )

  assert_trees_equal(run(), _with_upstream_flax(run))


def test_no_static_arguments_matches_plain():
  variables = Plain().init(jax.random.key(0), X, 2.0)
  for wrap in (ext_nn.remat, ext_nn.partitioning.remat):
    remat = wrap(Plain)
    np.testing.assert_array_equal(
        remat().apply(variables, X, 2.0), Plain().apply(variables, X, 2.0)
    )
    np.testing.assert_array_equal(
        remat().apply(variables, X, scale=2.0), Plain().apply(variables, X, 2.0)
    )


@needs_patch
def test_lift_positional_static_argnums_matches_upstream():
  def fn(scope, x, activation):
    w = scope.param('w', nn.initializers.lecun_normal(), (x.shape[-1], 3))
    y = x @ w
    return jax.nn.relu(y) if activation == 'relu' else jnp.tanh(y)

  def run():
    rematted = flax.core.lift.remat(fn, static_argnums=(1,))
    y, variables = flax.core.init(rematted)(jax.random.key(0), X, 'tanh')
    grads = jax.grad(
        lambda v: flax.core.apply(rematted)(v, X, 'tanh').sum())(variables)
    return y, variables, grads

  assert_trees_equal(run(), _with_upstream_flax(run))


# -- scan over remat (openpi's layout), with the index fixed and by name -------


class Block(nn.Module):

  @nn.compact
  def __call__(self, xs, kv_cache, positions, attn_mask, adarms_cond,
               deterministic=True):
    y = nn.Dropout(0.1, deterministic=deterministic)(nn.Dense(4)(xs))
    return xs + y, None


class Stack(nn.Module):
  block: type

  @nn.compact
  def __call__(self, x, deterministic=True):
    scanned = nn.scan(
        self.block,
        variable_axes={'params': 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=(nn.broadcast,) * 5,
        length=3,
    )
    x, _ = scanned(name='layers')(x, None, None, None, None, deterministic)
    return x


@pytest.mark.parametrize(
    'block',
    [
        pytest.param(lambda: ext_nn.remat(Block, static_argnums=(6,), prevent_cse=False),
                     id='nn.remat-(6,)'),
        pytest.param(lambda: ext_nn.remat(Block, static_argnames='deterministic'),
                     id='nn.remat-name'),
        pytest.param(lambda: ext_nn.partitioning.remat(Block, static_argnums=5),
                     id='nn.partitioning.remat-5'),
    ],
)
@pytest.mark.parametrize('deterministic', [  # dropout off: with --end-to-end
    pytest.param(True, marks=pytest.mark.end_to_end), False])
def test_scan_over_remat_matches_plain_scan(block, deterministic):
  variables = Stack(Block).init(jax.random.key(0), X)

  def run(model):
    def loss(v):
      y = model.apply(v, X, deterministic, rngs=RNGS)
      return y.sum(), y

    (_, y), grads = jax.value_and_grad(loss, has_aux=True)(variables)
    return y, grads

  assert_trees_close(run(Stack(block())), run(Stack(Block)))


def test_lift_without_static_arguments_passes_keywords_like_upstream():
  def fn(scope, x, *, scale):
    return x * scale

  y, _ = flax.core.init(ext_lift.checkpoint(fn))(jax.random.key(0), X, scale=3.0)
  np.testing.assert_array_equal(y, X * 3.0)


@needs_patch
@pytest.mark.parametrize('wrap', [
    pytest.param(lambda remat: remat(MLP, concrete=True), id='nn.remat'),
    pytest.param(lambda remat: remat(MLP, static_argnums=2, concrete=True),
                 id='nn.remat-argnums'),
])
def test_concrete_does_what_upstream_does_on_this_jax(wrap):
  # jax 0.12's jax.checkpoint has no `concrete`; Flax raises
  # NotImplementedError itself on recent releases, older ones pass it to
  # jax.checkpoint, which raises. Whatever upstream does here, we do.
  def run():
    try:
      wrap(nn.remat)().init(jax.random.key(0), X, True)
    except Exception as e:  # pylint: disable=broad-except
      return type(e)
    return None

  expected = _with_upstream_flax(run)
  assert expected is not None
  assert run() is expected
