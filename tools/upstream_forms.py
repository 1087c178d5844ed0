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

"""A generated call-form differential of the Flax PRs: Flax main against each prefix, and ``jax.jit``.

    python tools/upstream_forms.py MAIN_TREE PATCHED_TREE --applied 0001,0002 [-n 300] [--seed 0]

``generate(seed, n)`` draws ``n`` call forms of ``nn.remat`` / ``nn.checkpoint``:
a method signature (positional, defaults, keyword-only, ``*args``,
``**kwargs``, positional-only, behind a decorator with and without
``functools.wraps``, a ``functools.partial`` of the class, two methods of
different arities under ``methods=``), a static spec (ints, negatives, out of
range, tuples, lists, ``[]``, ``None``, floats, bools, NumPy integers and
bools, names, typos, both together), a call (positional, keyword, defaults)
and a context (bare, the decorator form, ``nn.scan`` over it with broadcast
arguments, ``jax.jit`` around ``apply``; with ``policy``, ``prevent_cse``,
``concrete``). Each form runs on each tree in one fresh interpreter per tree
(``run``), printing one line: where it ended (``build``, ``init`` or
``grad``) and how (the error's type, or a digest of the output and
gradient), which arguments the method saw as Python values, how many times
it was traced, and the warnings raised. Beside it, ``jax.jit`` of the
undecorated method with the same spec says whether JAX's own checks accept
it (``jit ok`` or the error's type).

``compare`` puts each form of the patched tree beside main's and names its
class (``classify``): ``same``; a form that fails on main and fails the
same way (phase and type); or one of ``CLASSES``, each a behaviour change
that an applied PR's text states (the sentence it must hold). A form that
runs on main and differs, or a change of no stated class, is a problem, as
is a validation error of the patched tree that ``jax.jit`` does not raise
for the same signature and spec (``0``, negative indices and the name
``self`` are Flax's own and not compared). Prints the class counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATCHES = ROOT / 'patches' / 'flax'

# Signatures: name -> (the method's source, the names it takes by keyword).
# The body branches on `flag` in Python and scales by `scale`.
BODY = '''
    SEEN.append(static(x, flag, scale))
    y = nn.Dense(4)(x) * scale
    y = nn.relu(y) if flag else y
    return RET
'''
# Name -> (a decorator, the def line, how the body reads flag and scale).
SIGNATURES = {
    'positional': ('', 'def __call__(self, x, flag, scale):', ''),
    'defaults': ('', 'def __call__(self, x, flag=False, scale=2.):', ''),
    'keyword_only': ('', 'def __call__(self, x, *, flag=False, scale=2.):', ''),
    'positional_only': ('', 'def __call__(self, x, flag, /, scale=2.):', ''),
    'var_positional': ('', 'def __call__(self, x, *args):',
                       'flag, scale = (args + (False, 2.)[len(args):])[:2]'),
    'var_keyword': ('', 'def __call__(self, x, **kwargs):',
                    'flag, scale = kwargs.get("flag", False), kwargs.get("scale", 2.)'),
    'wrapper': ('@wrap', 'def __call__(self, x, flag=False, scale=2.):', ''),
    'wraps': ('@wraps', 'def __call__(self, x, flag=False, scale=2.):', ''),
    'partial': ('', 'def __call__(self, x, flag=False, scale=2.):', ''),
    'two_methods': ('', 'def __call__(self, x, flag=False, scale=2.):', ''),
}
ARGNUMS = ['()', '1', '2', '3', '(2,)', '(3,)', '(2, 3)', '(1, 2)', '(0,)', '(-1,)', '(-2,)',
           '(-3,)', '(-1, -2, -3, -4)', '(4,)', '(9,)', '[2]', '[]', '[2, 3]', 'None', '(2.0,)',
           '2.0', '(True,)', 'True', 'np.int64(2)', '(np.int64(2),)', 'np.array([2])',
           '(np.bool_(True),)', '(2, 2)']
ARGNAMES = [None, "'flag'", "['flag']", "'scale'", "('flag', 'scale')", "'flga'", "'x'",
            "'self'", "'args'", "'kwargs'", "()"]
CALLS = {'pos': '(x, True)', 'pos3': '(x, True, 3.)', 'kw': '(x, flag=True)',
         'default': '(x,)', 'kw_scale': '(x, scale=3.)', 'mixed': '(x, True, scale=3.)',
         'kw_both': '(x, flag=True, scale=3.)'}
CONTEXTS = ['bare', 'bare', 'bare', 'decorator', 'scan', 'jit', 'policy', 'no_cse', 'concrete']

PRELUDE = '''
import functools, json, warnings
import jax, jax.numpy as jnp, numpy as np
from flax import linen as nn

def static(*args):
  return ''.join('T' if isinstance(a, jax.core.Tracer) else 's' for a in args)

def wrap(fn):  # a decorator without functools.wraps
  def wrapper(*args, **kwargs):
    return fn(*args, **kwargs)
  return wrapper

def wraps(fn):
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    return fn(*args, **kwargs)
  return wrapper

def digest(tree):
  return round(float(jax.tree.reduce(lambda a, b: a + jnp.abs(b).sum(), tree, 0.)), 3)

x = jnp.linspace(-1., 1., 8).reshape(2, 4)
SEEN = []
'''


def generate(seed: int, n: int) -> list[dict]:
  """``n`` forms drawn from ``seed``: each a dict of source fragments."""
  rng = random.Random(seed)
  forms = []
  for i in range(n):
    signature = rng.choice(list(SIGNATURES))
    context = rng.choice(CONTEXTS)
    argnums = rng.choice(ARGNUMS) if rng.random() < 0.8 else None
    argnames = rng.choice(ARGNAMES) if rng.random() < 0.4 else None
    call = rng.choice(list(CALLS))
    if context == 'scan':  # nn.scan passes its arguments by position
      call = rng.choice(['pos', 'pos3', 'default'])
    method = 'encode' if signature == 'two_methods' and rng.random() < 0.5 else '__call__'
    forms.append({'id': i, 'signature': signature, 'context': context, 'argnums': argnums,
                  'argnames': argnames, 'call': call, 'method': method})
  return forms


def source(form: dict) -> str:
  """The program of ``form``: defines ``build()``, ``run(model)`` and ``jit_check()``."""
  decorator, head, unpack = SIGNATURES[form['signature']]
  ret = '(y, None)' if form['context'] == 'scan' else 'y'
  body = BODY.replace('RET', ret)
  if unpack:
    body = f'\n    {unpack}' + body
  spec = []
  if form['argnums'] is not None:
    spec.append(f'static_argnums={form["argnums"]}')
  if form['argnames'] is not None:
    spec.append(f'static_argnames={form["argnames"]}')
  options = {'policy': 'policy=jax.checkpoint_policies.nothing_saveable',
             'no_cse': 'prevent_cse=False', 'concrete': 'concrete=True'}.get(form['context'])
  kwargs = ', '.join(spec + ([options] if options else []))
  decorate = form['context'] == 'decorator'
  lines = ['class M(nn.Module):']
  if form['signature'] == 'partial':
    lines.append('  features: int = 4')
  if decorate:
    lines.append(f'  @functools.partial(nn.remat, {kwargs})')
  lines.append('  @nn.compact')
  if decorator:
    lines.append(f'  {decorator}')
  lines.append(f'  {head}')
  lines.append(body.rstrip('\n'))
  if form['signature'] == 'two_methods':
    lines += ['  @nn.compact', '  def encode(self, x):', '    SEEN.append(static(x))',
              '    y = nn.Dense(4)(x) * 2.', f'    return {ret}']
  text = '\n'.join(lines)
  target = 'functools.partial(M, features=4)' if form['signature'] == 'partial' else 'M'
  methods = ", methods=['__call__', 'encode']" if form['signature'] == 'two_methods' else ''
  if decorate:
    build = f'def build():\n  return {target}'
  else:
    build = f'def build():\n  return nn.remat({target}{", " if kwargs else ""}{kwargs}{methods})'
  call = CALLS[form['call']]
  method = f", method='{form['method']}'" if form['method'] != '__call__' else ''
  if form['context'] == 'scan':
    run = f'''def run(cls):
  model = nn.scan(cls, variable_axes={{'params': 0}}, split_rngs={{'params': True}},
                  in_axes=nn.broadcast, length=2)()
  args = {call}
  variables = model.init(jax.random.key(0), *args)
  STAGE[0] = 'grad'
  loss = lambda v: model.apply(v, *args)[0].sum()
  return jax.value_and_grad(loss)(variables)'''
  else:
    args, kw = _split_call(call)
    apply = f'model.apply(v, {args}{kw}{method})'
    wrap_jit = form['context'] == 'jit'
    run = f'''def run(cls):
  model = cls()
  variables = model.init(jax.random.key(0), {args}{kw}{method})
  STAGE[0] = 'grad'
  loss = lambda v: {apply}.sum()
  return ({'jax.jit(' if wrap_jit else '('}jax.value_and_grad(loss)))(variables)'''
  jit_spec = ', '.join(spec)
  undecorated = 'M.__call__.__wrapped__' if decorate else 'M.__call__'
  jit_check = f'def jit_check():\n  return jax.jit({undecorated}{", " if jit_spec else ""}{jit_spec})'
  return '\n'.join([text, build, run, jit_check])


def _split_call(call: str) -> tuple[str, str]:
  inner = call[1:-1].rstrip(',')
  parts = [p.strip() for p in inner.split(',') if p.strip()]
  pos = [p for p in parts if '=' not in p]
  kw = [p for p in parts if '=' in p]
  return ', '.join(pos), ''.join(f', {k}' for k in kw)


DRIVER = '''
import sys
forms = json.loads(sys.stdin.read())
for form in forms:
  SEEN.clear()
  STAGE = ['build']
  line = {'id': form['id']}
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    try:
      scope = {**globals(), 'STAGE': STAGE}
      exec(form['source'], scope)
      cls = scope['build']()
      STAGE[0] = 'init'
      value, grads = scope['run'](cls)
      line['end'] = f'ok {round(float(value), 3)} {digest(grads)}'
    except Exception as e:
      line['end'] = f'{STAGE[0]} {type(e).__name__}'
      line['message'] = str(e).splitlines()[0][:160] if str(e) else ''
    try:
      scope['jit_check']()
      line['jit'] = 'ok'
    except Exception as e:
      line['jit'] = type(e).__name__
  line['seen'] = SEEN[-1] if SEEN else '-'
  line['traces'] = len(SEEN)
  line['warnings'] = sorted({f'{w.category.__name__}({str(w.message)[:40]})' for w in caught
                             if not issubclass(w.category, DeprecationWarning)})
  print(json.dumps(line), flush=True)
'''


def run(tree: str, forms: list[dict], python: str = sys.executable,
        env: dict[str, str] | None = None) -> dict[int, dict]:
  """Each form's line on the Flax of ``tree``, in one fresh interpreter."""
  payload = json.dumps([{'id': f['id'], 'source': source(f)} for f in forms])
  out = subprocess.run([python, '-c', PRELUDE + DRIVER], input=payload, capture_output=True,
                       text=True, timeout=3000, check=False,
                       env={**os.environ, 'PYTHONPATH': tree, 'JAX_PLATFORMS': 'cpu',
                            **(env or {})})
  lines = {}
  for text in out.stdout.splitlines():
    if text.startswith('{'):
      line = json.loads(text)
      lines[line['id']] = line
  if out.returncode or len(lines) != len(forms):
    raise RuntimeError(f'the forms did not all run on {tree}:\n{out.stderr[-3000:]}')
  return lines


# Class -> (the PR that states it, the sentence its text holds).
CLASSES = {
    'static_argnames given': ('0002', 'nn.checkpoint now takes static_argnames'),
    'a list or NumPy integers read as a tuple of ints':
        ('0001', 'static_argnums a list, or holding NumPy integers'),
    'a list or NumPy integers read as a tuple of ints (nn.remat)':
        ('0002', 'static_argnums=[2]) (a list), or NumPy integers'),
    'a static position passed by keyword or left to its default':
        ('0002', 'leaving train to its default'),
    'a NumPy bool, a NumPy integer after nn.checkpoint\'s shift, read as one':
        ('0001', 'a NumPy bool in nn.checkpoint\'s static_argnums'),
    # JAX_REMAT3=1 only: jax.checkpoint ignores an index it cannot use.
    'JAX_REMAT3=1: a float index or a NumPy bool, ignored on main, refused as jax.jit does':
        ('0001', 'With jax_remat3 on, for programs that ran'),
    'JAX_REMAT3=1: a float index or a NumPy bool, ignored on main, refused (nn.remat)':
        ('0002', 'With jax_remat3 on, for programs that ran'),
    'JAX_REMAT3=1: a static position passed by keyword, traced on main, static now':
        ('0002', 'train passed by keyword: before: train traced'),
}


def _kind(form: dict) -> set[str]:
  """What about ``form``'s spec a class can name."""
  kinds = set()
  argnums = form['argnums'] or ''
  if form['argnames'] is not None:
    kinds.add('names')
  if argnums.startswith('[') or 'np.int64' in argnums or 'np.array' in argnums:
    kinds.add('sequence')
  if 'np.bool_' in argnums:  # nn.checkpoint's `- 1` makes it a NumPy integer
    kinds.add('numpy bool')
  if form['call'] in ('kw', 'default', 'kw_scale', 'kw_both') or (
      form['call'] in ('pos', 'mixed') and re.search(r'\b3\b', argnums)):
    kinds.add('keyword')
  return kinds


def classify(form: dict, before: dict, after: dict, applied: set[str],
             remat3: bool = False) -> str:
  """The class of ``form``'s change from main (``before``) to a patched tree."""
  keys = ('end', 'seen', 'traces', 'warnings')
  if all(before[k] == after[k] for k in keys):
    return 'same'
  was, now = before['end'], after['end']
  ran = r'^(ok|init TracerBoolConversionError)'
  if remat3 and re.match(ran, was):
    if re.search(r'\d\.\d|np\.bool_', form['argnums'] or '') and now == 'init TypeError':
      return ('JAX_REMAT3=1: a float index or a NumPy bool, ignored on main, refused'
              + (' (nn.remat)' if '0002' in applied else ' as jax.jit does'))
    if ('keyword' in _kind(form) and '0002' in applied and now.startswith('ok')
        and (not was.startswith('ok') or was == now)):
      return 'JAX_REMAT3=1: a static position passed by keyword, traced on main, static now'
  if was.startswith('ok'):
    return 'RUNS ON MAIN, DIFFERS'
  if not now.startswith('ok') and was.split()[:2] == now.split()[:2]:
    return 'fails as on main'
  kinds = _kind(form)
  if 'names' in kinds and '0002' in applied:
    return 'static_argnames given'
  if 'sequence' in kinds:
    if '0002' in applied:
      return 'a list or NumPy integers read as a tuple of ints (nn.remat)'
    if '0001' in applied:
      return 'a list or NumPy integers read as a tuple of ints'
  if 'numpy bool' in kinds and applied == {'0001'}:
    return 'a NumPy bool, a NumPy integer after nn.checkpoint\'s shift, read as one'
  if 'keyword' in kinds and '0002' in applied and was == 'init ValueError':
    return 'a static position passed by keyword or left to its default'
  return 'UNSTATED'


def _flax_own(form: dict) -> bool:
  """Whether the spec reaches what is Flax's own (self, the internal arguments)."""
  argnums, argnames = form['argnums'] or '', form['argnames'] or ''
  return bool(re.search(r'-\d|\(0,\)|\bTrue\b|\b1\b', argnums) or "'self'" in argnames
              or form['signature'] in ('wrapper', 'two_methods', 'partial')
              or form['context'] == 'concrete')


def jit_problem(form: dict, after: dict) -> str | None:
  """A validation error of the patched tree that ``jax.jit`` does not raise."""
  if _flax_own(form):
    return None
  message = after.get('message', '')
  ours = re.match(r'static_arg|.*cannot be interpreted as an integer|.* is not iterable',
                  message)
  # Kept from main, where jax.jit differs: an index past a call's arguments
  # (with *args, which jax.jit ignores), and None (jax.jit reads it as ()).
  if not ours or 'for a call with' in message or form['argnums'] == 'None':
    return None
  raised = after['end'].split()[1]
  # jax.jit of a method that a lifted transform decorates can fail on its own
  # (a KeyError reading its signature): nothing to compare.
  if after['jit'] in ('ok', 'TypeError', 'ValueError') and after['jit'] != raised:
    return f'raises {raised} ({message[:80]}) where jax.jit gives {after["jit"]}'
  return None


def stated(applied: set[str]) -> dict[str, bool]:
  """For each class, whether an applied PR's text holds its sentence."""
  texts = {p.name[:4]: ' '.join(p.read_text().split('\n---\n', 1)[0].split())
           for p in PATCHES.glob('*.patch')}
  return {c: pr in applied and sentence in texts.get(pr, '')
          for c, (pr, sentence) in CLASSES.items()}


def compare(forms, before, after, applied,
            remat3=False) -> tuple[collections.Counter, list[str]]:
  """Class counts and problems of the patched lines ``after`` against main's."""
  counts, problems = collections.Counter(), []
  holds = stated(applied)
  for form in forms:
    b, a = before[form['id']], after[form['id']]
    cls = classify(form, b, a, applied, remat3)
    counts[cls] += 1
    if cls not in ('same', 'fails as on main') and not holds.get(cls):
      problems.append(f'form {form["id"]} ({cls}): {_describe(form)}\n'
                      f'    main:    {b["end"]} {b["seen"]} {b["traces"]}\n'
                      f'    patched: {a["end"]} {a["seen"]} {a["traces"]} {a.get("message", "")}')
    jit = jit_problem(form, a)
    if jit:
      counts['validation differs from jax.jit'] += 1
      problems.append(f'form {form["id"]}: {jit}: {_describe(form)}')
  return counts, problems


def _describe(form: dict) -> str:
  return (f"{form['signature']} {form['context']} static_argnums={form['argnums']}"
          f" static_argnames={form['argnames']} call={CALLS[form['call']]}"
          f" method={form['method']}")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('main_tree')
  parser.add_argument('patched_tree')
  parser.add_argument('--applied', required=True, help='e.g. 0001,0002')
  parser.add_argument('-n', type=int, default=300)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--cache', help='a folder keeping main\'s lines between runs')
  parser.add_argument('--python', default=sys.executable,
                      help='the interpreter (and so the JAX) to run the forms on')
  parser.add_argument('--remat3', action='store_true',
                      help='run with JAX_REMAT3=1 (jax.checkpoint\'s other implementation)')
  args = parser.parse_args()
  applied = set(args.applied.split(','))
  forms = generate(args.seed, args.n)
  version = subprocess.run([args.python, '-c', 'import sys; print(sys.version.split()[0])'],
                           capture_output=True, text=True, check=True).stdout.strip()
  env = {'JAX_REMAT3': '1'} if args.remat3 else {}
  label = f'py{version}' + ('-remat3' if args.remat3 else '')
  kept = (pathlib.Path(args.cache, f'forms-{args.seed}-{args.n}-{label}.json')
          if args.cache else None)
  if kept and kept.exists():
    before = {int(k): v for k, v in json.loads(kept.read_text()).items()}
  else:
    before = run(args.main_tree, forms, args.python, env)
    if kept:
      kept.parent.mkdir(parents=True, exist_ok=True)
      kept.write_text(json.dumps(before))
  after = run(args.patched_tree, forms, args.python, env)
  counts, problems = compare(forms, before, after, applied, args.remat3)
  print(f'forms ({args.applied}, Python {version}{", JAX_REMAT3=1" if args.remat3 else ""},'
        f' seed {args.seed}, {len(forms)} forms):')
  for cls, n in counts.most_common():
    print(f'  {n:5d}  {cls}')
  for problem in problems:
    print('PROBLEM:', problem)
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(main())
