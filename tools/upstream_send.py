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

"""Commits every Flax PR of ``patches/`` onto a clone of Flax, under the sender's own name.

    python tools/upstream_send.py PATH/TO/FLAX-CLONE [--base REV]

Each patch of ``patches/flax/`` and ``patches/docs/`` (``PATCH_DIRS``) is one
pull request, and each applies to Flax main alone: this makes one branch per
patch (``<dir>-<patch file name>``, e.g. ``flax-0002-Add-static_argnames-...``)
from ``--base`` (default ``BASE``, the Flax main the patches were checked
against), with one commit whose message is the patch's. Push each branch to
your fork and open a pull request from it.

Flax's CLA check reads each commit's author, so the commits must be the
sender's, not whoever made the patch files: the author is the clone's
``git config user.name`` / ``user.email``, as for any ``git commit`` there,
and the patches' own ``From:`` and ``Date:`` lines are not used. With either
unset, or with uncommitted changes in the clone, this refuses, saying why. A
branch that exists already is left alone, and reported; the clone is left on
the branch it was on.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Where the Flax pull requests are, each a `git format-patch` file.
PATCH_DIRS = (ROOT / 'patches' / 'flax', ROOT / 'patches' / 'docs')
BASE = '18f8f311c275d57f46d95e41b15aa97b454754c0'


def git(clone, *args, **kwargs):
  return subprocess.run(['git', '-C', str(clone), *args], text=True, capture_output=True,
                        check=False, **kwargs)


def identity(clone) -> tuple[str, str] | None:
  """The clone's ``(user.name, user.email)``, or None when either is unset."""
  name, email = (git(clone, 'config', key).stdout.strip() for key in ('user.name', 'user.email'))
  return (name, email) if name and email else None


def patches(dirs=PATCH_DIRS) -> list[pathlib.Path]:
  """Every patch to send, by directory then number."""
  return [p for d in dirs for p in sorted(d.glob('*.patch'))]


def branch_name(patch: pathlib.Path) -> str:
  return f'{patch.parent.name}-{patch.stem}'


def commit(clone: pathlib.Path, patch: pathlib.Path, base: str) -> str | None:
  """Branch ``branch_name(patch)`` from ``base`` with ``patch`` committed; an error or None."""
  branch = branch_name(patch)
  if git(clone, 'rev-parse', '--verify', '-q', f'refs/heads/{branch}').returncode == 0:
    return f'branch {branch} exists already: left alone'
  checkout = git(clone, 'checkout', '-q', '-b', branch, base)
  if checkout.returncode:
    return checkout.stderr.strip()
  with tempfile.TemporaryDirectory() as tmp:
    msg, diff = pathlib.Path(tmp, 'msg'), pathlib.Path(tmp, 'diff')
    info = git(clone, 'mailinfo', str(msg), str(diff), input=patch.read_text())
    subject = next((line[len('Subject: '):] for line in info.stdout.splitlines()
                    if line.startswith('Subject: ')), None)
    if info.returncode or subject is None:
      return f'not a patch git can read: {info.stderr.strip()}'
    msg.write_text(f'{subject}\n\n{msg.read_text()}')
    for step in (('apply', '--index', str(diff)), ('commit', '-q', '-F', str(msg))):
      done = git(clone, *step)
      if done.returncode:
        return f'git {step[0]} failed: {done.stderr.strip()}'
  return None


def send(clone: pathlib.Path, base: str = BASE, dirs=PATCH_DIRS) -> int:
  who = identity(clone)
  if who is None:
    print('upstream_send: refusing: git has no user.name / user.email for '
          f'{clone}.\nThe commits are sent to Flax under your own name, the one '
          "that signed Google's CLA. Set it, then run this again:\n"
          f'    git -C {clone} config user.name "Your Name"\n'
          f'    git -C {clone} config user.email you@example.com', file=sys.stderr)
    return 2
  if git(clone, 'status', '--porcelain', '--untracked-files=no').stdout.strip():
    print(f'upstream_send: refusing: {clone} has uncommitted changes; commit or'
          ' stash them first (each branch is checked out in turn)', file=sys.stderr)
    return 2
  resolved = git(clone, 'rev-parse', '--verify', '-q', f'{base}^{{commit}}').stdout.strip()
  if not resolved:
    print(f'upstream_send: {clone} has no commit {base}: fetch Flax main first'
          ' (git fetch origin main), or give --base', file=sys.stderr)
    return 2
  start = git(clone, 'symbolic-ref', '-q', '--short', 'HEAD').stdout.strip() or git(
      clone, 'rev-parse', 'HEAD').stdout.strip()
  print(f'committing as {who[0]} <{who[1]}>, each branch from {resolved[:12]}')
  failed = 0
  for patch in patches(dirs):
    error = commit(clone, patch, resolved)
    if error:
      failed += 'left alone' not in error
      print(f'{patch.parent.name}/{patch.name}: {error}', file=sys.stderr)
    else:
      print(f'{patch.parent.name}/{patch.name}: committed on branch {branch_name(patch)}')
    git(clone, 'reset', '-q', '--hard')
    git(clone, 'checkout', '-q', start)
  return 1 if failed else 0


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('clone', type=pathlib.Path, help='a clone of github.com/google/flax')
  parser.add_argument('--base', default=BASE,
                      help=f'the commit each branch starts from (default: {BASE[:8]})')
  arguments = parser.parse_args()
  sys.exit(send(arguments.clone.resolve(), arguments.base))
