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

"""What a program that uses neither feature pays for ``import flax_tieext``.

Each figure is measured in two fresh interpreters, plain Flax (flax_tieext
never imported) and patched, and reported as patched / plain:

- Python calls (``sys.setprofile`` 'call' events, deterministic) of ``init``
  and of the grad trace of a model of N ``nn.remat`` blocks, N = 8, 32, 128;
- CPU time (``time.thread_time``: tracing is the calling thread's Python,
  and another process's load does not count) of the same ``init`` and grad
  trace, and of an untied
  ``nn.scan(nn.remat(...))`` model's, in one interpreter that uninstalls and
  installs the patch between the two (``uninstall()`` puts Flax's very
  objects back), interleaved round by round so a change in the machine's
  load hits both alike: the median of the per-round ratios;
- arrays and bytes alive after 50 eager (un-jitted) SGD steps of 4 rematted
  ``Dense`` blocks, and the ``Scope`` objects and tracers alive then. (Live
  memory is what Python keeps referenced, the same on every XLA backend; the
  XLA:CPU barrier flag of conftest.py does not change it.)

The programs are those of tests/test_transparency.py, which asserts the
bounds (calls <= 1.005, nothing alive that plain Flax does not keep).
"""

import pathlib
import sys

from conftest import record

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / 'tests'))
import test_transparency  # pylint: disable=g-import-not-at-top,wrong-import-position

SIZES = (8, 32, 128)
EAGER_STEPS = 50


def _plain_and_patched(benchmark, code):
  """``code``'s output in a fresh plain and a fresh patched interpreter."""
  runs = {}

  def one_round():
    for mode in ('plain', 'patched'):
      runs[mode] = test_transparency.run_python(code, mode)

  benchmark.pedantic(one_round, rounds=1, iterations=1)
  return runs


def test_untied_python_calls(benchmark):
  runs = _plain_and_patched(benchmark,
                            test_transparency.CALLS.format(sizes=SIZES))
  rows = []
  for n in map(str, SIZES):
    (pi, pg), (qi, qg) = runs['plain'][n], runs['patched'][n]
    rows.append({'blocks': int(n), 'init_plain': pi, 'init_patched': qi,
                 'init_ratio': qi / pi, 'grad_plain': pg, 'grad_patched': qg,
                 'grad_ratio': qg / pg})
  record('untied_calls', rows)


def test_live_memory_after_eager_remat_steps(benchmark):
  code = test_transparency.EAGER_REMAT.replace(
      'range(30)', f'range({EAGER_STEPS})').replace(
          'if step in (9, 29)', f'if step in (9, {EAGER_STEPS - 1})')
  runs = _plain_and_patched(benchmark, code)
  rows = []
  for static, label in (('False', 'nn.remat(Block)'),
                        ('True', 'nn.remat(FlagBlock, static_argnums=(2,))')):
    plain, patched = runs['plain'][static][-1], runs['patched'][static][-1]
    rows.append({'model': label, 'steps': EAGER_STEPS,
                 'plain': plain, 'patched': patched,
                 'bytes_ratio': patched[1] / plain[1] if plain[1] else None})
  record('untied_live_memory', rows)


TIMES = '''
import json, statistics, time
import jax, jax.numpy as jnp
import flax.linen as nn
import flax_tieext

class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(x.shape[-1])(x)

class Model(nn.Module):
  n: int
  @nn.compact
  def __call__(self, x):
    for i in range(self.n):
      x = nn.remat(Block)(name=f'b{{i}}')(x)
    return x

class Layer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    return Block()(x), None

class Scanned(nn.Module):
  @nn.compact
  def __call__(self, x):
    stack = nn.scan(nn.remat(Layer), variable_axes={{'params': 0}},
                    split_rngs={{'params': True}}, length=8)
    return stack(name='layers')(x, None)[0]

x = jnp.ones((1, 8))
out = {{}}
for n, m in [*((n, Model(n)) for n in {sizes}), ('scan', Scanned())]:
  v = m.init(jax.random.key(0), x)
  work = {{'init': lambda: m.init(jax.random.key(0), x),
          'grad': lambda: jax.make_jaxpr(jax.grad(
              lambda v: m.apply(v, x).sum()))(v)}}
  seconds = {{(mode, what): [] for mode in ('plain', 'patched') for what in work}}
  for r in range({rounds} + 1):  # round 0 warms both up
    for mode in (('plain', 'patched') if r % 2 else ('patched', 'plain')):
      (flax_tieext.uninstall if mode == 'plain' else flax_tieext.install)()
      for what, f in work.items():
        t = time.thread_time()  # this thread's CPU: the trace is Python's
        jax.block_until_ready(f())
        if r:
          seconds[mode, what].append(time.thread_time() - t)
  out[n] = {{what: [statistics.median(seconds['plain', what]),
                   statistics.median(seconds['patched', what]),
                   statistics.median([b / a for a, b in zip(
                       seconds['plain', what], seconds['patched', what])])]
            for what in work}}
print(json.dumps(out))
'''


def test_untied_trace_time(benchmark):
  runs = {}

  def one_round():
    runs['patched'] = test_transparency.run_python(
        TIMES.format(sizes=SIZES, rounds=7), 'patched')

  benchmark.pedantic(one_round, rounds=1, iterations=1)
  rows = []
  for n, times in runs['patched'].items():
    rows.append({'model': f'{n} nn.remat blocks' if n != 'scan' else
                          'nn.scan(nn.remat), 8 layers',
                 **{f'{what}_{k}': times[what][i] for what in ('init', 'grad')
                    for i, k in enumerate(('plain_s', 'patched_s', 'ratio'))}})
  record('untied_trace_time', rows)
