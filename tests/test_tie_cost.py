"""Ties cost a constant factor in Python calls, whatever their number.

``init`` of ``N`` rematted blocks tied to ``block_0`` against the same model
with one shared block (``flax_tieext.examples.tie_cost``), counted with
``sys.setprofile``: call counts are deterministic, so this is no timed
assertion. Before the ties in force had one indexed normal form, every
resolution scanned every tie and the ratio grew with ``N`` (1.32 at 8
blocks, 1.55 at 32, 2.39 at 128 with this model).
"""

import pytest

from flax_tieext.examples import tie_cost

pytestmark = pytest.mark.needs_patch

# Issue 24's bound. Measured at 8 / 64 blocks: 1.030 / 1.028 on Flax 0.8.5, 1.039 / 1.037 on
# 0.12.0, 1.048 / 1.045 (32) on 0.12.8 and 1.045 / 1.043 on 0.12.12, flat up to 512 blocks.
INIT_RATIO_BOUND = 1.05


def test_init_of_tied_blocks_costs_a_constant_factor():
  rows = [tie_cost.ratios(n, grad=False) for n in (8, 64)]
  for row in rows:
    assert row['init_ratio'] <= INIT_RATIO_BOUND, row
  ratios = [row['init_ratio'] for row in rows]
  assert max(ratios) - min(ratios) < 0.01, ratios  # does not grow with N


def test_grad_trace_of_tied_blocks_costs_a_constant_factor():
  for blocks in (8, 16):
    row = tie_cost.ratios(blocks)
    assert row['grad_ratio'] <= 1.05, row
