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

"""Makes the upstream PR series ``patches/main/`` from the plugin's source.

The plugin is the one source of truth (docs/upstream_patches.md). Each PR names
its *roots*, the definitions it adds or changes; it carries them and every
top-level definition of the plugin's modules they reach (by name, or as
``module.name``), verbatim, into the same-named Flax module: a definition Flax
has is replaced in place, a new one goes after its predecessor in our source,
an import Flax lacks is added. Test classes move the same way, from
``tests/upstream/<Flax test file>`` (which our own pytest run collects). Only
our import blocks stay behind. Nothing is rewritten by pattern: what cannot
move verbatim stops the series at that PR, with the reason.

    python tools/upstream.py build         # writes patches/main/
    python tools/upstream.py draft DIR     # every PR, leftovers included, in DIR/flax
    python tools/upstream_verify.py               # all checks (`nox -s upstream`)
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import symtable
import tarfile
import tempfile
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / '.ci'))
import harness  # pylint: disable=g-import-not-at-top,wrong-import-position

SERIES = ROOT / 'patches' / 'main'
SPEC = tomllib.loads((ROOT / 'patches' / 'series.toml').read_text())
BASE, BUILD_ON, RELEASES = SPEC['base'], SPEC['build_on'], SPEC['releases']
AUTHOR = ('flax-tieext', 'flax-tieext@users.noreply.github.com')
DATE = '2026-12-01T00:00:00+00:00'
# Text that marks plugin code; none of it may reach Flax.
LEFTOVERS = ('flax_tieext', 'machinery_installed', '__flax_tie', 'plugin-only',
             '# section:', 'needs_patch', '_compat')


class Error(Exception):
  """The source cannot make a PR as it is; the message says why and where."""


def flax_module(ours: str) -> str:
  """``flax_tieext.core.lift`` -> ``flax.core.lift``; tests/upstream -> Flax's file."""
  if ours.startswith('tests.upstream.'):
    return TESTS[ours.rpartition('.')[2]]
  return 'flax' + ours[len('flax_tieext'):]


def _path(module: str) -> pathlib.Path:
  return pathlib.Path(*module.split('.')).with_suffix('.py')


def _first_line(node: ast.stmt) -> int:
  return min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])


def _names(node: ast.stmt) -> list[str]:
  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    return [node.name]
  targets = getattr(node, 'targets', None) or [getattr(node, 'target', None)]
  return [t.id for t in targets if isinstance(t, ast.Name)]


def _imports(body) -> list[ast.stmt]:
  return [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]


def _one(node: ast.stmt, alias: ast.alias) -> ast.stmt:
  """The import of ``alias`` alone, as ``node`` imports it."""
  if isinstance(node, ast.ImportFrom):
    return ast.ImportFrom(node.module, [alias], node.level)
  return ast.Import([alias])


@dataclasses.dataclass
class Def:
  module: str  # ours, e.g. 'flax_tieext.core.lift'
  name: str
  text: str    # its lines, with the comment lines right above it
  uses: set    # global names it reads, and ('module', 'name') of ours it reaches
  end: int = 0  # its last line in our source


def _globals(node: ast.stmt, table: symtable.SymbolTable | None) -> set[str]:
  """The global names a top-level statement reads."""
  found, outer = set(), [node]
  if table is not None:  # a def or class: its body through the symbol table
    outer = [*node.decorator_list, *getattr(node, 'bases', [])]
    outer += [node.args, *filter(None, [node.returns])] if hasattr(node, 'args') else []
    tables = [table]
    while tables:
      t = tables.pop()
      tables += t.get_children()
      found |= {s.get_name() for s in t.get_symbols() if s.is_referenced() and (
          s.is_global() or (t.get_type() == 'class' and not s.is_assigned()
                            and not s.is_free()))}
  for n in outer:
    found |= {s.id for s in ast.walk(n) if isinstance(s, ast.Name)
              and isinstance(s.ctx, ast.Load)}
  return found - set(dir(builtins)) - {'__class__'}  # zero-argument super()


def _annotations(node: ast.stmt) -> set[str]:
  """The names the annotations in ``node`` read, which symtable does not see."""
  found = [n.annotation for n in ast.walk(node) if isinstance(n, (ast.arg, ast.AnnAssign))]
  found += [n.returns for n in ast.walk(node) if isinstance(
      n, (ast.FunctionDef, ast.AsyncFunctionDef))]
  return {s.id for a in filter(None, found) for s in ast.walk(a) if isinstance(s, ast.Name)}


_MODULES: dict[str, tuple[list[Def], dict[str, str], str]] = {}


def read_module(module: str):
  """A module of ours: its definitions, its imports (bound name -> statement), its docstring."""
  if module in _MODULES:
    return _MODULES[module]
  source = (ROOT / _path(module)).read_text()
  tree, lines = ast.parse(source), source.split('\n')
  tables = {t.get_name(): t for t in symtable.symtable(source, module, 'exec').get_children()}
  imports, ours = {}, {}  # ours: bound name -> our module, or (our module, name)
  for node in _imports(tree.body):
    for a in node.names:
      bound = (a.asname or a.name).split('.')[0]
      imports[bound] = ast.unparse(_one(node, a))
      full = f'{node.module}.{a.name}' if isinstance(node, ast.ImportFrom) else a.name
      if full.startswith('flax_tieext.') and (ROOT / _path(full)).exists():
        ours[bound] = full
      elif getattr(node, 'module', '').startswith('flax_tieext.'):
        ours[bound] = (node.module, a.name)
  top = set(imports) | {n for node in tree.body for n in _names(node)}
  defs = []
  for node in tree.body:
    if not _names(node):
      continue
    first = _first_line(node)
    while first > 1 and lines[first - 2].startswith('#') and set(lines[first - 2]) - {'#', '-', ' '}:
      first -= 1
    uses = _globals(node, tables.get(_names(node)[0]) if hasattr(node, 'body') else None)
    uses |= _annotations(node) & top  # unevaluated (`from __future__ import annotations`)
    uses |= {ours[n] for n in uses if isinstance(ours.get(n), tuple)}
    uses |= {(ours[s.value.id], s.attr) for s in ast.walk(node) if isinstance(s, ast.Attribute)
             and isinstance(s.value, ast.Name) and isinstance(ours.get(s.value.id), str)}
    text = '\n'.join(lines[first - 1:node.end_lineno])
    if defs and _names(node) == [defs[-1].name] and hasattr(node, 'body'):  # @overload
      defs[-1].text += '\n' + '\n'.join(lines[defs[-1].end:node.end_lineno])
      defs[-1].uses |= uses
    else:
      defs += [Def(module, name, text, uses) for name in _names(node)]
    defs[-1].end = node.end_lineno
  _MODULES[module] = defs, imports, ast.get_docstring(tree) or ''
  return _MODULES[module]


def _find(module: str, name: str) -> list[Def]:
  """``name`` in our ``module``, or in the one module of package ``module`` defining it."""
  if (ROOT / _path(module)).exists():
    return [d for d in read_module(module)[0] if d.name == name]
  package = ROOT / pathlib.Path(*module.split('.'))
  found = [d for p in sorted(package.rglob('[!_]*.py'))
           for d in read_module('.'.join(p.relative_to(ROOT).with_suffix('').parts))[0]
           if d.name == name]
  return found if len({d.module for d in found}) == 1 else []


@dataclasses.dataclass
class PR:
  """One PR of patches/series.toml."""
  slug: str
  roots: list = dataclasses.field(default_factory=list)  # [our module or package, name]
  tests: list = dataclasses.field(default_factory=list)  # [Flax test file stem, class]
  edits: list = dataclasses.field(default_factory=list)  # [Flax file, anchor, replacement]
  files: list = dataclasses.field(default_factory=list)  # [Flax file, our file]: copied


PRS = [PR(**pr) for pr in SPEC['pr']]
TESTS = SPEC['test_files']
WAIVED = SPEC['waived']


def reach(pr: PR, taken: set) -> list[Def]:
  """``pr``'s roots and the definitions of ours they reach that no earlier PR took."""
  todo, mine = [*map(tuple, pr.roots)], []
  while todo:
    module, name = todo.pop()
    if module.split('.')[1].startswith('_') or module.startswith('flax_tieext.testing'):
      raise Error(f'{name} of {module} is reached, but that module is plugin-only:'
                  ' Flax has no counterpart for it')
    found = _find(module, name)
    if not found:
      raise Error(f'{module} defines no (or more than one) {name}')
    for d in found:
      if (d.module, d.name) not in taken:
        taken.add((d.module, d.name))
        mine.append(d)
        local = {x.name for x in read_module(d.module)[0]}
        todo += [u if isinstance(u, tuple) else (d.module, u) for u in d.uses
                 if isinstance(u, tuple) or u in local]
  order = {(d.module, d.name): i for m in _MODULES.values() for i, d in enumerate(m[0])}
  return sorted(mine, key=lambda d: (d.module, order[d.module, d.name]))


def _spans(source: str) -> dict[str, tuple[int, int]]:
  """Name -> (first, last line) of each top-level definition; overloads as one."""
  spans, previous = {}, None
  for node in ast.parse(source).body:
    for name in _names(node):
      first = spans[name][0] if name == previous and name in spans else _first_line(node)
      spans[name], previous = (first, node.end_lineno), name
  return spans


def _bound(source: str) -> set[str]:
  body = ast.parse(source).body
  return {n for node in body for n in _names(node)} | {
      (a.asname or a.name).split('.')[0] for n in _imports(body) for a in n.names}


def _insert_import(source: str, stmt: str, dest: str = '') -> str:
  """Adds ``stmt``: a stdlib module among the leading stdlib imports, others after the last.

  A name the module already imports the same way is not imported again. In a
  module ``dest`` that imports its own package relatively (``from . import
  meta``), an import from that package is made relative too.
  """
  body, lines = ast.parse(source).body, source.split('\n')
  node = ast.parse(stmt).body[0]
  package = '.'.join(pathlib.Path(dest).parts[:-1]) if dest else ''
  if (package and isinstance(node, ast.ImportFrom) and not node.level
      and (node.module == package or node.module.startswith(package + '.'))
      and any(getattr(n, 'level', 0) for n in _imports(body))):
    node.module, node.level = node.module[len(package) + 1:] or None, 1
  have = {ast.unparse(_one(n, a)) for n in _imports(body) for a in n.names}
  node.names = [a for a in node.names if ast.unparse(_one(node, a)) not in have]
  if not node.names:
    return source
  same = [n for n in _imports(body) if isinstance(node, ast.ImportFrom) and isinstance(
      n, ast.ImportFrom) and (n.module, n.level) == (node.module, node.level)
      and n.lineno == n.end_lineno and '#' not in lines[n.lineno - 1]]
  if same:  # `from collections.abc import Callable, Mapping` gains a name
    names = [a.name for a in same[0].names]
    same[0].names += node.names
    if names == sorted(names):  # in order, as it was
      same[0].names.sort(key=lambda a: a.name)
    lines[same[0].lineno - 1] = ast.unparse(same[0])
    return '\n'.join(lines)
  stmt = ast.unparse(node)
  if getattr(node, 'level', 0):  # beside the module's other relative imports
    at = max(n.end_lineno for n in _imports(body) if getattr(n, 'level', 0))
    return '\n'.join(lines[:at] + [stmt] + lines[at:])
  stdlib = [n for n in _imports(body) if isinstance(n, ast.Import) and
            n.names[0].name.split('.')[0] in sys.stdlib_module_names]
  if isinstance(node, ast.Import) and stdlib and (
      node.names[0].name.split('.')[0] in sys.stdlib_module_names):
    after = [n for n in stdlib if n.names[0].name < node.names[0].name]
    at = after[-1].end_lineno if after else stdlib[0].lineno - 1
  else:
    at = max(n.end_lineno for n in _imports(body))
  return '\n'.join(lines[:at] + [stmt] + lines[at:])


def sort_imports(source: str) -> str:
  """A new module's import block in groups: __future__, stdlib, others, flax."""
  body, lines = ast.parse(source).body, source.split('\n')
  block, merged = _imports(body), {}
  for n in block:  # one statement per module it imports from, each name once
    key = (n.module, n.level) if isinstance(n, ast.ImportFrom) else id(n)
    first = merged.setdefault(key, n)
    if first is not n:
      first.names += [a for a in n.names if ast.unparse(a) not in map(ast.unparse, first.names)]
  def group(n):
    top = (n.module if isinstance(n, ast.ImportFrom) else n.names[0].name).split('.')[0]
    return 0 if top == '__future__' else 1 if top in sys.stdlib_module_names else (
        3 if top == 'flax' else 2)
  def text(n):  # a long `from x import a, b` wrapped as Flax wraps it
    if isinstance(n, ast.ImportFrom):
      n.names.sort(key=lambda a: a.name)
    line = ast.unparse(n)
    if len(line) <= 80 or not isinstance(n, ast.ImportFrom):
      return line
    return line.split(' import ')[0] + ' import (\n' + ''.join(
        f'    {ast.unparse(a)},\n' for a in n.names) + ')'
  out = []
  for g in sorted({group(n) for n in merged.values()}):
    out += sorted((text(n) for n in merged.values() if group(n) == g),
                  key=lambda t: t.split()[1]) + ['']
  return '\n'.join(lines[:block[0].lineno - 1] + out[:-1] + lines[block[-1].end_lineno:])


def module_disables(source: str, ours: str) -> str:
  """``source``, a new module, with our module's module-wide disable after its imports.

  That is the ``# pylint: disable=`` line at column 0 of ``ours`` and the
  comment above it, placed as Flax's ``linen/module.py`` places its own.
  """
  lines = (ROOT / _path(ours)).read_text().split('\n')
  at = next((i for i, l in enumerate(lines) if l.startswith('# pylint: disable=')), None)
  if at is None or '# pylint: disable=' in source:
    return source
  first = at
  while first > 0 and lines[first - 1].startswith('#'):
    first -= 1
  body, out = ast.parse(source).body, source.split('\n')
  end = max(n.end_lineno for n in _imports(body))
  return '\n'.join(out[:end] + ['', *lines[first:at + 1]] + out[end:])


def hoist(text: str) -> tuple[str, list[str]]:
  """``text`` without the imports inside its functions; those imports."""
  tree, lines = ast.parse(text), text.split('\n')
  found = [n for n in ast.walk(tree) if n not in tree.body and isinstance(
      n, (ast.Import, ast.ImportFrom))]
  for n in sorted(found, key=lambda n: -n.lineno):
    del lines[n.lineno - 1:n.end_lineno]
    if n.lineno <= len(lines) and not lines[n.lineno - 1].strip() and (
        lines[n.lineno - 2].rstrip().endswith('"""') or not lines[n.lineno - 2].strip()):
      del lines[n.lineno - 1]
  return '\n'.join(lines), [ast.unparse(n) for n in found]


def place(source: str, defs: list[Def]) -> str:
  """Puts ``defs`` into a Flax module: replaced in place, or after their predecessor."""
  previous = None
  for i, d in enumerate(defs):
    lines, top = source.split('\n'), _spans(source)
    text = hoist(d.text)[0].split('\n')
    if d.name in top:
      lines[top[d.name][0] - 1:top[d.name][1]] = text
    else:
      ours = [e.name for e in read_module(d.module)[0]]
      before = [n for n in ours[:ours.index(d.name)] if n in top]
      if previous or before:  # after what precedes it in our source
        at = top[previous or before[-1]][1]
      else:  # before the next one Flax has, or `if __name__ == '__main__'`, or at the end
        later = [top[e.name][0] for e in defs[i:] if e.name in top] + [
            n.lineno for n in ast.parse(source).body if isinstance(n, ast.If)
            and '__main__' in ast.unparse(n.test)]
        at = later[0] - 1 if later else len(lines)
        while at > 0 and (not lines[at - 1].strip() or (later and lines[at - 1].startswith('#'))):
          at -= 1
      lines[at:at] = ['', '', *text]
    source, previous = '\n'.join(lines), d.name
    while '\n\n\n\n' in source:
      source = source.replace('\n\n\n\n', '\n\n\n')
  return source


def add_imports(source: str, defs: list[Def], dest: str, tree: pathlib.Path) -> str:
  """Imports each name the moved definitions read that ``dest`` does not bind."""
  for d in defs:
    ours = read_module(d.module)[1]
    for stmt in hoist(d.text)[1]:
      if ast.parse(stmt).body[0].names[0].name not in _bound(source):
        source = _insert_import(source, stmt, dest)
    for name in sorted(u for u in d.uses if isinstance(u, str) and u not in _bound(source)):
      if name not in ours:
        raise Error(f'{dest}: {d.name} reads {name}, which Flax does not define there'
                    ' (defined by a PR that is not in the series?)')
      node = ast.parse(ours[name]).body[0]
      if isinstance(node, ast.ImportFrom) and node.module.startswith('flax_tieext'):
        full = flax_module(f'{node.module}.{node.names[0].name}')
        if (tree / _path(full)).exists():  # `from flax_tieext.core import ties as x`
          node.module, node.names[0].name = full.rpartition('.')[0], full.rpartition('.')[2]
        else:
          node.module = flax_module(node.module)
        if not (tree / _path(node.module)).exists() and not (
            tree / _path(f'{node.module}.{node.names[0].name}')).exists():
          raise Error(f'{dest}: {d.name} reads {name} ({ours[name]}), which has no'
                      ' counterpart in Flax')
      source = _insert_import(source, ast.unparse(node), dest)
  return source


def _in_pristine(tree: pathlib.Path, pristine: str, path: str) -> bool:
  """Whether Flax has ``path`` before the series (at the tree's first commit)."""
  return not subprocess.run(['git', 'cat-file', '-e', f'{pristine}:{path}'], cwd=tree,
                            capture_output=True).returncode


def add_edit_imports(path: pathlib.Path, new: str, tree: pathlib.Path, pristine: str) -> None:
  """Imports the ``flax.core`` modules of the series that an edit's ``new`` text calls into."""
  source = path.read_text()
  for name in sorted(set(re.findall(r'\b([a-z_]+)\.[A-Za-z_]', new))):
    module = f'flax/core/{name}.py'
    if ((tree / module).exists() and name not in _bound(source)
        and not _in_pristine(tree, pristine, module)):
      source = _insert_import(source, f'from flax.core import {name}', str(path.relative_to(tree)))
  path.write_text(source)


def new_module(tree: pathlib.Path, dest: str, doc: str) -> str:
  """A module the series adds: Flax's license header of this year, our docstring.

  A test file (its classes come from ``tests/upstream/<stem>.py``, whose
  docstring is the Flax file's) ends as Flax's do, running ``absltest``.
  """
  header = (tree / 'flax/core/lift.py').read_text().split('\n\n')[0]
  header = re.sub(r'Copyright \d{4} ', f'Copyright {DATE[:4]} ', header, count=1)
  if dest.startswith('tests/'):
    return (f'{header}\n\n"""{doc}"""\n\nfrom absl.testing import absltest\n\n\n'
            "if __name__ == '__main__':\n  absltest.main()\n")
  return f'{header}\n\n"""{doc}\n"""\n\nfrom __future__ import annotations\n'


def apply_pr(pr: PR, taken: set, tree: pathlib.Path) -> None:
  """Makes ``pr``'s change in the Flax source ``tree``."""
  by_dest = {}
  for d in reach(pr, taken):
    by_dest.setdefault(str(_path(flax_module(d.module))), []).append(d)
  for stem, name in pr.tests:
    found = [d for d in read_module(f'tests.upstream.{stem}')[0] if d.name == name]
    if not found:
      raise Error(f'tests/upstream/{stem}.py has no {name}')
    for module, attr in (u for u in found[0].uses if isinstance(u, tuple)):
      if not _find(module, attr):
        raise Error(f'{name} in tests/upstream/{stem}.py uses {module}.{attr}, which'
                    ' does not exist')
    by_dest.setdefault(str(_path(TESTS[stem])), []).extend(found)
  pristine_commit = git(tree, 'rev-list', '--max-parents=0', 'HEAD', capture=True).strip()
  new = {dest for dest in by_dest if not _in_pristine(tree, pristine_commit, dest)}
  for dest, defs in by_dest.items():
    path = tree / dest
    if not path.exists():
      path.write_text(new_module(tree, dest, read_module(defs[0].module)[2]))
    path.write_text(place(path.read_text(), defs))
  for dest, defs in by_dest.items():  # once every new module exists
    source = add_imports((tree / dest).read_text(), defs, dest, tree)
    # The series' own modules: their import block in order, whoever added to it.
    source = module_disables(sort_imports(source), defs[0].module) if dest in new else source
    (tree / dest).write_text(source.rstrip('\n') + '\n')
  for file, anchor, new in pr.edits:
    text = (tree / file).read_text()
    if anchor not in text:
      raise Error(f'{file} has no {anchor!r}')
    (tree / file).write_text(text.replace(anchor, new, 1))
    if file.endswith('.py'):
      add_edit_imports(tree / file, new, tree, pristine_commit)
  for file, ours in pr.files:
    (tree / file).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / ours, tree / file)


def leftovers(tree: pathlib.Path) -> list[str]:
  """Plugin code and whitespace errors the last commit adds; new private parameters."""
  diff = git(tree, 'diff', 'HEAD~1', capture=True).split('\n')
  bad = [l for l in diff if l.startswith('+') and not l.startswith('+++') and (
      any(m in l for m in LEFTOVERS) or l != l.rstrip())]

  def private(rev, path):
    try:
      source = git(tree, 'show', f'{rev}:{path}', capture=True)
    except subprocess.CalledProcessError:
      return set()
    return {f'{path}: {n.name}({a.arg}=...) is private' for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.FunctionDef) and not n.name.startswith('_')
            for a in n.args.args + n.args.kwonlyargs if a.arg.startswith('_')}

  for path in git(tree, 'diff', '--name-only', 'HEAD~1', capture=True).split():
    if path.endswith('.py'):
      bad += sorted(private('HEAD', path) - private('HEAD~1', path))
  return bad


def git(cwd, *args, capture=False):
  env = {**os.environ, 'GIT_AUTHOR_NAME': AUTHOR[0], 'GIT_AUTHOR_EMAIL': AUTHOR[1],
         'GIT_COMMITTER_NAME': AUTHOR[0], 'GIT_COMMITTER_EMAIL': AUTHOR[1],
         'GIT_AUTHOR_DATE': DATE, 'GIT_COMMITTER_DATE': DATE}
  out = subprocess.run(['git', '-c', 'core.autocrlf=false', '-c', 'commit.gpgsign=false',
                        *args], cwd=cwd, env=env, check=True, text=True, capture_output=capture)
  return out.stdout if capture else None


def pristine(dest: pathlib.Path, version: str = BUILD_ON) -> pathlib.Path:
  """A git repository of Flax ``version``'s unpacked sdist."""
  shutil.rmtree(dest, ignore_errors=True)
  unpack = pathlib.Path(tempfile.mkdtemp())
  with tarfile.open(harness.flax_sdist(version)) as tar:
    tar.extractall(unpack, filter='data')
  shutil.move(next(unpack.iterdir()), dest)
  git(dest, 'init', '-q')
  git(dest, 'add', '-A')
  git(dest, 'commit', '-qm', f'flax {version}')
  return dest


def build(out: pathlib.Path = SERIES, tree: pathlib.Path | None = None,
          draft: bool = False) -> list[str]:
  """Commits each PR onto a pristine Flax and writes the series to ``out``.

  A PR the source cannot make yet is left out, with the PRs after it (they are
  still tried, so that every blocker is reported). Returns the blockers.
  """
  tree = pristine(tree or pathlib.Path(tempfile.mkdtemp()) / 'flax')
  start = git(tree, 'rev-parse', 'HEAD', capture=True).strip()
  series_end, taken, blocked, unused = start, set(), [], set(WAIVED)
  for pr in PRS:
    good, taken_before = git(tree, 'rev-parse', 'HEAD', capture=True).strip(), set(taken)
    try:
      apply_pr(pr, taken, tree)
      message = (ROOT / 'docs/upstream' / f'{pr.slug}.md').read_text().split('\n## ')[0]
      git(tree, 'add', '-A')
      git(tree, 'commit', '-q', '-m', message.removeprefix('# ').strip())
      for item in leftovers(tree):
        if item not in WAIVED and not draft:
          raise Error('plugin code or whitespace errors:\n  ' + '\n  '.join(
              b for b in leftovers(tree) if b not in WAIVED))
        print(f'warning: {pr.slug}: {item}: waived until'
              f' {WAIVED.get(item, "the draft is done")}', file=sys.stderr)
        unused.discard(item)
    except Error as e:
      blocked.append(f'{pr.slug}: {e}')
      taken = taken_before
      git(tree, 'reset', '-q', '--hard', good)
      git(tree, 'clean', '-qfd')
      continue
    if not blocked:
      series_end = git(tree, 'rev-parse', 'HEAD', capture=True).strip()
  shutil.rmtree(out, ignore_errors=True)
  if series_end != start:
    git(tree, 'format-patch', '-q', '--zero-commit', '--no-signature', '-o', str(out),
        f'{start}..{series_end}')
  for item in sorted(unused):
    print(f'note: no PR needs the waiver for {item!r} any more: remove it from'
          ' patches/series.toml', file=sys.stderr)
  for reason in blocked:
    print(f'NOT IN THE SERIES: {reason}', file=sys.stderr)
  return blocked


def main(argv: list[str]) -> int:
  command = argv[0] if argv else 'build'
  try:
    if command == 'build':
      build()
    elif command == 'draft':
      build(pathlib.Path(argv[1]) / 'series', pathlib.Path(argv[1]) / 'flax', draft=True)
    else:
      print(__doc__)
      return 2
  except Error as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
