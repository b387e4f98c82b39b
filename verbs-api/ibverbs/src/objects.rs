//! Protection domains, completion queues and completion channels.
//!
//! Each object is one allocation: the public rdma-core struct first (what the program
//! holds a pointer to), then the verbs-api object behind it. CQs are allocated as large
//! as `struct ibv_cq_ex` (zero past `ibv_cq`), because rdma-core's `ibv_cq_ex_to_cq` is a
//! cast.
//!
//! A completion channel is an epoll descriptor: each CQ created on the channel adds the
//! read end of its event pipe (which the NIC writes when the CQ is armed and a
//! completion arrives), so the channel fd is readable, to `poll(2)` as to
//! `ibv_get_cq_event`, exactly when one of its CQs has an event. Only the NIC writes the
//! pipes, through write ends of its own.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use verbs_api::{CompletionQueue, PollIdle, ProtectionDomain, WcOpcode, WorkCompletion};

use crate::abi::*;
use crate::device::softnic_context;
use crate::errno;
use crate::unacked::Unacked;

/// Completion events taken with `ibv_get_cq_event` and not yet acknowledged, by CQ
/// address: `ibv_destroy_cq` waits for them.
static COMP_EVENTS: Unacked = Unacked::new();

/// A PD: `ibv_pd`, then the verbs-api PD and a count of its MRs and QPs (a PD in use
/// cannot be deallocated: EBUSY, as the kernel answers). A parent domain
/// (`crate::parent_domain`) is one too, whose `api` is its protection domain's, so that
/// every verb taking an `ibv_pd` acts on that protection domain through either.
#[repr(C)]
pub struct SoftnicPd {
    /// Public part.
    pub pd: ibv_pd,
    /// The verbs-api PD.
    pub api: ProtectionDomain,
    /// MRs, QPs and parent domains on this PD.
    pub users: AtomicU32,
    /// For a parent domain: its protection domain and thread domain (NULL if none),
    /// each counted as a user of theirs while it lives; both NULL for a plain PD.
    pub(crate) parent: crate::parent_domain::Parent,
}

/// The [`SoftnicPd`] around `pd`.
///
/// # Safety
/// `pd` came from [`ibv_alloc_pd`] and is live.
pub(crate) unsafe fn softnic_pd<'a>(pd: *mut ibv_pd) -> &'a SoftnicPd {
    // SAFETY: `pd` is the first field of a boxed SoftnicPd (repr(C)).
    unsafe { &*(pd as *const SoftnicPd) }
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `context` came from `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    if context.is_null() {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    let api = match ctx.api.alloc_pd() {
        Ok(pd) => pd,
        Err(e) => return errno::null(errno::of(&e)),
    };
    let b = Box::new(SoftnicPd {
        pd: ibv_pd {
            context,
            handle: api.handle(),
        },
        api,
        users: AtomicU32::new(0),
        parent: Default::default(),
    });
    Box::into_raw(b) as *mut ibv_pd
}

/// `ibv_dealloc_pd`: EBUSY while MRs, QPs or parent domains use it. Also deallocates
/// a parent domain (`ibv_alloc_parent_domain`), which then stops counting as a user of
/// its protection and thread domains.
///
/// # Safety
/// `pd` came from [`ibv_alloc_pd`] or `ibv_alloc_parent_domain`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    if unsafe { softnic_pd(pd) }.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: reverses ibv_alloc_pd's (or alloc_parent_domain_op's) Box::into_raw.
    let b = unsafe { Box::from_raw(pd as *mut SoftnicPd) };
    // SAFETY: a parent domain's PD and TD outlive it (it counts as their user).
    unsafe { b.parent.release() };
    0
}

/// A CQ: `ibv_cq_ex` (whose first member is `ibv_cq`), then the verbs-api CQ.
#[repr(C)]
pub struct SoftnicCq {
    /// Public part.
    pub cqx: ibv_cq_ex,
    /// The completion `ibv_start_poll`/`ibv_next_poll` last returned (CQs from
    /// `ibv_create_cq_ex`).
    pub(crate) current: Mutex<WorkCompletion>,
    /// The verbs-api CQ. The lock is uncontended in the common single-poller case
    /// (an atomic, no syscall); rdma-core providers lock their CQs the same way.
    pub api: Mutex<CompletionQueue>,
    /// QPs using this CQ (EBUSY on destroy while non-zero).
    pub users: AtomicU32,
    /// The CQ's hybrid polling, usable without the `api` lock (see
    /// [`SoftnicCq::note_poll`]).
    pub(crate) idle: PollIdle,
}

impl SoftnicCq {
    /// After a poll that found nothing: spin, yield the core every
    /// `SOFTNIC_IBV_POLL_YIELD` empty polls (or nap while much send work is queued),
    /// and sleep once the context saw no completion for the spin window (hybrid
    /// polling, `verbs_api::poll_idle`).
    /// Called without the `api` lock held, so a sleeper does not block other threads.
    ///
    /// Why: perftest, the pingpongs and most verbs programs busy-poll their CQs without
    /// ever yielding, which is right on a host with a hardware NIC. Here the NIC is a
    /// process that needs the same cores: with the program spinning, the NIC (and the
    /// peer) ran only when the scheduler preempted it, and a stock `ib_send_lat -s 8`
    /// round trip took milliseconds instead of tens of microseconds (docs/ibverbs.md,
    /// "Speed"); and a program waiting milliseconds for its next completion burned a
    /// core the NIC needed. `softnic perf` runs the same code. A poll that finds
    /// completions never gets here, so a busy data path makes no system call.
    pub(crate) fn note_poll(&self, found: bool) {
        if !found {
            self.idle.idle();
        }
    }
}

/// The [`SoftnicCq`] around `cq`.
///
/// # Safety
/// `cq` came from [`ibv_create_cq`] and is live.
pub(crate) unsafe fn softnic_cq<'a>(cq: *mut ibv_cq) -> &'a SoftnicCq {
    // SAFETY: `cq` is the first field of a boxed SoftnicCq.
    unsafe { &*(cq as *const SoftnicCq) }
}

/// A completion channel: `ibv_comp_channel` whose `fd` is an epoll instance.
#[repr(C)]
pub struct SoftnicChannel {
    /// Public part.
    pub ch: ibv_comp_channel,
    epoll: OwnedFd,
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// `context` came from `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    if context.is_null() {
        return errno::null(libc::EINVAL);
    }
    let epoll = match verbs_api::os::epoll() {
        Ok(ep) => ep,
        Err(e) => return errno::null(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let fd = epoll.as_raw_fd();
    let b = Box::new(SoftnicChannel {
        ch: ibv_comp_channel {
            context,
            fd,
            refcnt: 0,
        },
        epoll,
    });
    Box::into_raw(b) as *mut ibv_comp_channel
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it.
///
/// # Safety
/// `channel` came from [`ibv_create_comp_channel`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    if channel.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    if unsafe { (*channel).refcnt } != 0 {
        return libc::EBUSY;
    }
    // SAFETY: reverses ibv_create_comp_channel's Box::into_raw.
    drop(unsafe { Box::from_raw(channel as *mut SoftnicChannel) });
    0
}

pub(crate) fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `ibv_create_cq`: at least `cqe` entries; on `channel` if not NULL.
///
/// # Safety
/// `context` came from `ibv_open_device`; `channel` is NULL or from
/// [`ibv_create_comp_channel`].
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded caller contract.
    unsafe { create_cq(context, cqe, cq_context, channel, comp_vector, false) }
}

/// `ibv_create_cq`, and the `create_cq_ex` op when `ex` (the poll API installed).
///
/// # Safety
/// As [`ibv_create_cq`].
pub(crate) unsafe fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    ex: bool,
) -> *mut ibv_cq {
    if context.is_null() || cqe <= 0 || comp_vector != 0 {
        return errno::null(libc::EINVAL);
    }
    // SAFETY: caller contract.
    let ctx = unsafe { softnic_context(context) };
    let api = match ctx.api.create_cq(cqe as u32) {
        Ok(cq) => cq,
        Err(e) => return errno::null(errno::of(&e)),
    };
    let capacity = api.capacity();
    api.set_poll_yield(yield_every());
    let idle = api.poll_idle();
    // SAFETY: ibv_cq is pointers, integers, a mutex and a condvar: all-zero is valid
    // before pthread_*_init below.
    let mut pub_cq: ibv_cq = unsafe { std::mem::zeroed() };
    pub_cq.context = context;
    pub_cq.channel = channel;
    pub_cq.cq_context = cq_context;
    pub_cq.handle = api.handle();
    pub_cq.cqe = capacity.min(c_int::MAX as u32) as c_int;
    // SAFETY: ibv_cq_ex is an ibv_cq, integers and Option<fn>s: all-zero is valid.
    let mut cqx: ibv_cq_ex = unsafe { std::mem::zeroed() };
    cqx.cq_base = pub_cq;
    if ex {
        crate::cq_ex::install(&mut cqx);
    }
    let b = Box::into_raw(Box::new(SoftnicCq {
        cqx,
        current: Mutex::new(WorkCompletion::default()),
        api: Mutex::new(api),
        users: AtomicU32::new(0),
        idle,
    }));
    // SAFETY: b is a fresh box; the mutex and condvar are at their final addresses.
    unsafe {
        libc::pthread_mutex_init(
            std::ptr::addr_of_mut!((*b).cqx.cq_base.mutex),
            std::ptr::null(),
        );
        libc::pthread_cond_init(
            std::ptr::addr_of_mut!((*b).cqx.cq_base.cond),
            std::ptr::null(),
        );
    }
    if !channel.is_null() {
        // SAFETY: channel is a live SoftnicChannel (caller contract); b is the fresh box.
        let (ep, cq) = unsafe { (&(*(channel as *mut SoftnicChannel)).epoll, &*b) };
        let added = {
            let api = cq.api.lock().unwrap_or_else(|e| e.into_inner());
            verbs_api::os::epoll_add(ep.as_fd(), api.event_fd(), b as u64)
        };
        if let Err(e) = added {
            let e = e.raw_os_error().unwrap_or(libc::EIO);
            // SAFETY: reverses the Box::into_raw above; nothing else saw it.
            drop(unsafe { Box::from_raw(b) });
            return errno::null(e);
        }
        // SAFETY: caller contract; refcnt is only changed under the program's own
        // create/destroy calls, which rdma-core also leaves unsynchronised.
        unsafe { (*channel).refcnt += 1 };
        COMP_EVENTS.open(b as usize);
    }
    b as *mut ibv_cq
}

/// `ibv_destroy_cq`: EBUSY while QPs use it. On a completion channel it returns once
/// the CQ's events taken with `ibv_get_cq_event` are acknowledged, as rdma-core's does
/// (`unacked.rs`).
///
/// # Safety
/// `cq` came from [`ibv_create_cq`].
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let c = unsafe { softnic_cq(cq) };
    if c.users.load(Ordering::Acquire) != 0 {
        return libc::EBUSY;
    }
    // SAFETY: caller contract.
    let channel = unsafe { (*cq).channel };
    if !channel.is_null() {
        let fd = c
            .api
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .event_fd()
            .as_raw_fd();
        // SAFETY: the channel outlives its CQs (refcnt); deleting needs no event.
        unsafe {
            libc::epoll_ctl((*channel).fd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut());
            (*channel).refcnt -= 1;
        }
        if !COMP_EVENTS.retire(cq as usize) {
            // An event of it is still out after the wait: the CQ goes in the NIC but
            // its memory stays for the late acknowledgement. `api` is initialised and
            // dropped only here; the rest is leaked, never read as a CQ again (no
            // event can be taken for it any more).
            let b = cq as *mut SoftnicCq;
            // SAFETY: as said; the box is never reconstructed.
            unsafe { std::ptr::drop_in_place(std::ptr::addr_of_mut!((*b).api)) };
            return 0;
        }
    }
    // SAFETY: reverses ibv_create_cq's Box::into_raw.
    let b = unsafe { Box::from_raw(cq as *mut SoftnicCq) };
    // SAFETY: initialised in ibv_create_cq; nobody waits on them any more.
    unsafe {
        libc::pthread_cond_destroy(std::ptr::addr_of!(b.cqx.cq_base.cond).cast_mut());
        libc::pthread_mutex_destroy(std::ptr::addr_of!(b.cqx.cq_base.mutex).cast_mut());
    }
    drop(b);
    0
}

/// `enum ibv_wc_opcode` of a verbs-api opcode.
pub(crate) fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        WcOpcode::AtomicWrite => 9,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
        WcOpcode::Other(v) => v as c_int,
    }
}

pub(crate) fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status.raw() as c_int,
        opcode: wc_opcode(w.opcode),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        // `invalidated_rkey` (IBV_WC_WITH_INV) shares the union, in host order.
        imm_data: match w.wc_flags & verbs_api::abi::slots::wc_flags::WITH_INV {
            0 => w.imm_data.map_or(0, u32::to_be),
            _ => w.imm_data.unwrap_or(0),
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        // verbs-api keeps `enum ibv_wc_flags` values (IBV_WC_GRH, IBV_WC_WITH_IMM).
        wc_flags: w.wc_flags,
        ..ibv_wc::default()
    }
}

/// The `poll_cq` op behind the inline `ibv_poll_cq`: loads and stores on the shared
/// ring, no syscall when it finds completions; a poll that finds none may yield the
/// core or sleep up to 1 ms (`SoftnicCq::note_poll`). Returns the number of
/// completions, or a negative value on error.
///
/// # Safety
/// `cq` came from [`ibv_create_cq`]; `wc` is writable for `num_entries` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut c_void, num_entries: c_int, wc: *mut c_void) -> c_int {
    if cq.is_null() || num_entries < 0 || (wc.is_null() && num_entries > 0) {
        return -libc::EINVAL;
    }
    // SAFETY: caller contract.
    let c = unsafe { softnic_cq(cq as *mut ibv_cq) };
    let mut api = c.api.lock().unwrap_or_else(|e| e.into_inner());
    let wc = wc as *mut ibv_wc;
    let want = num_entries as usize;
    // Straight into the caller's array: no buffer of completions to fill first (this
    // runs for every empty poll of a busy-poll loop).
    let mut written = 0usize;
    let found = api.poll_with(want, |i, w| {
        // SAFETY: i < num_entries, within the caller's array.
        unsafe { wc.add(i).write(to_ibv_wc(&w)) };
        written = i + 1;
    });
    drop(api);
    // A corrupt ring: what was converted before it is still the caller's.
    let done = match found {
        Ok(n) => n,
        Err(_) if written > 0 => written,
        Err(_) => return -libc::EIO,
    };
    if want > 0 {
        c.note_poll(done > 0);
    }
    done as c_int
}

/// The environment variable that sets how many empty polls in a row make a CQ poll
/// yield the core once: default 4 (measured: see docs/ibverbs.md, "Speed"); 0 = never
/// yield nor sleep, spin as on hardware (for a program that owns a core). The spin
/// window before an idle poller sleeps is `SOFTNIC_POLL_SPIN_US`
/// ([`verbs_api::cq::POLL_SPIN_ENV`]); the shortest nap while much send work is
/// queued, `SOFTNIC_POLL_NAP_US` ([`verbs_api::cq::POLL_NAP_ENV`]).
pub const POLL_YIELD_ENV: &str = "SOFTNIC_IBV_POLL_YIELD";

/// Default of [`POLL_YIELD_ENV`]: the streak `softnic perf` uses too, so the two are
/// compared like for like (docs/ibverbs.md, "Speed"; why 4: [`POLL_YIELD_EVERY`]).
///
/// [`POLL_YIELD_EVERY`]: verbs_api::cq::POLL_YIELD_EVERY
const DEFAULT_POLL_YIELD: u32 = verbs_api::cq::POLL_YIELD_EVERY;

/// [`POLL_YIELD_ENV`], read once per process.
fn yield_every() -> u32 {
    static EVERY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var(POLL_YIELD_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_POLL_YIELD)
    })
}

/// The `req_notify_cq` op behind the inline `ibv_req_notify_cq`: arms the CQ so the
/// NIC signals its *next* completion on the CQ's event pipe, as rxe and the kernel's
/// verbs do (`IB_CQ_NEXT_COMP`, no `IB_CQ_REPORT_MISSED_EVENTS`): completions already
/// waiting raise nothing, so a program re-arms and then polls (the pattern every
/// verbs program uses; the arm is fenced against the NIC's publish, so a completion
/// either is seen by that poll or raises the event). Raising at once instead gave
/// perftest 4.5's `ib_send_lat -e`, which acks, re-arms and polls each event's CQ, a
/// second event for every completion, and its one channel for both CQs then woke its
/// send wait for a receive: "Couldn't post send". softnic does not distinguish
/// solicited completions, so `solicited_only` arms for every completion (a superset,
/// as the verbs allow spurious events).
///
/// # Safety
/// `cq` came from [`ibv_create_cq`].
pub unsafe extern "C" fn req_notify_cq(cq: *mut c_void, _solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller contract.
    let c = unsafe { softnic_cq(cq as *mut ibv_cq) };
    let mut api = c.api.lock().unwrap_or_else(|e| e.into_inner());
    match api.arm() {
        Ok(_) => 0,
        Err(e) => errno::of(&e),
    }
}

/// `ibv_get_cq_event`: waits for an event on `channel` (blocking, unless the program
/// made the channel fd non-blocking: then -1 with EAGAIN), consumes it and returns the
/// CQ and its `cq_context`. -1 with EIO when the CQ's event pipe is at end of file (the
/// NIC is gone: no event will come).
///
/// # Safety
/// `channel` came from [`ibv_create_comp_channel`]; `cq` and `cq_context` are writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq.is_null() || cq_context.is_null() {
        errno::set(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller contract.
    let fd = unsafe { (*channel).fd };
    // SAFETY: plain fcntl on the channel's own descriptor.
    let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    loop {
        // SAFETY: one event into `ev`.
        let n = unsafe { libc::epoll_wait(fd, &mut ev, 1, if nonblocking { 0 } else { -1 }) };
        if n < 0 {
            // rdma-core blocks in read(2), which a signal interrupts (EINTR) only when
            // its handler lacks SA_RESTART; qperf ends a timed test so.
            if last_errno() == libc::EINTR && verbs_api::os::interrupted_wait_restarts() {
                continue;
            }
            errno::set(last_errno());
            return -1;
        }
        if n == 0 {
            errno::set(libc::EAGAIN);
            return -1;
        }
        let found = ev.u64 as *mut SoftnicCq;
        // Counted before the CQ is touched: one being destroyed by another thread
        // (its epoll registration not yet gone when epoll_wait answered) refuses.
        if !COMP_EVENTS.take(found as usize) {
            if nonblocking {
                errno::set(libc::EAGAIN);
                return -1;
            }
            continue;
        }
        // SAFETY: the epoll data is the SoftnicCq registered by ibv_create_cq, and
        // the event just counted keeps it from being freed.
        let c = unsafe { &*found };
        if c.cqx.cq_base.channel != channel {
            // A CQ made at the address of the one epoll named, freed meanwhile: not
            // this channel's.
            COMP_EVENTS.ack(found as usize, 1);
            continue;
        }
        // Readable per epoll; empty if another thread took the event first (then
        // wait again).
        let took = c.api.lock().unwrap_or_else(|e| e.into_inner()).take_event();
        // Nothing taken: the count comes back off.
        match took {
            Ok(true) => {}
            Ok(false) => {
                COMP_EVENTS.ack(found as usize, 1);
                if nonblocking {
                    errno::set(libc::EAGAIN);
                    return -1;
                }
                continue;
            }
            Err(_) => {
                COMP_EVENTS.ack(found as usize, 1);
                errno::set(libc::EIO);
                return -1;
            }
        }
        // SAFETY: out-pointers are writable (caller contract).
        unsafe {
            *cq = found as *mut ibv_cq;
            *cq_context = (*found).cqx.cq_base.cq_context;
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`: counts acknowledged events, which `ibv_destroy_cq` waits for
/// (`unacked.rs`), as in rdma-core.
///
/// # Safety
/// `cq` came from [`ibv_create_cq`].
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: live CQ; the mutex was initialised at create.
    unsafe {
        let m = std::ptr::addr_of_mut!((*cq).mutex);
        libc::pthread_mutex_lock(m);
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents);
        libc::pthread_cond_signal(std::ptr::addr_of_mut!((*cq).cond));
        libc::pthread_mutex_unlock(m);
    }
    // Last: the CQ may be freed once this count is down.
    COMP_EVENTS.ack(cq as usize, nevents);
}
