"""The demo (``python -m flax_tieext.demo``, console script ``flax-tieext``)."""

import importlib.util
import io
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from flax_tieext import demo

pytestmark = pytest.mark.end_to_end


@pytest.fixture(scope='module')
def small_run(tmp_path_factory):
  """stdout, stderr and plot path of ``main(['--layers', '2', '--steps', '3', '--plot', ...])``.

  Run once for the module: it compiles four variants of the encoder, and
  three per depth for the plot where matplotlib is installed.
  """
  out = tmp_path_factory.mktemp('demo')
  plot = out / 'memory.png'
  flags = ['--plot', str(plot)] if _has_matplotlib() else []
  with open(out / 'stdout', 'w') as stdout, open(out / 'stderr', 'w') as stderr:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    try:
      code = demo.main(['--layers', '2', '--steps', '3', *flags])
    finally:
      sys.stdout, sys.stderr = saved
  assert code == 0
  return (out / 'stdout').read_text(), (out / 'stderr').read_text(), plot


def _has_matplotlib():
  return importlib.util.find_spec('matplotlib') is not None


def test_small_run_prints_the_comparison_table(small_run):
  stdout, _, _ = small_run
  for row in ('in all collections (count, bytes)',
              'compiled temp memory, remat',
              'compiled temp memory, no remat'):
    assert row in stdout
  # Remat's cost in time comes with the spread of its per-round ratios: on a
  # shared CPU it is mostly noise, and two runs may disagree on its side of 1.
  ratio = r'\d\.\d{3} \(\d\.\d\d-\d\.\d\d\)'
  assert re.search(rf'time remat / no remat \[2\] +{ratio} +{ratio} *$', stdout, re.M), (
      stdout)
  # Two blocks: the tied encoder stores the 32x32 mask once, the untied twice.
  assert re.search(r"in collection 'graph' \(count, bytes\)\s+1 \(4\.0 KiB\)"
                   r"\s+2 \(8\.0 KiB\)\s+0\.500", stdout), stdout


def test_each_header_of_the_table_is_over_the_rows_it_describes(small_run):
  stdout, _, _ = small_run
  table = stdout[stdout.index('stored variables'):stdout.index('[1] median')]
  sections = [s.splitlines() for s in table.strip().split('\n\n')]
  # What is stored does not depend on dropout; the compiled function does.
  assert [lines[0].split('  ')[0] for lines in sections] == [
      'stored variables', 'loss + gradient, dropout off'], table
  assert [line.split('  ')[0] for line in sections[0][2:]] == [
      "in collection 'graph' (count, bytes)",
      'in all collections (count, bytes)'], table
  assert all(set(lines[1]) <= {'-', ' '} for lines in sections), table
  assert all('memory' in line or 'time' in line
             for line in sections[1][2:]), table


def test_times_come_with_the_machines_load_and_cpu_time(small_run):
  stdout, _, _ = small_run
  assert re.search(r'over steps 2-3, step 1 \(it compiles\) left out \(\d+ CPUs,'
                   r' load average \d+\.\d\)', stdout), stdout
  assert re.search(r'Timed on \d+ CPUs, load average \d+\.\d:', stdout), stdout
  assert re.search(r'^wall time: \d+\.\d s, CPU time: \d+\.\d s \(user \+ system,'
                   r'.*\d+ CPUs, load average \d+\.\d\)$', stdout, re.M), stdout


def test_tied_gradients_match_the_untied_reference(small_run):
  stdout, _, _ = small_run
  match = re.search(r'max \|grad tied - grad untied\| = (\S+),', stdout)
  assert match, stdout
  assert float(match.group(1)) < 1e-5


def test_progress_bar_reaches_the_last_step(small_run):
  _, stderr, _ = small_run
  assert re.search(r'train \[#+\] 3/3', stderr), stderr


def test_step_time_is_one_figure_with_its_spread_and_the_table_says_why(
    small_run):
  stdout, _, _ = small_run
  assert re.search(r'training step \(batch, loss \+ gradient with dropout,'
                   r' AdamW update\): median \S+ ms, \S+-\S+ ms over steps'
                   r' 2-3', stdout), stdout
  assert re.search(r'time, remat \[1\] +\S+ ms \(\S+-\S+\)', stdout), stdout
  assert '[1] median (fastest-slowest)' in stdout
  assert 'shorter than the training step above' in stdout


def test_tied_untied_ratio_comes_with_its_noise_and_a_pointer(small_run):
  stdout, _, _ = small_run
  assert re.search(r'\d\.\d{3} \(\d\.\d\d-\d\.\d\d\) \[2\]', stdout), stdout
  assert 'per-round ratios' in stdout
  assert demo.BENCHMARKS in stdout
  assert (pathlib.Path(__file__).parent.parent / demo.BENCHMARKS).is_file()


def test_rate_is_over_the_steps_after_the_first():
  stream = io.StringIO()
  bar = demo.ProgressBar(4, stream=stream)
  bar.update(1, 2.0, 3.0)  # compiles: no rate yet
  assert 'step 1 took 3.00 s (it compiles)' in stream.getvalue()
  assert 'steps/s' not in stream.getvalue()
  bar.update(2, 1.9, 0.25)
  bar.update(3, 1.8, 0.25)
  bar.update(4, 1.7, 0.5)
  rates = [float(r) for r in re.findall(r'([\d.]+) steps/s', stream.getvalue())]
  assert rates == [4.0, 4.0, 3.0], stream.getvalue()
  # Never faster than the fastest step allows.
  assert max(rates) <= 1 / 0.25


def test_heartbeat_says_what_is_still_running(capsys):
  with demo._heartbeat(interval=0.2):  # pylint: disable=protected-access
    demo._status('compiling something slow')  # pylint: disable=protected-access
    time.sleep(1.2)
  err = capsys.readouterr().err
  assert re.search(r'\] compiling something slow\n', err), err
  assert re.search(
      r'\] \.\.\. still compiling something slow \(\d+ s so far\)', err), err


@pytest.mark.parametrize('flags', [
    ['--layers', '0'],
    ['--layers', 'twelve'],
    ['--steps', '-3'],
    ['--processes', '0'],
    ['--processes', '5'],
    ['--bogus'],
])
def test_bad_flags_are_argparse_errors(flags, capsys):
  with pytest.raises(SystemExit) as exc:
    demo.main(flags)
  assert exc.value.code == 2
  assert 'usage: flax-tieext' in capsys.readouterr().err


def _run_module(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'flax_tieext.demo', *args],
      capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))


def test_unwritable_plot_path_is_a_clean_error():
  result = _run_module('--plot', '/nonexistent/dir/x.png')
  assert result.returncode != 0
  assert 'Traceback' not in result.stderr
  assert 'cannot write the plot to /nonexistent/dir/x.png' in result.stderr
  assert 'does not exist' in result.stderr


def test_plot_is_written(small_run):
  pytest.importorskip('matplotlib')
  stdout, _, path = small_run
  assert f'plot: {path}' in stdout
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_plot_states_the_tables_sizes_as_the_table_writes_them(small_run):
  pytest.importorskip('matplotlib')
  stdout, stderr, path = small_run
  shown = demo.shown_figure_data(str(path))
  tied, untied = re.search(
      r'in all collections \(count, bytes\)\s+\d+ \((.+?)\)\s+\d+ \((.+?)\)',
      stdout).groups()
  assert (f'all variables stored at 2 blocks: {untied} untied, {tied} tied'
          in ' '.join(shown['texts'])), shown['texts']
  assert shown['depths'] == [1, 2]
  # The progress counts the blocks of each depth in words: '1 block'.
  assert re.findall(r'\] compiling for the plot: (\d+ blocks?),', stderr) == [
      '1 block'] * 3 + ['2 blocks'] * 3, stderr
  # While matplotlib draws, the heartbeat says so.
  assert re.search(r'\] drawing the plot with matplotlib\n', stderr), stderr


@pytest.mark.installs_patch  # the demo's functions, in this process: nn.tie
def test_training_on_a_mesh_compiles_the_update_once(caplog):
  # Step 2 of a --processes run compiled the optimizer update again: AdamW's
  # step count came from one device at step 1 and from the mesh at step 2.
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from flax_tieext.examples import t5  # pylint: disable=g-import-not-at-top

  mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
  config = t5.T5Config(num_layers=1)
  probe = demo._batch_fn(config)(0)[:2]  # pylint: disable=protected-access
  tied, _ = demo._tied_and_untied_variables(config, probe[0])  # pylint: disable=protected-access
  variables = jax.jit(lambda v: v, out_shardings=NamedSharding(
      mesh, PartitionSpec()))(tied)
  training = demo._compile_variant(  # pylint: disable=protected-access
      config, variables, tied=True, remat=True, dropout=True,
      batch=demo._batch_fn(config, mesh)(0)[:2])  # pylint: disable=protected-access
  with jax.log_compiles(True), caplog.at_level('WARNING'):
    demo._train(training, config, 3, mesh, lambda *_: None)  # pylint: disable=protected-access
  compiled = [r.getMessage().split(' with ')[0] for r in caplog.records
              if r.getMessage().startswith('Compiling ')]
  assert compiled.count('Compiling jit(update)') == 1, compiled
