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

"""What the test harness shares: Python interpreters, Flax sdists, JUnit reports.

Used by ``noxfile.py`` and ``.ci/summary.py``; a tool elsewhere imports it with
``sys.path.insert(0, str(ROOT / '.ci')); import harness``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import urllib.request
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
SDISTS = ROOT / '.nox' / '_sdists'
SIMPLE_INDEX = 'https://pypi.org/simple/flax/'
# Flax's tests of nnx.remat, the one NNX transform the plugin replaces, in its
# sdist: `-k remat` selects TestRemat and the tests of remat inside other
# transforms (19 of the 530 in Flax 0.12.8's file; the rest test transforms it
# does not change).
NNX_REMAT_TESTS = ('tests/nnx/transforms_test.py', '-k', 'remat')


def compilation_cache(directory: pathlib.Path) -> dict[str, str]:
  """The environment for JAX's persistent compilation cache in ``directory``.

  Every program is written, however small or fast to compile: an entry is
  keyed by program, JAX version and flags, so a hit is the program a miss
  would compile.
  """
  return {
      'JAX_COMPILATION_CACHE_DIR': str(directory),
      'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
      'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0',
  }



def find_python(version: str) -> str | None:
  """An interpreter of Python ``version`` (``'3.13'``) that runs, or None.

  ``python3.13`` on ``PATH`` if it runs (a pyenv shim answers only when
  ``PYENV_VERSION`` names its version), else pyenv's own
  ``$PYENV_ROOT/versions/3.13.*/bin/python3.13``.
  """
  pyenv = pathlib.Path(os.environ.get('PYENV_ROOT', '~/.pyenv')).expanduser()
  installed = sorted(pyenv.glob(f'versions/{version}.*/bin/python{version}'))
  for exe in filter(None, [shutil.which(f'python{version}'), *installed]):
    try:
      found = subprocess.run(
          [exe, '-c', 'import sys; print("%d.%d" % sys.version_info[:2])'],
          capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
      continue
    if found.returncode == 0 and found.stdout.strip() == version:
      return str(exe)
  return None


# The sha256 of each Flax sdist we use, as PyPI lists it
# (https://pypi.org/simple/flax/). A downloaded sdist must match.
FLAX_SDIST_SHA256 = {
    '0.8.5': '4a9cb7950ece54b0addaa73d77eba24e46138dbe783d01987be79d20ccb2b09b',
    '0.9.0': '8b7f361eed0f5324e81f9dc8d02ea53da5f993d7c2e37e7aa5b37d3f6331dd53',
    '0.10.7': '2930d6671e23076f6db3b96afacf45c5060898f5c189ecab6dda7e05d26c2085',
    '0.11.2': '55452529b70c704128075a17f7a54d94f1f90b0f2d9498bdc9578cae3646e460',
    '0.12.0': 'cb3d4a2028666640c1a2e5b267dadfbd42ef14c6db41896fb4c765a7f05ebe74',
    '0.12.8': '1bb438775b967a3f1f42b9c3d4ddf1d2883cd6406589f9cecdc244634036bdc4',
    '0.12.12': '103cc503c94219513b73027aa0e93aac408adfd3fcdfb1df85e9d147219e4896',
}


class SdistError(RuntimeError):
  """A Flax sdist is unknown here or does not match its sha256."""


def flax_sdist(version: str) -> pathlib.Path:
  """Flax ``version``'s sdist from PyPI (cached in ``.nox/_sdists``), sha256-checked.

  Raises:
    SdistError: for a version without a recorded sha256, or a file that does
      not match it (it is deleted, so that the next call downloads it again).
  """
  if version not in FLAX_SDIST_SHA256:
    raise SdistError(
        f'no sha256 recorded for the flax {version} sdist: add it to'
        ' FLAX_SDIST_SHA256 in .ci/harness.py (https://pypi.org/simple/flax/).'
    )
  tarball = SDISTS / f'flax-{version}.tar.gz'
  if not tarball.exists():
    # From PyPI's simple index, as pip finds it; no pip needed (uv's
    # environments have none).
    index = urllib.request.urlopen(SIMPLE_INDEX, timeout=120).read().decode()
    url = re.search(rf'href="([^"#]*/{re.escape(tarball.name)})[#"]', index)
    if url is None:
      raise SdistError(f'{SIMPLE_INDEX} lists no {tarball.name}')
    SDISTS.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix('.part')
    urllib.request.urlretrieve(url.group(1), partial)
    partial.rename(tarball)
  digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
  if digest != FLAX_SDIST_SHA256[version]:
    tarball.unlink()
    raise SdistError(
        f'{tarball} has sha256 {digest}, expected'
        f' {FLAX_SDIST_SHA256[version]} (PyPI); deleted it.'
    )
  return tarball


def extract(tarball: pathlib.Path, dest: pathlib.Path, keep=lambda rel: True):
  """Extracts the files of an sdist whose path (without the top directory) ``keep`` accepts."""
  with tarfile.open(tarball) as tar:
    members = []
    for member in tar.getmembers():
      _, _, rel = member.name.partition('/')
      if rel and keep(rel):
        member.name = rel
        members.append(member)
    tar.extractall(dest, members=members, filter='data')
  return dest


# -- JUnit reports ---------------------------------------------------------------


def outcomes(xml: pathlib.Path) -> dict[str, str]:
  """``{test id: 'passed' | 'failed' | 'error' | 'skipped'}`` of a JUnit report."""
  found = {}
  for case in ET.parse(xml).getroot().iter('testcase'):
    tags = {child.tag for child in case}
    outcome = next(
        (o for tag, o in (('error', 'error'), ('failure', 'failed'),
                          ('skipped', 'skipped')) if tag in tags),
        'passed',
    )
    found[f"{case.get('classname')}::{case.get('name')}"] = outcome
  return found


def counts(found: dict[str, str]) -> collections.Counter:
  return collections.Counter(
      {'passed': 0, 'failed': 0, 'skipped': 0, 'error': 0, **collections.Counter(found.values())}
  )


def describe(c: collections.Counter) -> str:
  return (
      f"{c['passed']:>5} passed, {c['failed']:>4} failed, {c['skipped']:>3} skipped,"
      f" {c['error']:>3} errors"
  )
