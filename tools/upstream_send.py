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

"""Commits ``patches/flax/`` onto a clone of Flax under the sender's own name.

    python tools/upstream_send.py PATH/TO/FLAX-CLONE

Flax's CLA check reads each commit's author, so the commits must be the
sender's, not whoever made the patch files: the author is the clone's
``git config user.name`` / ``user.email``, as for any ``git commit`` there,
and the patches' own ``From:`` and ``Date:`` lines are not used. With either
unset this refuses, saying how to set them. It makes branch ``BRANCH`` from
Flax main ``BASE`` and one commit per patch, message as in the patch; push
it to your fork and open one pull request per commit.
"""

import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATCHES = ROOT / 'patches' / 'flax'
BASE = '18f8f311'
BRANCH = 'remat-static-args'


def git(clone, *args, **kwargs):
  return subprocess.run(['git', '-C', str(clone), *args], text=True, capture_output=True,
                        check=False, **kwargs)


def identity(clone) -> tuple[str, str] | None:
  """The clone's ``(user.name, user.email)``, or None when either is unset."""
  name, email = (git(clone, 'config', key).stdout.strip() for key in ('user.name', 'user.email'))
  return (name, email) if name and email else None


def send(clone: pathlib.Path) -> int:
  who = identity(clone)
  if who is None:
    print('upstream_send: refusing: git has no user.name / user.email for '
          f'{clone}.\nThe commits are sent to Flax under your own name, the one '
          "that signed Google's CLA. Set it, then run this again:\n"
          f'    git -C {clone} config user.name "Your Name"\n'
          f'    git -C {clone} config user.email you@example.com', file=sys.stderr)
    return 2
  print(f'committing as {who[0]} <{who[1]}>')
  checkout = git(clone, 'checkout', '-q', '-b', BRANCH, BASE)
  if checkout.returncode:
    print(checkout.stderr, file=sys.stderr)
    return 1
  for patch in sorted(PATCHES.glob('*.patch')):
    with tempfile.TemporaryDirectory() as tmp:
      msg, diff = pathlib.Path(tmp, 'msg'), pathlib.Path(tmp, 'diff')
      info = git(clone, 'mailinfo', str(msg), str(diff), input=patch.read_text())
      subject = next(line[len('Subject: '):] for line in info.stdout.splitlines()
                     if line.startswith('Subject: '))
      msg.write_text(f'{subject}\n\n{msg.read_text()}')
      for step in (('apply', '--index', str(diff)), ('commit', '-q', '-F', str(msg))):
        done = git(clone, *step)
        if done.returncode:
          print(f'{patch.name}: git {step[0]} failed:\n{done.stderr}', file=sys.stderr)
          return 1
    print(f'{patch.name}: committed')
  return 0


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit(__doc__)
  sys.exit(send(pathlib.Path(sys.argv[1]).resolve()))
