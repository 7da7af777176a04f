//! Checks of the ABI itself, which a Rust trait kit cannot see: the version handshake, the table size a plugin fills, last-error messages, `comm_address`'s text and `comm_event_fd`, and a bounded notification queue. The raw ones call the library's table directly, in the case's own process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hmc_core::testing::cases::About;
use hmc_core::{Communicator, Deadline, Error, PeerAddr};
use hmc_plugin::abi::*;
use hmc_plugin::{Plugin, PluginCommunicator};

use crate::Args;
use crate::needs::Needs;

/// The checks, in the order they run: name, what it checks and expects, what it needs.
pub const CHECKS: &[(&str, About, Needs)] = &[
    (
        "abi::loads_through_the_loader",
        About {
            checks: "the loader's checks: permissions, dlopen(RTLD_NOW), hmc_plugin_init, the \
                     table's size, name and required functions",
            expects: "none (the loader's message says what to change)",
        },
        Needs::Nothing,
    ),
    (
        "abi::refuses_another_abi_major",
        About {
            checks: "hmc_plugin_init called with host_abi_major = HMC_PLUGIN_ABI_MAJOR + 1",
            expects: "HMC_ERR_VERSION",
        },
        Needs::Nothing,
    ),
    (
        "abi::fills_no_more_than_offered",
        About {
            checks: "hmc_plugin_init offered only ABI 1.0's table size (an older host): no byte \
                     written past out_size, header.struct_size <= out_size",
            expects: "HMC_OK",
        },
        Needs::Nothing,
    ),
    (
        "abi::comm_address_and_event_fd",
        About {
            checks: "comm_address with cap 0 (HMC_ERR_TOO_SMALL and the length needed), then the \
                     text: that length, no NUL counted, a PeerAddr; comm_event_fd an open fd",
            expects: "HMC_ERR_TOO_SMALL, then HMC_OK",
        },
        Needs::Communicator,
    ),
    (
        "abi::errors_carry_a_message",
        About {
            checks: "connect to the address of a communicator that was closed and destroyed",
            expects: "an error whose last_error message is set",
        },
        Needs::Communicator,
    ),
    (
        "plugin::a_full_notification_queue_fails_with_a_named_limit",
        About {
            checks: "up to 64 notifications to a receiver opened with max_pending_notifications=8 \
                     that receives none",
            expects: "LimitExceeded naming the limit (HMC_ERR_LIMIT, message `NAME: ...`), not a \
                      stall until the deadline",
        },
        Needs::Communicator,
    ),
];

/// Runs check `name`; panics with what differed.
pub fn run(name: &str, args: &Args) {
    match name {
        "abi::loads_through_the_loader" => {
            if let Err(e) = Plugin::load(&args.plugin) {
                panic!("the loader refused the plugin: {e}");
            }
        }
        "abi::refuses_another_abi_major" => refuses_another_major(&args.plugin),
        "abi::fills_no_more_than_offered" => fills_no_more_than_offered(&args.plugin),
        "abi::comm_address_and_event_fd" => address_and_event_fd(&args.plugin, args),
        "abi::errors_carry_a_message" => on_runtime(errors_carry_a_message(args)),
        "plugin::a_full_notification_queue_fails_with_a_named_limit" => {
            on_runtime(full_notification_queue(args))
        }
        other => panic!("no check named {other}"),
    }
}

fn on_runtime(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}

/// The host table the raw checks hand the plugin: its log goes to `tracing`.
struct HostTable(HmcHostApi);
// SAFETY: immutable; the name points to a static C string.
unsafe impl Sync for HostTable {}

static HOST: HostTable = HostTable(HmcHostApi {
    header: HmcTableHeader {
        struct_size: std::mem::size_of::<HmcHostApi>(),
        abi_major: HMC_PLUGIN_ABI_MAJOR,
        abi_minor: HMC_PLUGIN_ABI_MINOR,
        name: c"hmc-plugin-kit".as_ptr(),
        capabilities: 0,
    },
    log: Some(host_log),
});

unsafe extern "C" fn host_log(_level: u32, msg: *const u8, len: usize) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the ABI says `msg` points to `len` readable bytes for this call.
    let bytes = unsafe { std::slice::from_raw_parts(msg, len) };
    tracing::info!(target: "plugin", "{}", String::from_utf8_lossy(bytes));
}

/// The plugin's `hmc_plugin_init`, from a `dlopen` of its own (never closed).
fn init_fn(path: &Path) -> HmcPluginInitFn {
    // SAFETY: loading the library runs its initialisers: the trust the author extends by
    // asking the kit to test it.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .unwrap_or_else(|e| panic!("dlopen: {e}"));
    let lib: &'static libloading::os::unix::Library = Box::leak(Box::new(lib));
    // SAFETY: the symbol has the signature hmc_plugin.h declares.
    let f = unsafe { lib.get::<HmcPluginInitFn>(b"hmc_plugin_init\0") }
        .unwrap_or_else(|e| panic!("no hmc_plugin_init: {e}"));
    *f
}

/// The table as the plugin fills it for this host's version.
fn table(path: &Path) -> HmcPluginApi {
    let init = init_fn(path);
    // SAFETY: an all-zero table is valid (null pointers, `None` functions).
    let mut api: HmcPluginApi = unsafe { std::mem::zeroed() };
    // SAFETY: `api` is a writable table of the size given; HOST lives forever.
    let code = unsafe {
        init(
            HMC_PLUGIN_ABI_MAJOR,
            HMC_PLUGIN_ABI_MINOR,
            &HOST.0,
            &mut api,
            std::mem::size_of::<HmcPluginApi>(),
        )
    };
    assert_eq!(code, HMC_OK, "hmc_plugin_init: {}", status_name(code));
    api
}

/// `HmcCommCaps::flags` of a communicator opened with the kit's configuration.
pub fn comm_flags(path: &Path, args: &Args) -> Result<u32, String> {
    let api = table(path);
    let config = args.comm_config();
    let mut comm: *mut HmcComm = std::ptr::null_mut();
    // SAFETY: `config` is readable for its length; `comm` is writable.
    let code = unsafe { api.comm_open.expect("checked")(config.as_ptr(), config.len(), &mut comm) };
    if code != HMC_OK {
        return Err(format!("comm_open: {}", last_error(&api)));
    }
    // SAFETY: all-zero is a valid HmcCommCaps.
    let mut caps: HmcCommCaps = unsafe { std::mem::zeroed() };
    caps.struct_size = std::mem::size_of::<HmcCommCaps>();
    // SAFETY: a live communicator; `caps` is writable for its struct_size.
    let code = unsafe { api.comm_capabilities.expect("checked")(comm, &mut caps) };
    // SAFETY: no other handle of `comm` exists.
    unsafe {
        api.comm_close.expect("checked")(comm);
        api.comm_destroy.expect("checked")(comm);
    }
    if code != HMC_OK {
        return Err(format!("comm_capabilities: {}", last_error(&api)));
    }
    Ok(caps.flags)
}

fn last_error(api: &HmcPluginApi) -> String {
    let Some(f) = api.last_error else {
        return "(no last_error function)".into();
    };
    // SAFETY: ABI: NULL or a NUL-terminated string valid until the next call on this thread.
    let p = unsafe { f() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: as above; copied at once.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

fn refuses_another_major(path: &Path) {
    let init = init_fn(path);
    // SAFETY: as in `table`.
    let mut api: HmcPluginApi = unsafe { std::mem::zeroed() };
    let major = HMC_PLUGIN_ABI_MAJOR + 1;
    // SAFETY: as in `table`.
    let code = unsafe {
        init(
            major,
            0,
            &HOST.0,
            &mut api,
            std::mem::size_of::<HmcPluginApi>(),
        )
    };
    assert_eq!(
        code,
        HMC_ERR_VERSION,
        "hmc_plugin_init(host_abi_major = {major}) returned {code} ({}); a plugin built for ABI \
         {HMC_PLUGIN_ABI_MAJOR} must return HMC_ERR_VERSION when the host's major differs \
         (hmc_plugin.h, hmc_plugin_init)",
        status_name(code)
    );
}

/// A table with room past it, to see what the plugin writes beyond `out_size`.
#[repr(C)]
struct Guarded {
    api: HmcPluginApi,
    tail: [u8; 256],
}

fn fills_no_more_than_offered(path: &Path) {
    const CANARY: u8 = 0xA5;
    let init = init_fn(path);
    let offered = HMC_PLUGIN_API_V1_0_SIZE;
    // SAFETY: all-zero bytes are a valid `Guarded`.
    let mut g: Guarded = unsafe { std::mem::zeroed() };
    let base = &mut g as *mut Guarded as *mut u8;
    let total = std::mem::size_of::<Guarded>();
    // SAFETY: `offered < total`; the bytes lie inside `g`. Only the bytes the plugin may not
    // touch are set; the table it may fill stays zeroed.
    unsafe { std::ptr::write_bytes(base.add(offered), CANARY, total - offered) };
    // SAFETY: `out` points to `offered` writable, zeroed bytes (and more the plugin must not
    // touch); HOST lives forever.
    let code = unsafe {
        init(
            HMC_PLUGIN_ABI_MAJOR,
            0,
            &HOST.0,
            base.cast::<HmcPluginApi>(),
            offered,
        )
    };
    assert_eq!(
        code,
        HMC_OK,
        "hmc_plugin_init offered {offered} bytes (ABI 1.0's table) returned {code} ({}): {}",
        status_name(code),
        last_error(&g.api)
    );
    // SAFETY: `offered..total` lies inside `g`.
    let after = unsafe { std::slice::from_raw_parts(base.add(offered), total - offered) };
    if let Some(i) = after.iter().position(|b| *b != CANARY) {
        panic!(
            "hmc_plugin_init was offered {offered} bytes (out_size) and wrote byte {} past them: \
             fill at most out_size bytes (copy a table built on the stack with \
             memcpy(out, &t, min(out_size, sizeof t)))",
            offered + i
        );
    }
    let filled = g.api.header.struct_size;
    assert!(
        filled <= offered,
        "header.struct_size is {filled} but out_size was {offered}: say how many bytes you \
         filled, at most out_size"
    );
}

fn address_and_event_fd(path: &Path, args: &Args) {
    let api = table(path);
    let config = args.comm_config();
    let mut comm: *mut HmcComm = std::ptr::null_mut();
    let open = api.comm_open.expect("checked by the loader");
    // SAFETY: `config` is readable for its length; `comm` is writable.
    let code = unsafe { open(config.as_ptr(), config.len(), &mut comm) };
    assert_eq!(code, HMC_OK, "comm_open: {}", last_error(&api));
    let address = api.comm_address.expect("checked by the loader");
    let mut needed = 0usize;
    // SAFETY: cap 0 with a null buffer: nothing may be written but `needed`.
    let code = unsafe { address(comm, std::ptr::null_mut(), 0, &mut needed) };
    assert_eq!(
        code,
        HMC_ERR_TOO_SMALL,
        "comm_address with cap 0 returned {code} ({}); it must return HMC_ERR_TOO_SMALL and set \
         *len to the length needed",
        status_name(code)
    );
    assert!(
        needed > 0,
        "comm_address: *len is 0 after HMC_ERR_TOO_SMALL"
    );
    let mut buf = vec![0xA5u8; needed + 8];
    let mut len = 0usize;
    // SAFETY: `buf` is writable for `needed` bytes (the cap given).
    let code = unsafe { address(comm, buf.as_mut_ptr(), needed, &mut len) };
    assert_eq!(
        code,
        HMC_OK,
        "comm_address with the {needed} bytes it asked for: {}",
        last_error(&api)
    );
    assert_eq!(
        len, needed,
        "comm_address asked for {needed} bytes and wrote {len}"
    );
    assert!(
        buf[needed..].iter().all(|b| *b == 0xA5),
        "comm_address wrote past its cap"
    );
    let text = std::str::from_utf8(&buf[..len]).expect("comm_address: not UTF-8");
    assert!(
        !text.contains('\0'),
        "comm_address's text `{}` holds a NUL: the length counts text bytes only, no NUL",
        text.escape_debug()
    );
    if let Err(e) = text.parse::<PeerAddr>() {
        panic!(
            "comm_address `{text}` is not an address hosts parse (`tcp://IP:PORT`, \
             `unix:///path`, `<transport id>:<hex>`): {e}"
        );
    }
    let fd_of = api.comm_event_fd.expect("checked by the loader");
    // SAFETY: a live communicator.
    let fd = unsafe { fd_of(comm) };
    // SAFETY: F_GETFD only asks whether `fd` is open.
    let open_fd = fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
    assert!(
        open_fd,
        "comm_event_fd returned {fd}, not an open file descriptor (it returns the fd itself, \
         not a status)"
    );
    // SAFETY: no other handle of `comm` exists.
    unsafe {
        api.comm_close.expect("checked")(comm);
        api.comm_destroy.expect("checked")(comm);
    }
}

fn open(args: &Args, extra: &str) -> Arc<PluginCommunicator> {
    let plugin = Plugin::load(&args.plugin).unwrap_or_else(|e| panic!("{e}"));
    let config = format!("{}{extra}", args.comm_config());
    Arc::new(PluginCommunicator::open(plugin, &config).unwrap_or_else(|e| panic!("comm_open: {e}")))
}

async fn errors_carry_a_message(args: &Args) {
    let gone = open(args, "");
    let address = gone.address();
    gone.close();
    drop(gone);
    let a = open(args, "");
    match a
        .connect(&address, Deadline::after(Duration::from_secs(5)))
        .await
    {
        Ok(_) => panic!(
            "connect to {address}, whose communicator was closed and destroyed, succeeded; it \
             must fail (HMC_ERR_PEER)"
        ),
        Err(e) => {
            let text = e.to_string();
            assert!(
                !text.contains("without a message"),
                "connect failed without setting the last-error string: {text}"
            );
        }
    }
}

async fn full_notification_queue(args: &Args) {
    const MAX: usize = 8;
    // The kit holds a plugin to the ABI minor it declares: the limit's name at the start of
    // HMC_ERR_LIMIT's message is a rule of ABI 1.2; before it the message is free text,
    // which the host reports as a limit without its name.
    let named = Plugin::load(&args.plugin)
        .map(|p| p.abi().1 >= 2)
        .unwrap_or(true);
    let receiver = open(args, &format!("max_pending_notifications={MAX}\n"));
    let sender = open(args, "");
    if !sender.capabilities().notifications {
        panic!("the plugin does not declare HMC_CAP_NOTIFICATIONS; the host needs notifications");
    }
    let ep = sender
        .connect(
            &receiver.address(),
            Deadline::after(Duration::from_secs(10)),
        )
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    for i in 0..64u64 {
        let deadline = Deadline::after(Duration::from_secs(5));
        match sender.notify(&ep, i, b"a full queue?", deadline).await {
            Ok(()) => {}
            Err(Error::LimitExceeded { limit, .. }) => {
                assert!(
                    i as usize >= MAX,
                    "notification {i} refused ({limit}) with fewer than {MAX} pending"
                );
                return;
            }
            Err(Error::InvalidArgument(m)) if !named && m.starts_with("limit reached") => {
                assert!(
                    i as usize >= MAX,
                    "notification {i} refused ({m}) with fewer than {MAX} pending"
                );
                return;
            }
            Err(e) if e.is_deadline() => panic!(
                "notification {i} waited until its deadline: a full queue must fail notify at \
                 once with HMC_ERR_LIMIT (message `max_pending_notifications: ...`), not stall \
                 the sender"
            ),
            Err(e) => panic!(
                "notification {i}: {e}; a full queue must fail with HMC_ERR_LIMIT and a message \
                 that begins with the limit's name (`max_pending_notifications: ...`)"
            ),
        }
    }
    panic!(
        "64 notifications to a receiver opened with max_pending_notifications={MAX}, which \
         received none, were all accepted: honour max_pending_notifications=N (hmc_plugin.h, \
         comm_open) and fail notify with HMC_ERR_LIMIT once N are pending"
    );
}
