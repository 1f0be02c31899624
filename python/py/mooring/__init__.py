"""Mooring: a distributed KV-cache store for LLM inference.

- :mod:`mooring.store`: a drop-in for ``mooncake.store`` (``MooncakeDistributedStore``).
- :mod:`mooring.integrations.sglang`: an SGLang HiCache storage backend.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mooring")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"
