#!/usr/bin/env python3
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

"""Generates ``patches/<flax version>/``: upstream-ready diffs against Flax.

The patches are *generated* from the plugin's own source, never kept by hand.
``flax_tieext/core/lift.py``, ``flax_tieext/linen/transforms.py`` and
``flax_tieext/linen/partitioning.py`` are written as parts of the same-named
Flax files: every top-level definition in them is transplanted, verbatim, into
the pristine Flax file of a release (replacing the definition of the same name,
or added next to its neighbours); only their import blocks differ from
upstream and are dropped. ``flax_tieext/core/ties.py`` becomes the new module
``flax/core/ties.py``. The wiring that the monkeypatch does at run time
(``flax_tieext/_patch.py``) becomes source edits: the Scope methods it wraps are
decorated in ``flax/core/scope.py``, and the new transforms are exported.

For each release in ``RELEASES`` the pristine sdist is fetched (``pip download``,
cached in ``.nox/_sdists``, checked against a pinned sha256), committed to a
temporary git repository, and each feature in ``FEATURES`` is applied and
committed in turn; ``git format-patch`` then writes one patch per feature with
a fixed author, date and subject, so that the output depends only on the
plugin's source and the release.

Guards (any failure stops the run with a message saying what to change):

* every global name a transplanted definition uses must be bound in the
  upstream module after the transplant: our files must stay "written as
  upstream". Names our import block takes from other modules are imported
  upstream as well, translated through ``MODULE_MAP``;
* no ``flax_tieext`` may remain in a patch (``SPELLINGS`` rewrites the plugin's
  public names to Flax's in docstrings and messages, ``MODULE_MAP`` does
  imports in tests), and no ``# section:`` marker;
* the result must compile.

Usage::

  python tools/make_patches.py                  # regenerate patches/
  python tools/make_patches.py --check          # fail if patches/ is stale
  python tools/make_patches.py --apply 0.12.8 DIR  # pristine sdist + series in DIR

Standard library and ``git`` only.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import difflib
import fnmatch
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import symtable
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATCHES = ROOT / 'patches'
# Shared with noxfile.py (`.nox/` is gitignored).
SDIST_CACHE = ROOT / '.nox' / '_sdists'
# Extra directories searched for `flax-<version>.tar.gz` before downloading.
SDIST_PATH_ENV = 'FLAX_TIEEXT_SDIST_PATH'

AUTHOR_NAME = 'flax-tieext'
AUTHOR_EMAIL = 'flax-tieext@users.noreply.github.com'
# Fixed, so that regenerating gives byte-identical patches.
DATE = '2026-01-01T00:00:00+00:00'
COPYRIGHT_YEAR = '2026'


# ---------------------------------------------------------------------------
# What is generated
# ---------------------------------------------------------------------------

# Flax releases a series is generated for -> sha256 of the sdist on PyPI.
# Each is tested by `nox -s patches` with the JAX that noxfile.PINS pairs it
# with. Flax <= 0.9 is left out: its `pack` expects a sixth value
# (invalidate_scopes_fn) from `_partial_pack`, which our `_partial_pack`, written
# as part of the current Flax, does not return.
RELEASES = {
    '0.10.7': '2930d6671e23076f6db3b96afacf45c5060898f5c189ecab6dda7e05d26c2085',
    '0.11.2': '55452529b70c704128075a17f7a54d94f1f90b0f2d9498bdc9578cae3646e460',
    '0.12.0': 'cb3d4a2028666640c1a2e5b267dadfbd42ef14c6db41896fb4c765a7f05ebe74',
    '0.12.8': '1bb438775b967a3f1f42b9c3d4ddf1d2883cd6406589f9cecdc244634036bdc4',
}


@dataclasses.dataclass(frozen=True)
class Transplant:
  """Top-level definitions of one of our files, into the same Flax file.

  Attributes:
    ours: path in this repository.
    upstream: path in the Flax source tree.
    section: take the definitions under ``# section: <section>`` only; ``None``
      takes every definition of the file.
  """

  ours: str
  upstream: str
  section: str | None = None


@dataclasses.dataclass(frozen=True)
class Feature:
  """One patch of the series.

  Attributes:
    subject: the commit subject (and, through git, the patch file name).
    body: the commit message body.
    transplants: definitions transplanted into existing Flax files.
    modules: ``(ours, upstream)``: whole files that become new Flax modules.
    tests: ``(glob, destination)``: our test files, transplanted into Flax's
      test tree; ``{name}`` in the destination is the file's stem without its
      ``test_`` prefix.
    wiring: source edits ``fn(tree: pathlib.Path)`` for what the monkeypatch
      does at run time (decorators, exports).
  """

  subject: str
  body: str
  transplants: tuple[Transplant, ...] = ()
  modules: tuple[tuple[str, str], ...] = ()
  tests: tuple[tuple[str, str], ...] = ()
  wiring: tuple[Callable[[pathlib.Path], None], ...] = ()


# Plugin module -> the Flax module it is (or becomes) upstream. Used to
# translate imports, of transplanted definitions and of tests.
MODULE_MAP = {
    'flax_tieext.core.lift': 'flax.core.lift',
    'flax_tieext.core.ties': 'flax.core.ties',
    'flax_tieext.core': 'flax.core',
    'flax_tieext.linen.transforms': 'flax.linen.transforms',
    'flax_tieext.linen.partitioning': 'flax.linen.partitioning',
    'flax_tieext.linen': 'flax.linen',
}
# Public names of the plugin's root package -> (Flax module, name).
ROOT_NAMES = {
    'core': ('flax', 'core'),
    'linen': ('flax', 'linen'),
    'lift': ('flax.core', 'lift'),
    'TieError': ('flax.core', 'TieError'),
    'tie_variables': ('flax.core', 'tie_variables'),
    'untie_variables': ('flax.core', 'untie_variables'),
}

# How the plugin's public names are spelled in Flax, for docstrings, doctests
# and messages of transplanted code (regular expression -> replacement).
SPELLINGS = (
    (r'(>>> )import flax_tieext\b(?!\.)', r'\1import flax'),
    (r'\bfrom flax_tieext import lift\b', 'from flax.core import lift'),
    (r'\bflax_tieext\.lift\.', 'flax.core.lift.'),
    (r'\bflax_tieext\.linen\.', 'flax.linen.'),
    (r'\bflax_tieext\.(TieError|tie_variables|untie_variables)\b',
     r'flax.core.\1'),
    # The marker ties.py puts on its Scope hooks.
    (r'__flax_tieext_hook__', '__flax_tie_hook__'),
)

# Test markers of our suite that mean nothing to Flax's: lines applying only
# these are dropped from transplanted tests.
PLUGIN_MARKERS = ('needs_patch',)

FLAX_LICENSE_HEADER = f"""\
# Copyright {COPYRIGHT_YEAR} The Flax Authors.
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
"""


class PatchGenerationError(RuntimeError):
  """The plugin's source cannot be turned into an upstream patch as it is."""


# ---------------------------------------------------------------------------
# Reading Python source
# ---------------------------------------------------------------------------

_SECTION = re.compile(r'^# section: (?P<name>.+?)\s*$')
_RULE = re.compile(r'^# -{5,}\s*$')
_DEFINITION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _defined_names(node: ast.stmt) -> list[str]:
  """Names a top-level definition binds (``[]`` for other statements)."""
  if isinstance(node, _DEFINITION):
    return [node.name]
  if isinstance(node, ast.Assign):
    return [t.id for t in node.targets if isinstance(t, ast.Name)]
  if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
    return [node.target.id]
  return []


def _first_line(node: ast.stmt) -> int:
  """1-based first line of ``node``, decorators included."""
  decorators = getattr(node, 'decorator_list', [])
  return min([node.lineno] + [d.lineno for d in decorators])


def _is_marker(line: str) -> bool:
  return bool(_SECTION.match(line) or _RULE.match(line))


def _attached_comments(lines: list[str], first: int) -> int:
  """First line of the comment block directly above line ``first`` (1-based).

  Section markers and horizontal rules are not part of a definition.
  """
  start = first
  while start > 1:
    above = lines[start - 2]
    if not above.startswith('#') or _is_marker(above):
      break
    start -= 1
  return start


@dataclasses.dataclass
class Definition:
  """A top-level definition of one of our files."""

  name: str
  section: str | None
  text: str  # attached comments, decorators and body; no trailing newline


def read_definitions(path: pathlib.Path) -> list[Definition]:
  """Every top-level definition of ``path`` after its import block, in order."""
  source = strip_plugin_only(path.read_text(), _rel(path))
  lines = source.splitlines()
  tree = ast.parse(source, str(path))
  sections = [
      (i + 1, m.group('name'))
      for i, line in enumerate(lines)
      if (m := _SECTION.match(line))
  ]
  out = []
  for k, node in enumerate(tree.body):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      continue
    if k == 0 and isinstance(node, ast.Expr) and isinstance(
        getattr(node, 'value', None), ast.Constant):
      continue  # the module docstring
    names = _defined_names(node)
    if len(names) != 1:
      raise PatchGenerationError(
          f'{_rel(path)}:{node.lineno}: only imports and definitions of one'
          f' name (def, class, `name = ...`) may appear at the top level of a'
          f' file written as part of Flax; found {ast.dump(node)[:60]}...'
      )
    first = _first_line(node)
    start = _attached_comments(lines, first)
    section = None
    for line_no, name in sections:
      if line_no < start:
        section = name
    text = '\n'.join(lines[start - 1:node.end_lineno])
    out.append(Definition(names[0], section, text))
  return out


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
  """name -> the last top-level statement binding it by definition."""
  found = {}
  for node in tree.body:
    for name in _defined_names(node):
      found[name] = node
  return found


def _rel(path: pathlib.Path) -> str:
  try:
    return str(path.relative_to(ROOT))
  except ValueError:
    return str(path)


def respell(text: str) -> str:
  """Rewrites the plugin's public names to Flax's (``SPELLINGS``)."""
  for pattern, replacement in SPELLINGS:
    text = re.sub(pattern, replacement, text)
  return text


_PLUGIN_ONLY = re.compile(r'^\s*# plugin-only: (?P<edge>begin|end)\b.*$')


def strip_plugin_only(text: str, where: str) -> str:
  """Removes ``# plugin-only: begin`` ... ``# plugin-only: end`` blocks.

  Code that only the plugin needs (e.g. a check that its monkeypatch is
  installed, which upstream's decorators make always true) is fenced so in our
  source; the markers and everything between them stay out of the patches.
  """
  out, inside = [], None
  for number, line in enumerate(text.split('\n'), 1):
    m = _PLUGIN_ONLY.match(line)
    if m and m.group('edge') == 'begin':
      if inside is not None:
        raise PatchGenerationError(
            f'{where}:{number}: nested `# plugin-only: begin` (open at {inside})')
      inside = number
    elif m:
      if inside is None:
        raise PatchGenerationError(f'{where}:{number}: `# plugin-only: end` without begin')
      inside = None
    elif inside is None:
      out.append(line)
  if inside is not None:
    raise PatchGenerationError(f'{where}:{inside}: `# plugin-only: begin` never ends')
  return '\n'.join(out)


def strip_section_markers(text: str) -> str:
  """Removes ``# section:`` markers (and the rules around them)."""
  lines = text.split('\n')
  drop = set()
  for i, line in enumerate(lines):
    if _SECTION.match(line):
      drop.add(i)
      for j in (i - 1, i + 1):
        if 0 <= j < len(lines) and _RULE.match(lines[j]):
          drop.add(j)
  kept = [line for i, line in enumerate(lines) if i not in drop]
  return re.sub(r'\n{4,}', '\n\n\n', '\n'.join(kept))


# ---------------------------------------------------------------------------
# Imports
# ---------------------------------------------------------------------------


def _module_name(upstream_path: str) -> str:
  """``flax/core/lift.py`` -> ``flax.core.lift``."""
  parts = pathlib.PurePosixPath(upstream_path).with_suffix('').parts
  if parts[-1] == '__init__':
    parts = parts[:-1]
  return '.'.join(parts)


def _package(upstream_path: str) -> str:
  module = _module_name(upstream_path)
  if upstream_path.endswith('__init__.py'):
    return module
  return module.rpartition('.')[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
  if not node.level:
    return node.module or ''
  base = package.split('.')
  if node.level > 1:
    base = base[: -(node.level - 1)]
  return '.'.join(base + ([node.module] if node.module else []))


def imported_names(tree: ast.Module, package: str) -> dict[str, tuple[str, str | None]]:
  """Bound name -> ``(absolute module, imported name or None for a module)``."""
  names = {}
  for node in tree.body:
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.asname:
          names[alias.asname] = (alias.name, None)
        else:
          top = alias.name.split('.')[0]
          names[top] = (top, None)
    elif isinstance(node, ast.ImportFrom):
      module = _absolute(node, package)
      for alias in node.names:
        names[alias.asname or alias.name] = (module, alias.name)
  return names


def _translate(module: str) -> str:
  """A plugin module's upstream name (other modules are unchanged)."""
  if module == 'flax_tieext' or module.startswith('flax_tieext.'):
    for ours in sorted(MODULE_MAP, key=len, reverse=True):
      if module == ours or module.startswith(ours + '.'):
        return MODULE_MAP[ours] + module[len(ours):]
    raise PatchGenerationError(
        f'{module} has no upstream counterpart: add it to MODULE_MAP in'
        ' tools/make_patches.py, or stop importing it in a file written as part'
        ' of Flax.'
    )
  return module


def _translate_import(module: str, name: str | None) -> tuple[str, str | None]:
  """``from module import name`` (``name=None``: ``import module``), upstream."""
  if module == 'flax_tieext' and name is not None:
    if name not in ROOT_NAMES:
      raise PatchGenerationError(
          f'flax_tieext.{name} is plugin-only: it has no Flax counterpart in'
          ' ROOT_NAMES (tools/make_patches.py).'
      )
    return ROOT_NAMES[name]
  return _translate(module), name


def _alias_text(name: str, asname: str | None) -> str:
  return f'{name} as {asname}' if asname else name


def ensure_import(source: str, package: str, module: str, name: str,
                  asname: str | None) -> str:
  """Returns ``source`` importing ``name`` from ``module`` as ``asname``.

  The alias is added to an existing ``from`` import of the same module when
  there is one (in sorted position if its names are sorted), else a new
  ``from`` statement goes after the imports that sort before it.
  """
  tree = ast.parse(source)
  lines = source.split('\n')
  alias = _alias_text(name, asname)
  same = [
      n for n in tree.body
      if isinstance(n, ast.ImportFrom) and _absolute(n, package) == module
      and not any(a.name == '*' for a in n.names)
  ]
  if same:
    node = same[0]
    # Before the first name that sorts after it (ASCII, as Flax sorts).
    existing = [a.name for a in node.names]
    index = next((i for i, e in enumerate(existing) if e > name), len(existing))
    if node.lineno == node.end_lineno:
      line = lines[node.lineno - 1]
      names = [_alias_text(a.name, a.asname) for a in node.names]
      names.insert(index, alias)
      head = line[: line.index(' import ') + len(' import ')]
      comment = line[line.index('#'):] if '#' in line else ''
      new = head + ', '.join(names) + ('  ' + comment if comment else '')
      if len(new) > 80 and not comment:
        # Too long for one line: one alias a line, as Flax writes them.
        new = head + '(\n' + ''.join(f'    {n},\n' for n in names) + ')'
      lines[node.lineno - 1] = new
      return '\n'.join(lines)
    # Parenthesized, one alias a line.
    if index < len(node.names):
      at = node.names[index].lineno - 1
      indent = re.match(r'\s*', lines[at]).group(0)
    else:
      last = node.names[-1].lineno - 1
      indent = re.match(r'\s*', lines[last]).group(0)
      at = last + 1
      if not lines[last].rstrip().endswith(','):
        lines[last] = lines[last].rstrip() + ','
    lines.insert(at, f'{indent}{alias},')
    return '\n'.join(lines)
  # A new statement, among the imports of its kind in sorted position.
  relative = module.startswith(package + '.') or module == package
  imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
  if not imports:
    raise PatchGenerationError(f'no import block to add `{alias}` to')
  if relative and any(isinstance(n, ast.ImportFrom) and n.level for n in imports):
    # The file imports its siblings relatively (`from .scope import ...`).
    text = f'from .{module[len(package) + 1:]} import {alias}'
    peers = [n for n in imports if isinstance(n, ast.ImportFrom) and n.level]
  else:
    text = f'from {module} import {alias}'
    peers = [n for n in imports if not (isinstance(n, ast.ImportFrom) and n.level)]
  before = [n for n in peers if _sort_key(n, package) <= module] or peers
  after_line = max(n.end_lineno for n in before)
  lines.insert(after_line, text)
  return '\n'.join(lines)


def _add_plain_import(source: str, module: str, bound: str) -> str:
  """``import module`` (``as bound``) after the file's last plain import."""
  tree = ast.parse(source)
  lines = source.split('\n')
  plain = [n for n in tree.body if isinstance(n, ast.Import)]
  if not plain:
    raise PatchGenerationError(f'no `import` statement to add `import {module}` after')
  asname = '' if module.split('.')[0] == bound else f' as {bound}'
  lines.insert(plain[-1].end_lineno, f'import {module}{asname}')
  return '\n'.join(lines)


def _sort_key(node: ast.stmt, package: str) -> str:
  if isinstance(node, ast.ImportFrom):
    return _absolute(node, package)
  return node.names[0].name


# ---------------------------------------------------------------------------
# The guard: transplanted code uses only names the upstream module binds
# ---------------------------------------------------------------------------

_BUILTINS = frozenset(dir(builtins)) | {'__file__', '__name__', '__doc__'}


def used_globals(text: str) -> set[str]:
  """Global names a top-level definition's source uses (builtins excluded)."""
  table = symtable.symtable(text, '<definition>', 'exec')
  used = set()
  for sym in table.get_symbols():
    if sym.is_referenced() and not sym.is_assigned() and not sym.is_imported():
      used.add(sym.get_name())
  stack = list(table.get_children())
  while stack:
    child = stack.pop()
    stack.extend(child.get_children())
    for sym in child.get_symbols():
      if sym.is_global() and sym.is_referenced():
        used.add(sym.get_name())
  return used - _BUILTINS


def bound_names(source: str) -> set[str]:
  """Names bound at the top level of a module."""
  table = symtable.symtable(source, '<module>', 'exec')
  return {
      s.get_name() for s in table.get_symbols()
      if s.is_assigned() or s.is_imported() or s.is_namespace()
  }


# ---------------------------------------------------------------------------
# Transplanting
# ---------------------------------------------------------------------------


def transplant(upstream: str, definitions: list[Definition]) -> str:
  """Puts ``definitions`` into ``upstream`` source.

  A definition whose name upstream defines replaces it (upstream's own comments
  above it are kept). A new one goes before the next definition, in our order,
  that upstream has (so helpers precede their users), or, when none follows,
  at the end of the file.
  """
  tree = ast.parse(upstream)
  lines = upstream.split('\n')
  theirs = _top_level(tree)
  # upstream name -> (new definitions to put before it, its replacement)
  plan: dict[str, tuple[list[str], str]] = {}
  pending: list[str] = []
  for d in definitions:
    if d.name in theirs:
      plan[d.name] = (pending, d.text)
      pending = []
    else:
      pending.append(d.text)
  edits = []  # (first line, last line, new text), 1-based inclusive
  for name, (before, text) in plan.items():
    node = theirs[name]
    first = _first_line(node)
    start = _attached_comments(lines, first)
    prefix = ''.join(t + '\n\n\n' for t in before)
    # The replaced definition keeps upstream's comments; new ones go above them.
    head = '\n'.join(lines[start - 1:first - 1])
    new = prefix + (head + '\n' if head else '') + text
    edits.append((start, node.end_lineno, new))
  for start, end, new in sorted(edits, reverse=True):
    lines[start - 1:end] = new.split('\n')
  out = '\n'.join(lines)
  if pending:
    out = out.rstrip('\n') + '\n\n\n' + '\n\n\n'.join(pending) + '\n'
  return out


def check_and_import(path: str, source: str, definitions: list[Definition],
                     ours: pathlib.Path) -> str:
  """Adds the imports transplanted code needs; fails on names it cannot bind.

  A global that a transplanted definition uses must be bound in the upstream
  module. If it is not, and our import block imports it from another module
  (translated through ``MODULE_MAP``), that import is added upstream; anything
  else is an error: our file is no longer written as part of Flax.
  """
  package = _package(path)
  module = _module_name(path)
  our_tree = ast.parse(strip_plugin_only(ours.read_text(), _rel(ours)))
  our_imports = imported_names(our_tree, _package(_rel(ours)))
  needed: dict[str, list[str]] = {}
  for d in definitions:
    for name in sorted(used_globals(d.text)):
      needed.setdefault(name, []).append(d.name)
  problems = []
  bound = bound_names(source)
  theirs = imported_names(ast.parse(source), package)
  for name, users in sorted(needed.items()):
    where = f'{_rel(ours)}: {", ".join(users)} use{"s" if len(users) == 1 else ""} `{name}`'
    if name in bound:
      if name in our_imports and name in theirs:
        ours_from = _translate_import(*our_imports[name])
        if ours_from != theirs[name] and not _same_object(ours_from, theirs[name], module):
          problems.append(
              f'{where}, imported from {ours_from[0]} in our file but from'
              f' {theirs[name][0]} in {path}: import it from where upstream'
              ' does.'
          )
      continue
    if name not in our_imports:
      problems.append(
          f'{where}, which {path} does not define or import. Transplant its'
          ' definition too (give it a top-level definition in the same'
          f' section), or use a name {path} has.'
      )
      continue
    source_module = our_imports[name][0]
    translated, imported = _translate_import(*our_imports[name])
    if translated == module:
      problems.append(
          f'{where}, imported from {source_module} ({path} itself), which does'
          ' not define it.'
      )
      continue
    if imported is None:
      source = _add_plain_import(source, translated, name)
    else:
      source = ensure_import(source, package, translated, imported,
                             name if name != imported else None)
  if problems:
    raise PatchGenerationError(
        f'Transplanting into {path}:\n  ' + '\n  '.join(problems)
    )
  return source


def _same_object(ours: tuple[str, str | None], theirs: tuple[str, str | None],
                 module: str) -> bool:
  """Whether two imports plausibly bind the same object (a re-export)."""
  if ours[1] != theirs[1]:
    return False
  a, b = ours[0], theirs[0]
  return a.startswith(b + '.') or b.startswith(a + '.') or module in (a, b)


def new_module_text(ours: pathlib.Path) -> str:
  """One of our files as a new Flax module: Flax's header, Flax's names."""
  text = strip_plugin_only(ours.read_text(), _rel(ours))
  text = re.sub(r'\A(# Copyright \d+ The )flax-tieext( Authors\.)',
                r'\1Flax\2', text)
  return strip_section_markers(respell(text)).rstrip('\n') + '\n'


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

# Our test files (or single tests, ``file::name``) that stay out of the
# patches -> why. Mostly tests of the plugin rather than of the feature.
TESTS_KEPT_OUT = {
    'tests/test_static_argnames_compat.py':
        'compares the patched Flax with the unpatched one (install/uninstall)',
    'tests/test_static_argnames.py::test_twins_are_the_installed_objects':
        'checks that the plugin installed its twins into Flax',
    'tests/test_static_argnames_properties.py':
        'needs hypothesis, which Flax\'s tests do not depend on',
    'tests/test_tie_errors.py::test_tie_without_the_scope_machinery_says_how_to_install':
        'the plugin uninstalled; upstream the Scope hooks are decorators',
    'tests/test_tie_properties.py':
        'needs hypothesis, which Flax\'s tests do not depend on',
    'tests/test_tie_sharding.py':
        'needs an 8-device mesh; Flax\'s CI forces 4 host devices',
}
# What a transplanted test may import besides the standard library: what
# Flax's own tests use.
UPSTREAM_TEST_IMPORTS = frozenset(
    {'absl', 'flax', 'jax', 'jaxlib', 'numpy', 'optax', 'pytest'})


def test_text(ours: pathlib.Path) -> str:
  """One of our test files as a Flax test: Flax names only, Flax's header.

  Besides the imports, what only makes sense for the plugin goes: tests listed
  in ``TESTS_KEPT_OUT``, ``pytest.param`` cases of the plugin's twins
  (``id='flax_tieext...'``: upstream they are the Flax object tested next to
  them), the ``PLUGIN_MARKERS``, and docstring paragraphs about the plugin.
  """
  text = ours.read_text()
  for rewrite in (_drop_kept_out_tests, _drop_twin_cases,
                  _drop_plugin_markers, _rewrite_test_imports,
                  _drop_plugin_paragraphs, _check_test_imports):
    try:
      text = rewrite(text, ours)
    except PatchGenerationError as e:
      if str(e).startswith('line '):
        raise PatchGenerationError(f'{_rel(ours)}:{str(e)[5:]}') from None
      raise
  text = respell(re.sub(r'\n{4,}', '\n\n\n', text)).rstrip('\n') + '\n'
  if text.startswith('# Copyright'):
    return re.sub(r'\A(# Copyright \d+ The )flax-tieext( Authors\.)',
                  r'\1Flax\2', text)
  return FLAX_LICENSE_HEADER + '\n' + text


def _cut(text: str, spans: list[tuple[int, int, int, int]], replacement='') -> str:
  """Replaces ``(line, col, end_line, end_col)`` spans (1-based lines)."""
  lines = text.split('\n')
  offsets = [0]
  for line in lines:
    offsets.append(offsets[-1] + len(line) + 1)
  for line, col, end_line, end_col in sorted(spans, reverse=True):
    a = offsets[line - 1] + col
    b = offsets[end_line - 1] + end_col
    text = text[:a] + replacement + text[b:]
  return text


def _whole_lines(text: str, node: ast.AST, lines: list[str],
                 with_comma: bool = False) -> tuple[int, int, int, int]:
  """The span of the full lines ``node`` occupies (and a trailing comma)."""
  first = _first_line(node) if isinstance(node, ast.stmt) else node.lineno
  first = _attached_comments(lines, first) if isinstance(node, ast.stmt) else first
  before = lines[node.lineno - 1][:node.col_offset] if first == node.lineno else ''
  after = lines[node.end_lineno - 1][node.end_col_offset:].split('#')[0].strip()
  if before.strip() or after not in ('', ',' if with_comma else ''):
    raise PatchGenerationError(
        f'line {node.lineno}: cannot remove {ast.get_source_segment(text, node)!r}'
        ' from a transplanted test: put it on lines of its own.')
  return (first, 0, node.end_lineno + 1, 0)


def _drop_kept_out_tests(text: str, ours: pathlib.Path) -> str:
  wanted = {key.partition('::')[2] for key in TESTS_KEPT_OUT
            if key.startswith(_rel(ours) + '::')}
  if not wanted:
    return text
  tree = ast.parse(text)
  lines = text.split('\n')
  found = {n.name: n for n in tree.body if isinstance(n, _DEFINITION)}
  missing = wanted - set(found)
  if missing:
    raise PatchGenerationError(
        f'TESTS_KEPT_OUT names {", ".join(sorted(missing))}, which'
        f' {_rel(ours)} does not define: update the table.')
  return _cut(text, [_whole_lines(text, found[n], lines) for n in wanted])


def _plugin_id(call: ast.Call) -> bool:
  return any(
      k.arg == 'id' and isinstance(k.value, ast.Constant)
      and 'flax_tieext' in str(k.value.value)
      for k in call.keywords)


def _drop_twin_cases(text: str, ours: pathlib.Path) -> str:
  del ours
  tree = ast.parse(text)
  lines = text.split('\n')
  spans = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.List, ast.Tuple)):
      for element in node.elts:
        if (isinstance(element, ast.Call)
            and ast.unparse(element.func) == 'pytest.param'
            and _plugin_id(element)):
          spans.append(_whole_lines(text, element, lines, with_comma=True))
  return _cut(text, spans)


def _drop_plugin_markers(text: str, ours: pathlib.Path) -> str:
  """Removes ``PLUGIN_MARKERS``: their aliases, decorators and ``marks=``."""
  tree = ast.parse(text)
  lines = text.split('\n')
  markers = {f'pytest.mark.{m}' for m in PLUGIN_MARKERS}
  aliases = set(markers)
  spans = []
  for node in tree.body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id != 'pytestmark'
        and ast.unparse(node.value) in markers):
      aliases.add(node.targets[0].id)
      spans.append(_whole_lines(text, node, lines))
    elif (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == 'pytestmark'
        and ast.unparse(node.value) in markers):
      spans.append(_whole_lines(text, node, lines))
  for node in ast.walk(tree):
    for decorator in getattr(node, 'decorator_list', []):
      if ast.unparse(decorator) in aliases:
        spans.append((decorator.lineno, 0, decorator.end_lineno + 1, 0))
    if isinstance(node, ast.Call):
      for k in node.keywords:
        if k.arg == 'marks' and ast.unparse(k.value) in aliases:
          # From the end of the previous argument: drops the separating comma.
          previous = [a for a in node.args + node.keywords if a is not k
                      and (a.end_lineno, a.end_col_offset) <= (k.lineno, k.col_offset)]
          if not previous:
            raise PatchGenerationError(
                f'{_rel(ours)}:{k.lineno}: marks= must follow another argument')
          last = max(previous, key=lambda a: (a.end_lineno, a.end_col_offset))
          spans.append((last.end_lineno, last.end_col_offset, k.end_lineno,
                        k.end_col_offset))
  text = _cut(text, spans)
  used = sorted({
      ast.unparse(n) for n in ast.walk(ast.parse(text))
      if isinstance(n, (ast.Name, ast.Attribute)) and ast.unparse(n) in aliases
  })
  if used:
    raise PatchGenerationError(
        f'{_rel(ours)}: cannot remove the plugin-only marker(s)'
        f' {", ".join(used)} everywhere (only as a decorator, a'
        ' module-level alias or `marks=<marker>` of pytest.param).')
  # `pytest.param(..., id=...,\n)` left with a dangling comma is fine Python.
  return text


def _bound_in(tree: ast.Module) -> set[str]:
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      names.add(node.id)
    elif isinstance(node, ast.arg):
      names.add(node.arg)
    elif isinstance(node, _DEFINITION):
      names.add(node.name)
    elif isinstance(node, ast.alias):
      names.add((node.asname or node.name).split('.')[0])
  return names


def _rewrite_test_imports(text: str, ours: pathlib.Path) -> str:
  """``flax_tieext`` imports and attributes -> the Flax names they become.

  ``import flax_tieext`` goes (importing it installed the features; upstream
  they are Flax's own); ``flax_tieext.<name>`` becomes its Flax spelling
  (``ROOT_NAMES``); ``from flax_tieext import lift as ext_lift`` becomes
  ``from flax.core import lift``, or, when the test already binds that module
  (``import flax.linen as nn``), uses of ``ext_nn`` become ``nn``.
  """
  tree = ast.parse(text)
  lines = text.split('\n')
  names_in_use = _bound_in(tree)
  existing = {}  # normalized (module, name) -> the name a Flax import binds
  imports_flax = False
  for node in tree.body:
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.asname:
          existing[_normal(a.name, None)] = a.asname
        imports_flax |= a.name.split('.')[0] == 'flax' and not a.asname
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:
        existing[_normal(node.module, a.name)] = a.asname or a.name

  def translate(module, name, lineno):
    try:
      return _translate_import(module, name)
    except PatchGenerationError as e:
      raise PatchGenerationError(
          f'{_rel(ours)}:{lineno}: {e} Tests of plugin-only API belong in'
          ' TESTS_KEPT_OUT.') from None

  statements = []  # (span of the statement's lines, new statement or None)
  renames = {}
  for node in tree.body:
    if isinstance(node, ast.Import) and any(
        a.name.split('.')[0] == 'flax_tieext' for a in node.names):
      if [a.name for a in node.names] != ['flax_tieext'] or node.names[0].asname:
        raise PatchGenerationError(
            f'{_rel(ours)}:{node.lineno}: write `import flax_tieext` alone on'
            ' its line, or `from flax_tieext... import ...`.')
      statements.append((_whole_lines(text, node, lines), None))
    elif isinstance(node, ast.ImportFrom) and (
        node.module or '').split('.')[0] == 'flax_tieext':
      new = []
      for alias in node.names:
        module, name = translate(node.module, alias.name, node.lineno)
        bound = alias.asname or alias.name
        same = existing.get(_normal(module, name))
        if same is not None:
          renames[bound] = same
        elif imports_flax and module.split('.')[0] == 'flax':
          renames[bound] = f'{module}.{name}'
        elif bound != name and name not in names_in_use:
          renames[bound] = name
          new.append(f'from {module} import {name}')
        else:
          new.append(f'from {module} import {_alias_text(name, alias.asname)}')
      statements.append((_whole_lines(text, node, lines), '\n'.join(new)))

  uses = {}  # span -> new text
  for node in ast.walk(tree):
    span = (getattr(node, 'lineno', 0), getattr(node, 'col_offset', 0),
            getattr(node, 'end_lineno', 0), getattr(node, 'end_col_offset', 0))
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == 'flax_tieext'):
      module, name = translate('flax_tieext', node.attr, node.lineno)
      uses[span] = existing.get(_normal(module, name), f'{module}.{name}')
    elif isinstance(node, ast.Name) and node.id in renames:
      uses[span] = renames[node.id]
  starts = {(span[0], span[1]) for span in uses}
  bare = [n.lineno for n in ast.walk(tree)
          if isinstance(n, ast.Name) and n.id == 'flax_tieext'
          and (n.lineno, n.col_offset) not in starts]
  if bare:
    raise PatchGenerationError(
        f'{_rel(ours)}:{bare[0]}: `flax_tieext` used as a value')
  needs_flax = not imports_flax and any(v.startswith('flax.') for v in uses.values())
  # Importing flax_tieext also imported flax.linen.partitioning, which
  # `import flax.linen` does not: a test using `nn.partitioning` needs it.
  needs_partitioning = bool(re.search(r'\.partitioning\.', text)) and not any(
      key == ('flax.linen.partitioning', None) for key in existing
  ) and not re.search(r'^import flax\.linen\.partitioning\b', text, re.M)
  # Uses lie below the imports: replace them first, then the statements.
  for span, new in sorted(uses.items(), reverse=True):
    text = _cut(text, [span], new)
  for span, new in sorted(statements, key=lambda item: item[0], reverse=True):
    if new is None and (needs_flax or needs_partitioning):
      new = 'import flax.linen.partitioning' if needs_partitioning else 'import flax'
      needs_flax = needs_partitioning = False
    text = _cut(text, [span], new + '\n' if new else '')
  return _tidy_imports(text)


def _normal(module: str, name: str | None) -> tuple[str, None]:
  """``('flax', 'linen')`` and ``('flax.linen', None)`` name the same thing."""
  return (module if name is None else f'{module}.{name}'), None


def _tidy_imports(text: str) -> str:
  """One blank line at most between the import statements."""
  tree = ast.parse(text)
  imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
  if not imports:
    return text
  lines = text.split('\n')
  first, last = imports[0].lineno - 1, imports[-1].end_lineno
  region = '\n'.join(lines[first:last])
  region = re.sub(r'\n{3,}', '\n\n', region)
  return '\n'.join(lines[:first] + region.split('\n') + lines[last:])


def _check_test_imports(text: str, ours: pathlib.Path) -> str:
  """Refuses a test that would add a dependency to Flax's test suite."""
  modules = set()
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, ast.Import):
      modules |= {a.name.split('.')[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and not node.level:
      modules.add((node.module or '').split('.')[0])
  extra = sorted(modules - UPSTREAM_TEST_IMPORTS - set(sys.stdlib_module_names))
  if extra:
    raise PatchGenerationError(
        f'{_rel(ours)} imports {", ".join(extra)}, which Flax\'s tests do not'
        ' depend on: keep the file out of the patches (TESTS_KEPT_OUT in'
        ' tools/make_patches.py), or do without it.')
  return text


def _drop_plugin_paragraphs(text: str, ours: pathlib.Path) -> str:
  """Module-docstring paragraphs about the plugin (``flax_tieext``, markers)."""
  del ours
  tree = ast.parse(text)
  if not (tree.body and isinstance(tree.body[0], ast.Expr)
          and isinstance(tree.body[0].value, ast.Constant)
          and isinstance(tree.body[0].value.value, str)):
    return text
  node = tree.body[0]
  segment = ast.get_source_segment(text, node)
  words = ('flax_tieext',) + PLUGIN_MARKERS
  paragraphs = segment.split('\n\n')
  kept = [p for p in paragraphs if not any(w in p for w in words)]
  if len(kept) == len(paragraphs):
    return text
  if not kept:
    raise PatchGenerationError('the whole module docstring is about the plugin')
  new = '\n\n'.join(kept)
  quote = segment[:3]
  if not new.rstrip().endswith(quote):
    one_line = '\n' not in new.strip()
    new = new.rstrip() + ('' if one_line else '\n') + quote
  return text.replace(segment, new, 1)


def _test_destination(pattern: str, ours: pathlib.Path) -> str:
  stem = ours.stem
  name = stem[len('test_'):] if stem.startswith('test_') else stem
  return pattern.format(name=name)


# ---------------------------------------------------------------------------
# Wiring: what the monkeypatch does at run time, as source edits
# ---------------------------------------------------------------------------


def _scope_hooks() -> list[tuple[str, str]]:
  """``(Scope method, ties hook)`` pairs, read from ``_patch._bindings``.

  The monkeypatch's binding table is the one list of the Scope methods the tie
  machinery wraps; upstream, the same hooks decorate those methods.
  """
  tree = ast.parse((ROOT / 'flax_tieext' / '_patch.py').read_text())
  pairs = []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and getattr(node.func, 'id', None) == '_Binding'):
      continue
    owner, attr, make = node.args
    if (isinstance(owner, ast.Name) and owner.id == 'Scope'
        and isinstance(make, ast.Attribute)
        and isinstance(make.value, ast.Name) and make.value.id == 'ties'):
      pairs.append((attr.value, make.attr))
  if not pairs:
    raise PatchGenerationError(
        'found no `_Binding(Scope, name, ties.hook)` in flax_tieext/_patch.py')
  return pairs


def decorate_scope_methods(tree: pathlib.Path) -> None:
  """``@ties.tie_aware_<method>`` on each Scope method the patch wraps."""
  path = tree / 'flax/core/scope.py'
  source = path.read_text()
  source = ensure_import(source, 'flax.core', 'flax.core', 'ties', None)
  module = ast.parse(source)
  scope_class = next(
      n for n in module.body if isinstance(n, ast.ClassDef) and n.name == 'Scope')
  methods = {n.name: n for n in scope_class.body if isinstance(n, ast.FunctionDef)}
  lines = source.split('\n')
  inserts = []
  for method, hook in _scope_hooks():
    if method not in methods:
      raise PatchGenerationError(f'flax/core/scope.py: Scope has no method {method}')
    node = methods[method]
    first = _first_line(node)
    indent = re.match(r'\s*', lines[first - 1]).group(0)
    inserts.append((first, f'{indent}@ties.{hook}'))
  for first, text in sorted(inserts, reverse=True):
    lines.insert(first - 1, text)
  path.write_text('\n'.join(lines))


def _exporter(init: str, module: str, names: Iterable[str]):
  """Wiring: ``from <module> import <name> as <name>`` in an ``__init__``."""
  names = tuple(names)

  def export(tree: pathlib.Path) -> None:
    path = tree / init
    source = path.read_text()
    package = _module_name(init)
    for name in names:
      source = ensure_import(source, package, module, name, name)
    path.write_text(source)

  export.__name__ = f'export_{"_".join(names)}'
  return export


def remove_upstream_comment(path: str, containing: str):
  """Wiring: drops the comment block of ``path`` that contains ``containing``."""

  def remove(tree: pathlib.Path) -> None:
    file = tree / path
    lines = file.read_text().split('\n')
    hits = [i for i, line in enumerate(lines)
            if line.startswith('#') and containing in line]
    if len(hits) != 1:
      raise PatchGenerationError(
          f'{path}: expected one comment containing {containing!r}, found'
          f' {len(hits)}')
    start = end = hits[0]
    while start > 0 and lines[start - 1].startswith('#'):
      start -= 1
    while end + 1 < len(lines) and lines[end + 1].startswith('#'):
      end += 1
    del lines[start:end + 1]
    # Keep two blank lines between top-level statements.
    while start < len(lines) and start > 0 and not lines[start].strip() \
        and not lines[start - 1].strip() and start > 1 and not lines[start - 2].strip():
      del lines[start]
    file.write_text('\n'.join(lines))

  remove.__name__ = 'remove_comment'
  return remove


# ---------------------------------------------------------------------------
# The series
# ---------------------------------------------------------------------------

STATIC_SECTION = 'checkpoint (static_argnames)'
TIE_SECTION = 'tie'

FEATURES = (
    Feature(
        subject='Add static_argnames to checkpoint and remat',
        body=(
            'lift.checkpoint / lift.remat, nn.checkpoint / nn.remat and\n'
            'nn.partitioning.remat take static_argnames, and resolve both\n'
            'static_argnums and static_argnames through the signature of the\n'
            'wrapped function, so that an argument is static however it is\n'
            'passed: positionally, by keyword, or left to its default. Static\n'
            'values are closed over (as nn.partitioning.remat already did), and\n'
            'mistakes are reported at wrap time, naming the parameters.\n'
            '\n'
            'nn.partitioning.remat keeps its numbering of static_argnums (self\n'
            'not counted) and its core_remat_static name.'
        ),
        transplants=(
            Transplant('flax_tieext/core/lift.py', 'flax/core/lift.py', STATIC_SECTION),
            Transplant('flax_tieext/linen/transforms.py', 'flax/linen/transforms.py',
                       STATIC_SECTION),
            Transplant('flax_tieext/linen/partitioning.py', 'flax/linen/partitioning.py'),
        ),
        tests=(
            ('tests/test_static_argnames*.py', 'tests/linen/linen_{name}_test.py'),
        ),
        wiring=(
            remove_upstream_comment('flax/linen/partitioning.py',
                                    'TODO(levskaya): upstream this fix'),
        ),
    ),
    Feature(
        subject='Add tie: tied variables through lifted transforms',
        body=(
            'lift.tie / nn.tie declare that the variables of a target path (a\n'
            'module, or one variable) are those of a source path: one stored\n'
            'variable, reachable under two paths, behaving as one module called\n'
            'at two places. The tie lives in the Scope (new module\n'
            'flax/core/ties.py, whose hooks decorate Scope.push and the\n'
            'variable accessors) and takes part in _partial_pack, so that it\n'
            'survives every lifted transform: a tied target inside remat, jit,\n'
            'map_variables, cond/switch/while_loop has its source lifted with it;\n'
            'inside vmap/scan the source is broadcast, read-only.\n'
            '\n'
            'flax.core.tie_variables / untie_variables convert variables between\n'
            'the tied and the untied layout.'
        ),
        transplants=(
            Transplant('flax_tieext/core/lift.py', 'flax/core/lift.py', TIE_SECTION),
            Transplant('flax_tieext/linen/transforms.py', 'flax/linen/transforms.py',
                       TIE_SECTION),
        ),
        modules=(('flax_tieext/core/ties.py', 'flax/core/ties.py'),),
        tests=(
            ('tests/test_tie*.py', 'tests/linen/linen_{name}_test.py'),
        ),
        wiring=(
            decorate_scope_methods,
            _exporter('flax/core/__init__.py', 'flax.core.ties',
                      ('TieError', 'tie_variables', 'untie_variables')),
            _exporter('flax/linen/__init__.py', 'flax.linen.transforms', ('tie',)),
        ),
    ),
)


def apply_feature(feature: Feature, tree: pathlib.Path) -> list[str]:
  """Applies one feature to the Flax source ``tree``; returns notes to print."""
  notes = []
  touched = []
  for t in feature.transplants:
    ours = ROOT / t.ours
    definitions = [
        dataclasses.replace(d, text=respell(d.text))
        for d in read_definitions(ours)
        if t.section is None or d.section == t.section
    ]
    if not definitions:
      raise PatchGenerationError(
          f'{t.ours} has no definitions in section {t.section!r}')
    target = tree / t.upstream
    source = transplant(target.read_text(), definitions)
    source = check_and_import(t.upstream, source, definitions, ours)
    target.write_text(source)
    touched.append(t.upstream)
  for ours, upstream in feature.modules:
    (tree / upstream).write_text(new_module_text(ROOT / ours))
    touched.append(upstream)
  for pattern, destination in feature.tests:
    matches = sorted(p for p in ROOT.glob(pattern)
                     if p.is_file() and _rel(p) not in TESTS_KEPT_OUT)
    if not matches:
      notes.append(f'{feature.subject}: no test file matches {pattern}')
    for ours in matches:
      dest = _test_destination(destination, ours)
      if (tree / dest).exists():
        raise PatchGenerationError(f'{dest} already exists in Flax')
      (tree / dest).write_text(test_text(ours))
      touched.append(dest)
  for wire in feature.wiring:
    wire(tree)
  for path in touched:
    compile((tree / path).read_text(), path, 'exec')
  return notes


def check_no_leak(patch: pathlib.Path) -> None:
  """Fails if a line the patch adds mentions the plugin or is a section marker."""
  leaks, path = [], None
  for line in patch.read_text().split('\n'):
    if line.startswith('+++ '):
      path = line[len('+++ b/'):]
    elif line.startswith('+') and ('flax_tieext' in line or _SECTION.match(line[1:])):
      leaks.append(f'{path}: {line[1:].strip()}')
  if leaks:
    raise PatchGenerationError(
        'The patch would mention the plugin (flax_tieext) or keep a section'
        ' marker. Spell these with Flax names in the source (or extend'
        ' SPELLINGS in tools/make_patches.py for a public name), or fence code'
        ' only the plugin needs with `# plugin-only: begin` / `# plugin-only:'
        ' end`:\n  '
        + '\n  '.join(leaks)
    )


# ---------------------------------------------------------------------------
# Sdists and git
# ---------------------------------------------------------------------------


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def sdist(version: str) -> pathlib.Path:
  """The pristine sdist of Flax ``version`` (cached; sha256-checked)."""
  expected = RELEASES[version]
  name = f'flax-{version}.tar.gz'
  cached = SDIST_CACHE / name
  if not cached.exists():
    extra = [pathlib.Path(p) for p in os.environ.get(SDIST_PATH_ENV, '').split(os.pathsep) if p]
    found = next((d / name for d in extra if (d / name).exists()), None)
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    if found is not None:
      shutil.copyfile(found, cached)
    else:
      subprocess.run(
          [sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps',
           '--no-binary', ':all:', '--dest', str(SDIST_CACHE), f'flax=={version}'],
          check=True,
      )
  actual = _sha256(cached)
  if actual != expected:
    raise PatchGenerationError(
        f'{cached} has sha256 {actual}, expected {expected} (the sdist on'
        ' PyPI). Delete it to download it again.'
    )
  return cached


def extract(tarball: pathlib.Path, dest: pathlib.Path) -> None:
  """Extracts an sdist into ``dest`` without its top-level directory."""
  with tarfile.open(tarball) as tar:
    members = []
    for m in tar.getmembers():
      _, _, rest = m.name.partition('/')
      if not rest:
        continue
      m.name = rest
      members.append(m)
    tar.extractall(dest, members=members, filter='data')


def _git_env(cwd: pathlib.Path) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith('GIT_')}
  env.update(
      GIT_CONFIG_GLOBAL=os.devnull,
      GIT_CONFIG_NOSYSTEM='1',
      GIT_CEILING_DIRECTORIES=str(cwd.parent),
      GIT_AUTHOR_NAME=AUTHOR_NAME,
      GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
      GIT_AUTHOR_DATE=DATE,
      GIT_COMMITTER_NAME=AUTHOR_NAME,
      GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
      GIT_COMMITTER_DATE=DATE,
      LC_ALL='C',
      TZ='UTC',
  )
  return env


_GIT_CONFIG = (
    '-c', 'core.abbrev=12', '-c', 'core.autocrlf=false',
    '-c', 'diff.algorithm=myers', '-c', 'diff.indentHeuristic=true',
    '-c', 'diff.renames=false', '-c', 'diff.noprefix=false',
    '-c', 'diff.mnemonicPrefix=false', '-c', 'format.signature=',
    '-c', 'init.defaultBranch=main', '-c', 'commit.gpgSign=false',
)


def git(cwd: pathlib.Path, *args: str, capture: bool = False) -> str:
  result = subprocess.run(
      ['git', *_GIT_CONFIG, *args], cwd=cwd, env=_git_env(cwd), check=True,
      stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True,
  )
  return result.stdout if capture else ''


def pristine_repo(version: str, dest: pathlib.Path) -> None:
  """``dest``: a git repository holding Flax ``version``'s sdist, committed."""
  dest.mkdir(parents=True)
  extract(sdist(version), dest)
  git(dest, 'init', '-q')
  git(dest, 'add', '-A')
  git(dest, 'commit', '-q', '-m', f'Flax {version} (pristine sdist)')


def generate(version: str, out: pathlib.Path) -> list[str]:
  """Writes the series for ``version`` into ``out``; returns notes."""
  notes = []
  with tempfile.TemporaryDirectory(prefix='flax-tieext-patches-') as tmp:
    repo = pathlib.Path(tmp) / f'flax-{version}'
    pristine_repo(version, repo)
    for feature in FEATURES:
      notes += apply_feature(feature, repo)
      message = pathlib.Path(tmp) / 'message'
      message.write_text(
          f'{feature.subject}\n\n{feature.body}\n\n'
          f'Generated by flax-tieext tools/make_patches.py against Flax {version}.\n'
      )
      git(repo, 'add', '-A')
      git(repo, 'commit', '-q', '-F', str(message))
    series = pathlib.Path(tmp) / 'series'
    git(repo, 'format-patch', '-q', '--zero-commit', '--no-signature',
        '--numbered', '--no-renames', '--stat=72', '--summary',
        '-o', str(series), f'HEAD~{len(FEATURES)}')
    for patch in sorted(series.glob('*.patch')):
      check_no_leak(patch)
    # Only a complete, checked series replaces the old one.
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob('*.patch'):
      old.unlink()
    for patch in sorted(series.glob('*.patch')):
      shutil.copyfile(patch, out / patch.name)
  return notes


def apply_series(version: str, dest: pathlib.Path,
                 patches: pathlib.Path = PATCHES) -> list[pathlib.Path]:
  """Pristine sdist into ``dest``, then each patch: ``git apply --check``, apply."""
  series = sorted((patches / version).glob('*.patch'))
  if not series:
    raise PatchGenerationError(f'no patches in {patches / version}')
  pristine_repo(version, dest)
  for patch in series:
    # Whitespace errors (trailing spaces, blank lines at the end of a file)
    # are what `git am` warns about and reviewers flag: refuse them.
    for args in (('apply', '--check', '--whitespace=error'), ('apply',)):
      try:
        git(dest, *args, str(patch.resolve()))
      except subprocess.CalledProcessError as e:
        raise PatchGenerationError(
            f'git {" ".join(args)} {patch.name} failed on Flax {version}:\n'
            f'{e.stderr}') from None
    print(f'applied {patch.name} (git apply --check: ok)')
  return series


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def check(versions: list[str]) -> int:
  """Regenerates into a temporary directory; 1 if ``patches/`` differs."""
  stale = []
  with tempfile.TemporaryDirectory(prefix='flax-tieext-check-') as tmp:
    for version in versions:
      fresh = pathlib.Path(tmp) / version
      for note in generate(version, fresh):
        print(f'note: {note}', file=sys.stderr)
      committed = PATCHES / version
      names = sorted({p.name for p in fresh.glob('*.patch')}
                     | {p.name for p in committed.glob('*.patch')})
      for name in names:
        a, b = committed / name, fresh / name
        old = a.read_text().splitlines(keepends=True) if a.exists() else []
        new = b.read_text().splitlines(keepends=True) if b.exists() else []
        if old == new:
          continue
        diff = list(difflib.unified_diff(
            old, new, f'patches/{version}/{name} (committed)',
            f'patches/{version}/{name} (from the current source)', n=1))
        added = sum(1 for l in diff if l.startswith('+') and not l.startswith('+++'))
        removed = sum(1 for l in diff if l.startswith('-') and not l.startswith('---'))
        state = 'missing' if not a.exists() else 'obsolete' if not b.exists() else 'stale'
        stale.append(f'patches/{version}/{name}: {state} (+{added} -{removed} lines)')
        sys.stdout.writelines(diff[:60])
        if len(diff) > 60:
          print(f'... ({len(diff) - 60} more diff lines)')
  if stale:
    print('\npatches/ is not current:\n  ' + '\n  '.join(stale))
    print('Regenerate with: python tools/make_patches.py')
    return 1
  print(f'patches/ is current ({", ".join(versions)}).')
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--check', action='store_true',
                      help='fail if patches/ differs from freshly generated ones')
  parser.add_argument('--apply', nargs=2, metavar=('VERSION', 'DIR'),
                      help='write the pristine sdist to DIR and apply the series')
  parser.add_argument('--version', action='append', dest='versions',
                      choices=sorted(RELEASES),
                      help='only this Flax release (repeatable; default: all)')
  args = parser.parse_args(argv)
  versions = args.versions or sorted(RELEASES)
  try:
    if args.apply:
      version, dest = args.apply
      if version not in RELEASES:
        parser.error(f'unknown release {version}; known: {", ".join(sorted(RELEASES))}')
      apply_series(version, pathlib.Path(dest).resolve())
      return 0
    if args.check:
      return check(versions)
    for version in versions:
      out = PATCHES / version
      for note in generate(version, out):
        print(f'note: {note}', file=sys.stderr)
      for patch in sorted(out.glob('*.patch')):
        lines = len(patch.read_text().splitlines())
        print(f'{_rel(patch)}: {lines} lines')
    return 0
  except PatchGenerationError as e:
    print(f'make_patches: {e}', file=sys.stderr)
    return 2


if __name__ == '__main__':
  sys.exit(main())
