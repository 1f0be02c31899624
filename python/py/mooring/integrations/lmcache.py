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
usage accounting for its L2 eviction; 0 leaves eviction to Mooring), and lists the keys
stored (``list_l2_keys``, the server's ``GET /cache/objects?tier=l2``), which LMCache's
``native_plugin`` wrapper cannot.

Tested with LMCache 0.5.6 (python/tests/test_lmcache.py).
"""

from __future__ import annotations

import re
from typing import Any

from mooring._native import MooringConnector

try:
    from lmcache.v1.distributed.api import KeyEntry, KeyListPage, ObjectKey
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

    def list_l2_keys(
        self,
        model_name: str | None = None,
        page_size: int = 500,
        cursor: str | None = None,
    ) -> KeyListPage:
        """LMCache's objects stored in the cluster (keys of this tenant in LMCache's form),
        sorted; ``cursor`` is the last key of the previous page. Grants no lease."""
        if page_size <= 0:
            raise ValueError(f"page_size must be positive (got {page_size})")
        pattern = "^" + re.escape(model_name) + "@" if model_name is not None else ".*"
        entries = []
        next_cursor = None
        for name, size in self._client.list_keys(pattern):
            if cursor is not None and name <= cursor:
                continue
            key = _parse_key(name)
            if key is None:
                continue  # another program's key in the same tenant
            if len(entries) == page_size:
                next_cursor = entries[-1][0]
                break
            entries.append((name, KeyEntry(key=key.to_encoded_object_key(), size_bytes=size)))
        return KeyListPage(entries=tuple(e for _, e in entries), next_page_token=next_cursor)


def _parse_key(name: str) -> ObjectKey | None:
    """The ObjectKey LMCache stored as ``name``
    (``model@kv_rank@object_group_id@chunk_hash[@cache_salt]``, hex numbers), or None."""
    parts = name.split("@")
    if len(parts) not in (4, 5):
        return None
    try:
        return ObjectKey(
            chunk_hash=bytes.fromhex(parts[3]),
            model_name=parts[0],
            kv_rank=int(parts[1], 16),
            object_group_id=int(parts[2], 16),
            cache_salt=parts[4] if len(parts) == 5 else "",
        )
    except ValueError:
        return None
