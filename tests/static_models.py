"""Shared fixtures of the static-argument tests: models, input, what is shown.

``MLP`` is the field report's model and the MLP of the docs' short answer:
``deterministic`` is a flag that ``nn.Dropout`` branches on in Python, so it
must be static under remat. ``Configured`` takes widths and a mode string;
``Star`` gets its flag through ``*args``. ``X`` is the input of the message
tests, ``ENTRIES`` the Linen transforms they run under.

:func:`shown` is what a user sees of an error: its message and its notes;
:func:`raised` is what is shown of the error a call raises.
The messages name a model by its ``__qualname__``: one defined here is named
as it is in the docs (``MLP.__call__``).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from flax_tieext import linen as ext_nn

# The Linen entry points, each with the static_argnums index of the first
# argument after `self`: nn.checkpoint (nn.remat is the same object) counts
# `self`, nn.partitioning.remat does not. With the patch installed, Flax's
# names are these objects (tests/test_patch.py).
ENTRIES = [
    pytest.param(ext_nn.checkpoint, 1, id='nn.checkpoint'),
    pytest.param(ext_nn.partitioning.remat, 0, id='nn.partitioning.remat'),
]

X = jnp.ones((2, 3))


class MLP(nn.Module):
  """A Dense layer, then dropout that ``deterministic`` switches off."""

  @nn.compact
  def __call__(self, x, deterministic=False):
    x = nn.Dense(4)(x)
    return nn.Dropout(0.5, deterministic=deterministic)(x)


class Configured(nn.Module):
  """A static tuple of widths and a mode string, both with defaults."""

  @nn.compact
  def __call__(self, x, layers=(4,), mode='relu'):
    for width in layers:
      x = nn.Dense(width)(x)
    return jax.nn.relu(x) if mode == 'relu' else x


class Star(nn.Module):
  """A flag reaching the method through ``*args``, next to ``**kwargs``."""

  @nn.compact
  def __call__(self, x, *args, **kwargs):
    (train,) = args
    return nn.Dropout(0.5, deterministic=not train)(nn.Dense(4)(x))


def shown(error: BaseException) -> str:
  """The full text a user sees of ``error``: its message and any notes."""
  return '\n'.join([str(error), *getattr(error, '__notes__', ())])


def raised(error_type, fn, *args, **kwargs) -> str:
  """What is :func:`shown` of the ``error_type`` that ``fn(*args, **kwargs)`` raises."""
  with pytest.raises(error_type) as info:
    fn(*args, **kwargs)
  return shown(info.value)
