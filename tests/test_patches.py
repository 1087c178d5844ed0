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

"""``patches/``: within their sizes, a person's text, every change stated, sent as the sender's.

What needs Flax's sdist and its suites (each PR applies, lints and passes) is
``nox -s upstream``; these checks read the files only, and run
``tools/upstream_send.py`` on a scratch repository.
"""

import importlib.util
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


verify = _load('upstream_verify', ROOT / 'tools' / 'upstream_verify.py')
send = _load('upstream_send', ROOT / 'tools' / 'upstream_send.py')
compat = _load('upstream_compat', ROOT / 'tests' / 'upstream_compat_test.py')
forms = _load('upstream_forms', ROOT / 'tools' / 'upstream_forms.py')

PATCHES = sorted(verify.PATCHES.glob('*.patch'))
DOCS = sorted(verify.DOCS_PATCHES.glob('*.patch'))


def test_there_is_a_pr_for_each_size_limit():
  assert [p.name[:4] for p in PATCHES] == sorted(verify.LIMITS) == sorted(verify.FAILS_BEFORE)


@pytest.mark.parametrize('patch', PATCHES, ids=lambda p: p.name[:4])
def test_each_pr_is_within_its_size(patch):
  under, most = verify.LIMITS[patch.name[:4]]
  assert len(verify.added(patch, under)) <= most


@pytest.mark.parametrize('patch', PATCHES + DOCS, ids=lambda p: f'{p.parent.name}/{p.name[:4]}')
def test_each_pr_reads_as_a_person_sends_it(patch):
  assert verify.text_problems(patch) == []
  assert not [l for f in verify.touched(patch) if f.endswith('.py')
              for l in verify.added(patch, f) if len(l) > 80]


@pytest.mark.parametrize('patch', PATCHES, ids=lambda p: p.name[:4])
def test_each_pr_adds_the_tests_that_fail_without_it(patch):
  for test in verify.FAILS_BEFORE[patch.name[:4]]:
    path, _, name = test.split('::')
    assert path in verify.touched(patch)
    assert f'  def {name}(' in patch.read_text(), test  # added or changed


@pytest.mark.parametrize('change', compat.CHANGES, ids=lambda c: f'{c[0]}-{c[1]}')
def test_every_behaviour_change_is_in_its_pr_text(change):
  pr, _, _, _, _, stated = change
  patch = next(p for p in PATCHES if p.name.startswith(pr))
  text = ' '.join(verify.message(patch).split())  # as wrapped in the message
  assert stated in text
  assert 'before:' in text and 'after:' in text


def test_the_text_check_finds_this_project(tmp_path):
  patch = tmp_path / '0001-x.patch'
  patch.write_text('Subject: [PATCH] fix\n\nAs flax_tieext does.\n\ndiff --git a/f b/f\n')
  problems = verify.text_problems(patch)
  assert any('no From: header' in p for p in problems)
  assert any("names this project ('flax_tieext')" in p for p in problems)


def test_the_generated_forms_draw_every_signature_and_context():
  drawn = forms.generate(0, verify.FORMS[1])
  assert forms.generate(0, verify.FORMS[1]) == drawn  # seeded
  assert {f['signature'] for f in drawn} == set(forms.SIGNATURES)
  assert {f['context'] for f in drawn} == set(forms.CONTEXTS)
  assert {f['call'] for f in drawn} == set(forms.CALLS)
  for form in drawn[:20]:
    compile(forms.source(form), f'form {form["id"]}', 'exec')


@pytest.mark.parametrize('cls', sorted(forms.CLASSES))
def test_every_class_of_generated_change_is_in_its_pr_text(cls):
  pr, sentence = forms.CLASSES[cls]
  patch = next(p for p in PATCHES if p.name.startswith(pr))
  assert sentence in ' '.join(verify.message(patch).split())


def test_a_generated_form_that_runs_on_main_and_differs_is_a_problem():
  form = forms.generate(0, 1)[0]
  before = {'id': 0, 'end': 'ok 1.0 2.0', 'seen': 'Ts', 'traces': 2, 'warnings': [],
            'jit': 'ok'}
  after = {**before, 'end': 'init ValueError', 'message': 'static_argnums index 2'}
  counts, problems = forms.compare([form], {0: before}, {0: after}, {'0001', '0002'})
  assert counts['RUNS ON MAIN, DIFFERS'] == 1 and len(problems) == 1
  counts, problems = forms.compare([form], {0: before}, {0: before}, {'0001', '0002'})
  assert counts == {'same': 1} and not problems


def test_the_size_table_is_the_patches():
  text = (ROOT / 'docs' / 'upstream_patches.md').read_text()
  for patch in PATCHES:
    label = f'PR {patch.name[:4]}'
    row = re.search(rf'^\| {label}[^|]*\| \+(\d+) / −(\d+) \| \+(\d+) \|$', text, re.M)
    assert row, label
    flax_added = [l for l in verify.added(patch, 'flax/') if l.strip()]
    tests_added = [l for l in verify.added(patch, 'tests/') if l.strip()]
    removed = [l for l in verify.removed(patch, 'flax/') if l.strip()]
    assert tuple(map(int, row.groups())) == (
        len(flax_added), len(removed), len(tests_added)), label


def test_the_readme_lists_what_to_send():
  text = (ROOT / 'patches' / 'README.md').read_text()
  for patch in PATCHES + DOCS:
    assert f'{patch.parent.name}/{patch.name[:4]}-*.patch' in text
  for report in sorted((ROOT / 'patches' / 'jax').glob('*.md')):
    assert f'jax/{report.name}' in text


def test_send_sends_every_pr():
  found = {d for d in (ROOT / 'patches').iterdir() if any(d.glob('*.patch'))}
  assert set(send.PATCH_DIRS) == found
  assert send.BASE == verify.MAIN


def _git(repo, *args, **env):
  return subprocess.run(['git', '-C', str(repo), *args], check=True, capture_output=True,
                        text=True, env={**_ENV, **env}).stdout.strip()


_ENV = {'PATH': '/usr/bin:/bin', 'GIT_CONFIG_GLOBAL': '/dev/null', 'GIT_CONFIG_NOSYSTEM': '1',
        'HOME': '/nonexistent'}


def test_send_commits_each_pr_on_its_branch_as_the_sender(tmp_path):
  """A PR of each directory, made by one person, committed by another."""
  flax = tmp_path / 'flax'
  flax.mkdir()
  _git(flax, 'init', '-q', '-b', 'main')
  (flax / 'lift.py').write_text('a = 1\n')
  (flax / 'guide.md').write_text('# Guide\n')
  maker = {'GIT_AUTHOR_NAME': 'Maker', 'GIT_AUTHOR_EMAIL': 'maker@example.com',
           'GIT_COMMITTER_NAME': 'Maker', 'GIT_COMMITTER_EMAIL': 'maker@example.com'}
  _git(flax, 'add', '-A')
  _git(flax, 'commit', '-q', '-m', 'main', **maker)
  base = _git(flax, 'rev-parse', 'HEAD')
  dirs = []
  for name, path, text in (('flax', 'lift.py', 'a = 2\n'), ('docs', 'guide.md', '# Guide\n\nMore.\n')):
    (flax / path).write_text(text)
    _git(flax, 'commit', '-q', '-am', f'Change {path}\n\nWhy it changes.', **maker)
    out = tmp_path / 'patches' / name
    _git(flax, 'format-patch', '-q', '-1', '-o', str(out))
    _git(flax, 'reset', '-q', '--hard', base)
    dirs.append(out)
  _git(flax, 'config', 'user.name', 'Sender')
  _git(flax, 'config', 'user.email', 'sender@example.org')

  assert send.send(flax, base, dirs) == 0
  for out in dirs:
    (patch,) = out.glob('*.patch')
    branch = send.branch_name(patch)
    assert _git(flax, 'log', '-1', '--format=%an <%ae>|%P', branch) == (
        f'Sender <sender@example.org>|{base}')
    assert _git(flax, 'log', '-1', '--format=%B', branch).startswith('Change ')
  assert _git(flax, 'rev-parse', 'HEAD') == base  # where it was


def test_send_refuses_without_the_senders_name(tmp_path, capsys, monkeypatch):
  for name, value in _ENV.items():
    monkeypatch.setenv(name, value)
  flax = tmp_path / 'flax'
  flax.mkdir()
  _git(flax, 'init', '-q')
  assert send.send(flax, 'HEAD', ()) == 2
  assert 'user.name' in capsys.readouterr().err


def test_the_hang_report_inlines_its_whole_reproducer():
  tool = (ROOT / 'tools' / 'jax_cache_hang_repro.py').read_text()
  report = (ROOT / 'patches' / 'jax' / 'persistent_cache_multiprocess_hang.md').read_text()
  assert f"```python\n{tool[tool.index('import os'):]}```" in report
  assert 'tools/' not in report and 'flax' not in report.lower()
  # What it says of the keys is in the output it shows, for both processes.
  for process in (0, 1):
    assert f'process {process}: jax._src.cache_key' in report
  assert 'Persistent compilation cache hit' in report and 'CACHE MISS' in report
