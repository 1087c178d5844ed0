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

"""``nnx.remat`` with ``static_argnames``: Flax main's ``nnx.remat``.

Written as ``flax/nnx/transforms/autodiff.py`` has it (graph and tree
modes, as Flax main has them). Static arguments are resolved by
``flax_tieext.core._static_args``, the resolver behind every Linen
checkpoint, so ``nnx.remat`` accepts the same arguments and explains the same
mistakes in the same words. Only the import
block below differs. A Flax whose ``nnx.remat`` has no graph or tree modes
gets ``flax_tieext._compat.nnx_remat`` instead (see ``flax_tieext.nnx``).
"""

# pylint: disable=g-importing-member,unused-import
import functools
import typing as tp

import jax

from flax.nnx import extract
from flax.nnx import graphlib
from flax.nnx.transforms import general
from flax.nnx.transforms.autodiff import F
from flax.nnx.transforms.autodiff import SimpleRematFn
from flax.nnx.transforms.transforms import _raise_bound_method_error
from flax.nnx.transforms.transforms import _resolve_bound_callable
from flax.nnx.transforms.transforms import resolve_kwargs
from flax.typing import MISSING
from flax.typing import Missing
from flax_tieext.core import _static_args
# pylint: enable=g-importing-member,unused-import


@tp.overload
def remat(
  *,
  prevent_cse: bool = True,
  static_argnums: int | tuple[int, ...] = (),
  static_argnames: str | tp.Iterable[str] = (),
  policy: tp.Callable[..., bool] | None = None,
  graph: bool | None = None,
  graph_updates: bool | None = None,
) -> tp.Callable[[F], F]: ...
@tp.overload
def remat(
  f: F,
  *,
  prevent_cse: bool = True,
  static_argnums: int | tuple[int, ...] = (),
  static_argnames: str | tp.Iterable[str] = (),
  policy: tp.Callable[..., bool] | None = None,
  graph: bool | None = None,
  graph_updates: bool | None = None,
) -> F: ...
def remat(
  f: F | Missing = MISSING,
  *,
  prevent_cse: bool = True,
  static_argnums: int | tuple[int, ...] = (),
  static_argnames: str | tp.Iterable[str] = (),
  policy: tp.Callable[..., bool] | None = None,
  graph: bool | None = None,
  graph_updates: bool | None = None,
) -> F | tp.Callable[[F], F]:
  """A 'lifted' version of the
  `jax.checkpoint <https://jax.readthedocs.io/en/latest/_autosummary/jax.checkpoint.html>`__
  (a.k.a. ``jax.remat``).

  ``flax.nnx.remat``, similar to ``jax.checkpoint`` can provide control over, for
    example, how ``flax.nnx.grad`` values are computed and saved during the forward pass versus
    how they are recomputed during the backward pass, trading off memory and FLOPs.

  Learn more in `Flax NNX vs JAX Transformations <https://flax.readthedocs.io/en/latest/guides/jax_and_nnx_transforms.html>`_.

  To learn about ``jax.remat``, go to JAX's
    `fundamentals of jax.checkpoint <https://jax.readthedocs.io/en/latest/notebooks/autodiff_remat.html#fundamentals-of-jax-checkpoint>`_
    and `practical notes <https://jax.readthedocs.io/en/latest/notebooks/autodiff_remat.html#practical-notes>`_.

  An argument that ``f`` branches on in Python, such as ``deterministic``,
  must be static. ``static_argnums`` (``self`` is 0 for a method) and
  ``static_argnames`` are resolved through the signature of ``f``: a static
  argument is static however it is passed, positionally, by keyword, or left
  to its default. ``f`` is traced once per static value.

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    ...
    >>> class Block(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.linear = nnx.Linear(3, 3, rngs=rngs)
    ...     self.dropout = nnx.Dropout(0.5, rngs=rngs)
    ...   @nnx.remat(static_argnames='deterministic')
    ...   def __call__(self, x, deterministic=False):
    ...     return self.dropout(self.linear(x), deterministic=deterministic)
    ...
    >>> model = Block(nnx.Rngs(0))
    >>> y = model(jnp.ones((1, 3)), deterministic=True)

  Args:
    f: Function to be rematerialized.
    prevent_cse: Optional, bool. If True, prevents common subexpression
      elimination. Default True.
    static_argnums: Optional, int or tuple of ints. Specifies which
      positional arguments to treat as static.
    static_argnames: Optional, str or sequence of str, the names of static
      arguments.
    policy: Optional, callable. A policy for which intermediates to save
      during the forward pass.
    graph: If ``True`` (default), uses graph-mode which supports the full
      NNX feature set including shared references and reference semantics.
      If ``False``, uses tree-mode which treats Modules as regular JAX
      pytrees, avoiding the overhead of the graph protocol. Tree-mode does
      not support shared ``Variable`` references.
    graph_updates: If ``True``, propagates updates on graph structure
      that happen inside the transform to the input graphs, has no
      effect when ``graph=False``.
  """
  if graph is None:
    graph = graphlib.set_graph_mode.current_value()
  if graph_updates is None:
    graph_updates = graphlib.set_graph_updates.current_value()
  if isinstance(f, Missing):
    return functools.partial(
      remat,
      prevent_cse=prevent_cse,
      static_argnums=static_argnums,
      static_argnames=static_argnames,
      policy=policy,
      graph=graph,
      graph_updates=graph_updates,
    )  # type: ignore[return-value]

  f_unbound, _, was_bound = _resolve_bound_callable(f)

  if was_bound:
    _raise_bound_method_error('remat')

  statics = _static_args.StaticArgs(
    f_unbound, static_argnums, static_argnames, transform='nnx.remat',
    supplies_first=False, rebuilds=graph,
  )
  rematted = _remat(
    statics, f_unbound, prevent_cse, policy, graph, graph_updates
  )

  if statics.as_flax or not graph or not graph_updates:
    # As Flax's, with static_argnums as jax.checkpoint reads it where
    # statics.as_flax (statics.apply then only explains its errors).
    call = rematted
    if statics.as_flax:
      call = lambda _, args, kwargs: rematted(*args, **kwargs)

    @functools.wraps(f_unbound)
    def remat_wrapper(*args, **kwargs):
      return statics.apply(call, args, kwargs)

    return remat_wrapper  # type: ignore[return-value]

  signature = _static_args.call_signature(f_unbound)
  # A str default stays untraced where arguments are made static; without,
  # it is traced and refused, as on plain Flax.
  omit_str = statics.static_argnums != () or statics.static_argnames != ()

  @functools.wraps(f_unbound)
  def resolved_remat_wrapper(*args, **kwargs):
    # As resolve_kwargs does in the graph path.
    return statics.apply(
      rematted, *_static_args.bind_call(signature, args, kwargs, omit_str)
    )

  return resolved_remat_wrapper  # type: ignore[return-value]


def _remat(
  statics: _static_args.StaticArgs,
  f: tp.Callable[..., tp.Any],
  prevent_cse: bool,
  policy: tp.Callable[..., bool] | None,
  graph: bool,
  graph_updates: bool,
) -> tp.Callable[..., tp.Any]:
  """``f`` rematerialized, called as ``(static, args, kwargs)`` by ``statics``.

  Where ``statics.as_flax``, ``f`` rematerialized as Flax's ``nnx.remat``
  makes it, called as ``f`` is, with ``static_argnums`` for
  ``jax.checkpoint``.
  """

  def f_unbound(static, args, kwargs):
    args, kwargs = statics.merge(static, args, kwargs)
    return f(*args, **kwargs)

  static_argnums = 0
  if statics.as_flax:
    f_unbound, static_argnums = f, statics.plain

  if not graph or not graph_updates:
    checkpointed_fn = jax.checkpoint(
      SimpleRematFn(f_unbound, graph=graph),
      prevent_cse=prevent_cse,
      static_argnums=static_argnums,
      policy=policy,
    )

    @functools.wraps(f_unbound)
    def simple_remat_wrapper(*args, **kwargs):
      if graph:
        args, kwargs = extract.to_tree2((args, kwargs))
      variables = extract.check_no_aliases('remat', args=args, kwargs=kwargs)
      out, updates = checkpointed_fn(*args, **kwargs)
      if graph:
        out = extract.from_tree2(out)
      extract.apply_updates(variables, updates)
      return out

    return simple_remat_wrapper  # type: ignore[return-value]

  # Unbound function path: preserve the concise composition used in NNX.
  return resolve_kwargs()(  # type: ignore[return-value]
    graphlib.update_context('remat')(
      general.split_inputs(
        jax.checkpoint(
          general.merge_inputs(f_unbound, ctxtag='remat'),
          prevent_cse=prevent_cse,
          static_argnums=static_argnums,
          policy=policy,
        ),
        ctxtag='remat',
      ),
    )
  )
