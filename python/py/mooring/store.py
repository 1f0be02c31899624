"""Mooring's drop-in for ``mooncake.store``.

Change ``from mooncake.store import MooncakeDistributedStore`` to
``from mooring.store import MooncakeDistributedStore`` and a program runs against a
``mooring master``: the same names, signatures, return conventions and numeric error codes.

Conventions (Mooncake's):

- calls that store or remove answer ``0`` or a negative error code (see :class:`ErrorCode`);
- a put of a key that already exists keeps the stored value and answers ``0`` (``upsert``
  replaces it);
- ``get`` answers the value as ``bytes``, ``b""`` when it cannot;
- ``get_size`` answers the size, ``get_into`` the bytes read, or a negative code;
- ``is_exist`` answers ``1``, ``0`` or a negative code;
- batch calls answer one result per key, so one bad key never hides the others.

Failures are logged to stderr with what to do (``MOORING_LOG=debug`` for more). One store is
safe to share between threads: every network call runs with the GIL released.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Any, TypeVar

from . import _native
from ._native import BufferHandle, MooringError, parse_size
from .codes import ErrorCode
from .tensor_calls import TensorCalls

__all__ = [
    "BufferHandle",
    "Descriptor",
    "DiskDescriptor",
    "ErrorCode",
    "LocalDiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooringError",
    "ObjectDataType",
    "QueryTaskResponse",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
    "parse_size",
]

_T = TypeVar("_T")

# Mooncake's defaults for setup().
_DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
_DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024
_DEFAULT_MASTER = "127.0.0.1:50051"
_U64_MAX = 2**64 - 1


class SoftPinAction(IntEnum):
    """What a put or upsert does to the key's soft pin."""

    #: Keep the pin the key had (a new key gets none). The default.
    PRESERVE = 0
    #: Pin, for ``soft_pin_ttl_ms`` or the master's default TTL.
    ENABLE = 1
    #: Drop the pin.
    DISABLE = 2


class ReplicaStatus(IntEnum):
    """Mooncake's replica states (Mooring lists only complete replicas)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ObjectDataType(IntEnum):
    """Mooncake's label for what an object holds (``ReplicateConfig.data_type``)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


def _count(value: Any, name: str) -> int:
    """A replica count as Mooncake's ``size_t`` fields take it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise TypeError(f"{name} must be an int from 0 to 2**64-1, got {value!r}")
    return value


class ReplicateConfig:
    """How a put or upsert wants its object stored.

    Attributes:
        replica_num: replicas wanted, each on a different segment (best effort).
        soft_pin_action: a :class:`SoftPinAction` (default ``PRESERVE``).
        soft_pin_ttl_ms: the soft pin's TTL in ms, only with ``ENABLE``; ``None`` takes the
            master's default. A TTL with another action makes the call fail with -600.
        with_hard_pin: never evict the object (until it is removed).
        preferred_segment: a segment to place the first replica on (``get_hostname()`` of a
            store that contributes memory, or a ``mooring node``'s name).
        preferred_segments: segments to try first, in order.
        prefer_alloc_in_same_node: prefer this process's own segment, if it contributes one.
        data_type: an :class:`ObjectDataType` label. Accepted and not recorded: Mooring
            places, keeps and evicts every object alike whatever it holds.

    Newer Mooncake's fields for tiers and features Mooring does not have may be set, and keep
    their Mooncake defaults unless set; a put or upsert given anything else answers -600
    (``INVALID_PARAMS``) and logs what to do instead:

        nof_replica_num, preferred_nof_segments: replicas on NVMe-over-Fabrics targets
            (default 0 and ``[]``). Memory replicas are ``replica_num``; a node's SSD tier
            (``mooring node --disk-dir``) keeps disk copies by itself.
        dfs_replica_num: replicas on a distributed file system (default 0).
        group_ids: per-key routing groups (default ``None``; a list of ``""``, no group for
            any key, is the same). Mooring places, leases and evicts each key on its own.
    """

    __slots__ = (
        "_soft_pin_ttl_ms",
        "data_type",
        "dfs_replica_num",
        "group_ids",
        "nof_replica_num",
        "prefer_alloc_in_same_node",
        "preferred_nof_segments",
        "preferred_segment",
        "preferred_segments",
        "replica_num",
        "soft_pin_action",
        "with_hard_pin",
    )

    def __init__(self) -> None:
        self.replica_num: int = 1
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms: int | None = None
        self.with_hard_pin: bool = False
        self.preferred_segment: str = ""
        self.preferred_segments: list[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.nof_replica_num: int = 0
        self.dfs_replica_num: int = 0
        self.preferred_nof_segments: list[str] = []
        self.data_type: ObjectDataType = ObjectDataType.UNKNOWN
        self.group_ids: list[str] | None = None

    @property
    def soft_pin_ttl_ms(self) -> int | None:
        """The soft pin's TTL in milliseconds (an unsigned 64-bit int), or ``None``."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value: int | None) -> None:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX
        ):
            raise TypeError(
                f"soft_pin_ttl_ms must be None or an int from 0 to 2**64-1, got {value!r}"
            )
        self._soft_pin_ttl_ms = value

    @property
    def with_soft_pin(self) -> bool:
        """Older Mooncake's flag: ``True`` is ``soft_pin_action = ENABLE``."""
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value: bool) -> None:
        self.soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.PRESERVE

    def _refusal(self) -> str:
        """Why a write cannot honour this config, or "" (see the class docs)."""
        if _count(self.nof_replica_num, "nof_replica_num") or list(self.preferred_nof_segments):
            return (
                "ReplicateConfig.nof_replica_num/preferred_nof_segments: Mooring has no "
                "NVMe-over-Fabrics tier; leave them at 0 and [] (replica_num sets memory "
                "replicas; nodes started with --disk-dir keep disk copies themselves)"
            )
        if _count(self.dfs_replica_num, "dfs_replica_num"):
            return (
                "ReplicateConfig.dfs_replica_num: Mooring has no distributed-file-system "
                "tier; leave it at 0 (nodes started with --disk-dir keep disk copies themselves)"
            )
        if self.group_ids is not None and any(self.group_ids):
            return (
                "ReplicateConfig.group_ids: Mooring has no key groups (each key is placed, "
                "leased and evicted on its own); leave group_ids None (in SGLang, leave "
                "enable_group_semantics off)"
            )
        try:
            ObjectDataType(self.data_type)
        except ValueError:
            return f"ReplicateConfig.data_type {self.data_type!r} is not an ObjectDataType"
        return ""

    def _native(self, own_segment: str | None) -> tuple:
        refusal = self._refusal()
        if refusal:
            raise MooringError(int(ErrorCode.INVALID_PARAMS), refusal)
        preferred = list(self.preferred_segments)
        if self.preferred_segment:
            preferred.insert(0, self.preferred_segment)
        if self.prefer_alloc_in_same_node and own_segment:
            preferred.insert(0, own_segment)
        action = SoftPinAction(self.soft_pin_action)
        if not isinstance(self.replica_num, int) or not 0 <= self.replica_num < 2**32:
            raise TypeError(
                f"replica_num must be an int from 1 to 2**32-1, got {self.replica_num!r}"
            )
        return (
            self.replica_num,
            int(action),
            self._soft_pin_ttl_ms,
            bool(self.with_hard_pin),
            preferred,
        )

    def __str__(self) -> str:
        ttl = "default" if self._soft_pin_ttl_ms is None else f"{self._soft_pin_ttl_ms} ms"
        segments = list(self.preferred_segments)
        if self.preferred_segment:
            segments.insert(0, self.preferred_segment)
        return (
            f"ReplicateConfig(replica_num={self.replica_num}, "
            f"soft_pin_action={SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl={ttl}, "
            f"with_hard_pin={bool(self.with_hard_pin)}, preferred_segments={segments}, "
            f"prefer_alloc_in_same_node={bool(self.prefer_alloc_in_same_node)}, "
            f"nof_replica_num={self.nof_replica_num}, dfs_replica_num={self.dfs_replica_num}, "
            f"preferred_nof_segments={list(self.preferred_nof_segments)}, "
            f"data_type={self.data_type!r}, group_ids={self.group_ids!r})"
        )

    __repr__ = __str__


_DEFAULT_CONFIG = ReplicateConfig()


class Descriptor:
    """Where a memory replica's bytes are (Mooncake's ``AllocatedBuffer.Descriptor``)."""

    __slots__ = ("buffer_address", "size", "transport_endpoint")

    def __init__(self, size: int = 0, buffer_address: int = 0, transport_endpoint: str = ""):
        #: The value's size in bytes.
        self.size = size
        #: The address of its first byte in the segment.
        self.buffer_address = buffer_address
        #: The data server holding it (the segment's name).
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (
            f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
            f"transport_endpoint={self.transport_endpoint}>"
        )


class MemoryDescriptor:
    """A memory replica, as ``ReplicaDescriptor.get_memory_descriptor()`` describes it."""

    __slots__ = ("buffer_descriptor",)

    def __init__(self, buffer_descriptor: Descriptor) -> None:
        #: A :class:`Descriptor`.
        self.buffer_descriptor = buffer_descriptor

    def __repr__(self) -> str:
        return f"MemoryDescriptor({self.buffer_descriptor!r})"


class DiskDescriptor:
    """Mooncake's file replica (a path on a shared file system). Mooring never has one: its
    disk replicas are local-disk replicas (:class:`LocalDiskDescriptor`). The class exists
    for programs that name it."""

    __slots__ = ("file_path", "object_size")

    def __init__(self, file_path: str = "", object_size: int = 0) -> None:
        self.file_path = file_path
        self.object_size = object_size


class LocalDiskDescriptor:
    """A replica on the SSD of the node owning a segment (Mooncake's LOCAL_DISK replica)."""

    __slots__ = ("object_size", "transport_endpoint")

    def __init__(self, object_size: int, transport_endpoint: str) -> None:
        #: The value's size in bytes.
        self.object_size = object_size
        #: The data server of the node holding it (its segment's name).
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (
            f"LocalDiskDescriptor(object_size={self.object_size}, "
            f"transport_endpoint={self.transport_endpoint})"
        )


class ReplicaDescriptor:
    """Where one complete replica of a value lives: in a segment's memory, or on the SSD of
    the node that owns the segment (what Mooncake calls a LOCAL_DISK replica)."""

    __slots__ = ("_on_disk", "buffer_address", "size", "status", "transport_endpoint")

    def __init__(self, endpoint: str, address: int, size: int, on_disk: bool, status: str) -> None:
        #: The data server holding the replica (the segment's name).
        self.transport_endpoint = endpoint
        #: Memory replicas: the address in the segment. Disk replicas: the copy's write id.
        self.buffer_address = address
        #: The value's size in bytes.
        self.size = size
        self._on_disk = on_disk
        #: A :class:`ReplicaStatus`.
        self.status = ReplicaStatus[status]

    def is_memory_replica(self) -> bool:
        """Whether the replica is in a segment's memory."""
        return not self._on_disk

    def is_disk_replica(self) -> bool:
        """Whether the replica is a file on a shared file system (Mooncake's DISK replica):
        never, in Mooring. A copy on a node's SSD is a local-disk replica
        (:meth:`is_local_disk_replica`), as it is in Mooncake."""
        return False

    def is_local_disk_replica(self) -> bool:
        """Whether the replica is on the SSD of the node that owns the segment."""
        return self._on_disk

    def get_memory_descriptor(self) -> MemoryDescriptor:
        """Where a memory replica's bytes are; RuntimeError for a replica on disk (as
        Mooncake raises)."""
        if self._on_disk:
            raise RuntimeError(
                f"the replica on {self.transport_endpoint} is on the node's disk, not in "
                "memory: check is_memory_replica() first (get_local_disk_descriptor() "
                "describes this one)"
            )
        return MemoryDescriptor(Descriptor(self.size, self.buffer_address, self.transport_endpoint))

    def get_disk_descriptor(self) -> DiskDescriptor:
        """Mooncake's file replica: always RuntimeError in Mooring, which keeps disk copies
        on its nodes' SSDs (:meth:`get_local_disk_descriptor`), never as shared files."""
        where = "on the node's disk" if self._on_disk else "in memory"
        raise RuntimeError(
            f"the replica on {self.transport_endpoint} is {where}; Mooring has no file "
            "(DISK) replicas: check is_disk_replica() first, and use is_local_disk_replica() "
            "and get_local_disk_descriptor() for copies on a node's SSD"
        )

    def get_local_disk_descriptor(self) -> LocalDiskDescriptor:
        """The node and size of a replica on a node's SSD; RuntimeError for a memory
        replica."""
        if not self._on_disk:
            raise RuntimeError(
                f"the replica on {self.transport_endpoint} is in memory, not on a node's "
                "disk: check is_local_disk_replica() first"
            )
        return LocalDiskDescriptor(self.size, self.transport_endpoint)

    def __repr__(self) -> str:
        medium = "local disk" if self._on_disk else "memory"
        return (
            f"ReplicaDescriptor({medium} on {self.transport_endpoint}, "
            f"address={self.buffer_address:#x}, size={self.size}, status={self.status.name})"
        )


class TaskType(IntEnum):
    """What a copy or move task does (Mooncake's names; a repair of a lost replica is a copy)."""

    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(IntEnum):
    """Where a task stands. Mooring starts a task when it is created, so ``PENDING`` is never
    reported; it is kept for programs written against Mooncake."""

    PENDING = 0
    PROCESSING = 1
    SUCCESS = 2
    FAILED = 3


def _uuid(value: int) -> tuple[int, int]:
    """A 128-bit id as Mooncake's UUID pair (high 64 bits, low 64 bits)."""
    return (value >> 64, value & _U64_MAX)


class QueryTaskResponse:
    """A copy or move task as ``query_task`` reports it."""

    __slots__ = (
        "assigned_client",
        "created_at_ms_epoch",
        "id",
        "key",
        "last_updated_at_ms_epoch",
        "message",
        "status",
        "type",
    )

    def __init__(self, task: int, report: tuple[str, str, str, int, int, int, str]) -> None:
        key, action, state, client, started_ago, updated_ago, message = report
        now_ms = int(time.time() * 1000)
        #: The task, as the UUID pair ``create_copy_task`` returned.
        self.id = _uuid(task)
        #: The object it copies (a Mooring addition).
        self.key = key
        #: A :class:`TaskType`.
        self.type = TaskType[action]
        #: A :class:`TaskStatus`.
        self.status = TaskStatus[state]
        #: When it started, in ms since the epoch (the master's age of the task, taken from now).
        self.created_at_ms_epoch = now_ms - started_ago
        #: When its status last changed, in ms since the epoch.
        self.last_updated_at_ms_epoch = now_ms - updated_ago
        #: The client carrying it out, as a UUID pair.
        self.assigned_client = _uuid(client)
        #: Why it failed; empty otherwise.
        self.message = message

    def __repr__(self) -> str:
        why = f", message={self.message!r}" if self.message else ""
        return (
            f"QueryTaskResponse(id={self.id}, key={self.key!r}, type={self.type.name}, "
            f"status={self.status.name}{why})"
        )


def _task_id(task_id: Any) -> int:
    """A task id given as the UUID pair ``create_*_task`` returned, or as an int."""
    if isinstance(task_id, int):
        return task_id
    high, low = task_id
    return (int(high) << 64) | int(low)


def _size(value: Any, name: str) -> int:
    try:
        return parse_size(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: {e}") from None


def _flag(value: Any) -> bool:
    """A config dict's flag, given as a bool or as Mooncake's strings ("true", "1")."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _unsupported(ssd_offload: bool, client_http_server: bool) -> str:
    """Why Mooncake setup options Mooring does not carry out cannot be taken, or ""."""
    if ssd_offload:
        return (
            "enable_ssd_offload: Mooring's SSD tier runs on its storage nodes; start them with "
            "`mooring node --disk-dir DIR`, and leave enable_ssd_offload off here"
        )
    if client_http_server:
        return (
            "enable_client_http_server: Mooring serves metrics from its master and nodes "
            "(--metrics-listen); leave enable_client_http_server off here"
        )
    return ""


def _port_range() -> tuple[int, int]:
    low = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", "12300"))
    high = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", "14300"))
    if not (0 < low <= high < 65536):
        low, high = 12300, 14300
    return low, high


def _device_size(variable: str, default: str) -> int:
    """A size setting of the device staging path, from the environment:
    ``MOORING_DEVICE_STAGING_SIZE`` (64 MiB by default) is the pinned host memory each device's
    staging pool may use, and a value larger than a quarter of it cannot be stored from or
    read into device memory; ``MOORING_DEVICE_WAVE_SIZE`` (2 MiB) is how many bytes a batch
    stages before the next wave's device copy starts."""
    return _size(os.environ.get(variable, default), variable)


class MooncakeDistributedStore(TensorCalls):
    """A client of a Mooring cluster with Mooncake's ``MooncakeDistributedStore`` API.

    Call :meth:`setup` first. A store whose ``global_segment_size`` is above zero also
    contributes that much memory to the cluster, served from this process.
    """

    def __init__(self) -> None:
        self._client: _native.NativeClient | None = None
        self._setup_lock = threading.Lock()

    # ---- lifecycle ---------------------------------------------------------------------------

    def setup(
        self,
        local_hostname: Any,
        metadata_server: str | None = None,
        global_segment_size: Any = _DEFAULT_SEGMENT_SIZE,
        local_buffer_size: Any = _DEFAULT_LOCAL_BUFFER_SIZE,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = _DEFAULT_MASTER,
        engine: Any = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = "default",
        enable_client_http_server: bool = False,
        client_http_port: int | None = None,
        token_file: str | None = None,
    ) -> int:
        """Connects to the master; answers 0 or a negative code.

        Either ``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr)`` or
        ``setup(config: dict)`` with the same keys. Sizes are ints or strings ("16MB", as
        Mooncake reads them: powers of 1024). ``metadata_server`` is accepted and ignored:
        Mooring needs no metadata service. ``master_server_addr`` is the master's
        ``host:port``, a group's (``host:port,host:port``), or where etcd finds the group's
        masters (``etcd://host:port/cluster``). The cluster token comes from the ``token_file``
        option, else the file ``MOORING_TOKEN_FILE`` names; with neither, only a cluster
        running without a token on loopback accepts the store.

        ``tenant_id`` names the tenant whose keys the store reads and writes (its own
        namespace: keys, listings and ``remove_all`` see only that tenant's objects). With a
        member credential it must be the credential's tenant (``"default"`` or ``""`` take the
        credential's); the cluster token may act in any.

        Mooncake's other options are refused with -600 unless left at their defaults, rather
        than silently ignored: Mooring keeps its SSD tier on the nodes
        (``enable_ssd_offload``: start ``mooring node --disk-dir``), and serves metrics from
        the master and nodes (``enable_client_http_server``: ``--metrics-listen``).
        ``engine`` is ignored.
        """
        if isinstance(local_hostname, Mapping):
            return self._setup_from_dict(dict(local_hostname))
        refused = _unsupported(enable_ssd_offload, enable_client_http_server)
        if refused:
            return self._refuse("setup", ErrorCode.INVALID_PARAMS, refused)
        try:
            segment = _size(global_segment_size, "global_segment_size")
            local = _size(local_buffer_size, "local_buffer_size")
        except ValueError as e:
            return self._refuse("setup", ErrorCode.INVALID_PARAMS, str(e))
        return self._setup(
            str(local_hostname),
            segment,
            local,
            str(protocol),
            str(rdma_devices or ""),
            str(master_server_addr),
            token_file,
            str(tenant_id or ""),
        )

    def _setup_from_dict(self, config: dict) -> int:
        refused = _unsupported(
            _flag(config.get("enable_ssd_offload", False)),
            _flag(config.get("enable_client_http_server", False)),
        )
        if refused:
            return self._refuse("setup", ErrorCode.INVALID_PARAMS, refused)
        hostname = config.get("local_hostname")
        if not hostname:
            return self._refuse("setup", ErrorCode.INVALID_PARAMS, "config has no local_hostname")
        if "metadata_server" not in config:
            return self._refuse(
                "setup",
                ErrorCode.INVALID_PARAMS,
                "config has no metadata_server (Mooring ignores it, but Mooncake requires it; "
                'give "P2PHANDSHAKE")',
            )
        try:
            segment = _size(
                config.get("global_segment_size", _DEFAULT_SEGMENT_SIZE), "global_segment_size"
            )
            local = _size(
                config.get("local_buffer_size", _DEFAULT_LOCAL_BUFFER_SIZE), "local_buffer_size"
            )
        except ValueError as e:
            return self._refuse("setup", ErrorCode.INVALID_PARAMS, str(e))
        return self._setup(
            str(hostname),
            segment,
            local,
            str(config.get("protocol", "tcp")),
            str(config.get("rdma_devices", "") or ""),
            str(config.get("master_server_addr", _DEFAULT_MASTER)),
            config.get("token_file"),
            str(config.get("tenant_id", "") or ""),
        )

    def _setup(
        self,
        hostname: str,
        segment: int,
        local: int,
        protocol: str,
        rdma_devices: str,
        master: str,
        token_file: str | None,
        tenant: str = "",
    ) -> int:
        protocol = protocol.lower()
        if protocol not in ("tcp", "rdma"):
            return self._refuse(
                "setup",
                ErrorCode.INVALID_PARAMS,
                f'unknown protocol {protocol!r}: use "tcp" or "rdma"',
            )
        if master.startswith(("http://", "https://")):
            return self._refuse(
                "setup",
                ErrorCode.INVALID_PARAMS,
                f"master_server_addr {master!r}: give the master's host:port, every "
                "master's (host:port,host:port), or where etcd finds them "
                "(etcd://host:port/cluster)",
            )
        with self._setup_lock:
            if self._client is not None:
                # Mooncake replaces the client of a store set up twice; so does Mooring.
                self._close_locked()
            try:
                self._client = _native.NativeClient.connect(
                    master,
                    hostname,
                    segment,
                    local,
                    token_file,
                    _port_range(),
                    protocol,
                    rdma_devices,
                    # Mooncake's default tenant name means "the credential's own".
                    tenant if tenant not in ("", "default") else None,
                    transport=os.environ.get("MOORING_TRANSPORT") or None,
                    device_staging_size=_device_size("MOORING_DEVICE_STAGING_SIZE", "64MB"),
                    device_wave_size=_device_size("MOORING_DEVICE_WAVE_SIZE", "2MB"),
                )
            except MooringError as e:
                code, message = e.args
                _native.log_failure("setup", code, message)
                return code
            except ValueError as e:
                return self._refuse("setup", ErrorCode.INVALID_PARAMS, str(e))
        return 0

    def close(self) -> int:
        """Leaves the cluster. A contributed segment is unmounted: objects whose only
        replicas lived there are gone. ``setup()`` may be called again afterwards."""
        with self._setup_lock:
            return self._close_locked()

    def _close_locked(self) -> int:
        client, self._client = self._client, None
        if client is None:
            return 0
        try:
            client.close()
        except MooringError as e:
            code, message = e.args
            _native.log_failure("close", code, message)
            return code
        return 0

    def get_hostname(self) -> str:
        """``host:port`` of the memory this store contributes (its segment's name), or the
        ``local_hostname`` given to ``setup`` if it contributes none."""
        client = self._client
        return client.hostname() if client is not None else ""

    def health_check(self) -> int:
        """0 if the master answers, 1 if the store is not set up (or closed), 2 if the master
        does not answer."""
        client = self._client
        if client is None:
            return 1
        try:
            client.health_check()
        except MooringError as e:
            _native.log_failure("health_check", *e.args)
            return 2
        return 0

    # ---- plumbing ----------------------------------------------------------------------------

    def _refuse(self, call: str, code: ErrorCode, message: str) -> int:
        _native.log_failure(call, int(code), message)
        return int(code)

    def _run(self, call: str, work: Callable[[Any], _T], failed: Callable[[int], _T]) -> _T:
        client = self._client
        if client is None:
            return failed(self._refuse(call, ErrorCode.INVALID_PARAMS, "call setup() first"))
        try:
            return work(client)
        except MooringError as e:
            code, message = e.args
            _native.log_failure(call, code, message)
            return failed(code)

    def _config(self, config: ReplicateConfig | None) -> tuple:
        """``config`` as the native calls take it; raises ``MooringError`` (-600) for one a
        write cannot honour, so call it inside :meth:`_run`, which answers the code."""
        config = config or _DEFAULT_CONFIG
        client = self._client
        # Asked only when wanted: it is a call into the extension on every put.
        own = (
            client.segment_name()
            if config.prefer_alloc_in_same_node and client is not None
            else None
        )
        return config._native(own)

    def _many(self, call: str, keys: Sequence[str], *lists: Sequence) -> list[int] | None:
        """Per-key refusals for mismatched list lengths, or None when they match."""
        if all(len(other) == len(keys) for other in lists):
            return None
        code = self._refuse(
            call,
            ErrorCode.INVALID_PARAMS,
            f"{len(keys)} keys but lists of {[len(other) for other in lists]}: give one per key",
        )
        return [code] * len(keys)

    # ---- writes ------------------------------------------------------------------------------

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Stores a bytes-like ``value`` (bytes, bytearray, memoryview, numpy array) under
        ``key``; 0 or a negative code. As Mooncake's put does, a key that already exists keeps
        its value and the put answers 0: ``upsert`` replaces it."""
        return self._write("put", key, value, config, False)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Stores ``value`` under ``key`` whether or not it exists; 0 or a negative code."""
        return self._write("upsert", key, value, config, True)

    def _write(self, call: str, key: str, value: Any, config, upsert: bool) -> int:
        return self._run(call, lambda c: c.put(key, value, self._config(config), upsert) or 0, int)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Stores the concatenation of bytes-like ``parts`` as one value; 0 or a code."""
        return self._run(
            "put_parts",
            lambda c: c.put_parts(key, list(parts), self._config(config), False) or 0,
            int,
        )

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """``put_parts`` that replaces an existing value."""
        return self._run(
            "upsert_parts",
            lambda c: c.put_parts(key, list(parts), self._config(config), True) or 0,
            int,
        )

    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Stores many values; 0 if every one was stored, else the first failure's code."""
        return self._batch_write("put_batch", keys, values, config, False)

    def upsert_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        """``put_batch`` that replaces existing values."""
        return self._batch_write("upsert_batch", keys, values, config, True)

    def _batch_write(self, call, keys, values, config, upsert: bool) -> int:
        refused = self._many(call, keys, values)
        if refused is not None:
            return refused[0] if refused else 0
        if not keys:
            return 0
        codes = self._run(
            call,
            lambda c: c.put_batch(list(keys), list(values), self._config(config), upsert),
            lambda code: [code],
        )
        return next((code for code in codes if code != 0), 0)

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Stores ``size`` bytes at ``buffer_ptr``, inside a registered buffer, without a
        copy; 0 or a negative code."""
        return self._run(
            "put_from",
            lambda c: c.put_from(key, buffer_ptr, size, self._config(config), False) or 0,
            int,
        )

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """``put_from`` that replaces an existing value."""
        return self._run(
            "upsert_from",
            lambda c: c.put_from(key, buffer_ptr, size, self._config(config), True) or 0,
            int,
        )

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """``put_from`` for many keys; one code per key."""
        return self._batch_put_from("batch_put_from", keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """``upsert_from`` for many keys; one code per key."""
        return self._batch_put_from("batch_upsert_from", keys, buffer_ptrs, sizes, config, True)

    def _batch_put_from(self, call, keys, ptrs, sizes, config, upsert) -> list[int]:
        refused = self._many(call, keys, ptrs, sizes)
        if refused is not None:
            return refused
        return self._put_parts_from(
            call, keys, [[p] for p in ptrs], [[s] for s in sizes], config, upsert
        )

    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Stores each key's value from several registered buffers (concatenated in order);
        one code per key."""
        refused = self._many("batch_put_from_multi_buffers", keys, all_buffer_ptrs, all_sizes)
        if refused is not None:
            return refused
        return self._put_parts_from(
            "batch_put_from_multi_buffers",
            keys,
            [list(p) for p in all_buffer_ptrs],
            [list(s) for s in all_sizes],
            config,
            False,
        )

    def _put_parts_from(self, call, keys, ptrs, sizes, config, upsert) -> list[int]:
        if not keys:
            return []
        return self._run(
            call,
            lambda c: c.batch_put_from(list(keys), ptrs, sizes, self._config(config), upsert),
            lambda code: [code] * len(keys),
        )

    # ---- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The value of ``key``, or ``b""`` if it cannot be read (the log says why)."""
        return self._run("get", lambda c: c.get(key), lambda code: b"")

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """The values of ``keys``; ``b""`` for each one that cannot be read."""
        if not keys:
            return []
        results = self._run(
            "get_batch", lambda c: c.get_batch(list(keys)), lambda code: [code] * len(keys)
        )
        return [r if isinstance(r, bytes) else b"" for r in results]

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value of ``key`` in a :class:`BufferHandle` (view it without a copy), or
        ``None``."""
        return self._run("get_buffer", lambda c: c.get_buffer(key), lambda code: None)

    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        """``get_buffer`` for many keys."""
        if not keys:
            return []
        results = self._run(
            "batch_get_buffer",
            lambda c: c.batch_get_buffer(list(keys)),
            lambda code: [code] * len(keys),
        )
        return [r if isinstance(r, BufferHandle) else None for r in results]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Reads ``key`` into ``size`` bytes at ``buffer_ptr`` (inside a registered buffer);
        the value's length, or a negative code (-10 if the buffer is too small)."""
        return self._run("get_into", lambda c: c.get_into(key, buffer_ptr, size), int)

    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """``get_into`` for many keys; one length or code per key."""
        refused = self._many("batch_get_into", keys, buffer_ptrs, sizes)
        if refused is not None:
            return refused
        return self._get_parts_into(
            "batch_get_into", keys, [[p] for p in buffer_ptrs], [[s] for s in sizes]
        )

    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Reads each key into several registered buffers, filled in order; one length or
        code per key."""
        refused = self._many("batch_get_into_multi_buffers", keys, all_buffer_ptrs, all_sizes)
        if refused is not None:
            return refused
        return self._get_parts_into(
            "batch_get_into_multi_buffers",
            keys,
            [list(p) for p in all_buffer_ptrs],
            [list(s) for s in all_sizes],
        )

    def _get_parts_into(self, call, keys, ptrs, sizes) -> list[int]:
        if not keys:
            return []
        return self._run(
            call,
            lambda c: c.batch_get_into(list(keys), ptrs, sizes),
            lambda code: [code] * len(keys),
        )

    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Copies byte ranges of values into registered buffers: for buffer ``b``, key ``k``
        and fragment ``f``, ``all_sizes[b][k][f]`` bytes from offset ``all_src_offsets[b][k][f]``
        of the value to offset ``all_dst_offsets[b][k][f]`` of the buffer. Answers, per buffer,
        per key, per fragment, the bytes copied or a negative code; a bad fragment fails
        alone."""

        def failed(code: int) -> list[list[list[int]]]:
            # Shaped by the destination offsets, as Mooncake shapes its failures.
            return [
                [[code] * len(fragments) for fragments in per_key]
                for per_key in (
                    all_dst_offsets[b] if b < len(all_dst_offsets) else []
                    for b in range(len(buffer_ptrs))
                )
            ]

        return self._run(
            "get_into_ranges",
            lambda c: c.get_into_ranges(
                list(buffer_ptrs),
                [list(k) for k in all_keys],
                [[list(f) for f in k] for k in all_dst_offsets],
                [[list(f) for f in k] for k in all_src_offsets],
                [[list(f) for f in k] for k in all_sizes],
            ),
            failed,
        )

    # ---- registered memory -------------------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Registers ``size`` bytes at ``buffer_ptr`` for the zero-copy calls (``put_from``,
        ``get_into``, their batches, ``get_into_ranges`` and the tensor calls); 0 or a
        negative code. Keep the memory allocated until ``unregister_buffer``.

        GPU memory (CUDA, from torch or any other library) is accepted: its bytes move
        through a pool of pinned host memory (``MOORING_DEVICE_STAGING_SIZE``, 64 MiB by
        default), one wave's copy to or from the GPU overlapping the next wave's transfer,
        and are checksummed on the host side. :meth:`stat` says which path is in use."""
        return self._run("register_buffer", lambda c: c.register_buffer(buffer_ptr, size) or 0, int)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Unregisters the buffer registered at ``buffer_ptr``; 0 or a negative code. Calls
        still moving bytes to or from it finish first, so once this returns the memory may
        be freed."""
        return self._run("unregister_buffer", lambda c: c.unregister_buffer(buffer_ptr) or 0, int)

    def stat(self) -> dict[str, Any]:
        """How this client moves registered device (GPU) memory (a Mooring addition):
        ``devices`` lists, per device with registered memory, its name, the ``path``
        ("staging through pinned host memory"), the bytes registered and the staging slabs;
        ``device_bytes_put`` and ``device_bytes_got`` count the bytes moved so far. Empty
        before ``setup``."""
        if self._client is None:
            return {}
        return self._client.device_stat()

    # ---- metadata ----------------------------------------------------------------------------

    def get_size(self, key: str) -> int:
        """The size of ``key``'s value, or a negative code."""
        return self._run("get_size", lambda c: c.get_size(key), int)

    def is_exist(self, key: str, prefetch: bool = False) -> int:
        """1 if ``key`` exists, 0 if not, a negative code on failure.

        With ``prefetch`` (a Mooring addition to the Python call; see docs/prefetch.md), a
        value whose only copy is on a node's disk is first brought back into memory,
        this store's segment first, so the get that follows the probe reads memory. Best
        effort: a failed promotion still answers 1, and is logged."""
        if prefetch:
            return self._run("is_exist", lambda c: int(c.exist_prefetch(key)), int)
        return self._run("is_exist", lambda c: int(c.exist(key)), int)

    def batch_is_exist(self, keys: Sequence[str], prefetch: bool = False) -> list[int]:
        """``is_exist`` for many keys: in one request, or with ``prefetch`` one request per key,
        32 keys at a time."""
        if not keys:
            return []
        if prefetch:
            return self._run(
                "batch_is_exist",
                lambda c: c.batch_exist_prefetch(list(keys)),
                lambda code: [code] * len(keys),
            )
        return self._run(
            "batch_is_exist", lambda c: c.batch_exist(list(keys)), lambda code: [code] * len(keys)
        )

    def remove(self, key: str, force: bool = False) -> int:
        """Removes ``key``; 0 or a negative code (-706 while a reader holds a lease on it).
        ``force`` is accepted for Mooncake's signature; Mooring never removes a value a
        reader is reading, so a leased key still answers -706."""
        return self._run("remove", lambda c: c.remove(key) or 0, int)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """``remove`` for many keys; one code per key."""
        if not keys:
            return []
        return self._run(
            "batch_remove", lambda c: c.batch_remove(list(keys)), lambda code: [code] * len(keys)
        )

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Removes every key matching the regular expression; how many, or a negative
        code."""
        return self._run("remove_by_regex", lambda c: c.remove_by_regex(regex_pattern), int)

    def remove_all(self, force: bool = False) -> int:
        """Removes every object that can be removed now; how many, or a negative code."""
        return self._run("remove_all", lambda c: c.remove_all(), int)

    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        """Starts copying ``key`` to each segment in ``targets`` and returns at once:
        ``(task id, 0)``, or ``((0, 0), negative code)`` when the master refuses the copy (no
        such key or segment, a replica already there, no room). This store carries the copy
        out in the background; ``query_task`` tells how it went. Closing the store fails
        copies still running."""
        return self._run(
            "create_copy_task",
            lambda c: (_uuid(c.start_copy(key, list(targets))), 0),
            lambda code: ((0, 0), code),
        )

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        """Starts moving ``key``'s replica on segment ``source`` to segment ``target``; returns
        as ``create_copy_task`` does."""
        return self._run(
            "create_move_task",
            lambda c: (_uuid(c.start_move(key, source, target)), 0),
            lambda code: ((0, 0), code),
        )

    def query_task(self, task_id: Any) -> tuple[QueryTaskResponse | None, int]:
        """Where a task stands: ``(QueryTaskResponse, 0)``, or ``(None, negative code)`` for a
        task the master does not know (never started, or one of many long ended: the master
        keeps the last 4096)."""
        task = _task_id(task_id)
        return self._run(
            "query_task",
            lambda c: (QueryTaskResponse(task, c.query_task(task)), 0),
            lambda code: (None, code),
        )

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """Where ``key``'s complete replicas are (empty if it cannot be read)."""
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys: Iterable[str]) -> dict[str, list[ReplicaDescriptor]]:
        """``get_replica_desc`` for many keys: keys that cannot be read are left out. Each
        :class:`ReplicaDescriptor` tells memory from disk (``is_memory_replica``,
        ``is_local_disk_replica``) and describes itself (``get_memory_descriptor``,
        ``get_local_disk_descriptor``). As in Mooncake, asking grants the keys a read lease."""
        keys = list(keys)
        if not keys:
            return {}
        results = self._run(
            "batch_get_replica_desc", lambda c: c.replicas(keys), lambda code: [code] * len(keys)
        )
        return {
            key: [ReplicaDescriptor(*r) for r in replicas]
            for key, replicas in zip(keys, results)
            if isinstance(replicas, list)
        }

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Clears replicas of objects this store wrote, as Mooncake's ``batch_replica_clear``:
        with no ``segment_name``, each object whole; with one, only its replica on that
        segment (an object whose only replica that was goes whole). Objects another store
        wrote, and those leased (read, probed or described within the master's lease TTL),
        pinned by a reader, being written or being copied, are skipped. Answers the keys
        cleared; ``[]`` on failure (the log says why)."""
        keys = list(keys)
        if not all(isinstance(k, str) for k in keys):
            self._refuse("batch_replica_clear", ErrorCode.INVALID_PARAMS, "keys must be strings")
            return []
        segment = str(segment_name or "") or None
        return self._run(
            "batch_replica_clear",
            lambda c: _native.clear_replicas(c, keys, segment),
            lambda code: [],
        )
