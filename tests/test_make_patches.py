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

"""tools/make_patches.py: the transplant and its guards, on small sources.

Whether ``patches/`` is current is checked for real by ``nox -s patches``
(``make_patches.py --check`` against the pristine sdist); these tests need no
sdist and no network.
"""

import importlib.util
import pathlib
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    'make_patches', ROOT / 'tools' / 'make_patches.py')
mp = importlib.util.module_from_spec(_spec)
sys.modules.setdefault('make_patches', mp)  # dataclasses look their module up
_spec.loader.exec_module(mp)


def _src(text):
  return textwrap.dedent(text).lstrip('\n')


UPSTREAM = _src('''
    """Upstream module."""

    from collections.abc import Callable

    import jax


    def helper(x):
      return x


    # Upstream's comment about f.
    def f(x):
      return helper(x)


    g = f
''')


def _ours(tmp_path, text):
  path = tmp_path / 'ours.py'
  path.write_text(_src(text))
  return path


def test_definition_replaces_the_upstream_one_of_the_same_name(tmp_path):
  ours = _ours(tmp_path, '''
      """Ours."""
      from upstream import helper


      def f(x):
        return helper(x) + 1
  ''')
  out = mp.transplant(UPSTREAM, mp.read_definitions(ours))
  assert 'return helper(x) + 1' in out
  assert 'return helper(x)\n\n\ng = f' not in out
  # Upstream's own comment above the replaced definition stays.
  assert "# Upstream's comment about f.\ndef f(x):" in out


def test_new_definition_goes_before_the_next_definition_upstream_has(tmp_path):
  ours = _ours(tmp_path, '''
      def _new_helper(x):
        return x


      def f(x):
        return _new_helper(x)


      def appended(x):
        return x
  ''')
  out = mp.transplant(UPSTREAM, mp.read_definitions(ours))
  assert out.index('def _new_helper') < out.index("# Upstream's comment")
  assert out.rstrip().endswith('def appended(x):\n  return x')


def test_guard_refuses_a_name_only_our_file_has(tmp_path):
  ours = _ours(tmp_path, '''
      def _ours_only(x):
        return x


      def f(x):
        return _ours_only(x)
  ''')
  definitions = [d for d in mp.read_definitions(ours) if d.name == 'f']
  out = mp.transplant(UPSTREAM, definitions)
  with pytest.raises(mp.PatchGenerationError, match='`_ours_only`'):
    mp.check_and_import('flax/core/upstream.py', out, definitions, ours)


def test_guard_imports_what_our_import_block_takes_from_elsewhere(tmp_path):
  ours = _ours(tmp_path, '''
      from collections.abc import Callable, Iterable

      from flax_tieext.core import ties as ties_lib


      def f(x: Iterable[int]) -> Callable:
        return ties_lib.declare(x)
  ''')
  definitions = mp.read_definitions(ours)
  out = mp.transplant(UPSTREAM, definitions)
  out = mp.check_and_import('flax/core/upstream.py', out, definitions, ours)
  assert 'from collections.abc import Callable, Iterable\n' in out
  assert 'from flax.core import ties as ties_lib\n' in out


def test_plugin_only_code_and_section_markers_stay_out(tmp_path):
  ours = _ours(tmp_path, '''
      # ---------------------------------------------------------------------------
      # section: tie
      # ---------------------------------------------------------------------------

      def f(x):
        # plugin-only: begin
        if x is None:
          raise ValueError('call flax_tieext.install() first')
        # plugin-only: end
        return x
  ''')
  (definition,) = mp.read_definitions(ours)
  assert definition.section == 'tie'
  assert 'flax_tieext' not in definition.text
  assert 'section' not in definition.text
  with pytest.raises(mp.PatchGenerationError, match='never ends'):
    mp.strip_plugin_only('# plugin-only: begin\nx = 1\n', 'ours.py')


def test_public_names_are_spelled_the_flax_way():
  text = ('    >>> import flax_tieext\n'
          '    >>> flax_tieext.tie_variables(v, ties)\n'
          '  Raises: flax_tieext.TieError, see flax_tieext.lift.tie.\n')
  assert mp.respell(text) == (
      '    >>> import flax\n'
      '    >>> flax.core.tie_variables(v, ties)\n'
      '  Raises: flax.core.TieError, see flax.core.lift.tie.\n')


def test_transplanted_test_uses_only_flax_names(tmp_path):
  test_file = tmp_path / 'test_feature.py'
  test_file.write_text(_src('''
      """Feature tests.

      The ``flax_tieext`` twins are marked ``needs_patch``.
      """

      import flax
      import flax.linen as nn
      import pytest

      import flax_tieext  # noqa: F401
      from flax_tieext import lift as ext_lift
      from flax_tieext import linen as ext_nn

      needs_patch = pytest.mark.needs_patch

      ENTRY_POINTS = [
          pytest.param(lambda: nn.remat, id='nn.remat', marks=needs_patch),
          pytest.param(lambda: ext_nn.remat, id='flax_tieext.linen.remat'),
      ]


      @needs_patch
      def test_it():
        assert ext_lift.remat is ext_nn.partitioning.remat.__wrapped__
        assert flax_tieext.TieError
  '''))
  out = mp.test_text(test_file)
  assert 'flax_tieext' not in out and 'needs_patch' not in out
  assert out.startswith('# Copyright 2026 The Flax Authors.')
  assert '"""Feature tests."""' in out
  assert "pytest.param(lambda: nn.remat, id='nn.remat')," in out
  assert 'ext_' not in out
  assert 'assert flax.core.lift.remat is nn.partitioning.remat.__wrapped__' in out
  assert 'assert flax.core.TieError' in out
  # `import flax_tieext` also imported flax.linen.partitioning.
  assert 'import flax.linen.partitioning\n' in out
  compile(out, 'test_feature.py', 'exec')


def test_transplanted_test_may_not_add_a_dependency(tmp_path):
  test_file = tmp_path / 'test_property.py'
  test_file.write_text('from hypothesis import given\n')
  with pytest.raises(mp.PatchGenerationError, match='hypothesis'):
    mp.test_text(test_file)


def test_scope_hooks_come_from_the_patch_binding_table():
  hooks = dict(mp._scope_hooks())
  assert hooks['push'] == 'tie_aware_push'
  assert set(hooks) == {'push', '_collection', '_mutable_collection',
                        'get_variable', 'has_variable', 'put_variable'}


def test_a_patch_adding_a_plugin_name_is_refused(tmp_path):
  patch = tmp_path / '0001-x.patch'
  patch.write_text(
      'diff --git a/flax/core/scope.py b/flax/core/scope.py\n'
      '--- a/flax/core/scope.py\n'
      '+++ b/flax/core/scope.py\n'
      '@@ -1,1 +1,2 @@\n'
      ' import jax\n'
      "+MESSAGE = 'call flax_tieext.install()'\n")
  with pytest.raises(mp.PatchGenerationError, match='flax/core/scope.py: MESSAGE'):
    mp.check_no_leak(patch)
