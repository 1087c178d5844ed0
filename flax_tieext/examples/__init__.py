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

"""Small models shared by the demo (``python -m flax_tieext.demo``), the docs
and the benchmarks, each in a file named for it:

* :mod:`flax_tieext.examples.t5`: a T5-style encoder whose blocks share one
  attention mask (collection ``graph``), tied with ``nn.tie``.
* :mod:`flax_tieext.examples.albert`: an ALBERT-style encoder whose blocks
  share one attention module, written the upstream way (a shared module passed
  in as an attribute) and the tied way.
* :mod:`flax_tieext.examples.scaling`: the tied ALBERT-style encoder trained
  on a mesh over every process of a ``jax.distributed`` job, checkpointed with
  Orbax (``docs/scaling.md``).
* :mod:`flax_tieext.examples.launch`: runs a program as N local
  ``jax.distributed`` processes (the tests, and the demo's ``--processes``).
* :mod:`flax_tieext.examples.nnx_tree`: NNX models tied in tree mode with
  ``flax_tieext.nnx.tie`` and their graph-mode shared references (needs a Flax
  with tree mode).
* :mod:`flax_tieext.examples.attention`: the multi-head self-attention both
  encoders use, with a counter of how often its body is traced.
* :mod:`flax_tieext.examples.task`: the synthetic task the encoders train on.
* :mod:`flax_tieext.examples.measure`: what the demo and the benchmarks
  measure (stored variables, XLA's cost and memory analysis, interleaved
  timings).
* :mod:`flax_tieext.examples.tie_cost`: Python calls of ``init`` and of a grad
  trace for tied against hand-shared blocks.
"""
