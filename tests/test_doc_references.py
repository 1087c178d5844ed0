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

"""Every reference to this project's code in the docs names something that exists.

A name in backticks that looks like a code path is checked:

* a file path (``tests/test_patch.py``, ``flax_tieext/core/lift.py``,
  ``docs/nnx.md``) must exist, from the repository root or from ``docs/``;
* a dotted name that starts with ``flax_tieext.`` must import, attribute by
  attribute (a trailing call, ``install()``, is dropped);
* a dotted name whose first part is one of the package's own modules
  (``ties.route``, ``tie_spec.normal_form``) must be an attribute of that
  module, wherever in the package it lives;
* a dotted name whose first part is one of the package's own classes
  (``Packed.wrap``) must be an attribute or field of that class;
* a file name outside those folders (``noxfile.py``, ``core/ties.py``,
  ``partitioning.py``) must exist in the repository, in the package, or in
  the installed Flax (whose files the pages cite too);
* a ``flax.`` name must not put one of the package's modules inside Flax
  (``flax.core.tie_lift``): no Flax release has them.

Flax's and JAX's names are not checked otherwise: which exist depends on the
release, and the pages' examples (``tests/test_docs_examples.py``) run them.
Nor are Flax's own test files (``tests/linen/...``, ``*_test.py``: they are in
its sdist, not in the installed package), build
outputs, placeholders (``docs/upstream/NN-name.md``, ``flax_tieext.X``), or
CHANGELOG.md, which records names as they were when each change was made.
"""

import dataclasses
import importlib
import importlib.util
import inspect
import os
import pathlib
import pkgutil
import re

import flax
import pytest

import flax_tieext

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
TOP_DIRS = ('flax_tieext/', 'tests/', 'docs/', 'patches/', 'benchmarks/', 'tools/', '.ci/')
SPAN = re.compile(r'(?<!`)`([^`\n]+)`(?!`)')
DOTTED = re.compile(r'[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+')
FLAX_TESTS = re.compile(r'tests/(core|linen|nnx)(/|$)')
BUILD_OUTPUTS = ('docs/_build', '.nox', 'benchmarks/.benchmarks')
PLACEHOLDER = re.compile(r'(^|[/._-])(N+|X)([/._-]|$)')
FILE_SUFFIX = re.compile(r'\.(py|md|toml|cfg|json|png|txt|patch)$')


def _own_modules():
  """Short name -> the package's modules of that name (``ties`` -> core.ties)."""
  modules = {}
  for info in pkgutil.walk_packages(flax_tieext.__path__, 'flax_tieext.'):
    if info.name.rsplit('.', 1)[-1] in {'demo', '__main__'}:
      continue
    modules.setdefault(info.name.rsplit('.', 1)[-1], []).append(info.name)
  return modules


OWN = _own_modules()
FLAX = pathlib.Path(flax.__file__).resolve().parent


def _own_classes():
  """Class name -> the package's classes of that name (``Packed`` -> ...).

  The examples' models are left out: the pages define their own ``Block``.
  """
  classes = {}
  for names in OWN.values():
    for name in names:
      if '.examples' in name:
        continue
      try:
        module = importlib.import_module(name)
      except Exception:  # pylint: disable=broad-except
        continue  # e.g. NNX tree mode on a Flax without it
      for attr, value in vars(module).items():
        if inspect.isclass(value) and value.__module__ == name:
          classes.setdefault(attr, []).append(value)
  return classes


def _file_names(top, skip=()):
  """The names of the files under ``top``, outside dot-folders and ``skip``."""
  names = set()
  for folder, dirs, files in os.walk(top):
    dirs[:] = [d for d in dirs if not d.startswith('.') and d not in skip
               and not d.endswith('.egg-info')]
    names.update(files)
  return names


CLASSES = _own_classes()
FILE_NAMES = (_file_names(ROOT, skip={'_build', '__pycache__'})
              | _file_names(FLAX))


FILE_ROOTS = (ROOT, ROOT / 'docs', ROOT / 'flax_tieext', FLAX, FLAX.parent)


def _has(cls, attr):
  """Whether ``cls.attr`` exists, a dataclass field without a default too."""
  if dataclasses.is_dataclass(cls):
    if attr in {f.name for f in dataclasses.fields(cls)}:
      return True
  return hasattr(cls, attr)


def _resolves(dotted):
  """Whether ``a.b.c`` names a module or an attribute chain that exists."""
  parts = dotted.split('.')
  for cut in range(len(parts), 0, -1):
    try:
      spec = importlib.util.find_spec('.'.join(parts[:cut]))
    except ImportError:
      continue
    if spec is None:
      continue
    if cut == len(parts):
      # A module is named, not used: it exists whether or not this Flax can
      # run it (the NNX tree-mode example raises on releases without it).
      return True
    obj = importlib.import_module('.'.join(parts[:cut]))
    for name in parts[cut:]:
      if not hasattr(obj, name):
        return False
      obj = getattr(obj, name)
    return True
  return False


def _problem(span):
  """What is wrong with the code reference ``span`` (None: fine or not one)."""
  text = span.strip()
  if PLACEHOLDER.search(text) or FLAX_TESTS.match(text) or text.startswith(BUILD_OUTPUTS):
    return None
  if text.startswith(TOP_DIRS) and not re.search(r'\s|[*<>{}$]|::', text):
    path = text.split(':')[0].rstrip('/')
    if not ((ROOT / path).exists() or (ROOT / 'docs' / path).exists()):
      return f'no file {path}'
    return None
  if FILE_SUFFIX.search(text) and re.fullmatch(r'[\w./-]+', text):
    if '/' not in text:
      if text.endswith('_test.py'):
        return None  # Flax's tests (ours are test_*.py), not installed
      return None if text in FILE_NAMES else f'no file {text}, here or in Flax'
    if not any((top / text).exists() for top in FILE_ROOTS):
      return f'no file {text} (from the root, docs/, flax_tieext/ or Flax)'
    return None
  match = DOTTED.fullmatch(re.sub(r'\(.*\)$', '', text))
  if not match or FILE_SUFFIX.search(text):
    return None
  dotted = match.group(0)
  head, _, rest = dotted.partition('.')
  if head == 'flax_tieext':
    return None if _resolves(dotted) else f'{dotted} does not exist'
  if head == 'flax':
    parts = dotted.split('.')
    for cut in range(1, len(parts)):
      if parts[cut] in OWN and not _resolves('.'.join(parts[:cut + 1])):
        plugin = ', '.join(OWN[parts[cut]])
        return f'{".".join(parts[:cut + 1])} is not Flax\'s; the plugin has {plugin}'
    return None
  if head in CLASSES:
    attr = rest.split('.')[0]
    if not any(_has(cls, attr) for cls in CLASSES[head]):
      return f'{dotted}: no {attr} in {head}'
    return None
  if head in OWN and head not in {'linen', 'nnx', 'core', 'lift', 'transforms', 'testing'}:
    attr = rest.split('.')[0]
    owners = OWN[head]
    modules = [m for m in map(_imported, owners) if m is not None]
    # Checked where a module imports (NNX tree mode: not on every release).
    if modules and not any(hasattr(m, attr) for m in modules):
      return f'{dotted}: no {attr} in {", ".join(owners)}'
  return None


def _imported(name):
  """The module ``name``, or None where this Flax cannot import it."""
  try:
    return importlib.import_module(name)
  except Exception:  # pylint: disable=broad-except
    return None


def _references():
  for page in PAGES:
    for number, line in enumerate(page.read_text().splitlines(), 1):
      for span in SPAN.findall(line):
        yield page.relative_to(ROOT), number, span


def test_the_checker_catches_what_it_is_for():
  assert _problem('ties.refuse_declared_inside')
  assert _problem('flax_tieext.no_such_name')
  assert _problem('tests/no_such_test.py')
  assert _problem('flax_tieext.install()') is None
  assert _problem('tests/test_patch.py') is None
  assert _problem('jax.checkpoint') is None  # not ours: not checked
  assert _problem('tests/linen/linen_transforms_test.py') is None  # Flax's
  assert _problem('core/no_such_module.py')
  assert _problem('no_such_file.py')
  assert _problem('core/ties.py') is None  # in the package
  assert _problem('partitioning.py') is None  # Flax's linen/partitioning.py
  assert _problem('flax/core/lift.py') is None  # Flax's
  assert _problem('linen_linear_test.py') is None  # Flax's sdist
  assert _problem('Packed.no_such_method')
  assert _problem('Packed.wrap') is None
  assert _problem('Tie.target') is None  # a dataclass field
  assert _problem('flax.core.tie_lift')
  assert _problem('flax.core.lift') is None


@pytest.mark.parametrize('page', [p.relative_to(ROOT) for p in PAGES], ids=str)
def test_every_code_reference_names_something_that_exists(page):
  wrong = [f'{p}:{n}: `{span}`: {why}'
           for p, n, span in _references() if p == page
           for why in [_problem(span)] if why]
  assert not wrong, '\n'.join(wrong)


def test_a_module_is_found_without_running_it(tmp_path, monkeypatch):
  # flax_tieext.examples.nnx_tree raises at import on a Flax without NNX tree
  # mode: the page names it, and it exists, on every release.
  (tmp_path / 'raises_on_import.py').write_text('raise RuntimeError("no")\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert _resolves('raises_on_import')
  assert not _resolves('raises_on_import_not_here')
