"""Mooring as an L2 store of LMCache's server (``lmcache server``, MP mode).

Two ways to load it, both with the same Rust client underneath:

``plugin`` (recommended: real locks)::

    lmcache server --l1-size-gb 20 --l2-adapter '{"type": "plugin",
        "module_path": "mooring.integrations.lmcache", "class_name": "MooringL2Adapter",
        "adapter_params": {"master": "HOST:50051"}}'

``native_plugin`` (LMCache's wrapper for native connectors)::

    lmcache server --l1-size-gb 20 --l2-adapter '{"type": "native_plugin",
        "module_path": "mooring.integrations.lmcache", "class_name": "MooringConnector",
        "adapter_params": {"master": "HOST:50051"}}'

``MooringConnector`` is the PyO3 class ``mooring._native.MooringConnector``: batches of keys
per call, submitted without the GIL, completions signalled on an eventfd, bytes moved straight
between LMCache's memory objects and the nodes. Its parameters (``adapter_params``):
``master`` (required), ``local_hostname`` (``"127.0.0.1"``), ``segment_size`` (memory the
server contributes from an in-process node, ``0`` by default, e.g. ``"4GB"``), ``token_file``,
``tenant``, ``protocol`` (``"tcp"`` or ``"rdma"``), ``rdma_devices``, ``replica_num`` (1).

Locks. LMCache's lookup-and-lock keeps an object from being evicted until it is loaded; its
``native_plugin`` wrapper counts locks in Python and never passes them or their unlocks to the
connector, so through it a lookup is Mooring's ``batch_exist``, which protects what it finds
only for the master's read lease (``--lease-ttl``). ``MooringL2Adapter`` is that same wrapper
with the locks passed on: each key a lookup finds is held on the master (not evicted, removed
or replaced while held, and released by the master if the server dies), and
``submit_unlock`` releases one hold per key. It also takes ``max_capacity_gb`` (LMCache's
usage accounting for its L2 eviction; 0 leaves eviction to Mooring).

Tested with LMCache 0.5.6 (python/tests/test_lmcache.py).
"""

from __future__ import annotations

from typing import Any

from mooring._native import MooringConnector

try:
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (
        NativeConnectorL2Adapter,
        _object_key_to_string,
    )
except ImportError as e:  # pragma: no cover - only LMCache imports this module
    raise ImportError(
        f"mooring.integrations.lmcache needs LMCache 0.5.6 or newer (pip install lmcache): {e}"
    ) from e

__all__ = ["MooringConnector", "MooringL2Adapter"]


class MooringL2Adapter(NativeConnectorL2Adapter):
    """LMCache's native-connector adapter over ``MooringConnector``, with real locks.

    LMCache's ``plugin`` factory builds it as ``MooringL2Adapter(adapter_params,
    l1_memory_desc=...)``. The L1 descriptor is not needed: loads and stores already move
    bytes straight between each memory object and the nodes.
    """

    def __init__(self, params: dict[str, Any], l1_memory_desc: Any = None) -> None:
        params = dict(params)
        max_capacity_gb = float(params.pop("max_capacity_gb", 0))
        params.pop("lock_on_lookup", None)
        connector = MooringConnector(lock_on_lookup=True, **params)
        super().__init__(connector, max_capacity_gb=max_capacity_gb, type_name="mooring")

    def submit_unlock(self, keys: list[Any]) -> None:
        """Releases one hold per key (keys a lookup did not find hold nothing)."""
        self._client.unlock([_object_key_to_string(k) for k in keys])
        super().submit_unlock(keys)
