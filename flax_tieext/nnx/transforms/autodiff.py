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

"""``nnx.remat`` with ``static_argnames``.

Written as a part of ``flax/nnx/transforms/autodiff.py``. Static arguments are
resolved by ``lift._StaticArgs``, the resolver behind every Linen checkpoint,
so ``nnx.remat`` accepts the same arguments and explains the same mistakes in
the same words. Everything else is Flax's own ``nnx.remat``: graph and tree
modes, state updates, the refusal of bound methods.
"""

# pylint: disable=g-importing-member,unused-import
import functools
import inspect
import typing as tp
from collections.abc import Callable, Iterable

import jax

from flax_tieext import _compat
from flax_tieext.core import lift
# pylint: enable=g-importing-member,unused-import

F = tp.TypeVar('F', bound=tp.Callable[..., tp.Any])
MISSING = _compat.MISSING
Missing = _compat.Missing

# -------------------------------
# remat
# -------------------------------


def _stand_in(f: Callable[..., tp.Any]) -> Callable[..., tp.Any]:
  """``f``'s signature behind one extra leading parameter, for the resolver.

  ``lift._StaticArgs`` sets the first parameter aside (the scope or ``self``
  that a Linen transform passes on by itself). The stand-in gives it one to
  set aside that is not ``f``'s. Never called.
  """
  try:
    signature = inspect.signature(f)
  except (TypeError, ValueError):
    return f  # resolved as (*args, **kwargs): nothing is set aside
  set_aside = inspect.Parameter(
      '_nnx_remat_caller', inspect.Parameter.POSITIONAL_ONLY
  )

  def stand_in(*args, **kwargs):
    return f(*args, **kwargs)

  stand_in.__signature__ = signature.replace(
      parameters=[set_aside, *signature.parameters.values()]
  )
  stand_in.__qualname__ = (
      getattr(f, '__qualname__', None)
      or getattr(f, '__name__', None)
      or type(f).__name__
  )
  return stand_in


class _StaticArgs(lift._StaticArgs):  # pylint: disable=protected-access
  """``lift._StaticArgs`` for a function that receives all its arguments.

  An NNX transform passes nothing on by itself: as in ``jax.checkpoint`` and
  upstream ``nnx.remat``, ``static_argnums`` counts from the first parameter
  (``self`` of a decorated method is 0), and every parameter can be named.
  """

  # The parameter the base class sets aside is the stand-in's, not one of
  # f's: report none, and f's own signature. Its assignments are ignored.
  leading = property(lambda self: None, lambda self, value: None)
  display = property(
      lambda self: f'{self.fn_name}{self.signature}', lambda self, value: None
  )

  def __init__(self, f, static_argnums, static_argnames):
    super().__init__(
        _stand_in(f), static_argnums, static_argnames, transform='nnx.remat'
    )


def _remat(flax_remat, f, *, static_argnums, static_argnames):
  # Flax's own checks (bound methods are refused) and, without static
  # arguments, the whole transform.
  rematted = flax_remat(f)
  statics = _StaticArgs(f, static_argnums, static_argnames)

  @functools.wraps(f)
  def remat_wrapper(*args, **kwargs):
    call = rematted
    if statics.any:
      static, args, kwargs = statics.split(args, kwargs)

      # Static values are closed over: a new function for each call, which
      # jax.checkpoint traces for the static values it was called with.
      def static_bound(*dynamic_args, **dynamic_kwargs):
        args, kwargs = statics.merge(static, dynamic_args, dynamic_kwargs)
        return f(*args, **kwargs)

      call = flax_remat(static_bound)
    try:
      return call(*args, **kwargs)
    except jax.errors.ConcretizationTypeError as e:
      statics.explain_concretization_error(e, args, kwargs)
      raise

  return remat_wrapper


@tp.overload
def remat(
    *,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Iterable[str] = (),
    policy: Callable[..., bool] | None = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> Callable[[F], F]:
  ...
@tp.overload
def remat(
    f: F,
    *,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Iterable[str] = (),
    policy: Callable[..., bool] | None = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> F:
  ...
def remat(
    f: F | Missing = MISSING,
    *,
    prevent_cse: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | Iterable[str] = (),
    policy: Callable[..., bool] | None = None,
    graph: bool | None = None,
    graph_updates: bool | None = None,
) -> F | Callable[[F], F]:
  """A 'lifted' version of ``jax.checkpoint`` (a.k.a. ``jax.remat``).

  Rematerialization (gradient checkpointing) trades memory for compute: the
  intermediate values of ``f`` are not kept for the backward pass but
  recomputed from its inputs when gradients are taken. Results and gradients
  are those of ``f`` itself.

  Arguments of ``f`` are traced like arrays unless they are *static*. An
  argument ``f`` branches on in Python (``if deterministic:``) or uses as a
  shape must be static. ``static_argnames`` names such arguments, and a named
  argument is static however it is passed: positionally, by keyword, or left
  out so that its default applies. ``static_argnums`` counts positions from
  the first parameter of ``f`` (``self`` is 0 for a decorated method, as in
  ``jax.checkpoint``) and is resolved through the signature too, so an index
  also covers keyword and omitted calls. Static values must be hashable.

  Example::

    >>> from flax import nnx
    >>> import jax, jax.numpy as jnp
    >>> from flax_tieext.nnx import remat
    ...
    >>> class MLP(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.linear = nnx.Linear(3, 3, rngs=rngs)
    ...     self.dropout = nnx.Dropout(0.5, rngs=rngs)
    ...
    ...   @remat(static_argnames='deterministic')
    ...   def __call__(self, x, deterministic=False):
    ...     return self.dropout(self.linear(x), deterministic=deterministic)
    ...
    >>> model = MLP(nnx.Rngs(0))
    >>> x = jnp.ones((1, 3))
    >>> y1 = model(x, deterministic=True)  # keyword
    >>> y2 = model(x, True)                # positional
    >>> bool((y1 == model.linear(x)).all() and (y2 == y1).all())
    True

  Args:
    f: Function to be rematerialized. If omitted, returns a decorator.
    prevent_cse: Optional, bool. If True, prevents common subexpression
      elimination. Default True.
    static_argnums: Optional, int or tuple of ints: the positions of static
      arguments, counted from the first parameter of ``f`` (0). Negative
      indices count from the end of the positional parameters.
    static_argnames: Optional, str or sequence of str: the names of static
      arguments, positional or keyword-only.
    policy: Optional, callable. A policy for which intermediates to save
      during the forward pass.
    graph: Graph mode (``True``) or tree mode (``False``), as in Flax's
      ``nnx.remat`` (only on releases that have it).
    graph_updates: Whether graph updates inside the transform propagate to
      the inputs, as in Flax's ``nnx.remat`` (only on releases that have it).

  Returns:
    A wrapped version of ``f``, or a decorator when ``f`` is omitted.

  Raises:
    ValueError: when ``static_argnames`` names no parameter of ``f`` (the
      message lists them and the closest match), when an index in
      ``static_argnums`` is out of range (the message shows the numbering),
      or, when called, if a static argument receives an array.
    TypeError: when called, if a static argument receives an unhashable value
      or a traced one receives a ``str``. A JAX concretization error raised
      because a Python bool or number was traced gets a note naming those
      arguments.
  """
  # Flax's nnx.remat as a decorator, its own defaults (graph mode) resolved
  # now, as it resolves them.
  flax_remat = _compat.nnx_remat_decorator(
      prevent_cse=prevent_cse,
      policy=policy,
      graph=graph,
      graph_updates=graph_updates,
  )
  if isinstance(f, Missing):
    return functools.partial(
        _remat,
        flax_remat,
        static_argnums=static_argnums,
        static_argnames=static_argnames,
    )  # type: ignore[return-value]
  return _remat(
      flax_remat,
      f,
      static_argnums=static_argnums,
      static_argnames=static_argnames,
  )
