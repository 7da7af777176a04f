//! `export_plugin!`'s transfer glue, driven through the C table as a host would: a transfer that wakes itself while it is polled (a future that yields, as a busy-poll does) is polled again in place without signalling the eventfd, up to a bound; a wake from another thread signals the eventfd, or calls the host's wake callback instead when the transfer was started with one (`transfer_start_wake`), and never once the transfer is released.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::Duration;

use hmc_core::{
    Access, Communicator, Deadline, Error, LocalRegistration, Notification, Op, PeerAddr, Region,
    RemoteRegion, Result, TransferDesc, TransportId,
};
use hmc_plugin::abi::*;
use hmc_plugin::export::{Config, Exported};

/// A batch of this length is completed by another thread, later.
const FROM_ANOTHER_THREAD: u64 = 7777;

/// A batch of this length hands its waker to a thread that wakes it when [`GO`] is set,
/// then sets [`WOKEN_LATE`]; it never completes.
const WAKES_WHEN_TOLD: u64 = 8888;

static GO: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());
static WOKEN_LATE: AtomicBool = AtomicBool::new(false);

/// A communicator whose transfers yield `len` times (waking themselves each time) and then
/// complete; nothing moves.
struct YieldComm;

struct Reg(Region, Access);

impl LocalRegistration for Reg {
    fn region(&self) -> Region {
        self.0
    }
    fn access(&self) -> Access {
        self.1
    }
}

impl Communicator for YieldComm {
    type Endpoint = ();
    type Registration = Reg;
    type RemoteKey = ();

    fn transport(&self) -> TransportId {
        TransportId::from_wire_id(250)
    }

    fn address(&self) -> PeerAddr {
        "tcp://127.0.0.1:9".parse().unwrap()
    }

    async fn connect(&self, _: &PeerAddr, _: Deadline) -> Result<()> {
        Ok(())
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<Reg> {
        Ok(Reg(region, access))
    }

    fn export(&self, _: &Reg) -> Result<RemoteRegion> {
        Err(Error::Unsupported("yield: export".into()))
    }

    fn import(&self, _: &(), _: &RemoteRegion) -> Result<()> {
        Ok(())
    }

    async fn transfer(
        &self,
        _: &(),
        _: Op,
        batch: &[TransferDesc<'_, Self>],
        _: Deadline,
    ) -> Result<()> {
        let len = batch[0].len as u64;
        if len == WAKES_WHEN_TOLD {
            let mut spawned = false;
            return std::future::poll_fn(move |cx| {
                if !spawned {
                    spawned = true;
                    let waker = cx.waker().clone();
                    std::thread::spawn(move || {
                        let (go, told) = &GO;
                        let mut go = go.lock().unwrap();
                        while !*go {
                            go = told.wait(go).unwrap();
                        }
                        waker.wake();
                        WOKEN_LATE.store(true, Ordering::Release);
                    });
                }
                Poll::<Result<()>>::Pending
            })
            .await;
        }
        if len == FROM_ANOTHER_THREAD {
            let done = Arc::new(AtomicBool::new(false));
            let mut spawned = false;
            return std::future::poll_fn(move |cx| {
                if done.load(Ordering::Acquire) {
                    return Poll::Ready(Ok(()));
                }
                if !spawned {
                    spawned = true;
                    let (done, waker) = (done.clone(), cx.waker().clone());
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(20));
                        done.store(true, Ordering::Release);
                        waker.wake();
                    });
                }
                Poll::Pending
            })
            .await;
        }
        let mut left = len;
        std::future::poll_fn(move |cx| {
            if left == 0 {
                return Poll::Ready(Ok(()));
            }
            left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    async fn notify(&self, _: &(), _: u64, _: &[u8], _: Deadline) -> Result<()> {
        Ok(())
    }

    async fn recv_notification(&self, deadline: Deadline) -> Result<Notification> {
        Err(Error::DeadlineExceeded {
            during: "yield: recv_notification",
            elapsed: deadline.remaining(),
        })
    }

    fn close(&self) {}
}

fn open(_: &Config) -> Result<Exported<YieldComm>> {
    Ok(Exported::new(YieldComm))
}

hmc_plugin::export_plugin! {
    name: "yield",
    transport: TransportId::from_wire_id(250),
    comm: YieldComm,
    open: open,
}

/// A communicator, one registration and one remote key, through the table.
struct Rig {
    api: HmcPluginApi,
    comm: *mut HmcComm,
    ep: *mut HmcEndpoint,
    reg: *mut HmcReg,
    key: *mut HmcRemoteKey,
    efd: RawFd,
    _bytes: Box<[u8; 64]>,
}

impl Rig {
    fn new() -> Rig {
        // SAFETY: all-zero is a valid table; the entry point fills at most its size.
        let mut api: HmcPluginApi = unsafe { std::mem::zeroed() };
        let (mut comm, mut ep, mut reg, mut key) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let bytes = Box::new([0u8; 64]);
        let region = HmcRegion {
            addr: bytes.as_ptr() as u64,
            len: 64,
            device_kind: 0,
            device_ordinal: 0,
        };
        let addr = "tcp://127.0.0.1:9";
        let desc = HmcRemoteDesc {
            region,
            access: HMC_ACCESS_READ | HMC_ACCESS_WRITE,
            key: std::ptr::null(),
            key_len: 0,
        };
        // SAFETY: every pointer is valid for its call; handles come from the calls before.
        unsafe {
            let size = std::mem::size_of::<HmcPluginApi>();
            assert_eq!(
                hmc_plugin_init(1, 0, std::ptr::null(), &mut api, size),
                HMC_OK
            );
            assert_eq!(
                api.comm_open.unwrap()(std::ptr::null(), 0, &mut comm),
                HMC_OK
            );
            let efd = api.comm_event_fd.unwrap()(comm);
            assert!(efd >= 0);
            let no_deadline = HMC_NO_DEADLINE;
            assert_eq!(
                api.connect.unwrap()(comm, addr.as_ptr(), addr.len(), no_deadline, &mut ep),
                HMC_OK
            );
            assert_eq!(
                api.register_mem.unwrap()(
                    comm,
                    &region,
                    HMC_ACCESS_READ | HMC_ACCESS_WRITE,
                    &mut reg
                ),
                HMC_OK
            );
            assert_eq!(api.import.unwrap()(comm, ep, &desc, &mut key), HMC_OK);
            Rig {
                api,
                comm,
                ep,
                reg,
                key,
                efd,
                _bytes: bytes,
            }
        }
    }

    /// Starts a transfer of `len` (the number of times it yields).
    fn start(&self, len: u64) -> *mut HmcTransfer {
        self.start_with(len, None)
    }

    /// Starts a transfer of `len`, with `transfer_start_wake` and `wakes` as its wake
    /// context when given (which must outlive the transfer's release).
    fn start_with(&self, len: u64, wakes: Option<&Wakes>) -> *mut HmcTransfer {
        let d = HmcTransferDesc {
            local: self.reg,
            local_offset: 0,
            remote: self.key,
            remote_offset: 0,
            len,
        };
        let mut t = std::ptr::null_mut();
        // SAFETY: live handles; `d` is read during the call; `wakes` outlives the transfer.
        let code = unsafe {
            match wakes {
                None => self.api.transfer_start.unwrap()(
                    self.comm,
                    self.ep,
                    HMC_OP_WRITE,
                    &d,
                    1,
                    HMC_NO_DEADLINE,
                    &mut t,
                ),
                Some(w) => self.api.transfer_start_wake.unwrap()(
                    self.comm,
                    self.ep,
                    HMC_OP_WRITE,
                    &d,
                    1,
                    HMC_NO_DEADLINE,
                    Wakes::wake,
                    (w as *const Wakes).cast(),
                    &mut t,
                ),
            }
        };
        assert_eq!(code, HMC_OK);
        t
    }

    fn poll(&self, t: *mut HmcTransfer) -> i32 {
        // SAFETY: live handles.
        unsafe { self.api.transfer_poll.unwrap()(self.comm, t) }
    }

    fn release(&self, t: *mut HmcTransfer) {
        // SAFETY: live handles, released once.
        unsafe { self.api.transfer_release.unwrap()(self.comm, t) }
    }

    /// The eventfd's count, without blocking (0 when not signalled), reset to 0.
    fn signals(&self) -> u64 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v` from the plugin's non-blocking eventfd.
        let n = unsafe { libc::read(self.efd, (&mut v as *mut u64).cast(), 8) };
        if n == 8 { v } else { 0 }
    }

    /// Waits up to a minute for the eventfd (only a hang fails).
    fn wait_signal(&self) {
        let mut p = libc::pollfd {
            fd: self.efd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on this frame.
        let n = unsafe { libc::poll(&mut p, 1, 60_000) };
        assert_eq!(n, 1, "the eventfd was never signalled");
    }
}

/// A host's wake context: counts the plugin's calls of the wake callback.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wakes {
    /// The callback handed to `transfer_start_wake`.
    unsafe extern "C" fn wake(ctx: *const c_void) {
        // SAFETY: the test passes a `Wakes` that outlives the transfer.
        unsafe { &*ctx.cast::<Wakes>() }
            .0
            .fetch_add(1, Ordering::SeqCst);
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits up to a minute for a first call (only a hang fails).
    fn wait_first(&self) {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while self.count() == 0 {
            assert!(std::time::Instant::now() < give_up, "never woken");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: live handles, each released once, the communicator last.
        unsafe {
            self.api.remote_key_release.unwrap()(self.comm, self.key);
            self.api.deregister.unwrap()(self.comm, self.reg);
            self.api.endpoint_release.unwrap()(self.comm, self.ep);
            self.api.comm_destroy.unwrap()(self.comm);
        }
    }
}

#[test]
fn a_transfer_that_yields_a_few_times_completes_in_place_without_the_eventfd() {
    let rig = Rig::new();
    rig.signals();
    let t = rig.start(10);
    assert_eq!(
        rig.poll(t),
        HMC_OK,
        "ten yields are polled through in place"
    );
    assert_eq!(rig.signals(), 0, "no eventfd round trip per yield");
    rig.release(t);
}

#[test]
fn a_transfer_that_keeps_yielding_hands_back_to_the_host_through_the_eventfd() {
    let rig = Rig::new();
    rig.signals();
    let t = rig.start(1000);
    let mut polls = 0;
    loop {
        // Each round of in-place polls ends with a signal, so the host comes back.
        assert!(rig.signals() > 0, "the host must be told to poll again");
        polls += 1;
        if rig.poll(t) == HMC_OK {
            break;
        }
        assert!(polls < 1000, "a bounded number of in-place polls per call");
    }
    assert!(
        polls > 1 && polls < 100,
        "{polls} host polls for 1000 yields"
    );
    rig.release(t);
}

#[test]
fn a_wake_from_another_thread_signals_the_eventfd() {
    let rig = Rig::new();
    rig.signals();
    let t = rig.start(FROM_ANOTHER_THREAD);
    assert_eq!(rig.poll(t), HMC_PENDING);
    rig.wait_signal();
    assert!(rig.signals() > 0);
    assert_eq!(rig.poll(t), HMC_OK);
    rig.release(t);
}

#[test]
fn a_wake_from_another_thread_calls_the_host_wake_not_the_eventfd() {
    let rig = Rig::new();
    rig.signals();
    let wakes = Wakes::default();
    // `start_with` polls once: the other thread has the waker now.
    let t = rig.start_with(FROM_ANOTHER_THREAD, Some(&wakes));
    wakes.wait_first();
    assert_eq!(
        rig.signals(),
        0,
        "a transfer started with a wake callback must not go through the eventfd"
    );
    assert_eq!(rig.poll(t), HMC_OK);
    rig.release(t);
    assert_eq!(wakes.count(), 1, "one wake from the other thread");
}

#[test]
fn a_transfer_that_keeps_yielding_hands_back_through_the_host_wake() {
    let rig = Rig::new();
    rig.signals();
    let wakes = Wakes::default();
    let t = rig.start_with(1000, Some(&wakes));
    let mut polls = 0;
    while rig.poll(t) != HMC_OK {
        polls += 1;
        // Each round of in-place polls (the first in transfer_start) ends with a call of
        // the callback.
        assert_eq!(
            wakes.count(),
            polls + 1,
            "the host must be told to poll again"
        );
        assert!(polls < 1000, "a bounded number of in-place polls per call");
    }
    assert!(
        polls > 0,
        "1000 yields take more than one round of in-place polls"
    );
    assert_eq!(rig.signals(), 0, "nothing through the eventfd");
    rig.release(t);
}

#[test]
fn no_host_wake_once_the_transfer_is_released() {
    let rig = Rig::new();
    let wakes = Wakes::default();
    // `start_with` polls once: the transfer's waker is with the thread now.
    let t = rig.start_with(WAKES_WHEN_TOLD, Some(&wakes));
    assert_eq!(rig.poll(t), HMC_PENDING);
    rig.release(t);
    // The transport kept a clone of the waker, and now wakes it.
    *GO.0.lock().unwrap() = true;
    GO.1.notify_all();
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !WOKEN_LATE.load(Ordering::Acquire) {
        assert!(std::time::Instant::now() < give_up, "the thread never woke");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        wakes.count(),
        0,
        "the host's wake context ends at transfer_release: no call after it"
    );
}
