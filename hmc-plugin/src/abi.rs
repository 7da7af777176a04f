//! The C ABI of an HMC transport plugin: the `#[repr(C)]` tables, opaque handles, status codes and constants from which cbindgen generates `include/hmc_plugin.h`.
//!
//! Everything here crosses a shared-library boundary, so only plain C types do: integers,
//! raw pointers to opaque handles, `(pointer, length)` slices and function pointers. No
//! Rust type, no C++ class, no allocator crosses: whoever allocates a handle frees it.
//!
//! # Versioning
//!
//! A plugin exports one symbol, `hmc_plugin_init` ([`HmcPluginInitFn`]). The host passes
//! its ABI version and a zeroed [`HmcPluginApi`] of `out_size` bytes; the plugin fills at
//! most that many bytes and sets `header.struct_size` to how many it filled. Tables only
//! grow by appended fields (a minor version), so the host reads fields up to
//! `struct_size` and treats later ones as absent. A different major version is refused by
//! both sides.
//!
//! # Handles, ownership and threads
//!
//! | handle | made by | released by | may be used from |
//! | --- | --- | --- | --- |
//! | [`HmcComm`] | `comm_open` | `comm_destroy`, once, after every other handle of it | any thread, concurrently |
//! | [`HmcEndpoint`] | `connect` | `endpoint_release` | any thread, concurrently |
//! | [`HmcReg`] | `register_mem` | `deregister` (returns only when no peer can touch the memory) | any thread, concurrently |
//! | [`HmcRemoteKey`] | `import` | `remote_key_release` | any thread, concurrently |
//! | [`HmcTransfer`] | `transfer_start`, `transfer_start_wake` | `transfer_release` (cancels; returns only when the transfer no longer touches local memory, nor, since ABI 1.3, the peer's: see below) | one thread at a time |
//! | [`HmcMemory`] | `memory_open` | `memory_destroy`, once, after every buffer of it | any thread, concurrently |
//! | [`HmcBuffer`] | `memory_alloc` | `memory_free` | any thread, concurrently |
//!
//! The host keeps every endpoint, registration and remote key named by a transfer alive
//! until that transfer is released, and releases every handle before the communicator.
//!
//! # When a transfer ends (ABI 1.3)
//!
//! Once `transfer_poll` has returned anything but [`HMC_PENDING`] for a transfer (`HMC_OK`,
//! an error, [`HMC_ERR_DEADLINE`], [`HMC_ERR_CANCELLED`]), or `transfer_release` has
//! returned for it, no byte of it lands afterwards in either side's memory: not in the
//! initiator's local memory, and for a WRITE not in the target's, so that both sides may
//! reuse or free that memory at once. A target drops whatever arrives for a transfer it has
//! ended. A plugin whose target applies received bytes on its own (a byte stream the
//! target keeps reading, as TCP's) cannot always know that at the moment it reports the end
//! without a round trip; it provides `endpoint_settle`, and then the rule holds for the
//! target's memory once `endpoint_settle` on the transfer's endpoint has returned `HMC_OK`
//! (the host calls it before it reports the early end of a WRITE: hmc-core's
//! `Communicator::settle`). Without `endpoint_settle` the rule holds at the end itself.
//!
//! Plugins that declare ABI 1.0 to 1.2 promised this for local memory only: the host
//! treats their `endpoint_settle` as absent, and its `Communicator::settle` answers
//! `Unsupported` for them (the end of their WRITEs is not known to be final).

use std::ffi::{c_char, c_void};

/// Major version of this ABI. A plugin built for another major is refused.
pub const HMC_PLUGIN_ABI_MAJOR: u32 = 1;
/// Minor version of this ABI: fields appended to the tables, or rules stated, since the
/// major began (1.1: `HmcPluginApi::transfer_start_wake`; 1.2: `HMC_ERR_LIMIT`'s message
/// begins with the limit's name; 1.3: no byte of a transfer lands in either side's memory
/// after it ended, and `HmcPluginApi::endpoint_settle`).
pub const HMC_PLUGIN_ABI_MINOR: u32 = 3;

/// Success.
pub const HMC_OK: i32 = 0;
/// Not finished yet (`transfer_poll`), or nothing there yet (`recv_notification`): wait
/// for the communicator's event fd and ask again.
pub const HMC_PENDING: i32 = 1;
/// A malformed argument, or a handle of another communicator.
pub const HMC_ERR_INVALID_ARGUMENT: i32 = -1;
/// An offset and length outside a registered region.
pub const HMC_ERR_OUT_OF_BOUNDS: i32 = -2;
/// The region does not allow this access.
pub const HMC_ERR_ACCESS_DENIED: i32 = -3;
/// A remote key that is unknown, forged or of a deregistered region.
pub const HMC_ERR_INVALID_KEY: i32 = -4;
/// The deadline passed.
pub const HMC_ERR_DEADLINE: i32 = -5;
/// Cancelled by `transfer_release` or `comm_close`.
pub const HMC_ERR_CANCELLED: i32 = -6;
/// The peer is unknown, unreachable or went away.
pub const HMC_ERR_PEER: i32 = -7;
/// The communicator was closed.
pub const HMC_ERR_CLOSED: i32 = -8;
/// The peer broke the protocol.
pub const HMC_ERR_PROTOCOL: i32 = -9;
/// The plugin cannot do this.
pub const HMC_ERR_UNSUPPORTED: i32 = -10;
/// The plugin cannot use memory of this device kind.
pub const HMC_ERR_UNSUPPORTED_MEMORY: i32 = -11;
/// Out of memory.
pub const HMC_ERR_OUT_OF_MEMORY: i32 = -12;
/// A configured limit was reached. Since ABI 1.2 the message reads `NAME: VALUE > MAX; how
/// to raise it` (the host reports that named limit); a 1.0 or 1.1 plugin's message is free
/// text, which the host reports without the limit's name.
pub const HMC_ERR_LIMIT: i32 = -13;
/// An operating-system call failed.
pub const HMC_ERR_IO: i32 = -14;
/// A library or device the plugin needs is not present.
pub const HMC_ERR_UNAVAILABLE: i32 = -15;
/// A bug in the plugin (a Rust plugin's panic lands here).
pub const HMC_ERR_INTERNAL: i32 = -16;
/// The caller's buffer is too small; the length out-parameter holds the length needed.
pub const HMC_ERR_TOO_SMALL: i32 = -17;
/// The host's ABI major differs from the plugin's (`hmc_plugin_init`).
pub const HMC_ERR_VERSION: i32 = -18;

/// `HmcTableHeader::capabilities` of an [`HmcPluginApi`]: it provides a communicator
/// (`comm_open` through `recv_notification`).
pub const HMC_PLUGIN_PROVIDES_COMMUNICATOR: u64 = 1;
/// `HmcTableHeader::capabilities`: it provides a device memory backend (`memory_open`
/// through `memory_copy`).
pub const HMC_PLUGIN_PROVIDES_MEMORY: u64 = 2;

/// `HmcCommCaps::flags`: `notify`/`recv_notification` work.
pub const HMC_CAP_NOTIFICATIONS: u32 = 1;
/// `HmcCommCaps::flags`: transfers move bytes with no intermediate CPU copy.
pub const HMC_CAP_ZERO_COPY: u32 = 2;
/// `HmcCommCaps::flags`: `rekey` revokes a live registration's keys.
pub const HMC_CAP_REKEY: u32 = 4;
/// `HmcCommCaps::flags`: the transport reaches communicators of its own process only (a
/// loopback or test transport); hmc-plugin-kit then skips its two-process cases.
pub const HMC_CAP_SAME_PROCESS_ONLY: u32 = 8;

/// `max_transfer_len` and `max_batch_len` of [`HmcCommCaps`]: no limit (0 allows nothing).
pub const HMC_NO_LIMIT: u64 = u64::MAX;

/// Peers may READ a registered region.
pub const HMC_ACCESS_READ: u32 = 1;
/// Peers may WRITE a registered region.
pub const HMC_ACCESS_WRITE: u32 = 2;

/// A transfer copies remote bytes into local memory.
pub const HMC_OP_READ: u32 = 0;
/// A transfer copies local bytes into remote memory; complete when visible at the target.
pub const HMC_OP_WRITE: u32 = 1;

/// No deadline (`deadline_ns` arguments).
pub const HMC_NO_DEADLINE: u64 = 0xFFFF_FFFF_FFFF_FFFF;

/// Log level of [`HmcHostApi::log`]: an error.
pub const HMC_LOG_ERROR: u32 = 1;
/// Log level: a warning.
pub const HMC_LOG_WARN: u32 = 2;
/// Log level: information.
pub const HMC_LOG_INFO: u32 = 3;
/// Log level: debugging detail.
pub const HMC_LOG_DEBUG: u32 = 4;

/// The first member of every table: what it is, for which ABI, and how much of it the
/// writer filled.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcTableHeader {
    /// Bytes of the table the writer filled, header included. The reader reads no field
    /// at or past this offset.
    pub struct_size: usize,
    /// The writer's ABI major.
    pub abi_major: u32,
    /// The writer's ABI minor.
    pub abi_minor: u32,
    /// The writer's name, NUL-terminated, static for the life of the process (a plugin's
    /// name is how hosts choose it: `--data-plane NAME`).
    pub name: *const c_char,
    /// What the table provides (`HMC_PLUGIN_PROVIDES_*` bits; 0 for the host's table).
    pub capabilities: u64,
}

/// A communicator: one local endpoint of the transport, listening for peers. Opaque.
pub struct HmcComm {
    _opaque: [u8; 0],
}

/// A connection from a communicator to one peer. Opaque.
pub struct HmcEndpoint {
    _opaque: [u8; 0],
}

/// Local memory registered with a communicator. Opaque.
pub struct HmcReg {
    _opaque: [u8; 0],
}

/// A peer's region imported for use on one endpoint. Opaque.
pub struct HmcRemoteKey {
    _opaque: [u8; 0],
}

/// One transfer batch in progress. Opaque.
pub struct HmcTransfer {
    _opaque: [u8; 0],
}

/// A device memory backend: one device's allocator and copy engine. Opaque.
pub struct HmcMemory {
    _opaque: [u8; 0],
}

/// One allocation of an [`HmcMemory`]. Opaque.
pub struct HmcBuffer {
    _opaque: [u8; 0],
}

/// What a memory backend serves (`memory_info`). Appended to like the tables.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcMemoryInfo {
    /// Bytes the plugin filled; the host zeroes the struct and passes its size here.
    pub struct_size: usize,
    /// The device family's wire number (128–255 for third parties).
    pub device_kind: u32,
    /// The device's ordinal.
    pub device_ordinal: u32,
    /// Largest single allocation in bytes.
    pub max_alloc: u64,
}

/// A range of one device's memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcRegion {
    /// Start address in the device's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The device family's wire number (0 = host; see hmc-core's `DeviceKind`).
    pub device_kind: u32,
    /// The device's ordinal within its family.
    pub device_ordinal: u32,
}

/// A peer's exported region, as `import` receives it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcRemoteDesc {
    /// Where the region is at its owner (as the owner said; check it against your own
    /// table at the target, never trust it).
    pub region: HmcRegion,
    /// `HMC_ACCESS_*` bits the owner granted.
    pub access: u32,
    /// The key bytes the owner's `export_key` produced.
    pub key: *const u8,
    /// Length of `key`.
    pub key_len: usize,
}

/// One element of a transfer batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcTransferDesc {
    /// Local registered memory.
    pub local: *mut HmcReg,
    /// Offset into the local registration.
    pub local_offset: u64,
    /// Imported remote region.
    pub remote: *mut HmcRemoteKey,
    /// Offset into the remote region.
    pub remote_offset: u64,
    /// Bytes to move.
    pub len: u64,
}

/// What a communicator can do (`comm_capabilities`). Appended to like the tables.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcCommCaps {
    /// Bytes the plugin filled; the host zeroes the struct and passes its size here.
    pub struct_size: usize,
    /// `HMC_CAP_*` bits.
    pub flags: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Largest `notify` message in bytes (0 without notifications).
    pub max_notification_len: u64,
    /// Largest single descriptor of a transfer, in bytes.
    pub max_transfer_len: u64,
    /// Most descriptors in one transfer.
    pub max_batch_len: u64,
    /// Device kinds `register_mem` accepts: bit `k % 64` of word `k / 64` for wire number `k`.
    pub local_kinds: [u64; 4],
    /// Device kinds a peer's region may live on for this transport to reach it.
    pub remote_kinds: [u64; 4],
}

/// A received notification (`recv_notification`): the host provides the buffers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcNotification {
    /// The sender's tag (written by the plugin).
    pub tag: u64,
    /// Buffer for the sender's address text, as the sender's `comm_address` gave it.
    pub from: *mut u8,
    /// Capacity of `from`.
    pub from_cap: usize,
    /// Length written to `from` (written by the plugin).
    pub from_len: usize,
    /// Buffer for the message.
    pub msg: *mut u8,
    /// Capacity of `msg` (at least the communicator's `max_notification_len`).
    pub msg_cap: usize,
    /// Length written to `msg` (written by the plugin).
    pub msg_len: usize,
}

/// What the host offers a plugin. Valid for the life of the process.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcHostApi {
    /// `name` is the host's (`"hmc"`), `capabilities` 0.
    pub header: HmcTableHeader,
    /// Writes `len` bytes of UTF-8 at `msg` to the host's log at `level`
    /// (`HMC_LOG_*`). Thread-safe; may be called from any thread, also the plugin's own.
    pub log: Option<unsafe extern "C" fn(level: u32, msg: *const u8, len: usize)>,
}

/// What a plugin provides: filled by `hmc_plugin_init`. Every function is thread-safe
/// unless the module docs' handle table says otherwise; every function returning `int32_t`
/// returns [`HMC_OK`] or a negative `HMC_ERR_*` and, on error, sets the calling thread's
/// last-error string. `deadline_ns` arguments are absolute `CLOCK_MONOTONIC` nanoseconds
/// ([`HMC_NO_DEADLINE`]: none).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmcPluginApi {
    /// `name`: the transport's name; `capabilities`: `HMC_PLUGIN_PROVIDES_*`.
    pub header: HmcTableHeader,
    /// The transport's wire number (hmc-core's `TransportId`; 128–255 for third parties).
    pub transport_id: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The last error message set on the calling thread, NUL-terminated, valid until the
    /// next call into the plugin on this thread; NULL or "" when none. Set it in the table
    /// first in `hmc_plugin_init`: an init failure's message is read through it.
    pub last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    /// Opens a communicator. `config` is `key=value` lines (the host passes `bind=IP` and
    /// may pass `max_pending_notifications=N`; ignore keys you do not know).
    pub comm_open:
        Option<unsafe extern "C" fn(config: *const u8, len: usize, out: *mut *mut HmcComm) -> i32>,
    /// Closes: transfers in flight end (their next poll returns `HMC_ERR_CLOSED` or
    /// `HMC_ERR_CANCELLED`), later calls fail with `HMC_ERR_CLOSED`; handles stay valid and
    /// their release functions still work.
    pub comm_close: Option<unsafe extern "C" fn(comm: *mut HmcComm)>,
    /// Frees the communicator, after the host released every handle of it.
    pub comm_destroy: Option<unsafe extern "C" fn(comm: *mut HmcComm)>,
    /// An eventfd (or any fd that polls readable) the plugin signals whenever a transfer
    /// may have progressed or a notification arrived. Owned by the plugin, valid until
    /// `comm_destroy`; the host only polls and reads it. Returns the fd (>= 0), or a
    /// negative `HMC_ERR_*`.
    pub comm_event_fd: Option<unsafe extern "C" fn(comm: *mut HmcComm) -> i32>,
    /// The address peers connect to, as text (`tcp://IP:PORT`, `unix:///path`, or
    /// `<transport id>:<hex>`), without a NUL; `*len` excludes any NUL. With `cap` too
    /// small (0 included) it returns `HMC_ERR_TOO_SMALL` and sets `*len` to the length
    /// needed.
    pub comm_address: Option<
        unsafe extern "C" fn(comm: *mut HmcComm, buf: *mut u8, cap: usize, len: *mut usize) -> i32,
    >,
    /// Fills `out` up to `out->struct_size` bytes and sets `struct_size` to what it filled.
    pub comm_capabilities:
        Option<unsafe extern "C" fn(comm: *mut HmcComm, out: *mut HmcCommCaps) -> i32>,
    /// Connects to the peer at `addr` (address text), by the deadline. May block; the host
    /// calls it from a thread of its own.
    pub connect: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            addr: *const u8,
            addr_len: usize,
            deadline_ns: u64,
            out: *mut *mut HmcEndpoint,
        ) -> i32,
    >,
    /// Releases an endpoint.
    pub endpoint_release: Option<unsafe extern "C" fn(comm: *mut HmcComm, ep: *mut HmcEndpoint)>,
    /// Registers memory for `access` (`HMC_ACCESS_*`). The host keeps it allocated until
    /// `deregister` returns.
    pub register_mem: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            region: *const HmcRegion,
            access: u32,
            out: *mut *mut HmcReg,
        ) -> i32,
    >,
    /// Deregisters. Must not return while a peer can still read or write the memory.
    pub deregister: Option<unsafe extern "C" fn(comm: *mut HmcComm, reg: *mut HmcReg)>,
    /// Writes the key a peer needs to reach `reg` into `buf`. Refuses a registration of
    /// another communicator with `HMC_ERR_INVALID_ARGUMENT`.
    pub export_key: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            reg: *mut HmcReg,
            buf: *mut u8,
            cap: usize,
            len: *mut usize,
        ) -> i32,
    >,
    /// Revokes every key exported for `reg` so far: returns 1 when revoked, 0 when this
    /// registration cannot be rekeyed, or a negative `HMC_ERR_*`. NULL: not supported.
    pub rekey: Option<unsafe extern "C" fn(comm: *mut HmcComm, reg: *mut HmcReg) -> i32>,
    /// Imports a peer's region for use on `ep`.
    pub import: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            ep: *mut HmcEndpoint,
            desc: *const HmcRemoteDesc,
            out: *mut *mut HmcRemoteKey,
        ) -> i32,
    >,
    /// Releases an imported key.
    pub remote_key_release:
        Option<unsafe extern "C" fn(comm: *mut HmcComm, key: *mut HmcRemoteKey)>,
    /// Starts a batch of `count` descriptors of one direction (`HMC_OP_*`) against `ep`.
    /// `descs` is read during the call only. Check every descriptor before moving any
    /// byte; end by the deadline (check it between chunks); signal the event fd when done.
    pub transfer_start: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            ep: *mut HmcEndpoint,
            op: u32,
            descs: *const HmcTransferDesc,
            count: usize,
            deadline_ns: u64,
            out: *mut *mut HmcTransfer,
        ) -> i32,
    >,
    /// `HMC_PENDING` while running, then `HMC_OK` or the error, from then on. May drive
    /// progress; must not block. A deadline passed while running: `HMC_ERR_DEADLINE`.
    /// Return a terminal result (anything but `HMC_PENDING`) only once no byte of the
    /// transfer can land afterwards in local memory, nor (ABI 1.3) in the target's memory
    /// of a WRITE, unless the plugin provides `endpoint_settle`, which then makes the
    /// target's side final (see the module docs).
    pub transfer_poll: Option<unsafe extern "C" fn(comm: *mut HmcComm, t: *mut HmcTransfer) -> i32>,
    /// Cancels if still running and frees the transfer. Must not return while the
    /// transfer can still touch its local memory, nor (ABI 1.3) while a byte of a WRITE
    /// can still land at the target, unless the plugin provides `endpoint_settle`, which
    /// then makes that final. Either side may reuse the memory once it returns.
    pub transfer_release: Option<unsafe extern "C" fn(comm: *mut HmcComm, t: *mut HmcTransfer)>,
    /// Sends a small message to the peer of `ep`, by the deadline. May block; the host
    /// calls it from a thread of its own.
    pub notify: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            ep: *mut HmcEndpoint,
            tag: u64,
            msg: *const u8,
            len: usize,
            deadline_ns: u64,
        ) -> i32,
    >,
    /// Takes the next notification without blocking: `HMC_OK` with `out` filled, or
    /// `HMC_PENDING` when none is queued. Buffers too small: set `from_len` and `msg_len`
    /// to the lengths needed, return `HMC_ERR_TOO_SMALL`, keep the notification queued.
    pub recv_notification:
        Option<unsafe extern "C" fn(comm: *mut HmcComm, out: *mut HmcNotification) -> i32>,
    /// Opens the memory backend of one device; `config` as for `comm_open` (hosts pass
    /// `ordinal=N`). Thread-safe handle, freed by `memory_destroy` after its buffers.
    pub memory_open: Option<
        unsafe extern "C" fn(config: *const u8, len: usize, out: *mut *mut HmcMemory) -> i32,
    >,
    /// Frees a memory backend, after the host freed every buffer of it.
    pub memory_destroy: Option<unsafe extern "C" fn(mem: *mut HmcMemory)>,
    /// Fills `out` up to `out->struct_size` bytes and sets `struct_size` to what it filled.
    pub memory_info:
        Option<unsafe extern "C" fn(mem: *mut HmcMemory, out: *mut HmcMemoryInfo) -> i32>,
    /// Allocates `len` bytes (0 allowed) on the device; `*addr` is where they are in the
    /// device's address space, stable until `memory_free`. `HMC_ERR_OUT_OF_MEMORY` when
    /// it cannot.
    pub memory_alloc: Option<
        unsafe extern "C" fn(
            mem: *mut HmcMemory,
            len: u64,
            out: *mut *mut HmcBuffer,
            addr: *mut u64,
        ) -> i32,
    >,
    /// Frees an allocation.
    pub memory_free: Option<unsafe extern "C" fn(mem: *mut HmcMemory, buf: *mut HmcBuffer)>,
    /// Copies `src` to `dst` (equal lengths; each host memory or this device's) and
    /// returns when the bytes are there. The host checks lengths and devices first.
    pub memory_copy: Option<
        unsafe extern "C" fn(
            mem: *mut HmcMemory,
            dst: *const HmcRegion,
            src: *const HmcRegion,
        ) -> i32,
    >,
    /// ABI 1.1, optional (NULL: the host uses `transfer_start` and the event fd). As
    /// `transfer_start`, but the plugin tells the host that this transfer may have
    /// progressed by calling `wake(wake_ctx)` instead of signalling the event fd: the host's
    /// waiting task is woken directly, without a trip through the event fd and the
    /// host's poller. Call it from any thread, as often as you like (the host then calls
    /// `transfer_poll`); never after `transfer_release` returned for this transfer.
    /// `wake_ctx` is the host's, valid until then.
    pub transfer_start_wake: Option<
        unsafe extern "C" fn(
            comm: *mut HmcComm,
            ep: *mut HmcEndpoint,
            op: u32,
            descs: *const HmcTransferDesc,
            count: usize,
            deadline_ns: u64,
            wake: HmcWakeFn,
            wake_ctx: *const c_void,
            out: *mut *mut HmcTransfer,
        ) -> i32,
    >,
    /// ABI 1.3, optional (NULL: a transfer's end is final by itself, the rule of the module
    /// docs holds when `transfer_poll` returns a terminal result or `transfer_release`
    /// returns). Makes sure that no byte of a WRITE on `ep` that ended early (released,
    /// or ended by its deadline or an error) lands at the peer any more: `HMC_OK` once the
    /// peer confirmed it dropped the rest (or there was nothing to drop); then the peer may
    /// reuse that memory. An error when that cannot be confirmed by the deadline
    /// (`HMC_ERR_DEADLINE`: a stopped or overloaded peer; `HMC_ERR_PEER`: unreachable;
    /// `HMC_ERR_UNSUPPORTED`: a peer of an older version), its message saying that bytes the
    /// peer already holds may still land; the host may call it again. May block until the
    /// deadline; the host calls it from a thread of its own. Ignored in a table that
    /// declares a minor below 3.
    pub endpoint_settle: Option<
        unsafe extern "C" fn(comm: *mut HmcComm, ep: *mut HmcEndpoint, deadline_ns: u64) -> i32,
    >,
}

/// The host's wake-up for one transfer (`transfer_start_wake`): called by the plugin with
/// the `wake_ctx` it was given, from any thread, whenever that transfer may have
/// progressed. It does not block and does not call into the plugin, so the plugin may
/// call it with its own locks held.
pub type HmcWakeFn = unsafe extern "C" fn(wake_ctx: *const c_void);

/// The signature of `hmc_plugin_init`, the one symbol a plugin exports. Returns `HMC_OK`
/// after filling at most `out_size` bytes of `out` (a zeroed table); `HMC_ERR_VERSION`
/// when `host_abi_major` is not the plugin's. `host` is valid for the life of the process.
pub type HmcPluginInitFn = unsafe extern "C" fn(
    host_abi_major: u32,
    host_abi_minor: u32,
    host: *const HmcHostApi,
    out: *mut HmcPluginApi,
    out_size: usize,
) -> i32;

/// The bytes of [`HmcPluginApi`] that ABI 1.0 requires: through `memory_copy`.
/// Fixed when fields are appended: a 1.0 plugin fills this much and no more.
///
/// cbindgen:ignore
pub const HMC_PLUGIN_API_V1_0_SIZE: usize = std::mem::offset_of!(HmcPluginApi, memory_copy)
    + std::mem::size_of::<Option<unsafe extern "C" fn()>>();

/// A name for a status code, for error messages.
pub fn status_name(code: i32) -> &'static str {
    match code {
        HMC_OK => "HMC_OK",
        HMC_PENDING => "HMC_PENDING",
        HMC_ERR_INVALID_ARGUMENT => "HMC_ERR_INVALID_ARGUMENT",
        HMC_ERR_OUT_OF_BOUNDS => "HMC_ERR_OUT_OF_BOUNDS",
        HMC_ERR_ACCESS_DENIED => "HMC_ERR_ACCESS_DENIED",
        HMC_ERR_INVALID_KEY => "HMC_ERR_INVALID_KEY",
        HMC_ERR_DEADLINE => "HMC_ERR_DEADLINE",
        HMC_ERR_CANCELLED => "HMC_ERR_CANCELLED",
        HMC_ERR_PEER => "HMC_ERR_PEER",
        HMC_ERR_CLOSED => "HMC_ERR_CLOSED",
        HMC_ERR_PROTOCOL => "HMC_ERR_PROTOCOL",
        HMC_ERR_UNSUPPORTED => "HMC_ERR_UNSUPPORTED",
        HMC_ERR_UNSUPPORTED_MEMORY => "HMC_ERR_UNSUPPORTED_MEMORY",
        HMC_ERR_OUT_OF_MEMORY => "HMC_ERR_OUT_OF_MEMORY",
        HMC_ERR_LIMIT => "HMC_ERR_LIMIT",
        HMC_ERR_IO => "HMC_ERR_IO",
        HMC_ERR_UNAVAILABLE => "HMC_ERR_UNAVAILABLE",
        HMC_ERR_INTERNAL => "HMC_ERR_INTERNAL",
        HMC_ERR_TOO_SMALL => "HMC_ERR_TOO_SMALL",
        HMC_ERR_VERSION => "HMC_ERR_VERSION",
        _ => "an unknown status code",
    }
}

/// Sets bit `kind` in a device-kind mask of [`HmcCommCaps`].
pub fn kind_mask_set(mask: &mut [u64; 4], kind: u8) {
    mask[kind as usize / 64] |= 1 << (kind % 64);
}

/// Whether bit `kind` is set in a device-kind mask.
pub fn kind_mask_has(mask: &[u64; 4], kind: u8) -> bool {
    mask[kind as usize / 64] & (1 << (kind % 64)) != 0
}
