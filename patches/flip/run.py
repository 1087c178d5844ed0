"""Runs the ties FLIP's reproducer, sharing_in_linen.py, and prints what it prints.

    python patches/flip/run.py [--python PATH]

Runs the reproducer in a fresh interpreter (``--python``'s, by default this
one) on the CPU and prints its output as it is: the versions it ran on,
then one line per case. Exits 1 only if the reproducer crashes. The FLIP's
output block is measured-flax-0.12.8.txt, what it printed on Flax 0.12.8.
"""
import argparse
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / 'sharing_in_linen.py'


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--python', default=sys.executable,
                      help='the interpreter whose Flax to use (default: this one)')
  python = parser.parse_args().python
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1',
             JAX_PLATFORMS=os.environ.get('JAX_PLATFORMS', 'cpu'))
  done = subprocess.run([python, SCRIPT.name], cwd=HERE, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  print(done.stdout, end='')
  if done.returncode:
    print(done.stderr[-3000:], file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
