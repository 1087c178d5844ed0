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

"""Module-level lifted transforms added or extended by flax_tieext.

Written as a part of ``flax/linen/transforms.py``: each public function is
transplanted verbatim into that file by ``tools/make_patches.py``. Like
upstream's transforms these are thin: they map Module methods to the
functional-core transforms in ``flax_tieext.core.lift`` via
``lift_transform``.
"""

# pylint: disable=g-importing-member,unused-import
import functools
import inspect
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax

from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.linen.module import _get_unbound_fn
from flax.linen.module import Module
from flax.linen.module import nowrap
from flax.linen.module import TestScope
from flax.linen.transforms import _is_module_class
from flax.linen.transforms import lift_transform
from flax.linen.transforms import Target
from flax_tieext.core import lift
from flax_tieext.core import tie_spec
from flax_tieext.core import ties as ties_lib
# pylint: enable=g-importing-member,unused-import

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

def _checkpoint_lift_transform(
    transform_id: str,
    target,
    *,
    transform_name: str,
    counts_self: bool,
    methods=None,
    **trafo_kwargs,
):
  """``lift_transform`` for a checkpoint, with static arguments per method.

  The scope function ``lift_transform`` lifts takes ``*args, **kwargs``; the
  signature that ``static_argnums`` and ``static_argnames`` refer to is the
  wrapped method's. It is known here, at wrap time, so errors in them are
  raised here, and the resolved ``lift._StaticArgs`` goes to
  ``lift._checkpoint``. Shared by ``nn.checkpoint`` (which counts ``self`` as
  0) and ``nn.partitioning.remat`` (which does not count it).
  ``transform_id`` is the name ``lift_transform`` gives the transformed
  Module class (``CheckpointMLP``), and with it auto-named submodules.
  """
  first_index = 1 if counts_self else 0

  def transform(fn, *, statics, **kwargs):
    return lift._checkpoint(fn, statics, **kwargs)  # pylint: disable=protected-access

  transform.__name__ = transform_id

  def resolve(fn, kwargs, first_index, transform_name, strict=True):
    kwargs = dict(kwargs)
    kwargs['statics'] = lift._StaticArgs(
        fn,
        kwargs.pop('static_argnums', ()),
        kwargs.pop('static_argnames', ()),
        transform=transform_name,
        first_index=first_index,
        strict=strict,
    )
    return kwargs

  if _is_module_class(target):
    module_class = target.func if isinstance(target, functools.partial) else target
    if methods is None:
      methods = ['__call__']
    if isinstance(methods, (list, tuple)):
      # The same static arguments for every listed method: each one need
      # only exist in one of them (a flag that only __call__ takes).
      methods = {
          name: resolve(
              getattr(module_class, name), trafo_kwargs, first_index,
              transform_name, strict=len(methods) == 1,
          )
          for name in methods
      }
      lift._raise_if_unresolved_everywhere(
          [kwargs['statics'] for kwargs in methods.values()]
      )
    elif isinstance(methods, dict):
      # As upstream, a per-method dict holds the arguments of the core
      # transform itself, whose static_argnums does not count self.
      methods = {
          name: resolve(
              getattr(module_class, name), kwargs, 0,
              f'{transform_name} methods[{name!r}]',
          )
          for name, kwargs in methods.items()
      }
    return lift_transform(transform, target, methods=methods)
  if callable(target) and not isinstance(target, Module):
    lifted = lift_transform(
        transform,
        target,
        **resolve(target, trafo_kwargs, first_index, transform_name),
    )

    @functools.wraps(lifted)
    def checked(self, *args, **kwargs):
      # `@nn.compact` applied on top of us marks this function, not the
      # method inside: its submodules would be created outside compact.
      if getattr(checked, 'compact', False) and not getattr(
          target, 'compact', False
      ):
        name = getattr(target, '__qualname__', target.__name__)
        raise TypeError(
            f'{transform_name}: {name.split("<locals>.")[-1]} is decorated'
            f' with @nn.compact above @{transform_name.split()[0]}(...). A'
            ' lifted transform wraps the compact method, so swap the two'
            ' decorators:\n\n'
            f'  @{transform_name.split()[0]}(...)\n'
            '  @nn.compact\n'
            f'  def {target.__name__}(self, ...):'
        )
      return lifted(self, *args, **kwargs)

    return checked
  # Not a valid target: let lift_transform raise its usual error.
  return lift_transform(transform, target, methods=methods, **trafo_kwargs)


def checkpoint(
    target: Target | None = None,
    variables: CollectionFilter = True,
    rngs: PRNGSequenceFilter = True,
    concrete: bool = False,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    policy: Callable[..., bool] | None = None,
    methods=None,
    static_argnames: str | Iterable[str] = (),
) -> Target:
  """Lifted version of ``jax.checkpoint``.

  Checkpointing is a technique for reducing memory usage by recomputing
  activations during backpropagation. When training large models, it can be
  helpful to checkpoint parts of the model to trade off memory usage for
  additional computation.

  Arguments of the checkpointed method are traced like arrays unless they are
  *static*. A flag the method branches on in Python, such as the
  ``deterministic`` argument handed to ``nn.Dropout``, must be static, or
  tracing fails with a ``TracerBoolConversionError``. Name it in
  ``static_argnames``: a named argument is static however it is passed
  (positionally, by keyword, or left out so that its default applies),
  keyword-only arguments included. ``static_argnums`` counts positions
  instead, with ``self`` as 0, and is resolved through the method's signature
  the same way.

  Example::

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    ...
    >>> class MLP(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x, deterministic=False):
    ...     x = nn.Dense(4)(x)
    ...     return nn.Dropout(0.5, deterministic=deterministic)(x)
    ...
    >>> RematMLP = nn.remat(MLP, static_argnames='deterministic')
    >>> x = jnp.ones((2, 3))
    >>> variables = RematMLP().init(jax.random.key(0), x, True)
    >>> y = RematMLP().apply(variables, x, deterministic=True)
    >>> y = RematMLP().apply(variables, x, rngs={'dropout': jax.random.key(1)})

  The same as a decorator, above ``nn.compact``::

    >>> class CheckpointedMLP(nn.Module):
    ...   @nn.checkpoint(static_argnames='deterministic')
    ...   @nn.compact
    ...   def __call__(self, x, deterministic=False):
    ...     x = nn.Dense(4)(x)
    ...     return nn.Dropout(0.5, deterministic=deterministic)(x)
    ...
    >>> variables = CheckpointedMLP().init(jax.random.key(0), x, True)

  This function is aliased to ``remat`` just like ``jax.remat``.

  Args:
    target: a ``Module`` or a function taking a ``Module``
      as its first argument. intermediate computations will be
      re-computed when computing gradients for the target. If ``None``,
      returns a decorator that takes the target.
    variables: The variable collections that are lifted. By default all
      collections are lifted.
    rngs: The PRNG sequences that are lifted. By default all PRNG sequences
      are lifted.
    concrete: Deprecated and unsupported by JAX; ``True`` raises
      ``NotImplementedError`` when called. Use ``static_argnames``.
    prevent_cse: Optional, boolean indicating whether to prevent common
      subexpression elimination (CSE) optimizations in the HLO generated from
      differentiation. This CSE prevention has costs because it can foil other
      optimizations, and because it can incur high overheads on some backends,
      especially GPU. The default is True because otherwise, under a ``jit`` or
      ``pmap``, CSE can defeat the purpose of this decorator. But in some
      settings, like when used inside a ``scan``, this CSE prevention mechanism
      is unnecessary, in which case ``prevent_cse`` should be set to False.
    static_argnums: Optional, int or sequence of ints: positions of static
      arguments, with ``self`` as 0 (``nn.partitioning.remat`` does not count
      ``self``). Negative indices count from the last positional parameter.
    policy: Experimental checkpoint policy, see ``jax.checkpoint``.
    methods: An optional list of method names that will be lifted, if
      ``methods`` is None (default) only the ``__call__`` method will be
      lifted. Each method's static arguments are resolved against its own
      signature. As a dict, it maps each method name to its own
      ``lift.checkpoint`` arguments (where ``static_argnums`` does not count
      ``self``). If ``target`` is a function, ``methods`` is ignored.
    static_argnames: Optional, str or sequence of str: names of static
      arguments.

  Returns:
    A wrapped version of ``target``. When computing gradients intermediate
    computations will be re-computed on the backward pass.

  Raises:
    ValueError: when a name in ``static_argnames`` is not a parameter of the
      method (the message lists them and the closest match) or an index in
      ``static_argnums`` is out of range (the message shows the numbering);
      for a Module class or a decorated method this happens here, at wrap
      time. When called, if a static argument receives an array: the message
      names the argument that was probably meant.
    TypeError: when called, if a static argument receives an unhashable
      value.
  """
  if target is None:
    return functools.partial(
        checkpoint,
        variables=variables,
        rngs=rngs,
        concrete=concrete,
        prevent_cse=prevent_cse,
        static_argnums=static_argnums,
        policy=policy,
        methods=methods,
        static_argnames=static_argnames,
    )
  return _checkpoint_lift_transform(
      'checkpoint',
      target,
      transform_name='nn.checkpoint (nn.remat)',
      counts_self=True,
      methods=methods,
      variables=variables,
      rngs=rngs,
      concrete=concrete,
      prevent_cse=prevent_cse,
      static_argnums=static_argnums,
      policy=policy,
      static_argnames=static_argnames,
  )


remat = checkpoint

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------


def tie(
    target: Target,
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
) -> Target:
  """Ties variables of one path to those of another: one variable, two paths.

  A tree of variables duplicates what a graph would share: the blocks of an
  encoder each get their own copy of an attention mask, an ALBERT-style model
  its own copy of every shared layer, a language model a head separate from
  its embedding. ``nn.tie`` declares that the variables of a *target* path (a
  submodule with all its variables in the tied ``collections``, or a single
  variable) *are* the variables of a *source* path. The result behaves exactly
  as one module instance called at two places: only the source is stored (in
  ``init``, in ``apply(mutable=...)`` results and so in checkpoints), every
  read sees the current value, writes land in the one variable in program
  order, and gradients with respect to the source sum over all uses.

  The tie is state of the tied module's scope, in force wherever that module
  is used: in every method and in ``setup``, under ``bind`` and
  ``apply(method=...)``, for submodules passed in as attributes, and through
  Flax's lifted transforms: a target inside ``nn.remat``, ``nn.checkpoint``,
  ``nn.partitioning.remat``, ``nn.jit``, ``nn.scan``, ``nn.vmap``,
  ``nn.map_variables``, ``nn.cond``/``nn.switch``/``nn.while_loop`` still
  reaches its source, and each call site is traced once. Inside
  ``nn.scan``/``nn.vmap`` a source outside the stack is broadcast (read-only),
  never stacked. ``init`` returns what ``apply`` of its variables returns.

  Example: one attention mask shared by every block, with rematted blocks::

    >>> import jax, jax.numpy as jnp
    >>> import flax.linen as nn
    ...
    >>> class Block(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     mask = self.variable('graph', 'mask', jnp.ones, x.shape[-1])
    ...     return nn.Dense(x.shape[-1])(x * mask.value)
    ...
    >>> class Encoder(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     for i in range(3):
    ...       x = nn.remat(Block)(name=f'block_{i}')(x)
    ...     return x
    ...
    >>> TiedEncoder = nn.tie(
    ...     Encoder, {'block_1': 'block_0', 'block_2': 'block_0'},
    ...     collections='graph')
    >>> variables = TiedEncoder().init(jax.random.key(0), jnp.ones((1, 4)))
    >>> list(variables['graph'])  # stored once
    ['block_0']
    >>> grads = jax.grad(lambda v: TiedEncoder().apply(
    ...     v, jnp.ones((1, 4))).sum())(variables)
    >>> grads['graph']['block_0']['mask'].shape  # summed over the 3 blocks
    (4,)

  Example: a language-model head tied to the embedding, transposed::

    >>> class LM(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, tokens):
    ...     x = nn.Embed(10, 4, name='embed')(tokens)
    ...     return nn.Dense(10, use_bias=False, name='head')(x)
    ...
    >>> TiedLM = nn.tie(LM, {'head/kernel': ('embed/embedding', jnp.transpose)})
    >>> params = TiedLM().init(jax.random.key(0), jnp.zeros((1, 2), int))
    >>> sorted(params['params'])
    ['embed']

  Args:
    target: a ``Module`` class (or a ``functools.partial`` of one).
    ties: maps a target path to a source path, or to ``(source_path,
      view_fn)``, where ``view_fn`` derives the target's read-only value from
      the source's. Paths are ``/``-separated names relative to the wrapped
      module; ``"."`` is the wrapped module itself and a leading ``/`` starts
      at the root module. A path names a module or one variable
      (``"head/kernel"``).
    collections: the tied collections: a collection filter such as
      ``"params"``, ``"graph"`` or ``["batch_stats", "cache"]``.

  Returns:
    A subclass of ``target`` whose instances declare the ties on their scope.

  Raises:
    errors.TieError: for a tie that cannot resolve, a write that cannot
      land, or values given for a tied target; the message names the paths,
      the collection and the declaring module, lists the nearest existing
      names and says how to fix it.
  """
  if not _is_module_class(target):
    raise TypeError(
        f'nn.tie takes a Module class, got {target!r}. A tie is state of a'
        " module's scope: apply nn.tie to the class whose submodule paths the"
        ' ties name, e.g. nn.tie(Encoder, {"block_1": "block_0"}).')
  partial_object = target if isinstance(target, functools.partial) else None
  module_class = partial_object.func if partial_object else target

  def declare(module):
    # A TestScope is the root of a clone that only runs setup's static checks.
    if module.scope is not None and not isinstance(module.scope, TestScope):
      return ties_lib.declare(module.scope, tie_spec.normalize(
          ties, collections, module.scope.path))
    return ()

  def check_init(module):
    """The end of an ``init`` call of the tied module: check the ties."""
    if module.scope is not None and module.is_initializing():
      ties_lib.check_init(module.scope, declare(module))

  def checked(fn):
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
      depth = self.__dict__.get('_tie_calls', 0)
      object.__setattr__(self, '_tie_calls', depth + 1)
      try:
        y = fn(self, *args, **kwargs)
      finally:
        object.__setattr__(self, '_tie_calls', depth)
      if depth == 0:
        check_init(self)
      return y
    return method

  def __post_init__(self):  # pylint: disable=invalid-name
    super(tied, self).__post_init__()
    declare(self)

  @nowrap
  def _register_submodules(self, name, val):
    declare(self)  # before a submodule passed as an attribute binds
    return super(tied, self)._register_submodules(name, val)

  @nowrap
  def init_with_output(self, rngs, *args, method=None, **kwargs):
    fn = _get_unbound_fn(getattr(self, method) if isinstance(method, str)
                         else method or self.__call__)

    def checked_method(module, *args, **kwargs):
      y = fn(module, *args, **kwargs)
      check_init(module)
      return y

    return super(tied, self).init_with_output(
        rngs, *args, method=checked_method, **kwargs)

  # Every method of the class checks the ties when an init call of it
  # returns; setup and Module's own API do not.
  methods = {
      name: checked(getattr(module_class, name))
      for name in dir(module_class)
      if name == '__call__' or not name.startswith('_')
      and name not in vars(Module) and name != 'setup'
      and inspect.isfunction(inspect.getattr_static(module_class, name))
  }
  tied = type(f'Tie{module_class.__name__}', (module_class,), {
      **methods, '__post_init__': __post_init__,
      '_register_submodules': _register_submodules,
      'init_with_output': init_with_output,
      '__module__': module_class.__module__,
  })
  if partial_object is not None:
    return functools.partial(tied, *partial_object.args,
                             **partial_object.keywords)
  return tied
