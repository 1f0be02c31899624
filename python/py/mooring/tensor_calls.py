"""The torch tensor calls of ``MooncakeDistributedStore``, Mooncake's names and conventions.

A tensor is stored as one value in Mooncake's tensor format (see :mod:`mooring.tensors`).
Tensor-parallel calls (``*_with_tp``) store a tensor as ``tp_size`` equal shards along
``split_dim``, under ``<key>_tp_<rank>``, and read back one rank's shard; with ``tp_size``
1 they are the plain calls on ``key``.

Writes answer 0 or a negative code; reads answer a tensor or ``None`` (the log says why).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import tensors
from .codes import ErrorCode

if TYPE_CHECKING:
    from .store import ReplicateConfig


_NO_SAFETENSORS = "the safetensors package is not installed: pip install safetensors"


def _safetensors(name: str) -> tuple[Any, tuple[type[BaseException], ...]]:
    """``safetensors.torch``'s function ``name`` (``None`` if safetensors is missing) and the
    errors it raises on a file it cannot read or write."""
    try:
        import safetensors
        import safetensors.torch
    except ImportError:
        return None, ()
    return getattr(safetensors.torch, name), (OSError, ValueError, safetensors.SafetensorError)


def shard_key(key: str, rank: int) -> str:
    """The key of tensor-parallel rank ``rank``'s shard of ``key`` (Mooncake's naming)."""
    return f"{key}_tp_{rank}"


class TensorCalls:
    """Mixed into ``MooncakeDistributedStore``: the tensor calls, built on its byte calls and
    its plumbing (``_run``, ``_config``, ``_refuse``, ``_many``)."""

    # ---- whole tensors -----------------------------------------------------------------------

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Stores a ``torch.Tensor`` (copied to host memory first if it is on a device) with
        its dtype and shape, in Mooncake's tensor format; 0 or a negative code."""
        return self._put_tensor("put_tensor", key, tensor, None, False)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """``put_tensor`` that replaces an existing value."""
        return self._put_tensor("upsert_tensor", key, tensor, None, True)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """``put_tensor`` with a :class:`ReplicateConfig`."""
        return self._put_tensor("pub_tensor", key, tensor, config, False)

    def upsert_pub_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int:
        """``upsert_tensor`` with a :class:`ReplicateConfig`."""
        return self._put_tensor("upsert_pub_tensor", key, tensor, config, True)

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """``put_tensor`` for many keys; one code per key."""
        return self._batch_put_tensor("batch_put_tensor", keys, tensors_list, None, False)

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """``upsert_tensor`` for many keys; one code per key."""
        return self._batch_put_tensor("batch_upsert_tensor", keys, tensors_list, None, True)

    def batch_pub_tensor(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """``pub_tensor`` for many keys; one code per key."""
        return self._batch_put_tensor("batch_pub_tensor", keys, tensors_list, config, False)

    def batch_upsert_pub_tensor(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """``upsert_pub_tensor`` for many keys; one code per key."""
        return self._batch_put_tensor("batch_upsert_pub_tensor", keys, tensors_list, config, True)

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` with ``put_tensor`` (in host memory), or ``None``
        if it cannot be read or is not a stored tensor (the log says why)."""
        return self._decoded("get_tensor", key, self.get_buffer(key))

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """``get_tensor`` for many keys; ``None`` for each one that cannot be read."""
        handles = self.batch_get_buffer(keys)
        return [self._decoded("batch_get_tensor", k, h) for k, h in zip(keys, handles)]

    # ---- registered memory ---------------------------------------------------------------

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads the tensor stored under ``key`` into ``size`` bytes at ``buffer_ptr``
        (inside a registered buffer; the header first, then the data) and answers it as a
        view of that memory, without a copy; ``None`` if it cannot be read."""
        length = self.get_into(key, buffer_ptr, size)
        return self._viewed("get_tensor_into", key, buffer_ptr, length)

    def batch_get_tensor_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Any]:
        """``get_tensor_into`` for many keys: a tensor or ``None`` per key (mismatched lists
        answer -600 per key, as Mooncake's do)."""
        refused = self._many("batch_get_tensor_into", keys, buffer_ptrs, sizes)
        if refused is not None:
            return list(refused)
        if self._client is None and keys:
            code = self._refuse(
                "batch_get_tensor_into", ErrorCode.INVALID_PARAMS, "call setup() first"
            )
            return [code] * len(keys)
        lengths = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [
            self._viewed("batch_get_tensor_into", key, ptr, length)
            for key, ptr, length in zip(keys, buffer_ptrs, lengths)
        ]

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores, without a copy, the ``size`` bytes at ``buffer_ptr`` (inside a registered
        buffer) laid out as ``get_tensor_into`` leaves them: a tensor header, then the data.
        The header is checked first (-600 if it does not describe the bytes)."""
        return self._put_tensors_from("put_tensor_from", [key], [buffer_ptr], [size], False)[0]

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """``put_tensor_from`` that replaces an existing value."""
        return self._put_tensors_from("upsert_tensor_from", [key], [buffer_ptr], [size], True)[0]

    def batch_put_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """``put_tensor_from`` for many keys; one code per key (a bad header fails alone)."""
        return self._put_tensors_from("batch_put_tensor_from", keys, buffer_ptrs, sizes, False)

    def batch_upsert_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """``upsert_tensor_from`` for many keys; one code per key."""
        return self._put_tensors_from("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, True)

    # ---- tensor parallel -------------------------------------------------------------------

    def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Stores ``tensor`` as ``tp_size`` equal shards along ``split_dim``, every rank's,
        under ``<key>_tp_<rank>`` (``tp_rank`` is accepted for the signature). Every shard is
        tried; the answer is 0, or the code of the first rank that failed (the others stay
        stored). -600 if the dimension does not split evenly."""
        return self._put_tensor_with_tp("put_tensor_with_tp", key, tensor, None, tp_size, split_dim)

    def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """``put_tensor_with_tp`` with a :class:`ReplicateConfig` for every shard."""
        return self._put_tensor_with_tp(
            "pub_tensor_with_tp", key, tensor, config, tp_size, split_dim
        )

    def batch_put_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """``put_tensor_with_tp`` for many keys; one code per key."""
        return self._batch_put_tensor_with_tp(
            "batch_put_tensor_with_tp", base_keys, tensors_list, None, tp_size, split_dim
        )

    def batch_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """``pub_tensor_with_tp`` for many keys; one code per key."""
        return self._batch_put_tensor_with_tp(
            "batch_pub_tensor_with_tp", base_keys, tensors_list, config, tp_size, split_dim
        )

    def put_tensor_with_tp_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """``put_tensor_with_tp`` of the whole tensor stored at ``buffer_ptr`` (a header, then
        the data, inside a registered buffer)."""
        if tp_size <= 1:
            return self.put_tensor_from(key, buffer_ptr, size)
        tensor = self._tensor_at("put_tensor_with_tp_from", key, buffer_ptr, size)
        if isinstance(tensor, int):
            return tensor
        return self._put_tensor_with_tp(
            "put_tensor_with_tp_from", key, tensor, None, tp_size, split_dim
        )

    def batch_put_tensor_with_tp_from(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """``put_tensor_with_tp_from`` for many keys; one code per key."""
        refused = self._many("batch_put_tensor_with_tp_from", base_keys, buffer_ptrs, sizes)
        if refused is not None:
            return refused
        return [
            self.put_tensor_with_tp_from(key, ptr, size, tp_rank, tp_size, split_dim)
            for key, ptr, size in zip(base_keys, buffer_ptrs, sizes)
        ]

    def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        """Rank ``tp_rank``'s shard of the tensor ``put_tensor_with_tp`` stored under ``key``
        (the whole tensor when ``tp_size`` is 1), or ``None``."""
        return self.get_tensor(self._rank_key(key, tp_rank, tp_size))

    def batch_get_tensor_with_tp(
        self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        """``get_tensor_with_tp`` for many keys."""
        return self.batch_get_tensor([self._rank_key(k, tp_rank, tp_size) for k in base_keys])

    def get_tensor_with_tp_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any:
        """``get_tensor_into`` of rank ``tp_rank``'s shard."""
        return self.get_tensor_into(self._rank_key(key, tp_rank, tp_size), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        """``batch_get_tensor_into`` of rank ``tp_rank``'s shards."""
        keys = [self._rank_key(k, tp_rank, tp_size) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # ---- safetensors files ---------------------------------------------------------------

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Writes the tensor stored under ``key`` to a safetensors file (``file_name``, else
        a file named as the key), as the tensor named ``key``; 0, -1100 if there is no tensor
        to save, or -1103 if the file cannot be written. Needs the ``safetensors`` package."""
        call = "save_tensor_to_safetensor"
        tensor = self.get_tensor(key)
        if tensor is None:
            return self._refuse(call, ErrorCode.FILE_NOT_FOUND, f"{key}: no tensor to save")
        save_file, errors = _safetensors("save_file")
        if save_file is None:
            return self._refuse(call, ErrorCode.INVALID_PARAMS, _NO_SAFETENSORS)
        try:
            save_file({key: tensor}, file_name if file_name is not None else key)
        except errors as e:
            return self._refuse(call, ErrorCode.FILE_WRITE_FAIL, f"{key}: {e}")
        return 0

    def load_tensor_from_safetensor(
        self, key: str | None = None, file_name: str | None = None
    ) -> Any:
        """Stores a tensor of the safetensors file ``file_name`` under ``key`` (else under
        the file's name) with ``put_tensor``, and answers it; ``None`` if the file cannot be
        read or the tensor stored. The tensor named ``key`` is taken, else the file's first
        (with a warning)."""
        call = "load_tensor_from_safetensor"
        if file_name is None:
            self._refuse(call, ErrorCode.INVALID_PARAMS, "give file_name, the file to load")
            return None
        load_file, errors = _safetensors("load_file")
        if load_file is None:
            self._refuse(call, ErrorCode.INVALID_PARAMS, _NO_SAFETENSORS)
            return None
        try:
            loaded = load_file(file_name)
        except errors as e:
            self._refuse(call, ErrorCode.FILE_READ_FAIL, f"{file_name}: {e}")
            return None
        if not loaded:
            self._refuse(call, ErrorCode.FILE_READ_FAIL, f"{file_name} holds no tensor")
            return None
        target = key if key is not None else file_name
        name = key if key in loaded else next(iter(loaded))
        if key is not None and name != key:
            warnings.warn(
                f"{file_name} has no tensor named {key!r}: storing its first, {name!r}",
                stacklevel=2,
            )
        tensor = loaded[name]
        if self.put_tensor(target, tensor) != 0:
            return None
        return tensor

    # ---- plumbing ----------------------------------------------------------------------------

    def _put_tensor(self, call: str, key: str, tensor: Any, config, upsert: bool) -> int:
        try:
            encoded = tensors.encode(tensor)
        except ValueError as e:
            return self._refuse(call, ErrorCode.INVALID_PARAMS, f"{key}: {e}")
        return self._put_encoded(call, key, encoded, config, upsert)

    def _put_encoded(self, call: str, key: str, encoded, config, upsert: bool) -> int:
        header, data, keep = encoded
        code = self._run(
            call,
            lambda c: c.put_parts(key, [header, data], self._config(config), upsert) or 0,
            int,
        )
        del keep  # the tensor's host copy, whose memory `data` views, lived through the put
        return code

    def _batch_put_tensor(self, call, keys, tensors_list, config, upsert: bool) -> list[int]:
        refused = self._many(call, keys, tensors_list)
        if refused is not None:
            return refused
        return [
            self._put_tensor(call, key, tensor, config, upsert)
            for key, tensor in zip(keys, tensors_list)
        ]

    def _put_tensor_with_tp(self, call, key, tensor, config, tp_size: int, split_dim: int) -> int:
        if tp_size <= 1:
            return self._put_tensor(call, key, tensor, config, False)
        try:
            shards = tensors.encode_shards(tensor, tp_size, split_dim)
        except ValueError as e:
            return self._refuse(call, ErrorCode.INVALID_PARAMS, f"{key}: {e}")
        codes = [
            self._put_encoded(call, shard_key(key, rank), encoded, config, False)
            for rank, encoded in enumerate(shards)
        ]
        return next((code for code in codes if code != 0), 0)

    def _batch_put_tensor_with_tp(
        self, call, keys, tensors_list, config, tp_size: int, split_dim: int
    ) -> list[int]:
        refused = self._many(call, keys, tensors_list)
        if refused is not None:
            return refused
        return [
            self._put_tensor_with_tp(call, key, tensor, config, tp_size, split_dim)
            for key, tensor in zip(keys, tensors_list)
        ]

    def _put_tensors_from(self, call, keys, ptrs, sizes, upsert: bool) -> list[int]:
        """Checks each key's tensor header in registered memory, then stores the good ones
        without a copy; one code per key."""
        refused = self._many(call, keys, ptrs, sizes)
        if refused is not None:
            return refused
        codes = [self._check_tensor_at(call, k, p, s) for k, p, s in zip(keys, ptrs, sizes)]
        good = [i for i, code in enumerate(codes) if code == 0]
        if good:
            stored = self._batch_put_from(
                call,
                [keys[i] for i in good],
                [ptrs[i] for i in good],
                [sizes[i] for i in good],
                None,
                upsert,
            )
            for i, code in zip(good, stored):
                codes[i] = code
        return codes

    def _check_tensor_at(self, call: str, key: str, ptr: int, size: int) -> int:
        """0 if the ``size`` bytes at ``ptr`` are registered and hold a stored tensor, else
        the code (logged)."""
        header = self._header_at(call, ptr, size)
        if isinstance(header, int):
            return header
        try:
            tensors.check_header(header[0], size)
        except ValueError as e:
            return self._refuse(call, ErrorCode.INVALID_PARAMS, f"{key}: {e}")
        return 0

    def _header_at(self, call: str, ptr: int, size: int) -> Any:
        """``(header bytes, device)`` of the registered ``size`` bytes at ``ptr`` (the device
        is ``None`` for host memory, else its name and CUDA ordinal), or the code. The header
        is copied out, so device memory is read through the device."""

        def read(c: Any) -> Any:
            device = c.check_registered(ptr, size)
            return c.read_registered(ptr, min(size, tensors.HEADER_SIZE)), device

        return self._run(call, read, int)

    def _tensor_at(self, call: str, key: str, ptr: int, size: int) -> Any:
        """The tensor stored in registered memory at ``ptr`` (a view), or the code."""
        header = self._header_at(call, ptr, size)
        if isinstance(header, int):
            return header
        try:
            return tensors.view_at(ptr, size, *header)
        except ValueError as e:
            return self._refuse(call, ErrorCode.INVALID_PARAMS, f"{key}: {e}")

    def _viewed(self, call: str, key: str, ptr: int, length: int) -> Any:
        """The tensor a successful ``get_into`` left at ``ptr`` (``length`` bytes, a view),
        or ``None`` if the read failed (already logged) or the bytes are not a tensor."""
        if length < 0:
            return None
        viewed = self._tensor_at(call, key, ptr, length)
        return None if isinstance(viewed, int) else viewed

    def _decoded(self, call: str, key: str, handle: Any) -> Any:
        if handle is None:
            return None
        try:
            return tensors.decode(handle)
        except ValueError as e:
            self._refuse(call, ErrorCode.INVALID_PARAMS, f"{key}: {e}")
            return None

    @staticmethod
    def _rank_key(key: str, tp_rank: int, tp_size: int) -> str:
        return key if tp_size <= 1 else shard_key(key, tp_rank)
