"""The processes of the two-process jobs here run without JAX's persistent compilation cache.

``nox`` runs every pytest with the cache on (noxfile.py: ``COMPILATION_CACHE``,
in the environment), and the jobs' processes would inherit it. It cannot help
them: only process 0 of a ``jax.distributed`` job writes entries, and the other
processes' keys differ from its own, so they compile every program anyway. On
JAX 0.12.1 it hangs them: once process 0 loads the train step from the cache
while process 1 compiles it, the step's first cross-process collective never
completes (reproduced with plain JAX, no Flax: docs/support_matrix.md), and a
job waits out its deadline, so the fault tests would time out instead of seeing
a peer die. This pytest process keeps the cache (JAX read its settings at
import); only the processes the tests start lose it.
"""

import pytest

CACHE_ENVIRONMENT = ('JAX_COMPILATION_CACHE_DIR',)


@pytest.fixture(autouse=True, scope='session')
def jobs_without_the_persistent_compilation_cache():
  with pytest.MonkeyPatch.context() as env:
    for name in CACHE_ENVIRONMENT:
      env.delenv(name, raising=False)
    yield
