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


"""Pytest plugin: run a test suite with the flax_tieext patch installed.

Usage::

  pytest -p flax_tieext.testing.autopatch tests/

The patch is installed while pytest loads this plugin, before any test module
is collected or imported, so test modules that bind ``nn.remat`` & co. at import
time see the patched transforms. It is installed even when
``FLAX_TIEEXT_AUTOPATCH=0`` is set: asking for this plugin is asking for the
patch. If the installed Flax cannot be patched, the run stops here with
``flax_tieext.PatchError`` instead of silently testing unpatched Flax.
"""

import flax_tieext

flax_tieext.install()


def pytest_configure(config):
  del config  # unused
  if not flax_tieext.is_installed():
    raise RuntimeError(
        'flax_tieext.testing.autopatch: the flax_tieext patch is not installed'
        ' (something called flax_tieext.uninstall() while pytest was starting).'
    )


def pytest_report_header(config):
  del config  # unused
  from flax_tieext import _compat  # pylint: disable=g-import-not-at-top

  flax = f'flax {_compat.FLAX_VERSION} (jax {_compat.JAX_VERSION})'
  return f'flax_tieext {flax_tieext.__version__}: patch installed into {flax}'
