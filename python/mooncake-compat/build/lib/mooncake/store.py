"""Mooncake's ``mooncake.store``, answered by Mooring: every name of :mod:`mooring.store`
(``MooncakeDistributedStore``, ``ReplicateConfig`` and the rest) under Mooncake's import path.
"""

from mooring.store import *
from mooring.store import __all__  # noqa: F401
