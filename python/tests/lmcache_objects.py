"""LMCache object keys for the LMCache tests and ``bench_lmcache.py`` (needs LMCache)."""

from __future__ import annotations

from lmcache.v1.distributed.api import ObjectKey


def keys_for(tag: str, n: int, model: str) -> list[ObjectKey]:
    """``n`` distinct object keys of ``model``, numbered from a hash of ``tag``."""
    return [
        ObjectKey(
            chunk_hash=ObjectKey.IntHash2Bytes((hash(tag) + i) & 0xFFFFFFFF),
            model_name=model,
            kv_rank=0,
        )
        for i in range(n)
    ]
