"""Runs every reproducer of the ties FLIP in a fresh interpreter and prints a table.

    python patches/flip/run.py [--python PATH] [--jobs N]

Each script prints one last line: `works`, or `fails: <what>`. The table is
`script args -> last line`, for the Flax installed in the interpreter given
by --python (default: this one). It exits 0 whatever the scripts print, and 1
only when a script prints no such line (a crash).

`tie.py` runs twice: plain (`fails: this Flax has no nn.tie`), and, when the
flax_tieext package of this repository imports in that interpreter, with it
imported first (it installs `nn.tie` into the Flax it finds).

How the table in ties-in-linen.md was measured (Flax main 18f8f311, jax 0.10.2,
Python 3.11, CPU):

    git clone -q https://github.com/google/flax flax-main
    git -C flax-main checkout -q 18f8f311      # plain Flax main
    git -C flax-main worktree add -q --detach ../flax-proto 18f8f311
    git -C flax-proto apply $PWD/patches/flip/scan-vmap-outer-instance.patch
    uv venv -p 3.11 venv-flaxmain && uv pip install -p venv-flaxmain/bin/python -e flax-main
    uv venv -p 3.11 venv-flaxproto && uv pip install -p venv-flaxproto/bin/python -e flax-proto
    python patches/flip/run.py --python venv-flaxmain/bin/python    # plain, (b), (c), (d), ties
    python patches/flip/run.py --python venv-flaxproto/bin/python   # (a): the --broadcast-outer rows

"""
import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
R = 'reproducers/'

RUNS = [  # (section, script, args)
    ('problem', R + 'scan_outer_instance.py', []),
    ('problem', R + 'vmap_outer_instance.py', []),
    ('problem', R + 'remat_sibling_mask.py', []),
    ('problem', R + 'remat_sibling_mask.py', ['--no-remat']),
    ('problem', R + 'map_variables_lost_write.py', []),
    ('problem', R + 'scan_outer_write.py', []),
    ('(a) broadcast_outer', R + 'scan_outer_instance.py', ['--broadcast-outer']),
    ('(a) broadcast_outer', R + 'vmap_outer_instance.py', ['--broadcast-outer']),
    ('(a) broadcast_outer', 'prototype_check.py', []),
    ('(a) broadcast_outer', R + 'scan_outer_write.py', ['--broadcast-outer']),
    ('(b) map_variables writes back', R + 'map_variables_write_back.py', []),
    ('(b) map_variables writes back', R + 'map_variables_write_back.py', ['--remat']),
    ('(b) map_variables writes back', R + 'scan_map_variables.py', []),
    ('(b) map_variables writes back', R + 'scan_map_variables.py', ['--vmap']),
    ('(c) variable_broadcast', R + 'variable_broadcast.py', ['params']),
    ('(c) variable_broadcast', R + 'variable_broadcast.py', ['custom']),
    ('(c) variable_broadcast', R + 'variable_broadcast.py', ['custom-rng']),
    ('(c) variable_broadcast', R + 'variable_broadcast.py', ['vmap-custom']),
    ('(d) workarounds', R + 'pass_values.py', ['scan']),
    ('(d) workarounds', R + 'pass_values.py', ['vmap']),
    ('(d) workarounds', R + 'pass_values.py', ['remat']),
    ('(d) workarounds', R + 'shared_instance.py', []),
    ('(d) workarounds', R + 'shared_instance.py', ['--write']),
    ('(d) workarounds', R + 'embed_attend.py', []),
] + [('ties', R + 'tie.py', [case]) for case in ('scan', 'scan-inside-only', 'vmap', 'remat', 'write', 'scan-write')]

WITH_TIES = ('import runpy, sys; import flax_tieext; sys.argv = sys.argv[1:]; '
             'runpy.run_path(sys.argv[0], run_name="__main__")')


def run(python, script, args, with_ties=False):
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1', JAX_PLATFORMS=os.environ.get('JAX_PLATFORMS', 'cpu'))
  path = HERE / script
  if with_ties:
    env['PYTHONPATH'] = os.pathsep.join([str(REPO)] + [p for p in [env.get('PYTHONPATH')] if p])
    command = [python, '-c', WITH_TIES, str(path), *args]
  else:
    command = [python, str(path), *args]
  try:
    done = subprocess.run(command, cwd=path.parent, env=env,
                          capture_output=True, text=True, timeout=600)
  except subprocess.TimeoutExpired:
    return None, 'timed out after 600 s'
  lines = done.stdout.strip().splitlines()
  last = lines[-1] if lines else ''
  if last == 'works' or last.startswith('fails:'):
    return last, None
  error = (done.stderr.strip().splitlines() or ['no output'])[-1]
  return None, f'crashed (exit {done.returncode}): {error}'


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--python', default=None,
                      help="the interpreter whose Flax to use (default: this one if it has Flax, "
                           "else the repository's .venv)")
  parser.add_argument('--jobs', type=int, default=4)
  options = parser.parse_args()
  if options.python is None:
    options.python = sys.executable
    venv = REPO / '.venv' / 'bin' / 'python'
    if subprocess.run([sys.executable, '-c', 'import flax'], capture_output=True).returncode and venv.exists():
      options.python = str(venv)
  version = subprocess.run(
      [options.python, '-c', 'import sys, flax, jax; print(f"flax {flax.__version__}, '
       'jax {jax.__version__}, python {sys.version.split()[0]}")'],
      capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  print(version.stdout.strip() or version.stderr.strip())
  ties_import = subprocess.run(
      [options.python, '-c', 'import flax_tieext'], capture_output=True,
      env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE='1', JAX_PLATFORMS='cpu'))
  runs = [(section, script, args, False) for section, script, args in RUNS]
  if ties_import.returncode == 0:
    runs += [('ties', s, a, True) for section, s, a in RUNS if section == 'ties']
  with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
    results = list(pool.map(lambda r: run(options.python, r[1], r[2], r[3]), runs))
  crashed = False
  width = max(len(' '.join([s.removeprefix(R), *a])) for _, s, a, _ in runs) + 2
  section_seen = None
  for (section, script, args, with_ties), (last, error) in zip(runs, results):
    label = section + (' (nn.tie installed)' if with_ties else '')
    if label != section_seen:
      print(f'\n{label}')
      section_seen = label
    name = ' '.join([script.removeprefix(R), *args])
    print(f'  {name:<{width}} -> {last if error is None else error}')
    crashed |= error is not None
  return 1 if crashed else 0


if __name__ == '__main__':
  sys.exit(main())
