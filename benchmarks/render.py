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

"""Renders ``benchmarks/results.json`` as ``docs/benchmarks.md`` and a PNG.

Usage::

  python benchmarks/render.py [--results benchmarks/results.json]
                              [--device-results benchmarks/device_results*.json]
                              [--out docs/benchmarks.md]
                              [--png docs/_static/benchmarks.png]

``nox -s bench`` runs it after the benchmarks. The PNG needs matplotlib (the
``plot`` extra); without it only the Markdown is written.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Targets of issue 5: (the ratio's upper bound, exact?).
TARGETS = {
    'flops': 1.0, 'temp_bytes': 1.0, 'argument_bytes': 1.0,
    'init_traces': 1.0, 'compile_seconds': 1.10,
}
STATIC_TARGETS = {'flops': 1.0, 'temp_bytes': 1.0, 'compile_seconds': 1.05}
IMPORT_TARGET_SECONDS = 0.050


# Between a number and its unit: a table cell wraps between words, not there.
NBSP = '&nbsp;'


def _fmt(value: float, kind: str) -> str:
  if kind == 'bytes':
    return f'{value / 2**20:.2f}{NBSP}MiB'
  if kind == 'seconds':
    return f'{value:.2f}{NBSP}s'
  if kind == 'ms':
    return f'{value * 1e3:.1f}{NBSP}ms'
  if kind == 'flops':
    return f'{value / 1e6:.1f}{NBSP}M'
  return f'{value:g}'


def _verdict(ratio: float, bound: float) -> str:
  ok = ratio == bound if bound == 1.0 else ratio <= bound
  target = f'={NBSP}1.000' if bound == 1.0 else f'≤{NBSP}{bound:.2f}'
  return f'{target}{NBSP}{"✓" if ok else "✗"}'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(' --- ' for _ in header) + '|']
  lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
  return lines


QUANTITIES = (
    ('flops', 'FLOPs (`cost_analysis`)', 'flops'),
    ('temp_bytes', 'temp bytes (`memory_analysis`)', 'bytes'),
    ('argument_bytes', 'argument bytes (`memory_analysis`)', 'bytes'),
    ('init_traces', 'attention `__call__` runs in `init`', 'count'),
    ('compile_seconds', 'trace + compile time (median)', 'seconds'),
)


def shared_attention(section: dict) -> list[str]:
  rows = []
  for layers, row in sorted(section.items(), key=lambda kv: int(kv[0])):
    for key, label, kind in QUANTITIES:
      base, tied, ratio = row[key]
      rows.append((layers, label, _fmt(base, kind), _fmt(tied, kind),
                   f'{ratio:.3f}', _verdict(ratio, TARGETS[key])))
    rows.append((layers, 'max \\|Δ loss\\|, max \\|Δ grad\\| (same params)',
                 '', '', f'{row["loss_difference"]:.1e}, '
                 f'{row["grad_difference"]:.1e}', ''))
  return [
      '## Tie + remat vs a shared module on upstream Flax',
      '',
      'ALBERT-style encoder (`flax_tieext.examples.albert`, width 64, 4 heads,'
      ' length 32, batch 8), every block in `nn.remat`, jitted loss +'
      ' gradient. Baseline: upstream Flax (patch uninstalled), one'
      ' `SelfAttention` created in the encoder and passed into every block as'
      ' an attribute. Candidate: every block has its own `attn`, tied to'
      ' `block_0/attn` with `nn.tie`.',
      '',
      *_table(('blocks', 'quantity', 'upstream: shared module', 'nn.tie',
               'ratio', 'target'), rows),
      '',
  ]


def scan_over_layers(row: dict) -> list[str]:
  rows = [(label, _fmt(row[key][0], kind), _fmt(row[key][1], kind),
           f'{row[key][2]:.3f}')
          for key, label, kind in QUANTITIES[:3]]
  rows.append(('\\|Δ loss\\| (same values)', '', '',
               f'{row["loss_difference"]:.1e}'))
  return [
      '## One module tied into every layer of `nn.scan(nn.remat(...))`',
      '',
      f'A MaxText-style stack of {row["layers"]} layers'
      ' (`benchmarks/test_scan_over_layers.py`): `nn.scan` over a rematted'
      ' block (`static_argnames="deterministic"`) whose attention adds a'
      ' T5-style relative-position bias. Candidate: one bias module at the'
      ' encoder, tied into every layer (`{"layers/rel_bias": "rel_bias"}`).'
      ' Baseline: the untied stack, every layer holding its own copy (what'
      ' `untie_variables(..., stacks={"layers": n})` writes). Upstream\'s'
      ' idiom of passing one module into the stack fails there: `nn.scan`'
      ' slices a module passed in along `variable_axes` like the layers\''
      ' own parameters (`ScopeParamShapeError`). The tie stores one bias'
      ' instead of one per layer (argument bytes); the extra temp bytes hold'
      ' the gradient of the broadcast bias, summed over the layers inside'
      ' the scan, where the untied stack returns one gradient per layer.',
      '',
      *_table(('quantity', 'untied stack', 'nn.tie', 'ratio'), rows),
      '',
  ]


def tie_nesting(section: dict) -> list[str]:
  out = [
      '## Init traces against tie nesting depth',
      '',
      'How many times the leaf attention\'s `__call__` runs while `init` is'
      ' traced, for ties nested `d` levels deep: `nn.tie` against the'
      ' hand-made tie `nn.map_variables(Module, "params", trans_in_fn=copy'
      ' source into target, trans_out_fn=drop target, init=True,'
      ' mutable=True)` at every level (`benchmarks/models.py`). *pair*: every'
      ' level calls two copies of the level below, the second tied to the'
      ' first; *chain*: every level calls a leaf and the level below, every'
      ' leaf tied to the root\'s.',
      '',
  ]
  for shape, rows in sorted(section.items(), reverse=True):
    out += [f'**{shape}**', '']
    out += _table(
        ('depth', 'call sites', 'nn.tie traces', 'map_variables traces',
         'map_variables / nn.tie', 'init nn.tie', 'init map_variables'),
        [(str(r['depth']), str(r['call_sites']), str(r['tie_traces']),
          str(r['map_variables_traces']),
          f'{r["map_variables_traces"] / r["tie_traces"]:.0f}×',
          _fmt(r['tie_init_seconds'], 'seconds'),
          _fmt(r['map_variables_init_seconds'], 'seconds')) for r in rows])
    out.append('')
  out += ['`nn.tie` traces every call site once: linear in the number of call'
          ' sites (*chain*: `d + 1`; *pair*: `2^d`). The `map_variables` tie'
          ' runs its module twice while initializing, at every level: `4^d`'
          ' for *pair*, `3·2^d - 2` for *chain*.', '']
  return out


def static_argnames(row: dict) -> list[str]:
  rows = []
  for key, label, kind in QUANTITIES:
    if key not in row:
      continue
    base, names, ratio = row[key]
    rows.append((label, _fmt(base, kind), _fmt(names, kind), f'{ratio:.3f}',
                 _verdict(ratio, STATIC_TARGETS[key])))
  rows.append(('max \\|Δ loss\\|, max \\|Δ grad\\|', '', '',
               f'{row["loss_difference"]:.1e}, {row["grad_difference"]:.1e}',
               ''))
  if 'same_instructions' in row:
    rows.append(('same optimized HLO instructions', '', '',
                 'yes' if row['same_instructions'] else 'no', ''))
  if 'same_program' in row:
    rows.append(('same optimized HLO (without source locations)', '', '',
                 'yes' if row['same_program'] else 'no', 'yes'))
  return [
      '## `static_argnames` vs upstream `static_argnums`',
      '',
      f'T5-style encoder (`flax_tieext.examples.t5`, {row["layers"]} blocks),'
      ' untied, every block rematted, dropout on, jitted loss + gradient.'
      ' Baseline: upstream Flax, `nn.checkpoint(Block, static_argnums=(2,))`'
      ' with `deterministic` passed positionally. Candidate:'
      ' `nn.checkpoint(Block, static_argnames=("deterministic",))`, passed by'
      ' keyword.',
      '',
      *_table(('quantity', 'upstream: static_argnums', 'static_argnames',
               'ratio', 'target'), rows),
      '',
  ]


def static_argnames_nnx(row: dict) -> list[str]:
  base_s, names_s, time_ratio = row['eager_call_seconds']
  base_t, names_t, trace_ratio = row['eager_traces']
  fast_base, fast_names, fast_ratio = row.get(
      'eager_call_fastest_seconds', (float('nan'),) * 3)
  return [
      '## `nnx.remat(static_argnames=...)` vs upstream `static_argnums`',
      '',
      f'{row["blocks"]} residual MLP blocks (128 -> 512 -> 128, batch 8),'
      ' dropout on. Baseline: Flax\'s own `nnx.remat(block, static_argnums=2)`,'
      ' `deterministic` passed positionally. Candidate: `nnx.remat(block,'
      ' static_argnames="deterministic")`, passed by keyword. Jitted: loss'
      ' and gradient of the stack. Eager: one block called without `jax.jit`'
      ' (per-call time over interleaved rounds), and the traces of a fresh'
      ' transform over five calls with two distinct static values.',
      '',
      *_table(('quantity', 'upstream: static_argnums', 'static_argnames',
               'ratio', 'target'), [
                   ('same optimized HLO under `jax.jit`', '', '',
                    'yes' if row['same_program'] else 'no', 'yes'),
                   ('eager time per call, median round', _fmt(base_s, 'ms'),
                    _fmt(names_s, 'ms'), f'{time_ratio:.3f}', '≈ 1'),
                   ('eager time per call, fastest round',
                    _fmt(fast_base, 'ms'), _fmt(fast_names, 'ms'),
                    f'{fast_ratio:.3f}', '≈ 1'),
                   ('eager traces (5 calls, 2 static values)', f'{base_t}',
                    f'{names_t}', f'{trace_ratio:.3f}',
                    _verdict(trace_ratio, 1.0)),
               ]),
      '',
  ]


NNX_TREE_TIE_MODELS = {
    'lm': 'language model, head tied to the transposed embedding',
    'encoder': 'rematted encoder, one mask tied into every block',
}


def nnx_tree_tie(section: dict) -> list[str]:
  rows = []
  for name, row in section.items():
    for key, label, kind in (
        ('flops', 'FLOPs (`cost_analysis`)', 'flops'),
        ('temp_bytes', 'temp bytes (`memory_analysis`)', 'bytes'),
        ('argument_bytes', 'argument bytes (`memory_analysis`)', 'bytes'),
        ('traces', 'traces of the train step (3 steps)', 'count'),
        ('compile_seconds', 'trace + compile time (median)', 'seconds')):
      base, tied, ratio = row[key]
      bound = 1.10 if key == 'compile_seconds' else (1.0 if key == 'traces' else 1.01)
      rows.append((NNX_TREE_TIE_MODELS.get(name, name), label, _fmt(base, kind),
                   _fmt(tied, kind), f'{ratio:.3f}', _verdict(ratio, bound)))
  return [
      '## NNX tree mode: `flax_tieext.nnx.tie` vs graph-mode sharing',
      '',
      'Jitted Adam train step (`flax_tieext.examples.nnx_tree`: vocabulary 512,'
      ' width 128, 4 layers, length 64, batch 8). Baseline: graph mode, one'
      ' module or Variable shared by reference. Candidate: tree mode'
      ' (`graph=False`), the same sharing declared with `flax_tieext.nnx.tie`.',
      '',
      *_table(('model', 'quantity', 'graph mode: shared reference',
               'tree mode: nnx.tie', 'ratio', 'target'), rows),
      '',
  ]


def remat_memory(section: dict) -> list[str]:
  rows = []
  for layers, row in sorted(section.items(), key=lambda kv: int(kv[0])):
    tr, tn, t_ratio = row['tied_temp_bytes']
    ur, un, u_ratio = row['untied_temp_bytes']
    rows.append((layers, _fmt(tr, 'bytes'), _fmt(tn, 'bytes'),
                 f'{t_ratio:.3f}', _fmt(ur, 'bytes'), _fmt(un, 'bytes'),
                 f'{u_ratio:.3f}',
                 f'{row["tied_argument_bytes"] / row["untied_argument_bytes"]:.3f}'))
  return [
      '## Remat\'s memory saving is kept under a tie',
      '',
      'T5-style encoder, loss + gradient with dropout off: compiled temp bytes'
      ' with every block rematted against no remat, with the attention mask'
      ' tied (`nn.tie`, stored once) and untied (one copy per block). The'
      ' last column is what the tie saves in stored variables (argument'
      ' bytes, tied / untied).',
      '',
      *_table(('blocks', 'tied, remat', 'tied, no remat', 'ratio',
               'untied, remat', 'untied, no remat', 'ratio',
               'argument bytes tied / untied'), rows),
      '',
  ]


def import_overhead(row: dict) -> list[str]:
  ok = row['flax_tieext_seconds'] <= IMPORT_TARGET_SECONDS
  return [
      '## Import overhead',
      '',
      f'Fresh interpreters, median of {row["runs"]} runs: `import flax.linen`,'
      ' then `import flax_tieext` (which installs the patch).',
      '',
      *_table(('import flax.linen', 'then import flax_tieext', 'relative',
               'target'),
              [(_fmt(row['flax_linen_seconds'], 'ms'),
                _fmt(row['flax_tieext_seconds'], 'ms'),
                f'{row["relative"]:.3f}',
                f'≤{NBSP}50{NBSP}ms{NBSP}{"✓" if ok else "✗"}')]),
      '',
  ]


def untied_calls(rows: list) -> list[str]:
  return [
      '## An untied model pays nothing for the patch: Python calls',
      '',
      'Fresh interpreters, plain Flax and `import flax_tieext`: Python calls'
      ' (`sys.setprofile`, deterministic) of `init` and of the grad trace of'
      ' N `nn.remat` blocks that use neither feature. Target: patched /'
      ' plain ≤ 1.005.',
      '',
      *_table(('blocks', 'init plain', 'init patched', 'ratio', 'grad plain',
               'grad patched', 'ratio'),
              [(str(r['blocks']), str(r['init_plain']), str(r['init_patched']),
                f'{r["init_ratio"]:.4f}', str(r['grad_plain']), str(r['grad_patched']),
                f'{r["grad_ratio"]:.4f}') for r in rows]),
      '',
  ]


def untied_live_memory(rows: list) -> list[str]:
  def fmt(v):
    return f'{v[0]} arrays, {_fmt(v[1], "bytes")}, {v[2]} Scopes, {v[3]} tracers'

  return [
      '## Nothing of an eager call outlives it',
      '',
      f'Alive after {rows[0]["steps"]} eager (un-jitted) SGD steps of 4'
      ' rematted `Dense(64)` blocks, plain Flax and patched (fresh'
      ' interpreters). Plain Flax keeps what `jax.checkpoint`\'s'
      ' `static_argnums` cache holds; the patch closes static values over.',
      '',
      *_table(('model', 'plain', 'patched', 'bytes patched / plain'),
              [(r['model'], fmt(r['plain']), fmt(r['patched']),
                'n/a' if r['bytes_ratio'] is None else f'{r["bytes_ratio"]:.3f}')
               for r in rows]),
      '',
  ]


def _ratio_cell(candidate, baseline) -> str:
  if candidate is None or baseline is None or not baseline:
    return 'n/a'
  return f'{candidate / baseline:.3f}'


def accelerator(data: dict, heading: str = '## Accelerator') -> list[str]:
  """The ``Accelerator`` section, from ``benchmarks/device_results.json``."""
  meta, groups, variants = data['meta'], data['groups'], data['variants']
  size = meta['size']
  # Groups measured in separate runs of one device and size keep their dates.
  dates = sorted({g.get('date', meta['date']) for g in groups.values()})
  when = dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'
  peak_keys = sorted({v['peak_key'] for v in variants.values() if v.get('peak_key')})
  lines = [
      heading,
      '',
      '<!-- From benchmarks/device_results*.json, written by benchmarks/device.py'
      ' (nox -s bench -- --device). -->',
      '',
      f'Measured {when} on {meta["device"]} ({meta["device_count"]}'
      f' device(s)): jax {meta["jax"]}, flax {meta["flax"]}, Python'
      f' {meta["python"]}. One jitted Adam train step (loss, gradient, update;'
      f' state donated), {meta["dtype"]}: vocabulary {size["vocab"]},'
      f' d_model {size["d_model"]}, {size["heads"]} heads, d_ff {size["d_ff"]},'
      f' {size["layers"]} layers, sequence {size["length"]}, batch'
      f' {size["batch"]}; layers: {meta.get("layers", "einsums")}. Step time:'
      f' median of {meta["rounds"]} interleaved'
      f' rounds (baseline, candidate, ...) after {meta["warmup"]} warm-up'
      ' rounds; the noise is the interquartile range of the per-round'
      ' ratios. Peak: the device\'s'
      f' `memory_stats()` ({", ".join(f"`{k}`" for k in peak_keys) or "not reported"})'
      ' after two steps, the variants stepped one at a time in increasing'
      ' order of their compiled footprint, each one\'s state freed first; (≤):'
      ' that variant did not raise the peak, which is then an upper bound.'
      ' FLOPs, temp and argument bytes: the compiled step\'s'
      ' `cost_analysis()` and `memory_analysis()` (which counts the body of'
      ' a scan\'s loop once: compare FLOPs within a group only). On a TPU'
      ' `peak_bytes_reserved` follows the temporaries; the state (arguments)'
      ' is held besides. Sources: `benchmarks/device.py`.',
      '',
  ]
  # One narrow table per group (docs/screenshots.py: a table fits the column
  # and no word breaks inside a cell): the spreads are in the JSON.
  order = ('albert', 'equinox', 'nnx', 'scan', 'vmap', 'prevent_cse')
  for _, group in sorted(groups.items(), key=lambda kv: (
      order.index(kv[0]) if kv[0] in order else len(order), kv[0])):
    dated = f' (measured {group["date"]})' if len(dates) > 1 else ''
    lines += [f'**{group["title"]}**{dated}', '']
    if 'skipped' in group:
      lines += [f'Skipped: {group["skipped"]}', '']
      continue
    rows = []
    for pair in group['pairs']:
      base, cand = variants[pair['baseline']], variants[pair['candidate']]
      _, q1, q3 = pair['round_ratio_median_iqr']
      rows.append((
          f'{cand["label"]} / {base["label"]}',
          f'{pair["candidate_step_seconds"] * 1e3:.1f} /'
          f' {pair["baseline_step_seconds"] * 1e3:.1f}',
          f'**{pair["step_ratio"]:.3f}** ({q1:.3f} to {q3:.3f})',
          _ratio_cell(cand.get('peak_bytes'), base.get('peak_bytes')),
          _ratio_cell(cand['temp_bytes'], base['temp_bytes']),
          _ratio_cell(cand['argument_bytes'], base['argument_bytes']),
          _ratio_cell(cand['flops'], base['flops'])))
    lines += _table(('candidate / baseline', 'step, ms', 'step ratio (IQR)',
                     'peak', 'temp', 'args', 'FLOPs'), rows) + ['']
  lines += ['Per variant (compiled step; MiB, peak marked (≤) where the'
            ' variant did not raise it):', '']
  mib = lambda b: f'{b / 2**20:,.0f}'
  in_use = lambda v: ('n/a' if v.get('peak_bytes_in_use') is None
                      else mib(v['peak_bytes_in_use']))
  peak = lambda v: ('n/a' if v.get('peak_bytes') is None else mib(
      v['peak_bytes']) + ('' if v.get('peak_raised', True) else f'{NBSP}(≤)'))
  lines += _table(
      ('variant', 'TFLOPs', 'temp', 'args', 'out (aliased)', 'peak',
       'in use'),
      [(f'`{name}`: {v["label"]}', f'{v["flops"] / 1e12:.3f}',
        mib(v['temp_bytes']), mib(v['argument_bytes']),
        f'{mib(v["output_bytes"])} ({mib(v["alias_bytes"])})',
        peak(v), in_use(v)) for name, v in variants.items()])
  lines += _earlier_scan_numbers(groups)
  hlo = groups.get('nnx', {}).get('hlo')
  if hlo:
    diff = hlo['tree_minus_graph']
    ops = ', '.join(f'{k} {v:+d}' for k, v in diff['ops'].items()) or 'none'
    lines += [
        '',
        '**NNX tree mode vs graph mode, optimized HLO** (`benchmarks/device.py'
        ' --hlo-dir`): fusions'
        f' {hlo["graph"]["fusions"]} (graph) vs {hlo["tree"]["fusions"]} (tree),'
        f' entry parameters {hlo["graph"]["entry_parameters"]} vs'
        f' {hlo["tree"]["entry_parameters"]}, donated (aliased) outputs'
        f' {hlo["graph"]["aliased_outputs"]} vs {hlo["tree"]["aliased_outputs"]};'
        f' ops, tree minus graph: {ops}.',
    ]
    lines += NNX_HLO_FINDING
  return lines + ['']


GRID_LOWERINGS = (('broadcast', "`'broadcast'`"), ('scanned', "`'scanned'`"))


def _mib(b) -> str:
  return 'n/a' if b is None else f'{b / 2**20:,.0f}'


def grid(data: dict) -> list[str]:
  """The layouts grid (``benchmarks/device.py --grid``): one table per stack
  and batch, each tied lowering against the untied stack."""
  meta, cells = data['meta'], data['cells']
  size = meta['size']
  dates = sorted({c.get('date', meta['date']) for c in cells.values()})
  when = dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'
  compiled = [c for c in cells.values() if c.get('compiled_only')]
  lines = [
      '## Accelerator: one module tied into a stack, on a grid of layouts',
      '',
      '<!-- From benchmarks/device_results_grid.json, written by benchmarks/device.py'
      ' --grid (nox -s bench -- --device --grid). -->',
      '',
      f'{when}, {meta["device"]}: jax {meta["jax"]}, flax {meta["flax"]}'
      + (f', libtpu {meta["libtpu"]}' if meta.get('libtpu') else '') + '.'
      f' One jitted Adam train step of `nn.scan(nn.remat(Layer))` (or `nn.vmap`),'
      f' {meta["dtype"]}: vocabulary {size["vocab"]}, d_model {size["d_model"]},'
      f' {size["heads"]} heads, d_ff {size["d_ff"]}, {size["layers"]} layers, sequence'
      f' {size["length"]}; each layer\'s attention (or MLP) is the module tied into'
      ' every layer, written as `LAYOUTS` in `benchmarks/device.py` says. Ratios are'
      ' against the untied stack: step time, median of'
      f' {meta["rounds"]} interleaved rounds (IQR of the per-round ratios); peak:'
      ' `memory_stats()` after two steps, smallest temporaries first ((≤): did not'
      ' raise the counter); temp and argument bytes and FLOPs: the compiled step.'
      ' *default* is `nn.tie` without `in_scan`; "= scanned" where it compiles to'
      ' that very program.',
      '',
  ]
  if compiled:
    how = meta.get('compiled_only', 'without the chip')
    lines += [f'Compiled only, {how}: {len(compiled)} of the {len(cells)} cells, their'
              ' programs\' memory and FLOPs, no step time or peak ("–"); where the'
              ' default was not compiled, the temp, args and FLOPs ratios are'
              ' `\'scanned\'`\'s, marked (s): the default\'s program wherever it'
              ' applies (`tests/test_device_benchmark.py` checks that they are one'
              ' program). Compiled this way, the Accelerator section\'s `scan_tie`'
              ' has the temp bytes, argument bytes and FLOPs measured on the chip,'
              ' to the byte (4,276,676,608 temp bytes).', '']
  by_table: dict = {}
  for cell in cells.values():
    by_table.setdefault((cell['stack'], cell['batch']), []).append(cell)
  for (stack, batch), rows in sorted(by_table.items()):
    rounds = {c.get('rounds', meta['rounds']) for c in rows} - {meta['rounds']}
    lines += [f'**`nn.{stack}`, batch {batch}**'
              + (f' ({rounds.pop()} rounds)' if rounds else ''), '']
    table = []
    for cell in sorted(rows, key=lambda c: c['layout']):
      low = cell['lowerings']
      untied = low['untied']

      def step(l, low=low, iqr=True):
        if l not in low or 'step_ratio' not in low[l]:
          return '–'
        _, q1, q3 = low[l]['round_ratio_median_iqr']
        return f'{low[l]["step_ratio"]:.3f}' + (f' ({q1:.3f} to {q3:.3f})' if iqr else '')

      default = low.get('default', {})
      same = default.get('same_program_as')
      # The ratios of the default's program; where the default was not
      # compiled, of 'scanned' (its program wherever it applies: the tests).
      mine = default or low.get('scanned', {})
      peak = '–'
      if default.get('peak_bytes') and untied.get('peak_bytes'):
        peak = f'{default["peak_bytes"] / untied["peak_bytes"]:.3f}' + (
            '' if default.get('peak_raised', True) else f'{NBSP}(≤)')
      temps = ' / '.join(_mib(low[l]['temp_bytes']) for l in
                         ('untied', 'broadcast', 'scanned') if l in low)
      table.append((
          f'`{cell["layout"]}`: {cell["describe"]}',
          f'**{step("default")}**' + (f' = {same}' if same else ''),
          *((' / '.join(step(l, iqr=False) for l, _ in GRID_LOWERINGS),)
            if stack == 'scan' else ()),
          peak, temps,
          ' / '.join((
              _ratio_cell(mine.get('temp_bytes'), untied['temp_bytes'])
              + ('' if default else f'{NBSP}(s)'),
              _ratio_cell(mine.get('argument_bytes'), untied['argument_bytes']),
              _ratio_cell(mine.get('flops'), untied['flops'])))))
    header = ('layout', 'default: step (IQR)',
              *((' / '.join(name for _, name in GRID_LOWERINGS) + ': step',)
                if stack == 'scan' else ()),
              'peak', 'temp MiB: untied / broadcast / scanned'
              if stack == 'scan' else 'temp MiB: untied', 'temp / args / FLOPs')
    lines += _table(header, table) + ['']
  return lines + SCAN_HLO_FINDING + ['']


# Why the closed-over ('broadcast') scan tie can be slower, and why
# 'scanned' holds more temporaries: the optimized TPU v5e programs of the
# grid's fused2d_f32 layout at batch 16 (benchmarks/device.py --grid
# --compile-only v5e:1x1 --hlo-dir), read instruction by instruction.
SCAN_HLO_FINDING = [
    '### Why the lowerings differ: the optimized HLO',
    '',
    'The optimized TPU v5e programs of `fused2d_f32` (a 2-D fused qkv `nn.Dense`'
    ' kernel, f32 logits; batch 16), closed over (`\'broadcast\'`) beside'
    ' scanned (`\'scanned\'`), compiled by libtpu 0.0.42.1 (`device.py --grid'
    ' --compile-only v5e:1x1 --hlo-dir DIR`; the instruction names below are'
    ' that compile\'s). Each has one forward loop and one backward loop of 12'
    ' iterations; no `opt-barrier` survives optimization in either, and their'
    ' loop bodies hold the same fusions but for these differences.',
    '',
    '1. *The weight\'s f32→bf16 cast is hoisted out of both loops either way.*'
    ' Closed over, once: `%convert.95 = bf16[1024,3072]{1,0:T(8,128)(2,1)}'
    ' convert(...)`, and the loops carry the bf16 weight as a loop invariant'
    ' (`bf16[1024,3072]{1,0}`, and the output projection\'s as'
    ' `bf16[1024,1024]{0,1}` in the forward loop). Scanned, once for the whole'
    ' stack: `%broadcast_in_dim.118 = bf16[12,1024,3072]{2,1,0:T(8,128)(2,1)}'
    ' broadcast(%custom-call.22), dimensions={1,2}`: the broadcast is'
    ' *materialized*, 12 copies of one weight (72 MiB, 24 MiB more for the'
    ' output projection) that each iteration slices back'
    ' (`%dynamic-slice_bitcast_fusion.12`). This is where `\'scanned\'`\'s extra'
    ' temporaries start (`patches/jax/scan_over_broadcast_materialized.md`).',
    '2. *Where the weight\'s gradient goes.* Closed over, into a loop-carried f32'
    ' accumulator, fused onto the weight-gradient matmul:'
    ' `%select_add_fusion.5 = f32[1024,3072]{1,0:T(8,128)} fusion(%get-tuple-element.1159,'
    ' %compare.21, ...)`, whose fused computation is `select(i == 0, 0, acc) +'
    ' convert(convolution(...))`: a read-modify-write of 12 MiB in HBM per layer.'
    ' Scanned, into the stacked output: `%bitcast_dynamic-update-slice_fusion.13 ='
    ' f32[12,1024,3072]{2,1,0:T(8,128)} fusion(...)`, summed after the loop'
    ' (`%reduce_sum.390 = f32[1024,3072] reduce(%while.36, ...)`): 192 MiB of'
    ' per-layer f32 gradients live at the end of the backward loop, the other'
    ' part of `\'scanned\'`\'s temporaries (the untied stack holds the same).',
    '3. *Where the weight lives while the loop reads it.* Scanned, each'
    ' iteration\'s slice is written into on-chip memory (`S(1)`):'
    ' `%dynamic-slice_bitcast_fusion.12 = bf16[1024,3072]{1,0:T(8,128)(2,1)S(1)}`,'
    ' and the recomputed projection (`%fusion.383`) and the input-gradient'
    ' fusion (`%fusion.399`, reading `%copy-done.21`, `S(1)`) read it there.'
    ' Closed over, memory-space assignment leaves the loop invariant in HBM:'
    ' `%fusion.381` and `%fusion.397` read `%get-tuple-element.1203 ='
    ' bf16[1024,3072]{1,0:T(8,128)(2,1)}` (no `S(1)`), in both loops (the 2 MiB'
    ' output projection is prefetched, `%copy-start.46`; the 6 MiB fused qkv'
    ' kernel never is). A pure-JAX `lax.scan` of a (1024, 3072) matmul compiled'
    ' for the v5e shows the same placement (the report, below its reproducer).',
    '',
    'What that costs in time, the compiler\'s own cost model (`estimated_cycles`'
    ' in each fusion\'s backend config) prices per backward iteration at'
    ' +432,664 cycles for the input-gradient fusion (1,549,472 closed over vs'
    ' 1,116,808 scanned), +34,744 for the weight-gradient accumulation (889,712'
    ' vs 854,968) and +17,443 for the recomputed projection (830,756 vs'
    ' 813,313): about 0.9% of a step, where issue 53 measured 5.4%. The same'
    ' model prices the bf16-logits layout `fused2d_bf16` *higher* (+2.3% for its'
    ' backward loop, +745,000 cycles for the same input-gradient fusion), which'
    ' issue 53 measured *faster* closed over than the untied stack. So the'
    ' HLO differences are the ones above, but the compile-time cost model does'
    ' not tell which layouts they make slower: no rule read from the compiled'
    ' program chooses the lowering, and the default scans (`docs/scaling.md`).'
    ' On the chip (`device.py --grid --profile fused2d_f32 --hlo-dir DIR`,'
    ' `jax.profiler` per HLO instruction, three steps each), the three programs'
    ' of `fused2d_f32` at batch 16 step in 111.8 to 112.4 ms closed over and'
    ' scanned and 112.5 to 113.0 ms untied: the differences above cost nothing'
    ' measurable in this layout, and issue 53\'s 5.4% is not reproduced by it.',
]


def _earlier_scan_numbers(groups: dict) -> list[str]:
  """These numbers beside issue 46's (an earlier TPU v5e run, other code)."""
  ratios = {p['candidate']: p['step_ratio'] for name in ('scan', 'prevent_cse')
            for p in groups.get(name, {}).get('pairs', ())}
  if not {'scan_tie', 'scan_tie_no_cse', 'scan_untied_no_cse'} <= set(ratios):
    return []
  return [
      '',
      'Issue 46 reported, from an earlier TPU v5e run (its model code is not in'
      ' the repository) at'
      ' these sizes, tied / untied 1.055 in the scan and `prevent_cse=False`'
      ' 7–8% faster. Not reproduced here: tied / untied'
      f' {ratios["scan_tie"]:.3f}, `prevent_cse=False` / default'
      f' {ratios["scan_tie_no_cse"]:.3f} (tied) and'
      f' {ratios["scan_untied_no_cse"]:.3f} (untied).',
  ]


# What the NNX tree / graph difference is, as measured on the TPU v5e
# (benchmarks/device.py --hlo-dir; the same shows on CPU at --tiny).
NNX_HLO_FINDING = [
    '',
    'Why tree mode is 1.2% slower here: the two programs have the same FLOPs,'
    ' fusions (201), entry parameters (238) and donated outputs (236); they'
    ' differ in where the gradient of the shared attention is summed. Graph'
    ' mode threads the one attention module through every `nnx.remat` (it is'
    ' an input and an output of each block), so the backward pass adds each'
    ' block\'s kernel gradient into a running float32 sum as it goes: 11'
    ' `convert_add_fusion`s per kernel, each fused onto the output of that'
    ' block\'s weight-gradient matmul, their operands prefetched by 13 more'
    ' asynchronous copies and 29 more asynchronous slices than tree mode'
    ' schedules. In tree mode the tie\'s rebuild hands the one array to all'
    ' 12 blocks before the forward pass, so JAX sums the 12 cotangents where'
    ' the array fans out: the 12 per-block bf16 kernel gradients stay live'
    ' to the end of the backward pass and are added up in one fusion'
    ' together with the Adam update (in the jaxpr, the tied kernels\''
    ' `add_any`s sit inside the remat transposes in graph mode and at the top'
    ' level in tree mode). Temporaries are the same (tree / graph 0.999):'
    ' the cost is time, the summation moved from overlapped with the'
    ' backward pass to the end of the step. That attribution is by'
    ' elimination (no other structural difference), not from a profile. A'
    ' tree-mode tie reaches graph mode\'s step time only if its gradient is'
    ' accumulated block by block as graph mode\'s is, i.e. if the tied'
    ' Variable is passed through each transform rather than fanned out'
    ' before them.',
]


SECTIONS = (
    ('shared_attention', shared_attention),
    ('scan_over_layers', scan_over_layers),
    ('tie_nesting', tie_nesting),
    ('static_argnames', static_argnames),
    ('static_argnames_nnx', static_argnames_nnx),
    ('remat_memory', remat_memory),
    ('nnx_tree_tie', nnx_tree_tie),
    ('import_overhead', import_overhead),
    ('untied_calls', untied_calls),
    ('untied_live_memory', untied_live_memory),
)


def render_markdown(data: dict, png: str | None, device: Sequence[dict] = ()) -> str:
  """The Markdown page for ``data`` (the parsed results file).

  ``device``: the parsed ``benchmarks/device_results*.json``, rendered as the
  Accelerator section (the first) and its subsections.
  """
  meta, results = data['meta'], data['results']
  lines = [
      '# Benchmarks',
      '',
      '<!-- Generated by benchmarks/render.py from benchmarks/results.json'
      ' (nox -s bench). Do not edit. -->',
      '',
      'Every benchmark compares a candidate with a baseline measured in the'
      ' same run; times are medians of interleaved rounds (baseline,'
      ' candidate, baseline, ...), so read the ratios, not the absolute times.'
      ' Compiled quantities come from XLA (`compiled.cost_analysis()`,'
      ' `compiled.memory_analysis()`) and are deterministic. Run them with'
      ' `nox -s bench` (sources in `benchmarks/`).',
      '',
      f'Measured {meta["date"]}: flax {meta["flax"]}, jax {meta["jax"]},'
      f' Python {meta["python"]}, {meta["backend"]} backend,'
      f' {meta["cpus"]} CPUs ({meta["machine"]}), {meta["rounds"]} rounds.',
      '',
  ]
  if meta.get('remat_barriers_kept'):
    lines += [
        'XLA:CPU expands the optimization barriers of `jax.checkpoint` before'
        ' common-subexpression elimination, which merges the recomputation'
        ' back into the forward pass: on stock XLA:CPU an unrolled rematted'
        ' model uses as much memory as an unrematted one. These runs set'
        f' `XLA_FLAGS={meta["xla_flags"]}` (see'
        ' `flax_tieext.examples.measure.keep_remat_on_cpu`) so that the'
        ' memory numbers show what remat does on GPU and TPU, which keep the'
        ' barriers.',
        '',
    ]
  if png:
    lines += [f'![Benchmark plots]({png})', '']
  for key, render in SECTIONS:
    if key in results:
      lines += render(results[key])
  for i, one in enumerate(d for d in device or () if 'cells' not in d):
    lines += accelerator(one, '## Accelerator' if i == 0 else
                         f'### Accelerator: {one["meta"].get("layers", "")},'
                         f' batch {one["meta"]["size"]["batch"]}')
  for one in (d for d in device or () if 'cells' in d):
    lines += grid(one)
  return '\n'.join(lines).rstrip() + '\n'


def render_png(data: dict, path: pathlib.Path) -> bool:
  """Init traces against depth, and remat temp memory; ``False`` if no plot."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  results = data['results']
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for shape, rows in sorted(results.get('tie_nesting', {}).items()):
    depths = [r['depth'] for r in rows]
    left.plot(depths, [r['tie_traces'] for r in rows], marker='o',
              label=f'nn.tie ({shape})')
    left.plot(depths, [r['map_variables_traces'] for r in rows], marker='s',
              linestyle='--', label=f'map_variables tie ({shape})')
  left.set_yscale('log', base=2)
  left.set_xlabel('tie nesting depth')
  left.set_ylabel('attention __call__ runs in init')
  left.set_title('init traces')
  left.grid(True, alpha=0.3)
  left.legend(fontsize=8)

  memory = results.get('remat_memory', {})
  layers = sorted(memory, key=int)
  bars = (('tied, no remat', 'tied_temp_bytes', 1),
          ('tied, remat', 'tied_temp_bytes', 0),
          ('untied, no remat', 'untied_temp_bytes', 1),
          ('untied, remat', 'untied_temp_bytes', 0))
  width = 0.2
  for n, (label, key, index) in enumerate(bars):
    right.bar([i + (n - 1.5) * width for i in range(len(layers))],
              [memory[l][key][index] / 2**20 for l in layers], width,
              label=label)
  right.set_xticks(range(len(layers)), [f'{l} blocks' for l in layers])
  right.set_ylabel('compiled temp memory (MiB)')
  right.set_title('T5-style encoder, loss + gradient')
  right.grid(True, axis='y', alpha=0.3)
  right.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, format='png', dpi=110)
  plt.close(fig)
  return True


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--results', default=ROOT / 'benchmarks' / 'results.json',
                      type=pathlib.Path)
  parser.add_argument('--out', default=ROOT / 'docs' / 'benchmarks.md',
                      type=pathlib.Path)
  parser.add_argument('--device-results', nargs='*', type=pathlib.Path,
                      default=sorted((ROOT / 'benchmarks').glob('device_results*.json')))
  parser.add_argument('--png', default=ROOT / 'docs' / '_static' / 'benchmarks.png',
                      type=pathlib.Path)
  args = parser.parse_args(argv)
  if not args.results.exists():
    parser.error(f'{args.results} does not exist: run nox -s bench first')
  data = json.loads(args.results.read_text())
  png = None
  if render_png(data, args.png):
    png = os.path.relpath(args.png, args.out.parent)
  elif args.png.exists():
    png = os.path.relpath(args.png, args.out.parent)
    print(f'matplotlib is not installed: keeping the old {args.png}',
          file=sys.stderr)
  device = [json.loads(p.read_text()) for p in args.device_results]
  args.out.write_text(render_markdown(data, png, device))
  print(f'wrote {args.out}' + (f' and {args.png}' if png else ''))
  return 0


if __name__ == '__main__':
  sys.exit(main())
