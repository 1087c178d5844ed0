"""Shared test configuration."""

import os

import jax

# Tests compare against references computed in float32 on CPU.
jax.config.update('jax_platforms', 'cpu') if 'JAX_PLATFORMS' not in os.environ else None
