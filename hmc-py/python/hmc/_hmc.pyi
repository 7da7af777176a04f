"""Type stubs of the extension module ``hmc._hmc`` (re-exported by ``hmc``, ``hmc.kv``
and ``hmc.rpc``)."""

from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Optional, Union

from typing_extensions import Buffer, Self

#: An object whose memory can be registered: a buffer-protocol object, an object with
#: ``__dlpack__``, or a raw ``(addr, length)``.
Registrable = Union[Buffer, Any, tuple[int, int]]
#: A transfer descriptor, or ``(local_addr, remote_addr, length)``.
DescLike = Union["TransferOpDesc", tuple[int, int, int]]

SIGNAL_CHECK_MS: int
#: Entries of a prepared list: ``(addr, len)``, ``(addr, len, dev)`` or strided ``(addr,
#: len, dev, stride, count)`` tuples, or an N x 2, 3 or 5 integer numpy array.
EntriesLike = Union[Sequence[tuple[int, ...]], Any]
#: Indices into a prepared list: a list of ints or a 1-D integer numpy array.
IndicesLike = Union[Sequence[int], Any]

class PreparedList:
    """A descriptor list resolved once (``Engine.prepare_local`` / ``prepare_remote``)."""

    def __len__(self) -> int: ...
    @property
    def peer(self) -> Optional[str]: ...
    @property
    def segments(self) -> int: ...
    @property
    def heap_bytes(self) -> int: ...

class PreparedXfer:
    """A transfer over prepared lists: post, poll, wait, release; re-postable once ended."""

    def post(self) -> None: ...
    def status(self) -> TransferStatus: ...
    def done(self) -> bool: ...
    def wait(self, timeout_ms: Optional[int] = None) -> TransferStatus: ...
    def error(self) -> Optional[BaseException]: ...
    def release(self) -> None: ...
    def telemetry(self) -> Optional[dict[str, Any]]: ...
    @property
    def bytes(self) -> int: ...
    @property
    def runs(self) -> int: ...

class MemType:
    """Where memory lives."""

    HOST: ClassVar[MemType]
    DEVICE: ClassVar[MemType]
    def __int__(self) -> int: ...

class TransferOp:
    """``READ``: remote to local; ``WRITE``: local to remote."""

    READ: ClassVar[TransferOp]
    WRITE: ClassVar[TransferOp]
    def __int__(self) -> int: ...

class TransferStatus:
    """Where an asynchronous transfer stands."""

    WAITING: ClassVar[TransferStatus]
    COMPLETED: ClassVar[TransferStatus]
    TIMEOUT: ClassVar[TransferStatus]
    FAILED: ClassVar[TransferStatus]
    def __int__(self) -> int: ...

class TransferOpDesc:
    """``length`` bytes between ``local_addr`` and ``remote_addr``."""

    local_addr: int
    remote_addr: int
    length: int
    def __init__(self, local_addr: int, remote_addr: int, length: int) -> None: ...

class HostMemory(Buffer):
    """Host memory an engine allocated (``Engine.alloc_mem``): a writable buffer object."""
    @property
    def handle(self) -> MemHandle: ...
    @property
    def addr(self) -> int: ...
    def __len__(self) -> int: ...

class MemHandle:
    """A registration (``addr``, ``length``, ``readonly``)."""

    addr: int
    length: int
    readonly: bool

class TransferReq(Awaitable[None]):
    """An asynchronous transfer."""

    def status(self) -> TransferStatus: ...
    def wait(self, timeout_ms: Optional[int] = None) -> TransferStatus: ...
    def error(self) -> Optional[BaseException]: ...
    def cancel(self) -> None: ...
    def __await__(self) -> Generator[Any, None, None]: ...

class Engine:
    """A one-sided transfer engine."""

    def __init__(self) -> None: ...
    def initialize(
        self,
        local: str,
        options: Optional[Mapping[str, str]] = None,
        *,
        metadata: Optional[str] = None,
        name: Optional[str] = None,
    ) -> None: ...
    @property
    def local_address(self) -> str: ...
    def register_mem(
        self, obj: Registrable, mem_type: MemType = MemType.HOST, device: Optional[str] = None
    ) -> MemHandle: ...
    def deregister_mem(self, handle: MemHandle) -> None: ...
    def alloc_mem(self, nbytes: int) -> HostMemory:
        """Zeroed host memory the engine owns, registered; shared memory under shm/auto."""
    def connect(self, remote: str, timeout_ms: int = 1000) -> None: ...
    def disconnect(self, remote: str, timeout_ms: int = 1000) -> None:
        """Closes the connection; a peer the engine already dropped as gone is no error."""
    def transfer_sync(
        self, remote: str, op: TransferOp, descs: Iterable[DescLike], timeout_ms: int = 1000
    ) -> None: ...
    def transfer_async(
        self, remote: str, op: TransferOp, descs: Iterable[DescLike], timeout_ms: int = 1000
    ) -> TransferReq: ...
    def send_notify(
        self, remote: str, msg: bytes, timeout_ms: int = 1000, name: str = ""
    ) -> None: ...
    def get_notifies(self) -> list[tuple[str, bytes]]: ...
    def get_notifications(self) -> list[tuple[str, str, bytes, Optional[str]]]: ...
    def prepare_local(self, entries: EntriesLike) -> PreparedList: ...
    def prepare_remote(
        self, remote: str, entries: EntriesLike, timeout_ms: int = 1000
    ) -> PreparedList: ...
    def make_transfer(
        self,
        op: TransferOp,
        local: PreparedList,
        local_idx: IndicesLike,
        remote: PreparedList,
        remote_idx: IndicesLike,
        notif_msg: Optional[bytes] = None,
        notif_name: str = "",
    ) -> PreparedXfer: ...
    def local_metadata(self) -> bytes: ...
    def partial_metadata(self, handles: Sequence[MemHandle]) -> bytes: ...
    def add_remote(self, blob: bytes, timeout_ms: int = 1000) -> str: ...
    def remove_remote(self, name: str) -> None: ...
    def check_remote(self, name: str) -> bool: ...
    def publish_label(self, label: str, blob: bytes) -> None: ...
    def fetch_label(self, name: str, label: str, timeout_ms: int = 1000) -> Optional[bytes]: ...
    def set_listed(self, listed: bool) -> None: ...
    def capabilities(self) -> dict[str, Any]: ...
    def finalize(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...
    def _transfer_sync_loop(
        self,
        remote: str,
        op: TransferOp,
        desc: Optional[TransferOpDesc],
        iters: int,
        timeout_ms: int = 1000,
    ) -> float: ...

# hmc.kv

class Role:
    """A cluster's role."""

    PROMPT: ClassVar[Role]
    DECODER: ClassVar[Role]
    def __int__(self) -> int: ...

class DataType:
    """Element type of a cache's tensors."""

    FP8: ClassVar[DataType]
    F16: ClassVar[DataType]
    BF16: ClassVar[DataType]
    F32: ClassVar[DataType]
    I8: ClassVar[DataType]
    U8: ClassVar[DataType]
    I32: ClassVar[DataType]
    def __int__(self) -> int: ...

class CacheDesc:
    """``num_tensors`` tensors of ``dtype`` and ``shape``."""

    num_tensors: int
    dtype: DataType
    shape: list[int]
    placement: MemType
    device: Optional[str]
    def __init__(
        self,
        num_tensors: int,
        dtype: DataType,
        shape: Sequence[int],
        placement: MemType = MemType.HOST,
        device: Optional[str] = None,
    ) -> None: ...

class CacheKey:
    """A request's whole cache at a prompt cluster."""

    prompt_cluster_id: int
    req_id: int
    model_id: int
    prefix_id: int
    def __init__(
        self, prompt_cluster_id: int, req_id: int, model_id: int = 0, prefix_id: int = 0
    ) -> None: ...

class BlocksCacheKey:
    """A paged cache's blocks at a cluster."""

    prompt_cluster_id: int
    model_id: int
    def __init__(self, prompt_cluster_id: int, model_id: int = 0) -> None: ...

class CacheTensor(Buffer):
    """One tensor of a host cache as a writable buffer."""

    addr: int
    def __len__(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

class Cache:
    """A registered cache."""

    id: int
    desc: CacheDesc
    tensor_addrs: list[int]
    tensors: list[CacheTensor]

class DataDist:
    """One cluster's KV-cache service."""

    cluster_id: int
    role: Role
    def __init__(self, cluster_id: int, role: Role, engine: Optional[Engine] = None) -> None: ...
    def initialize(
        self,
        local: str,
        options: Optional[Mapping[str, str]] = None,
        *,
        metadata: Optional[str] = None,
        name: Optional[str] = None,
    ) -> None: ...
    @property
    def local_address(self) -> str: ...
    def link_clusters(
        self, clusters: Sequence[tuple[int, str]], timeout_ms: int = 1000
    ) -> list[Optional[BaseException]]: ...
    def unlink_clusters(self, ids: Sequence[int]) -> list[Optional[BaseException]]: ...
    def links(self) -> list[tuple[int, str]]: ...
    def allocate_cache(
        self,
        desc: CacheDesc,
        keys: Sequence[CacheKey] = ...,
        blocks_key: Optional[BlocksCacheKey] = None,
    ) -> Cache: ...
    def register_kv_cache(
        self,
        desc: CacheDesc,
        tensors: Sequence[Registrable],
        keys: Sequence[CacheKey] = ...,
        blocks_key: Optional[BlocksCacheKey] = None,
    ) -> Cache: ...
    def deallocate_cache(self, cache: Cache) -> None: ...
    def pull_kv_cache(self, src: CacheKey, dst: Cache, timeout_ms: int = 1000) -> None: ...
    def push_kv_cache(
        self, src: Cache, dst_cluster: int, dst: CacheKey, timeout_ms: int = 1000
    ) -> None: ...
    def pull_kv_blocks(
        self,
        src: BlocksCacheKey,
        dst: Cache,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        layers: Optional[tuple[int, int]] = None,
        tensors_per_layer: int = 2,
        timeout_ms: int = 1000,
    ) -> None: ...
    def push_kv_blocks(
        self,
        src: Cache,
        dst_cluster: int,
        dst: BlocksCacheKey,
        src_blocks: Sequence[int],
        dst_blocks: Sequence[int],
        layers: Optional[tuple[int, int]] = None,
        tensors_per_layer: int = 2,
        timeout_ms: int = 1000,
    ) -> None: ...
    def copy_kv_blocks(
        self, cache: Cache, src_blocks: Sequence[int], dst_blocks: Sequence[int]
    ) -> None: ...
    def finalize(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...

# hmc.rpc

class Client:
    """An RPC client."""

    def __init__(
        self, address: str, timeout_ms: int = 30000, connect_timeout_ms: int = 5000
    ) -> None: ...
    @property
    def address(self) -> str: ...
    def call(self, method: int, payload: bytes, timeout_ms: Optional[int] = None) -> bytes: ...
    def echo(self, payload: bytes, timeout_ms: Optional[int] = None) -> bytes: ...
    def uppercase(self, text: str, timeout_ms: Optional[int] = None) -> str: ...
    def complex(
        self, label: str, values: Sequence[int], timeout_ms: Optional[int] = None
    ) -> dict[str, Any]: ...

class Server:
    """An RPC server with Python handlers."""

    def __init__(self, bind: str, demo: bool = True, workers: int = 4) -> None: ...
    def register(self, method: int, handler: Callable[[bytes], bytes]) -> None: ...
    def start(self) -> None: ...
    @property
    def address(self) -> str: ...
    def serve(self) -> None: ...
    def shutdown(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> bool: ...
