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

"""Property: the rematted call equals the plain call, gradients included.

Over generated signatures (array arguments, then flags and modes that are
positional or keyword-only, with or without defaults) and every way of
passing each argument (positionally, by keyword, omitted), with each flag made
static by name or by index in the entry point's own numbering. The function
branches on its flags in Python, so a flag that is not static fails loudly.
"""

import dataclasses

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from flax_tieext import lift as ext_lift
from static_models import ENTRIES
from tie_models import assert_trees_close

# end_to_end: generated signatures and calls; the README's test run leaves them
# to --end-to-end (tests/test_static_argnames.py covers each entry point).
pytestmark = pytest.mark.end_to_end

EXAMPLES = settings(max_examples=25, deadline=None, derandomize=True)


@dataclasses.dataclass(frozen=True)
class Param:
  name: str
  keyword_only: bool
  default: object  # NO_DEFAULT if required


NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Case:
  params: tuple[Param, ...]
  values: dict  # name -> value passed (or the default, when omitted)
  styles: dict  # name -> 'positional' | 'keyword' | 'omitted'
  by_index: frozenset  # flags made static through static_argnums


@st.composite
def cases(draw):
  arrays = [
      Param(f'x{i}', False, NO_DEFAULT) for i in range(draw(st.integers(1, 2)))
  ]
  flags = []
  for j in range(draw(st.integers(1, 3))):
    mode = draw(st.booleans())
    name = f'mode{j}' if mode else f'flag{j}'
    default = draw(
        st.sampled_from(
            [NO_DEFAULT, 'tanh', 'relu'] if mode else [NO_DEFAULT, True, False]
        )
    )
    flags.append(Param(name, draw(st.booleans()), default))
  positional_flags = [p for p in flags if not p.keyword_only]
  # Python wants required positional parameters before defaulted ones.
  positional_flags.sort(key=lambda p: p.default is not NO_DEFAULT)
  params = tuple(
      arrays + positional_flags + [p for p in flags if p.keyword_only]
  )

  values, styles = {}, {}
  positional_open = True
  for p in params:
    options = ['keyword']
    if not p.keyword_only and positional_open:
      options.append('positional')
    if p.default is not NO_DEFAULT:
      options.append('omitted')
    style = draw(st.sampled_from(options))
    if not p.keyword_only and style != 'positional':
      positional_open = False  # later arguments cannot be positional
    styles[p.name] = style
    if style == 'omitted':
      values[p.name] = p.default
    elif p.name.startswith('x'):
      values[p.name] = None  # filled in with arrays by the test
    elif p.name.startswith('mode'):
      values[p.name] = draw(st.sampled_from(['tanh', 'relu']))
    else:
      values[p.name] = draw(st.booleans())
  by_index = frozenset(
      p.name
      for p in positional_flags
      if draw(st.booleans())
  )
  return Case(params, values, styles, by_index)


def _signature_source(case):
  out, star = [], False
  for p in case.params:
    if p.keyword_only and not star:
      out.append('*')
      star = True
    out.append(p.name if p.default is NO_DEFAULT else f'{p.name}={p.default!r}')
  return ', '.join(out)


def _body(make_param, values):
  w = make_param('w', nn.initializers.normal(1.0), (3,))
  y = jnp.zeros((2, 3))
  for name in sorted(values):
    if name.startswith('x'):
      y = y + jnp.sin(values[name] * w)
  for name in sorted(values):
    value = values[name]
    if name.startswith('flag'):
      y = y * 2.0 if value else -y  # Python branch: must be static
    elif name.startswith('mode'):
      y = jnp.tanh(y) if value == 'tanh' else jax.nn.relu(y) + 1.0
  return y


def _build(case, leading):
  names = [p.name for p in case.params]
  source = (
      f'def fn({leading}, {_signature_source(case)}):\n'
      f'  return body({leading}, dict({", ".join(f"{n}={n}" for n in names)}))\n'
  )
  namespace = {}
  exec(source, {'body': lambda owner, values: _BODIES[leading](owner, values)},
       namespace)  # pylint: disable=exec-used
  return namespace['fn']


_BODIES = {
    'scope': lambda scope, values: _body(scope.param, values),
    'self': lambda module, values: _body(module.param, values),
}


def _call_args(case, arrays):
  args, kwargs = [], {}
  for p in case.params:
    value = arrays.get(p.name, case.values[p.name])
    if case.styles[p.name] == 'positional':
      args.append(value)
    elif case.styles[p.name] == 'keyword':
      kwargs[p.name] = value
  return args, kwargs


def _static_spec(case, first_index):
  positional = [p.name for p in case.params if not p.keyword_only]
  flags = [p.name for p in case.params if not p.name.startswith('x')]
  return {
      'static_argnums': tuple(
          positional.index(n) + first_index for n in sorted(case.by_index)
      ),
      'static_argnames': [n for n in flags if n not in case.by_index],
  }


def _arrays(case):
  arrays = {}
  for k, p in enumerate(case.params):
    if p.name.startswith('x'):
      arrays[p.name] = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3) * (k + 1)
  return arrays


@EXAMPLES
@given(case=cases())
def test_lift_checkpoint_equals_plain_call(case):
  fn = _build(case, 'scope')
  rematted = ext_lift.checkpoint(fn, **_static_spec(case, 0))
  arrays = _arrays(case)
  args, kwargs = _call_args(case, arrays)
  y_ref, variables = flax.core.init(fn)(jax.random.key(0), *args, **kwargs)
  y, variables_remat = flax.core.init(rematted)(jax.random.key(0), *args, **kwargs)
  np.testing.assert_array_equal(y, y_ref)
  assert_trees_close(variables_remat, variables)

  def loss(f):
    def run(v, arrays):
      args, kwargs = _call_args(case, arrays)
      return (flax.core.apply(f)(v, *args, **kwargs) ** 2).sum()
    return jax.grad(run, argnums=(0, 1))

  assert_trees_close(loss(rematted)(variables, arrays), loss(fn)(variables, arrays))


@pytest.mark.parametrize('transform, first_index', ENTRIES)
@EXAMPLES
@given(case=cases())
def test_module_remat_equals_plain_call(transform, first_index, case):
  plain = type('Generated', (nn.Module,), {
      '__call__': nn.compact(_build(case, 'self')),
      '__module__': __name__,
  })
  rematted = transform(plain, **_static_spec(case, first_index))
  arrays = _arrays(case)
  args, kwargs = _call_args(case, arrays)
  variables = plain().init(jax.random.key(0), *args, **kwargs)

  def loss(module):
    def run(v, arrays):
      args, kwargs = _call_args(case, arrays)
      return (module.apply(v, *args, **kwargs) ** 2).sum()
    return jax.value_and_grad(run, argnums=(0, 1))

  assert_trees_close(loss(rematted())(variables, arrays), loss(plain())(variables, arrays))
