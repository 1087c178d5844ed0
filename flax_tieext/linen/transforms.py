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

Written in the layout and style of ``flax/linen/transforms.py``. Like Flax's
transforms these are thin: they map Module methods to the
functional-core transforms in ``flax_tieext.core.lift`` via
``lift_transform``.
"""

# pylint: disable=g-importing-member,unused-import
import copyreg
import functools
import inspect
import weakref
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax

from flax.core import lift as flax_lift
from flax.core.scope import CollectionFilter
from flax.core.scope import PRNGSequenceFilter
from flax.linen.module import _get_unbound_fn
from flax.linen.module import Module
from flax.linen.module import nowrap
from flax.linen.module import TestScope
from flax.linen.transforms import _is_module_class
from flax.linen.transforms import lift_transform
from flax.linen.transforms import Target
from flax.linen import transforms as linen_transforms
from flax_tieext.core import _static_args
from flax_tieext.core import lift
from flax_tieext.core import tie_errors
from flax_tieext.core import tie_spec
from flax_tieext.core import ties as ties_lib
# pylint: enable=g-importing-member,unused-import

# As in Flax's linen/transforms.py:
# pylint: disable=protected-access

# ---------------------------------------------------------------------------
# section: checkpoint (static_argnames)
# ---------------------------------------------------------------------------

def _checkpoint_lift_transform(
  core_transform, transform_name: str, first_index: int, target, variables,
  rngs, concrete, prevent_cse, static_argnums, policy, methods,
  static_argnames, closes_over: bool = False,
):
  """``lift_transform`` of ``core_transform`` with static arguments resolved.

  ``target`` and the arguments after it are those of ``checkpoint``, in its
  order (``nn.partitioning.remat`` takes the same); with ``target=None`` this
  returns a decorator. The scope function the core transform gets takes
  ``*args, **kwargs``, so static arguments are resolved here, against each
  wrapped method's signature, and handed to ``lift._checkpoint``. The
  transform keeps the name of ``core_transform`` (``lift.checkpoint``), after
  which ``lift_transform`` names the transformed class (``CheckpointMLP``) and
  its unnamed instances.
  """
  if target is None:
    return lambda target: _checkpoint_lift_transform(
      core_transform, transform_name, first_index, target, variables, rngs,
      concrete, prevent_cse, static_argnums, policy, methods, static_argnames,
      closes_over,
    )
  kwargs = dict(variables=variables, rngs=rngs, concrete=concrete,
                prevent_cse=prevent_cse, policy=policy)

  @functools.wraps(core_transform)
  def transform(fn, statics, **kwargs):
    return lift._checkpoint(fn, statics, **kwargs)

  def statics_of(fn, nums, names, index=first_index, name=transform_name):
    return _static_args.StaticArgs(
      fn, nums, names, transform=name, first_index=index,
      closes_over=closes_over,
    )

  if not _is_module_class(target):  # a method, decorated
    statics = statics_of(target, static_argnums, static_argnames)
    statics.decorated = lift_transform(transform, target, statics, **kwargs)
    statics.decorated.static_args = statics  # for nn.scan (scan below)
    return statics.decorated
  module_class = target.func if isinstance(target, functools.partial) else target
  if isinstance(methods, dict):
    # As upstream, each method gets its own core-transform arguments, whose
    # static_argnums does not count `self`.
    methods = {
      m: {
        **{k: v for k, v in kw.items() if not k.startswith('static_arg')},
        'statics': statics_of(
          getattr(module_class, m), kw.get('static_argnums', ()),
          kw.get('static_argnames', ()), 0, f'{transform_name} methods[{m!r}]',
        ),
      }
      for m, kw in methods.items()
    }
  elif methods is None or isinstance(methods, (list, tuple)):
    # Each method resolves the same arguments; each need be in one only.
    # As Flax's lift_transform: None lifts __call__, [] no method.
    names = ['__call__'] if methods is None else list(methods)
    specs = [
      statics_of(getattr(module_class, m), static_argnums, static_argnames)
      for m in names
    ]
    for spec in specs:
      spec.group = tuple(specs)
    methods = {m: {**kwargs, 'statics': s} for m, s in zip(names, specs)}
  transformed = lift_transform(transform, target, methods=methods)
  transformed_class = (transformed.func if isinstance(transformed, functools.partial)
                       else transformed)
  for m, kw in methods.items():
    # Flax's wrappers copy it (functools.wraps): nn.scan reads it (scan below).
    vars(transformed_class)[m].static_args = kw['statics']
  return transformed


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

  A flag the method branches on in Python, such as ``deterministic`` of
  ``nn.Dropout``, must be static. Name it in ``static_argnames``: it is then
  static however it is passed, positionally, by keyword, or left to its
  default. ``static_argnums`` counts ``self`` as 0 and is resolved the same
  way.

  Example::

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    ...
    >>> class CheckpointedMLP(nn.Module):
    ...   @nn.checkpoint(static_argnames='deterministic')
    ...   @nn.compact
    ...   def __call__(self, x, deterministic=False):
    ...     x = nn.Dense(128)(x)
    ...     x = nn.Dropout(0.5, deterministic=deterministic)(x)
    ...     x = nn.Dense(1)(x)
    ...     return x
    ...
    >>> model = CheckpointedMLP()
    >>> variables = model.init(jax.random.key(0), jnp.ones((1, 16)), True)
    >>> y = model.apply(variables, jnp.ones((1, 16)), deterministic=True)

  This function is aliased to ``remat`` just like ``jax.remat``.

  Args:
    target: a ``Module`` or a function taking a ``Module``
      as its first argument. intermediate computations will be
      re-computed when computing gradients for the target. If ``None``,
      returns a decorator.
    variables: The variable collections that are lifted. By default all
      collections are lifted.
    rngs: The PRNG sequences that are lifted. By default all PRNG sequences
      are lifted.
    concrete: Optional, boolean indicating whether ``fun`` may involve
      value-dependent Python control flow (default ``False``). Support for such
      control flow is optional, and disabled by default, because in some
      edge-case compositions with :func:`jax.jit` it can lead to some extra
      computation.
    prevent_cse: Optional, boolean indicating whether to prevent common
      subexpression elimination (CSE) optimizations in the HLO generated from
      differentiation. This CSE prevention has costs because it can foil other
      optimizations, and because it can incur high overheads on some backends,
      especially GPU. The default is True because otherwise, under a ``jit`` or
      ``pmap``, CSE can defeat the purpose of this decorator. But in some
      settings, like when used inside a ``scan``, this CSE prevention mechanism
      is unnecessary, in which case ``prevent_cse`` should be set to False.
    static_argnums: Optional, int or sequence of ints, indicates which argument
      values on which to specialize for tracing and caching purposes. Specifying
      arguments as static can avoid ConcretizationTypeErrors when tracing, but
      at the cost of more retracing overheads.
    policy: Experimental checkpoint policy, see ``jax.checkpoint``.
    methods: An optional list of method names that will be lifted, if ``methods``
      is None (default) only the ``__call__`` method will be lifted. If``target``
      is a function, ``methods`` is ignored.
    static_argnames: Optional, str or sequence of str, the names of static
      arguments.

  Returns:
    A wrapped version of ``target``. When computing gradients intermediate
    computations will be re-computed on the backward pass.
  """
  return _checkpoint_lift_transform(
    lift.checkpoint, 'nn.checkpoint (nn.remat)', 1, target, variables, rngs,
    concrete, prevent_cse, static_argnums, policy, methods, static_argnames,
  )


remat = checkpoint

# ---------------------------------------------------------------------------
# section: scan (the static keywords of a scanned remat)
# ---------------------------------------------------------------------------

_SCAN_NOTE = """

  With flax_tieext: Flax's ``scan`` passes its body positional arguments only
  (``lift.pack`` drops a keyword with ``RuntimeWarning: kwargs are not
  supported in scan``). Where a scanned method is a remat given
  ``static_argnames``, a keyword that the remat makes static reaches every
  layer, closed over like the remat's other static values; any other keyword
  of that call raises ``TypeError`` before tracing, saying how to pass it. A
  target none of whose scanned methods takes ``static_argnames`` is scanned
  by Flax's own ``scan``, warning included.
"""


def passing_static_keywords(flax_scan):
  """``flax_scan`` (Flax's ``nn.scan``), passing on a remat's static keywords.

  The remat records its static arguments on the methods it makes
  (``static_args``, which Flax's wrappers copy); a target whose scanned
  methods record none is Flax's own scan.
  """
  if getattr(flax_scan, 'passes_static_keywords', False):
    return flax_scan
  signature = inspect.signature(flax_scan)
  methods_at = list(signature.parameters).index('methods') - 1  # in args

  @functools.wraps(flax_scan)
  def scan(target, *args, **kwargs):
    # Without binding the signature (an untied model's nn.scan calls pay
    # nothing): where no scanned method has static keywords, Flax's scan.
    methods = args[methods_at] if len(args) > methods_at else kwargs.get('methods')
    try:
      keywords = _scanned_static_keywords(target, methods)
    except TypeError:  # not method names: Flax's own error
      keywords = {}
    if not any(keywords.values()):
      return flax_scan(target, *args, **kwargs)
    try:
      bound = signature.bind(target, *args, **kwargs)
    except TypeError:
      return flax_scan(target, *args, **kwargs)  # Flax's own error
    bound.apply_defaults()
    scan_kwargs = {k: v for k, v in bound.arguments.items()
                   if k not in ('target', 'methods')}
    if not _is_module_class(target):  # a method, decorated
      return lift_transform(_scan_keywords, target, **scan_kwargs,
                            static_args=keywords[None])
    if isinstance(methods, dict):  # as upstream, each method's own arguments
      methods = {m: {**kw, 'static_args': keywords[m]}
                 for m, kw in methods.items()}
    else:
      methods = {m: {**scan_kwargs, 'static_args': keywords[m]}
                 for m in methods or ['__call__']}
    return lift_transform(_scan_keywords, target, methods=methods)

  # Flax's signature, without __wrapped__: the patch's docstring edits
  # (_patch._Use) stay on this copy of Flax's docstring.
  del scan.__wrapped__
  scan.__signature__ = signature
  scan.__doc__ = (flax_scan.__doc__ or '') + _SCAN_NOTE
  scan.passes_static_keywords = True
  return scan


scan = passing_static_keywords(linen_transforms.scan)


def _scanned_static_keywords(target, methods):
  """``{method name: StaticArgs or None}`` (``{None: ...}`` for a method)."""
  if not _is_module_class(target):
    found = {None: getattr(target, 'static_args', None)}
  else:
    module_class = target.func if isinstance(target, functools.partial) else target
    found = {m: getattr(getattr(module_class, m, None), 'static_args', None)
             for m in (methods if isinstance(methods, (list, tuple, dict))
                       else ['__call__'])}
  return {m: s if s is not None and s.keywords() is not None else None
          for m, s in found.items()}


def _scan_keywords(fn, *args, static_args=None, **kwargs):
  """``lift.scan`` of ``fn``, with the keywords ``static_args`` makes static.

  They are closed over, as the remat closes over its static values; another
  keyword raises. Without ``static_args``, Flax's ``lift.scan``.
  """
  if static_args is None:
    return flax_lift.scan(fn, *args, **kwargs)

  def scan_fn(scope_tree, *call_args, **call_kwargs):
    static = static_args.keywords()
    others = [k for k in call_kwargs if k not in static]
    if others:
      # A misspelt name or a bad index: the error the remat's first call
      # raises outside nn.scan ("Did you mean"), not ours.
      static_args.apply(lambda *split: None, call_args, call_kwargs)
      raise TypeError(_scan_keyword_error(static_args, others))
    body = functools.partial(fn, **call_kwargs) if call_kwargs else fn
    return flax_lift.scan(body, *args, **kwargs)(scope_tree, *call_args)

  return scan_fn


_scan_keywords.__name__ = 'scan'  # Flax names the class after it: ScanLayer


def _scan_keyword_error(static_args, names):
  listed = ', '.join(f'`{n}`' for n in names)
  return (
      f'nn.scan: {listed} was passed by keyword to {static_args.display},'
      f' but its {static_args.transform} does not make it static'
      f' (static_argnames={static_args.given["static_argnames"]!r}). Inside'
      ' nn.scan, a keyword reaches the layers only if the remat makes it'
      ' static: Flax\'s nn.scan passes its body positional arguments only,'
      f' and would drop {listed} with a RuntimeWarning. Pass it positionally,'
      ' with in_axes saying how each layer gets it (nn.broadcast: the whole'
      ' value; an axis: one slice per layer), or, if the layers branch on it'
      ' in Python, add it to static_argnames.')

# ---------------------------------------------------------------------------
# section: tie
# ---------------------------------------------------------------------------


def tie(
    target: Target,
    ties: Mapping[str, Any],
    collections: CollectionFilter = 'params',
    in_scan: str | None = None,
) -> Target:
  """Ties variables of one path to those of another: one variable, two paths.

  ``nn.tie`` declares that the variables of a *target* path (a submodule with
  all its variables in the tied ``collections``, or a single variable) *are*
  those of a *source* path: one attention mask for every block, ALBERT-style
  shared layers, a head tied to its embedding. The result behaves exactly as
  one module instance called at two places: only the source is stored (in
  ``init``, ``apply(mutable=...)`` results and so checkpoints), every read
  sees the current value, writes land in program order, and gradients with
  respect to the source sum over all uses.

  The tie is state of the tied module's scope, in force wherever that module
  is used: every method and ``setup``, ``bind``, ``apply(method=...)``,
  submodules passed in as attributes, and every lifted transform (each
  declares what a source outside it is: ``lift.pack``'s ``tie_sources``).
  Inside ``nn.scan``/``nn.vmap`` a source outside the stack is read-only
  and stored once, never as a stack (``in_scan`` says how a scan's loop
  reads it). Each call site is traced once, and ``init``
  returns what ``apply`` of its variables returns.

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
    in_scan: how a source outside an ``nn.scan`` whose layers hold the
      target enters the loop: ``"scanned"``, broadcast to the number of
      layers before the loop and scanned over like the layers' own variables
      (where the scan scans the tied collection, ``variable_axes``; another
      tied collection is a loop invariant);
      ``"broadcast"``, a loop invariant every layer reads, as
      ``variable_broadcast`` collections are. ``None`` (the default) takes
      ``"scanned"`` wherever it can: an ``nn.scan`` applied after
      ``import flax_tieext``, a target inside the scanned module (a stack
      tied whole to another is scanned like its source already); elsewhere
      a loop invariant. Values and gradients are the same either way;
      ``"scanned"`` steps as the untied stack does and holds its temporaries
      (a stacked gradient of the source), ``"broadcast"`` holds fewer but
      stepped up to 6% slower than the untied stack for a fused 2-D qkv
      kernel with float32 logits (``docs/scaling.md``, measured on a TPU
      v5e).

  Returns:
    A subclass of ``target``, of the same name, whose instances declare the
    ties on their scope.

  Raises:
    errors.TieError: for a tie that cannot resolve, a write that cannot
      land, or values given for a target, naming the paths and the fix.
  """
  if not _is_module_class(target):
    raise tie_errors.not_tieable(
        'nn.tie', 'target', target, 'a Module class (or a functools.partial'
        ' of one), whose submodule paths the ties name',
        'nn.tie(Encoder, {"block_1": "block_0"})')
  partial_object = target if isinstance(target, functools.partial) else None
  module_class = partial_object.func if partial_object else target
  tied = _tied_class(module_class, tie_spec.given(ties, 'nn.tie'),
                     tie_spec.collections_given(collections, 'nn.tie'),
                     tie_spec.in_scan_given(in_scan, 'nn.tie'))
  if partial_object is not None:
    return functools.partial(tied, *partial_object.args,
                             **partial_object.keywords)
  return tied


# One tied class per (class, ties, collections) while it is in use: nn.tie
# called in a loop or a method (a block tying its attention at each call)
# makes its class once, and call sites of one jitted tied class share their
# traces. Weak values: a class no longer used is freed, as without the cache.
_TIED_CLASSES = weakref.WeakValueDictionary()


def _tied_class(module_class, items, collections, in_scan):
  """The subclass of ``module_class`` that declares ``items``, made once.

  ``items``: the ties as ``tie_spec.given`` checked them (hashable).
  """
  ties = dict(items)
  key = (module_class, items,
         tuple(collections) if isinstance(collections, list) else collections,
         in_scan)
  try:
    tied = _TIED_CLASSES.get(key)
  except TypeError:  # an unhashable filter: a class of its own
    key, tied = None, None
  if tied is not None:
    return tied

  def declare(module):
    # A TestScope is the root of a clone that only runs setup's static checks.
    if module.scope is not None and not isinstance(module.scope, TestScope):
      # Stacked nn.ties are declared together, as their union, by each.
      *stacked, (last, cols, in_scan) = type(module)._tie_declarations
      return ties_lib.declare(module.scope, last, cols, stacked, in_scan)
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
    method.checks_ties = True  # (Flax's method wrapper copies it)
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
    # Checked when init's method returns, not when a method it calls does (a
    # function running both ends of a tie, `lambda m, x: m.b(m.a(x))`).
    return super(tied, self).init_with_output(rngs, *args, method=(
        method if getattr(fn, 'checks_ties', False) else checked(fn)), **kwargs)

  def __reduce_ex__(self, protocol):
    # The class has module_class's name, under which pickle finds
    # module_class: pickle the instance as the ties that make its class.
    reduced = tied._tie_root.__reduce_ex__(self, protocol)
    if isinstance(reduced, tuple) and reduced[0] is copyreg.__newobj__:
      return (_new_tied, (tied._tie_root, tied._tie_declarations),
              *reduced[2:])
    return reduced

  # Every method of the class checks the ties when an init call of it
  # returns; setup and Module's own API do not.
  methods = {
      name: checked(getattr(module_class, name))
      for name in dir(module_class)
      if name == '__call__' or not name.startswith('_')
      and name not in vars(Module) and name != 'setup'
      and inspect.isfunction(inspect.getattr_static(module_class, name))
  }
  # The class keeps the name of the class it ties: Flax names unnamed
  # submodules after their class (`Pair_0`), and repr, nn.tabulate and error
  # messages show it, so the tied model looks as the untied one does.
  tied = type(module_class.__name__, (module_class,), {
      **methods, '__post_init__': __post_init__,
      '_register_submodules': _register_submodules,
      'init_with_output': init_with_output,
      '__reduce_ex__': __reduce_ex__,
      '_tie_root': getattr(module_class, '_tie_root', module_class),
      '__module__': module_class.__module__,
      '__qualname__': module_class.__qualname__,
      '_tie_declarations': (*getattr(module_class, '_tie_declarations', ()),
                            (ties, collections, in_scan)),
  })
  if key is not None:
    _TIED_CLASSES[key] = tied
  return tied


def _new_tied(root, declarations):
  """An empty instance of ``root`` tied by ``declarations`` (for pickle)."""
  from flax_tieext import linen  # pylint: disable=g-import-not-at-top
  cls = root
  for ties, collections, in_scan in declarations:
    cls = linen.tie(cls, ties, collections, in_scan)
  return cls.__new__(cls)
