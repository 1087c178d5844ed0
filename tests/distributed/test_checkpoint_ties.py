"""An untied checkpoint loads into the tied model only if its copies agree.

The tied ALBERT-style encoder of :mod:`flax_tieext.examples.scaling` is
exported to the untied layout (``untie_variables``) and saved with Orbax, as
a tool that does not know about ties would keep it. Loading it back through
``tie_variables`` gives the tied state exactly; a checkpoint in which one
block's copy of the tied attention was changed is refused with a ``TieError``
naming that block and the ``merge=`` choices, never averaged or silently
replaced by the source unless asked.
"""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import flax_tieext
from flax_tieext.examples import albert
from flax_tieext.examples import scaling

pytestmark = [pytest.mark.needs_patch,  # the model uses nn.tie
              pytest.mark.end_to_end]

TIES = albert.attention_ties(scaling.CONFIG.num_layers)


def _save_and_restore(path, tree):
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, tree)
  checkpointer.wait_until_finished()
  return checkpointer.restore(path)


@pytest.fixture(scope='module')
def tied():
  mesh = scaling.make_mesh(jax.devices()[:1])
  state, _ = scaling.train(scaling.init_state(mesh), 1, mesh)
  return {'params': jax.device_get(state['params'])}


def test_untied_checkpoint_with_equal_copies_loads_tied(tied, tmp_path):
  untied = flax_tieext.untie_variables(tied, TIES)
  assert 'attn' in untied['params']['block_3']
  restored = _save_and_restore(tmp_path / 'untied', untied)
  back = flax_tieext.tie_variables(restored, TIES)
  assert 'attn' not in back['params']['block_3']
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, tied)


def test_untied_checkpoint_with_differing_copies_is_refused(tied, tmp_path):
  untied = flax_tieext.untie_variables(tied, TIES)
  kernel = untied['params']['block_2']['attn']['out']['kernel']
  untied['params']['block_2']['attn']['out']['kernel'] = kernel + 1e-3
  restored = _save_and_restore(tmp_path / 'differing', untied)
  with pytest.raises(flax_tieext.TieError, match='block_2/attn') as refused:
    flax_tieext.tie_variables(restored, TIES)
  assert 'block_0/attn' in str(refused.value)
  assert "merge='mean'" in str(refused.value)
