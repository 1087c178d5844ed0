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


"""The repository's entry points agree with what the README tells a user."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _readme_test_command():
  """The indented command line after "Run the tests" in README.md."""
  lines = (ROOT / 'README.md').read_text().splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith('Run the tests'))
  command = next(line for line in lines[start + 1:] if line.strip())
  assert command.startswith('    '), f'not an indented code line: {command!r}'
  return command.strip()


def _noxfile_assignment(name):
  tree = ast.parse((ROOT / 'noxfile.py').read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in node.targets
    ):
      return ast.literal_eval(node.value)
  raise AssertionError(f'noxfile.py assigns no {name}')


def _readme_section(title):
  text = (ROOT / 'README.md').read_text()
  match = re.search(rf'^## {re.escape(title)}\n(.*?)(?=^## |\Z)', text, re.M | re.S)
  assert match, f'README.md has no "## {title}" section'
  return match.group(1)


def test_ci_runs_the_readme_test_command_exactly():
  command = _readme_test_command()
  ci_lines = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()]
  assert command in ci_lines


def test_readme_support_matrix_lists_the_noxfile_pins():
  pins = _noxfile_assignment('PINS')
  rows = {}
  for line in _readme_section('Support matrix').splitlines():
    cells = [c.strip().strip('`') for c in line.strip().strip('|').split('|')]
    if len(cells) >= 3 and re.fullmatch(r'\d+\.\d+\.\d+', cells[0]):
      rows[cells[0]] = (cells[1], cells[2])
  assert rows == pins


def test_readme_names_every_nox_session():
  section = _readme_section('Support matrix')
  pins = _noxfile_assignment('PINS')
  for session in ['tests', 'clients', 'ci', *(f'matrix-{v}' for v in pins)]:
    assert f'nox -s {session}' in section, session
