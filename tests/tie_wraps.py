"""The Linen transforms a tie is tested under, shared by the tie tests.

Each maps a Module class to the class wrapped in that transform. A test file
adds the nestings it needs to a copy.
"""

import flax.linen as nn
from flax.linen import partitioning as nn_partitioning

WRAPS = {
    'none': lambda cls: cls,
    'remat': nn.remat,
    'partitioning.remat': nn_partitioning.remat,
    'jit': nn.jit,
}
MAP_VARIABLES = {
    'map_variables': lambda cls: nn.map_variables(
        cls, 'params', lambda v: v, lambda v: v, init=True),
}
