"""Runs the JAX bug reproducers of this folder on this interpreter's JAX.

    python patches/jax/run.py

Each ``<name>.py`` here (its report is ``<name>.md``) runs in a fresh
interpreter (``sys.executable``), all at once. A reproducer prints what a
reporter saw (values, error types); the verdict is this file's: ``JUDGES``
reads each one's output and names it ``reproduces``, ``fixed`` (news, not a
failure) or ``not-applicable`` (this JAX lacks what the report is about).
This prints the reproducer's output and one line for each:
``jax <version>: <name>: <verdict>``. It exits 1 only if a reproducer
crashed, ran past ``TIMEOUT_S``, has no judge here, or printed what its
judge does not recognise.

The reproducers run on CPU unless ``JAX_PLATFORMS`` says otherwise, and
with ``JAX_REMAT3=0``: the reports are about ``jax.checkpoint``'s default
path.
"""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

FOLDER = pathlib.Path(__file__).resolve().parent
WORDS = ('reproduces', 'fixed', 'not-applicable')
TIMEOUT_S = 300


def _line(out, label):
  """What ``out`` printed after ``<label>: `` (None if no such line)."""
  for line in out.splitlines():
    if line.startswith(label + ': '):
      return line[len(label) + 2:]
  return None


def judge_leak(out):
  """checkpoint_static_argnums_leak: arrays kept alive, a leaked trace."""
  counts, jits = {}, {}
  for nums in ('()', '(1,)'):
    alive = _line(out, f'static_argnums={nums}: eager, 30 steps')
    m = re.fullmatch(r'(\d+) arrays still alive', alive or '')
    jits[nums] = _line(out, f'static_argnums={nums}: jit under checking_leaks')
    if not m or jits[nums] is None:
      return None
    counts[nums] = int(m.group(1))
  if counts['(1,)'] > counts['()'] + 10 or jits['(1,)'].startswith('Leaked trace'):
    return 'reproduces'
  if counts['(1,)'] <= counts['()'] and jits['(1,)'] == 'ok':
    return 'fixed'
  return None


def judge_names(out):
  """checkpoint_static_argnames_ignored: the named argument traced or not."""
  if _line(out, 'static_argnums=(1,), f(x, True): grad') != '3.0':
    return None  # the control case must work for the verdict to mean anything
  seen = {_line(out, f"static_argnames=('flag',), f(x, flag=True): {how}")
          for how in ('grad', 'jit(grad)')}
  seen.discard(None)
  for said, word in (('3.0', 'fixed'), ('TracerBoolConversionError', 'reproduces'),
                     ('TypeError', 'not-applicable')):  # no static_argnames parameter
    if seen == {said}:
      return word
  return None


def judge_broadcast(out):
  """scan_over_broadcast_materialized: a [L, ...] copy of the cast weight."""
  closed, scanned = (_line(out, name) for name in ('closed_over', 'scanned'))
  if closed is None or scanned is None or not closed.endswith('values: []'):
    return None  # the control case must hold no stack for the verdict to mean anything
  return 'fixed' if scanned.endswith('values: []') else 'reproduces'


JUDGES = {
    'checkpoint_static_argnums_leak': judge_leak,
    'checkpoint_static_argnames_ignored': judge_names,
    'scan_over_broadcast_materialized': judge_broadcast,
}


def reproducers():
  """The reproducer scripts: every ``.py`` here but this one."""
  return sorted(p for p in FOLDER.glob('*.py') if p.name != 'run.py')


def verdict(name, out):
  """``name``'s verdict from its output, or None if its judge cannot tell."""
  judge = JUDGES.get(name)
  return judge(out) if judge else None


def main():
  env = dict(os.environ, JAX_REMAT3='0')
  env.setdefault('JAX_PLATFORMS', 'cpu')
  jax = importlib.metadata.version('jax')
  runs = {p.stem: subprocess.Popen([sys.executable, str(p)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, cwd=FOLDER)
          for p in reproducers()}
  failed = False
  for name, run in runs.items():
    try:
      out, err = run.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      run.kill()
      out, err = run.communicate()
      err += f'\n(killed after {TIMEOUT_S} s)'
    print(out, end='', flush=True)
    word = verdict(name, out) if run.returncode == 0 else None
    if word in WORDS:
      print(f'jax {jax}: {name}: {word}', flush=True)
      continue
    failed = True
    said = (f'exit {run.returncode}' if run.returncode
            else 'no judge in run.py' if name not in JUDGES
            else 'printed what its judge does not recognise')
    print(f'jax {jax}: {name}: FAILED ({said})', flush=True)
    print(err[-3000:], file=sys.stderr, flush=True)
  return 1 if failed or not runs else 0


if __name__ == '__main__':
  sys.exit(main())
