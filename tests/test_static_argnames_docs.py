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

"""docs/static_arguments.md says what Flax and flax_tieext do, on this Flax.

"Why upstream Flax needs this": every row of the table is run on the installed
Flax with the patch uninstalled, and its result (``works``, or the exception
or warning, quoted from the start of its message) must be the one the row
states. "Errors and how to fix them": every quoted message is the one the
mistake gives, word for word.
"""

import pathlib
import re
import warnings

import flax.linen as nn
import flax.linen.partitioning  # pylint: disable=unused-import
import jax
import pytest

import flax_tieext
from flax_tieext import linen as ext_nn
from static_models import MLP, X, Configured

DOC = pathlib.Path(__file__).parents[1] / 'docs' / 'static_arguments.md'
SECTION = '## Why upstream Flax needs this'


RNGS = {'dropout': jax.random.key(1)}


def _decorated():
  class Decorated(nn.Module):  # pylint: disable=unused-variable

    @nn.checkpoint(static_argnums=2)
    @nn.compact
    def __call__(self, x, deterministic=False):
      return x


def _apply(wrap, *args, **kwargs):
  """A call of the Module ``wrap()`` makes, wrapped when it is called."""
  def call():
    variables = MLP().init(jax.random.key(0), X, True)
    return wrap().apply(variables, X, *args, rngs=RNGS, **kwargs)
  return call


# The first cell of each row -> the calls it stands for.
CASES = {
    '`nn.remat(MLP, static_argnums=2)`, called `m(x, True)`': [
        _apply(lambda: nn.remat(MLP, static_argnums=2)(), True)],
    '`nn.remat(MLP, static_argnums=2)`, called `m(x, deterministic=True)` or `m(x)`': [
        _apply(lambda: nn.remat(MLP, static_argnums=2)(), deterministic=True),
        _apply(lambda: nn.remat(MLP, static_argnums=2)())],
    '`nn.remat(MLP, static_argnums=1)` or `-1`, called `m(x, True)`': [
        _apply(lambda: nn.remat(MLP, static_argnums=1)(), True),
        _apply(lambda: nn.remat(MLP, static_argnums=-1)(), True)],
    '`@nn.checkpoint(static_argnums=2)` above `@nn.compact`': [_decorated],
    '`nn.partitioning.remat(MLP, static_argnums=1)`, called `m(x, True)`': [
        _apply(lambda: nn.partitioning.remat(MLP, static_argnums=1)(), True)],
    '`nn.partitioning.remat(MLP, static_argnums=(1,))`, called `m(x, deterministic=True)`': [
        _apply(lambda: nn.partitioning.remat(MLP, static_argnums=(1,))(),
               deterministic=True)],
    "`nn.remat(MLP, static_argnames='deterministic')`": [
        lambda: nn.remat(MLP, static_argnames='deterministic')],
}


def _rows():
  text = DOC.read_text().split(SECTION)[1].split('\n## ')[0]
  rows = [line for line in text.splitlines() if line.startswith('| ')][2:]
  return [tuple(c.strip() for c in row.strip(' |').split(' | ')) for row in rows]


def _outcome(call):
  """'works', or (the name, the message) of what ``call`` raises or warns."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    try:
      call()
    except Exception as e:  # pylint: disable=broad-except
      return type(e).__name__, str(e)
  return (caught[0].category.__name__, str(caught[0].message)) if caught else 'works'


@pytest.fixture
def upstream_flax():
  was_installed = flax_tieext.is_installed()
  flax_tieext.uninstall()
  try:
    yield
  finally:
    if was_installed:
      flax_tieext.install()


def test_the_table_has_a_case_for_every_row():
  assert [call for call, _ in _rows()] == list(CASES)


@pytest.mark.parametrize('call, result', _rows(), ids=[c for c, _ in _rows()])
def test_row_is_what_upstream_flax_does(upstream_flax, call, result):
  del upstream_flax
  for case in CASES[call]:
    got = _outcome(case)
    if result == 'works':
      assert got == 'works', got
      continue
    name, message = re.match(r'`` (\w+): (.*?) ``', result).groups()
    # "(`OtherError` on JAX 0.4)": the name an older JAX gives the error.
    names = {name, *re.findall(r'\(`(\w+)` on JAX', result)}
    assert got != 'works' and got[0] in names, (call, got)
    assert got[1].startswith(message), (call, got[1])


# -- Inside nn.scan -------------------------------------------------------------


def test_the_scan_section_opens_with_the_warning_its_first_example_gives():
  # The trap first: a keyword to a scanned remat without static_argnames is
  # dropped with Flax's warning, quoted as Flax words it, and the example's
  # assert shows the layers ran with their default (no dropout).
  section = DOC.read_text().split('### Inside `nn.scan`')[1].split('\n### ')[0]
  example = re.search(r'```python\n(.*?)```', section, re.S)[1]
  assert 'static_argnames' not in example.split('# no static_argnames')[0]
  quoted = re.search(r'```text\n\S+/(flax/core/lift\.py):\d+: (\w+): (.*)\n', section)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    exec(compile(example, str(DOC), 'exec'), {'__name__': 'static_arguments'})  # pylint: disable=exec-used
  assert caught and {(w.filename.endswith(quoted[1]), w.category.__name__, str(w.message))
                     for w in caught} == {(True, quoted[2], quoted[3])}


# -- Errors and how to fix them ------------------------------------------------


def _outer_jit():
  remat = ext_nn.remat(MLP, static_argnames='deterministic')
  variables = remat().init(jax.random.key(0), X, True)

  def train_step(variables, x, deterministic):
    return remat().apply(variables, x, deterministic)

  jax.jit(train_step)(variables, X, True)


def _init(module, *args, **kwargs):
  return lambda: module().init(jax.random.key(0), X, *args, **kwargs)


# Heading of the section -> the mistake whose message it quotes. Wrapping
# never fails: each mistake raises at the first call.
MISTAKES = {
    'A name that is not a parameter': _init(
        ext_nn.remat(MLP, static_argnames='determinstic')),
    'An index out of range': _init(ext_nn.remat(MLP, static_argnums=3)),
    'An array in a static slot': _init(ext_nn.remat(MLP, static_argnums=1), True),
    'A flag traced by an outer `jax.jit`': _outer_jit,
    'A Python flag that is not static': _init(ext_nn.remat(MLP), True),
    'A `str` in a traced argument': _init(
        ext_nn.remat(Configured, static_argnames='layers'), mode='linear'),
}


def _quoted():
  text = DOC.read_text().split('## Errors and how to fix them')[1].split('\n## ')[0]
  for section in text.split('\n### ')[1:]:
    heading = section.split(' (')[0].split(':')[0]
    blocks = re.findall(r'```text\n(.*?)```', section, re.S)
    if blocks:
      yield heading, blocks[0].rstrip('\n')


def test_every_quoted_message_has_its_mistake():
  assert [heading for heading, _ in _quoted()] == list(MISTAKES)


@pytest.mark.installs_patch  # the explanations come with the patch
@pytest.mark.parametrize('heading, quoted', list(_quoted()),
                         ids=[h for h, _ in _quoted()])
def test_quoted_message_is_what_the_mistake_gives(heading, quoted):
  with pytest.raises(Exception) as excinfo:  # pylint: disable=broad-except
    MISTAKES[heading]()
  e = excinfo.value
  shown = [str(e), *getattr(e, '__notes__', ())]
  assert quoted in shown, '\n\n'.join(shown)
