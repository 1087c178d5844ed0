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

"""``patches/flax``: within their sizes, a person's text, the docs' numbers.

What needs Flax's sdist and its suites (each PR applies, lints and passes) is
``nox -s upstream``; these checks read the files only.
"""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location(
    'upstream_verify', ROOT / 'tools' / 'upstream_verify.py')
verify = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(verify)

PATCHES = sorted(verify.PATCHES.glob('*.patch'))


def test_there_is_a_pr_for_each_size_limit():
  assert [p.name[:4] for p in PATCHES] == sorted(verify.LIMITS)


@pytest.mark.parametrize('patch', PATCHES, ids=lambda p: p.name[:4])
def test_each_pr_is_within_its_size(patch):
  under, most = verify.LIMITS[patch.name[:4]]
  assert len(verify.added(patch, under)) <= most


@pytest.mark.parametrize('patch', PATCHES, ids=lambda p: p.name[:4])
def test_each_pr_reads_as_a_person_sends_it(patch):
  assert verify.text_problems(patch) == []
  assert not [l for l in verify.added(patch) if len(l) > 80]


def test_the_text_check_finds_this_project(tmp_path):
  patch = tmp_path / '0001-x.patch'
  patch.write_text('Subject: [PATCH] fix\n\nAs flax_tieext does.\n\ndiff --git a/f b/f\n')
  problems = verify.text_problems(patch)
  assert any('no From: header' in p for p in problems)
  assert any("names this project ('flax_tieext')" in p for p in problems)


def test_the_size_table_is_the_patches():
  text = (ROOT / 'docs' / 'upstream_patches.md').read_text()
  for patch in PATCHES:  # one PR: 'This PR'; a series: 'PR 0001', 'PR 0002', ...
    label = 'This PR' if len(PATCHES) == 1 else f'PR {patch.name[:4]}'
    row = re.search(rf'^\| {label}[^|]*\| \+(\d+) / −(\d+) \| \+(\d+) \|$', text, re.M)
    assert row, label
    flax_added = [l for l in verify.added(patch, 'flax/') if l.strip()]
    tests_added = [l for l in verify.added(patch, 'tests/') if l.strip()]
    removed = [l for l in _removed(patch, 'flax/') if l.strip()]
    assert tuple(map(int, row.groups())) == (
        len(flax_added), len(removed), len(tests_added)), label


def _removed(patch, under):
  lines, current = [], None
  for line in patch.read_text().splitlines():
    if line.startswith('diff --git'):
      current = line.split()[2][2:]
    elif line.startswith('-') and not line.startswith('---'):
      if current.startswith(under):
        lines.append(line[1:])
  return lines


def test_the_readme_lists_what_to_send():
  text = (ROOT / 'patches' / 'README.md').read_text()
  for patch in PATCHES:
    assert f'flax/{patch.name[:4]}-*.patch' in text
  for report in sorted((ROOT / 'patches' / 'jax').glob('*.md')):
    assert f'jax/{report.name}' in text
