"""Runs the ties FLIP's reproducer, sharing_in_linen.py, and prints what it measured.

    python patches/flip/run.py [--python PATH]

Prints the interpreter's Flax, jax and Python, then the reproducer's lines
run plain, then, when this repository's flax_tieext imports in that
interpreter, its last line (the nn.tie case) with flax_tieext imported
first (it installs nn.tie into the Flax it finds). Exits 1 only if the
reproducer crashes. The FLIP's table is measured-flax-0.12.8.txt.
"""
import argparse
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = HERE / 'sharing_in_linen.py'
WITH_TIES = ('import runpy, flax_tieext; '
             f'runpy.run_path({SCRIPT.name!r}, run_name="__main__")')


def run(python, *command, with_ties=False):
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1',
             JAX_PLATFORMS=os.environ.get('JAX_PLATFORMS', 'cpu'))
  if with_ties:
    env['PYTHONPATH'] = os.pathsep.join([str(REPO)] + [p for p in [env.get('PYTHONPATH')] if p])
  return subprocess.run([python, *command], cwd=HERE, env=env, capture_output=True, text=True,
                        timeout=600, check=False)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--python', default=sys.executable,
                      help='the interpreter whose Flax to use (default: this one)')
  python = parser.parse_args().python
  version = run(python, '-c', 'import sys, flax, jax; print(f"flax {flax.__version__}, '
                'jax {jax.__version__}, python {sys.version.split()[0]}")')
  print(version.stdout.strip() or version.stderr.strip())
  plain = run(python, SCRIPT.name)
  print(plain.stdout, end='')
  if plain.returncode:
    print(plain.stderr[-3000:], file=sys.stderr)
    return 1
  if run(python, '-c', 'import flax_tieext', with_ties=True).returncode == 0:
    tied = run(python, '-c', WITH_TIES, with_ties=True)
    if tied.returncode:
      print(tied.stderr[-3000:], file=sys.stderr)
      return 1
    print('with flax_tieext imported:', tied.stdout.strip().splitlines()[-1])
  return 0


if __name__ == '__main__':
  sys.exit(main())
