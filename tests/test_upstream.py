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

"""tools/upstream.py: how definitions move into Flax's files, on small sources.

The series itself (built from the real source, applied, linted and tested
against Flax's suites) is checked by `nox -s upstream`; these tests need no
sdist and no network.
"""

import ast
import pathlib
import re
import symtable
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import upstream  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def _module(name, source):
  """Registers ``source`` as our module ``name``; returns its definitions by name."""
  source = textwrap.dedent(source)
  tree = ast.parse(source)
  lines = source.split('\n')
  defs = [upstream.Def(name, upstream._names(n)[0],
                       '\n'.join(lines[upstream._first_line(n) - 1:n.end_lineno]), set())
          for n in tree.body if upstream._names(n)]
  upstream._MODULES[name] = (defs, {}, '')
  return {d.name: d for d in defs}


FLAX = textwrap.dedent('''\
    import functools

    from flax.core.scope import Scope


    def pack(fn):
      return fn


    def checkpoint(fn):
      """Upstream's."""
      return fn


    def jit(fn):
      return fn
    ''')


def test_a_definition_flax_has_is_replaced_in_place():
  ours = _module('t.replace', '''\
      def checkpoint(fn, static_argnames=()):
        """Ours."""
        return fn
      ''')
  out = upstream.place(FLAX, [ours['checkpoint']])
  assert '"""Ours."""' in out and '"""Upstream\'s."""' not in out
  names = [n.name for n in ast.parse(out).body if isinstance(n, ast.FunctionDef)]
  assert names == ['pack', 'checkpoint', 'jit']


def test_a_new_definition_follows_its_predecessor_in_our_source():
  ours = _module('t.order', '''\
      def pack(fn):
        return fn


      def _resolve(fn):
        return fn


      def tie(fn):
        return _resolve(fn)
      ''')
  out = upstream.place(FLAX, [ours['_resolve'], ours['tie']])
  names = [n.name for n in ast.parse(out).body if isinstance(n, ast.FunctionDef)]
  assert names == ['pack', '_resolve', 'tie', 'checkpoint', 'jit']
  assert '\n\n\n\n' not in out


def test_a_helper_with_no_predecessor_goes_before_the_definition_it_serves():
  ours = _module('t.helper', '''\
      def _split(args):
        return args


      def checkpoint(fn):
        return _split(fn)
      ''')
  out = upstream.place(FLAX, [ours['_split'], ours['checkpoint']])
  names = [n.name for n in ast.parse(out).body if isinstance(n, ast.FunctionDef)]
  assert names == ['pack', '_split', 'checkpoint', 'jit']


def test_imports_inside_functions_move_to_the_module():
  text, imports = upstream.hoist(textwrap.dedent('''\
      def f(fn):
        """Doc."""
        import inspect  # pylint: disable=g-import-not-at-top

        return inspect.signature(fn)
      '''))
  assert imports == ['import inspect']
  assert 'import' not in text and '"""Doc."""\n  return' in text
  out = upstream._insert_import(FLAX, imports[0])
  assert out.startswith('import functools\nimport inspect\n')


def test_a_missing_name_is_imported_the_way_flax_spells_its_module(tmp_path):
  (tmp_path / 'flax/core').mkdir(parents=True)
  (tmp_path / 'flax/core/ties.py').write_text('')
  ours = _module('t.imports', '''\
      def tie(fn):
        return ties_lib.declare(functools.partial(fn), Iterable)
      ''')
  d = ours['tie']
  d.uses = {'ties_lib', 'functools', 'Iterable'}
  upstream._MODULES['t.imports'] = ([d], {
      'ties_lib': 'from flax_tieext.core import ties as ties_lib',
      'functools': 'import functools',
      'Iterable': 'from collections.abc import Iterable',
  }, '')
  flax = FLAX.replace('import functools\n',
                      'import functools\nfrom collections.abc import Callable\n')
  out = upstream.add_imports(flax, [d], 'flax/core/lift.py', tmp_path)
  assert 'from flax.core import ties as ties_lib\n' in out
  assert 'from collections.abc import Callable, Iterable\n' in out
  assert out.count('import functools') == 1


def test_a_name_the_module_imports_is_not_imported_again():
  # Each hook on a Scope method once added `ties` to `from flax.core import ...`.
  out = FLAX.replace('from flax.core.scope import Scope\n', 'from flax.core import ties\n')
  for stmt in ('from flax.core import ties', 'from flax.core import ties',
               'from flax.core import tie_vars', 'import functools'):
    out = upstream._insert_import(out, stmt)
  assert 'from flax.core import tie_vars, ties\n' in out  # kept in order
  assert out.count('import functools') == 1


def test_a_third_party_module_is_not_imported_among_the_stdlib_ones():
  out = upstream._insert_import(FLAX, 'import numpy as np')
  assert out.startswith('import functools\n\nfrom flax.core.scope import Scope\nimport numpy as np\n')


def test_names_read_only_in_annotations_are_uses(tmp_path, monkeypatch):
  (tmp_path / 'annotated.py').write_text(textwrap.dedent('''\
      from __future__ import annotations

      from collections.abc import Callable, Iterator
      from typing import Any


      class View:
        fn: Callable[[Any], Any] | None

        def __iter__(self) -> Iterator[str]:
          yield from ()
      '''))
  monkeypatch.setattr(upstream, 'ROOT', tmp_path)
  defs, _, _ = upstream.read_module('annotated')
  assert {'Callable', 'Any', 'Iterator'} <= defs[0].uses


def test_the_series_own_modules_import_each_module_once_in_order():
  out = upstream.sort_imports(textwrap.dedent('''\
      """Doc."""

      from __future__ import annotations

      import numpy as np
      from flax.core import ties, lift
      import functools
      from flax.core import tie_spec, lift
      '''))
  assert out.endswith('''from __future__ import annotations

import functools

import numpy as np

from flax.core import lift, tie_spec, ties
''')


def test_a_new_flax_test_file_has_flax_header_of_this_year_and_runs_absltest(tmp_path):
  (tmp_path / 'flax/core').mkdir(parents=True)
  (tmp_path / 'flax/core/lift.py').write_text(
      '# Copyright 2024 The Flax Authors.\n#\n# Licensed ...\n\n"""Lift."""\n')
  made = upstream.new_module(tmp_path, 'tests/core/core_tie_test.py', 'Tests for ties.')
  assert made.startswith('# Copyright 2026 The Flax Authors.\n#\n# Licensed ...\n\n'
                         '"""Tests for ties."""\n\nfrom absl.testing import absltest\n')
  ours = _module('t.tests', '''\
      class TieTest(parameterized.TestCase):
        pass
      ''')
  out = upstream.place(made, [ours['TieTest']])
  assert out.endswith("\n\n\nclass TieTest(parameterized.TestCase):\n  pass\n\n\n"
                      "if __name__ == '__main__':\n  absltest.main()\n")
  module = upstream.new_module(tmp_path, 'flax/core/ties.py', 'Ties.')
  assert module.startswith('# Copyright 2026 The Flax Authors.')


def test_the_verifier_finds_a_name_imported_twice(tmp_path):
  import upstream_verify  # pylint: disable=g-import-not-at-top
  (tmp_path / 'scope.py').write_text(
      'from flax.core import ties, ties, tie_vars\nimport functools\nimport functools as ft\n')
  assert upstream_verify.imported_twice(tmp_path, 'scope.py') == ['ties']


def test_a_name_flax_cannot_bind_stops_the_pr(tmp_path):
  ours = _module('t.compat', '''\
      def remat(fn):
        return _compat.nnx_remat(fn)
      ''')
  d = ours['remat']
  d.uses = {'_compat'}
  upstream._MODULES['t.compat'] = ([d], {'_compat': 'from flax_tieext import _compat'}, '')
  with pytest.raises(upstream.Error, match=r'remat reads _compat .*no counterpart in Flax'):
    upstream.add_imports(FLAX, [d], 'flax/core/lift.py', tmp_path)


def _pr(slug):
  return next(pr for pr in upstream.PRS if pr.slug == slug)


def test_each_pr_reaches_its_helpers_and_nothing_of_a_later_pr():
  static = upstream.reach(_pr('02-lift-checkpoint-static-argnames'), set())
  names = {d.name for d in static}
  assert {'checkpoint', 'remat', '_checkpoint', 'StaticArgs'} <= names
  assert not names & {'tie', '_partial_pack', 'DiagnosedStaticArgs'}
  assert {d.module for d in static} == {
      'flax_tieext.core.lift', 'flax_tieext.core._static_args'}


def test_plugin_code_and_private_parameters_are_reported(tmp_path):
  def git(*args):
    subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', *args],
                   cwd=tmp_path, check=True, capture_output=True)

  git('init', '-q')
  (tmp_path / 'm.py').write_text('def f(x):\n  return x\n')
  git('add', '-A')
  git('commit', '-qm', 'base')
  (tmp_path / 'm.py').write_text(
      'def f(x, *, _channel=None):\n  import flax_tieext\n  return x \n')
  git('commit', '-qam', 'pr')
  found = upstream.leftovers(tmp_path)
  assert 'm.py: f(_channel=...) is private' in found
  assert '+  import flax_tieext' in found
  assert '+  return x ' in found  # trailing whitespace


def test_every_pr_has_a_description_and_its_test_classes():
  for pr in upstream.PRS:
    doc = (ROOT / 'docs' / 'upstream' / f'{pr.slug}.md').read_text()
    assert doc.startswith('# ') and '\n## Why' in doc and '\n## Tests' in doc, pr.slug
    for stem, name in pr.tests:
      assert name in {d.name for d in upstream.read_module(f'tests.upstream.{stem}')[0]}


def test_overloads_move_and_are_replaced_as_one_definition(tmp_path, monkeypatch):
  (tmp_path / 'overloaded.py').write_text(textwrap.dedent('''\
      @tp.overload
      def remat(*, static_argnames=()): ...
      @tp.overload
      def remat(f, *, static_argnames=()): ...
      def remat(f=None, *, static_argnames=()):
        """Ours."""
      '''))
  monkeypatch.setattr(upstream, 'ROOT', tmp_path)
  defs, _, _ = upstream.read_module('overloaded')
  assert [d.name for d in defs] == ['remat'] and defs[0].text.count('def remat') == 3
  flax = FLAX + textwrap.dedent('''\


      @tp.overload
      def remat(*, prevent_cse=True): ...
      @tp.overload
      def remat(f, *, prevent_cse=True): ...
      def remat(f=None, *, prevent_cse=True):
        """Upstream's remat."""
      ''')
  out = upstream.place(flax, defs)
  assert out.count('def remat') == 3 and '"""Ours."""' in out
  assert "Upstream's remat" not in out and 'prevent_cse' not in out


def test_each_transform_declares_upstream_what_the_plugin_declares_for_it():
  """The series' pack(..., tie_sources=...) edits and the plugin's table agree."""
  from flax_tieext import _compat  # pylint: disable=g-import-not-at-top
  declared = {}
  for file, _, new in _pr('08-tie-lifted-transforms').edits:
    found = re.search(r"name='(\w+)',\s+(?:enable_kwargs=True,\s+)?"
                      r'tie_sources=tie_lift\.(\w+)', new)
    if found:
      assert file == 'flax/core/lift.py'
      declared[found[1]] = found[2]
  assert declared == _compat.TIE_SOURCES_BY_PACK_NAME


def test_a_class_body_reads_its_enclosing_function_locals_not_globals():
  source = textwrap.dedent('''\
      class TestCase:
        def test(self):
          def model(index):
            class Model:
              step = index

              def __init__(self):
                super().__init__()  # reads __class__
            return Model
          return model
      ''')
  tree = ast.parse(source)
  table = {t.get_name(): t for t in symtable.symtable(source, 'm', 'exec').get_children()}
  assert upstream._globals(tree.body[0], table['TestCase']) == set()


def _counts(patch):
  """(files, lines added and removed under flax/, under tests/) of a patch file."""
  files, n, current = set(), {'flax+': 0, 'flax-': 0, 'tests+': 0, 'tests-': 0}, ''
  for line in patch.read_text().split('\n'):
    if line.startswith('diff --git'):
      current = line.split()[2][2:]
      files.add(current)
    elif line[:1] in ('+', '-') and line[:3] not in ('+++', '---'):
      top = current.split('/')[0]
      if top in ('flax', 'tests'):
        n[top + line[0]] += 1
  return len(files), n['flax+'], n['flax-'], n['tests+'], n['tests-']


def test_the_numbers_in_upstream_patches_md_are_the_series():
  rows = re.findall(r'^\| (\d\d) \| (\d+) \| \+(\d+) / −(\d+) \| \+(\d+) / −(\d+) \|',
                    (ROOT / 'docs' / 'upstream_patches.md').read_text(), re.M)
  patches = sorted((ROOT / 'patches' / 'main').glob('*.patch'))
  assert [r[0] for r in rows] == [p.name[2:4] for p in patches]
  for row, patch in zip(rows, patches):
    assert tuple(map(int, row[1:])) == _counts(patch), patch.name


def test_the_flips_costs_are_the_series():
  text = (ROOT / 'docs' / 'upstream' / 'flip-linen-ties.md').read_text()
  rows = re.findall(r'^\| (\d\d) [^|]*\| \+([\d,]+) / −(\d+) \| \+([\d,]+) / −(\d+) \|',
                    text, re.M)
  patches = {p.name[2:4]: p for p in (ROOT / 'patches' / 'main').glob('*.patch')}
  ties = [n for n in sorted(patches) if n >= '05']
  assert [r[0] for r in rows] == ties
  for row in rows:
    assert tuple(int(x) for x in row[1:]) == _counts(patches[row[0]])[1:], row[0]
  total = [sum(_counts(patches[n])[i] for n in ties) for i in range(1, 5)]
  assert (f'**ties, 05 to 10** | **+{total[0]:,} / −{total[1]}** |'
          f' **+{total[2]:,} / −{total[3]}**') in text
  static = sum(_counts(patches[n])[1] for n in ('02', '03', '04'))
  assert f'the static-argument PRs 02 to 04\nadd {static} lines' in text


def test_files_the_series_copies_are_current_in_patches_main():
  for number, pr in enumerate(upstream.PRS, 1):
    for dest, ours in pr.files:
      patch = next((ROOT / 'patches' / 'main').glob(f'{number:04d}-*.patch'))
      text = patch.read_text().split(f'diff --git a/{dest} b/{dest}\n')[1]
      body = text.split('\n@@')[1].split('\n', 1)[1].split('\ndiff --git')[0]
      added = [l[1:] for l in body.split('\n') if l.startswith('+')]
      assert added == (ROOT / ours).read_text().rstrip('\n').split('\n'), (
          f'{patch.name} has an old {ours}: run python tools/upstream.py build')


def test_an_import_from_its_own_package_is_relative_where_flax_imports_so():
  """flax/core/scope.py imports `from . import meta, ...`: the series does too."""
  scope = 'import jax\n\nfrom flax import errors\n\nfrom . import meta, tracers\nfrom .frozen_dict import freeze\n\nX = 1\n'
  out = upstream._insert_import(scope, 'from flax.core import ties', 'flax/core/scope.py')
  assert 'from . import meta, ties, tracers\n' in out and 'flax.core' not in out
  out = upstream._insert_import(out, 'from flax.core.frozen_dict import freeze', 'flax/core/scope.py')
  assert out.count('freeze') == 1
  # A module importing its package absolutely (linen/transforms.py) keeps that.
  linen = 'from flax.core import lift\n\nX = 1\n'
  out = upstream._insert_import(linen, 'from flax.linen import module', 'flax/linen/transforms.py')
  assert 'from flax.linen import module\n' in out


_CALL_INTO_TIES = re.compile(r'\b((?:ties|tie_vars|tie_lift)\.[a-z_]+)\(')


def test_the_plugin_wraps_flax_with_the_calls_the_series_writes_into_its_bodies():
  """_compat's wrappers call what series.toml's edits add to Flax's methods."""
  from flax_tieext import _compat  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  series = set()
  for pr in upstream.PRS:
    for _, anchor, new in pr.edits:
      series |= set(_CALL_INTO_TIES.findall(new)) - set(_CALL_INTO_TIES.findall(anchor))
  wrappers = (_compat.scope_push, _compat.scope_collection, _compat.scope_param,
              _compat.scope_variables, _compat.partial_pack)
  plugin = {c for w in wrappers for c in _CALL_INTO_TIES.findall(inspect.getsource(w))}
  assert series == plugin == {
      'ties.share_rngs', 'ties.collection', 'ties.check_param',
      'ties.refuse_unknown_collection', 'tie_vars.tied_variables', 'tie_lift.packed'}


def test_a_new_module_has_our_module_wide_disable_after_its_imports():
  """One `# pylint: disable=protected-access` per module, as Flax's module.py."""
  new = 'from __future__ import annotations\n\nimport jax\n\n\nX = 1\n'
  out = upstream.module_disables(new, 'flax_tieext.core.ties')
  assert out.index('import jax') < out.index('# pylint: disable=protected-access') < out.index('X = 1')
  assert upstream.module_disables(out, 'flax_tieext.core.ties') == out
  assert upstream.module_disables(new, 'flax_tieext.core.tie_errors') == new  # none there
