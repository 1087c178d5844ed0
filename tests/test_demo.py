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
  for row in ('all variables stored (count, bytes)',
              'compiled temp memory, remat',
              'compiled temp memory, no remat',
              'time remat / no remat (medians)'):
    assert row in stdout
  # Two blocks: the tied encoder stores the 32x32 mask once, the untied twice.
  assert re.search(r"variables stored in 'graph' \(count, bytes\)\s+1 \(4\.0 KiB\)"
                   r"\s+2 \(8\.0 KiB\)\s+0\.500", stdout), stdout


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
  assert re.search(r'loss \+ gradient time, remat \[1\] +\S+ ms \(\S+-\S+\)',
                   stdout), stdout
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
