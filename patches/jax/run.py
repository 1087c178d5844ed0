"""Runs the JAX bug reproducers of this folder on this interpreter's JAX.

    python patches/jax/run.py

Each ``<name>.py`` here (its report is ``<name>.md``) runs in a fresh
interpreter (``sys.executable``), all at once, and this prints one line for
each: ``jax <version>: <name>: <word>``, the word being the last line the
reproducer printed: ``reproduces``, ``fixed`` (news, not a failure) or
``not-applicable`` (this JAX lacks what the report is about). It exits 1 only
if a reproducer crashed, ran past ``TIMEOUT_S`` or printed anything else.

The reproducers run on CPU unless ``JAX_PLATFORMS`` says otherwise, and
without ``JAX_REMAT3``: the reports are about ``jax.checkpoint``'s default
path.
"""

import importlib.metadata
import os
import pathlib
import subprocess
import sys

FOLDER = pathlib.Path(__file__).resolve().parent
WORDS = ('reproduces', 'fixed', 'not-applicable')
TIMEOUT_S = 300


def reproducers():
  """The reproducer scripts: every ``.py`` here but this one."""
  return sorted(p for p in FOLDER.glob('*.py') if p.name != 'run.py')


def main():
  env = {k: v for k, v in os.environ.items() if k != 'JAX_REMAT3'}
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
    lines = out.strip().splitlines()
    word = lines[-1].strip() if lines else ''
    if run.returncode == 0 and word in WORDS:
      print(f'jax {jax}: {name}: {word}', flush=True)
      continue
    failed = True
    said = (f'exit {run.returncode}' if run.returncode
            else f'printed {word!r}, not one of {", ".join(WORDS)}')
    print(f'jax {jax}: {name}: FAILED ({said})', flush=True)
    print(err[-3000:], file=sys.stderr, flush=True)
  return 1 if failed or not runs else 0


if __name__ == '__main__':
  sys.exit(main())
