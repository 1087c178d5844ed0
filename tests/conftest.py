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

"""Shared test configuration: ``--opted-out-too``, ``--end-to-end``.

``pytest --opted-out-too`` runs the suite twice in one process: every test as
usual (patched at import), and every test once more with the patch uninstalled
(test id suffix ``[opted-out]``), which is what a user with
``FLAX_TIEEXT_AUTOPATCH=0`` runs: ``uninstall()`` restores Flax's exact
original objects (tests/test_patch.py), and interpreters the test starts get
``FLAX_TIEEXT_AUTOPATCH=0``. The version matrix uses it to cover both modes
with one collection, in one process per xdist worker.

Two markers leave a test's opted-out copy out: ``needs_patch`` (it relies on
the patch), and ``own_patch_mode`` (everything it checks runs in interpreters
whose ``FLAX_TIEEXT_AUTOPATCH`` it sets itself, so the copy would repeat it).
A third, ``installs_patch``, keeps the copy and installs the patch for the
test, as a user with ``FLAX_TIEEXT_AUTOPATCH=0`` calls ``flax_tieext.install()``
to use ties (the tie regression tests of issue 16).

Tests marked ``end_to_end`` run the docs' examples, the demo, generated
programs or two-process jobs in fresh interpreters: a third of the suite's
time, for checks of the whole rather than of the library. A plain ``pytest``
leaves them out (and says so in its header) unless given ``--end-to-end`` or
the test file by name; ``nox -s ci`` (so CI) runs them all.
"""

import pathlib

import pytest

import flax_tieext

OPTED_OUT = 'opted-out'


def pytest_addoption(parser):
  parser.addoption(
      '--opted-out-too', action='store_true',
      help='also run each test not marked needs_patch or own_patch_mode with the patch'
           ' uninstalled',
  )
  parser.addoption(
      '--end-to-end', action='store_true',
      help='also run the tests marked end_to_end (docs examples, the demo, the differential'
           ' harness, the FLIP reproducers, two-process jobs: fresh interpreters)',
  )


def pytest_report_header(config):
  if not config.getoption('end_to_end'):
    return ('end_to_end tests (docs examples, demo, differential, FLIP reproducers,'
            ' two-process jobs) are left out unless named: pytest --end-to-end runs them')


def pytest_generate_tests(metafunc):
  if metafunc.config.getoption('opted_out_too'):
    metafunc.fixturenames.append('patch_mode')
    metafunc.parametrize('patch_mode', ['patched', OPTED_OUT], indirect=True)


def pytest_collection_modifyitems(config, items):
  named = {pathlib.Path(arg.split('::')[0]).resolve() for arg in config.args}
  def left_out(item):
    if (item.get_closest_marker('end_to_end') and not config.getoption('end_to_end')
        and item.path not in named):
      return True
    callspec = getattr(item, 'callspec', None)
    return (
        config.getoption('opted_out_too')
        and callspec is not None
        and callspec.params.get('patch_mode') == OPTED_OUT
        and any(item.get_closest_marker(m) for m in ('needs_patch', 'own_patch_mode'))
    )

  drop = [item for item in items if left_out(item)]
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = [item for item in items if not left_out(item)]

@pytest.fixture
def patch_mode(request):
  """Opts the test out of the patch in the opted-out mode.

  The patch is uninstalled for the test's duration, and the interpreters the
  test starts (the demo, pytest runs) see ``FLAX_TIEEXT_AUTOPATCH=0``. Its own
  MonkeyPatch, not the test's: the patch is installed again after the test's
  fixtures have put back what they took from Flax.
  """
  if request.param != OPTED_OUT:
    yield request.param
    return
  with pytest.MonkeyPatch.context() as env:
    env.setenv('FLAX_TIEEXT_AUTOPATCH', '0')
    was_installed = flax_tieext.is_installed()
    flax_tieext.uninstall()
    try:
      yield request.param
    finally:
      if was_installed:
        flax_tieext.install()


@pytest.fixture(autouse=True)
def patch_installed(request):
  """Sets the test's patch mode; installs the patch for ``installs_patch``.

  The mode is requested here: pytest (9 at least) does not set up a fixture
  that ``pytest_generate_tests`` only parametrizes, so without this request
  every opted-out copy would run patched.
  """
  callspec = getattr(request.node, 'callspec', None)
  if callspec is not None and 'patch_mode' in callspec.params:
    request.getfixturevalue('patch_mode')  # opted out first, then install
  if request.node.get_closest_marker('installs_patch') is None:
    yield
    return
  was_installed = flax_tieext.is_installed()
  flax_tieext.install()
  yield
  if not was_installed:
    flax_tieext.uninstall()
