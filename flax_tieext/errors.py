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

"""Error classes added by flax_tieext (a part of ``flax/errors.py``)."""

from flax.errors import FlaxError


class TieError(FlaxError):
  """A tie that cannot be declared, resolved, or written through.

  ``nn.tie`` / ``lift.tie`` declare that the variables of a *target* path are
  those of a *source* path: only the source is stored, and both paths read and
  write it. Anything that would break that promise is refused with this error
  rather than left to fail silently: a path that names nothing (a typo), a
  source of another kind or structure than its target, shapes or dtypes that
  differ, a tied collection that does not exist, values given at ``apply`` for
  a target (they would be ignored), or a write that cannot reach the source
  (inside ``nn.scan``/``nn.vmap`` a source outside the transform is a
  read-only, broadcast value; a ``view_fn`` gives a read-only view).

  The message names the tie (target, source, collection, and the module that
  declares it), what was found nearby, and the options that fix it. A source
  path with a typo, for example::

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        x = Block(name='block_0')(x)
        return Block(name='block_1')(x)

    x = jnp.ones((1, 4))
    tied = nn.tie(Model, {'block_1': 'blok_0'})
    tied().init(jax.random.key(0), x)  # TieError: the source /blok_0 does
                                       # not exist; nearest: block_0
    tied = nn.tie(Model, {'block_1': 'block_0'})
    tied().init(jax.random.key(0), x)  # This works: block_1 is block_0.
  """


# Plugin only: Flax's error page has no entry for TieError, so the message
# points at the docstring that explains it.
def _init_tie_error(self, message):
  Exception.__init__(self, f'{message} (see help(flax_tieext.TieError))')


TieError.__init__ = _init_tie_error
