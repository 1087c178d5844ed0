"""Shared test configuration."""

import os

# The sharding tests run on an 8-device CPU mesh. XLA reads this flag when JAX
# initializes its backend, so it must be set before the first computation.
if '--xla_force_host_platform_device_count' not in os.environ.get(
    'XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '')
      + ' --xla_force_host_platform_device_count=8').strip()
