//! Devices and device contexts (`ibv_get_device_list`, `ibv_open_device`).
//!
//! A softnic device is a running `softnic run --name NAME` process; its control socket
//! is `$SOFTNIC_DIR/NAME.sock`. Opening it connects to that socket and sends
//! OpenDevice with the connection's *doorbell page* (a memfd; posts set a bit there so
//! the NIC reads only the rings that were posted to); the NIC answers with its
//! attributes and the *wake eventfd*, which a client writes only when the doorbell
//! page says NEED_WAKEUP (see [`crate::abi`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::abi::control::{self, DeviceAttr, Reply, Request, Response};
use crate::abi::{Doorbell, ABI_VERSION, DOORBELL_SEGMENT_LEN};
use crate::error::{io, Error, Result};
use crate::gid::Gid;
use crate::pd::ProtectionDomain;
use crate::poll_idle::ContextPoll;

/// Environment variable limiting the devices this process sees to these NIC names
/// (comma-separated; `softnic exec -d NAME` sets it), so a program that opens "the
/// first device", and the RDMA CM's look-up of the NIC holding an address, get the one
/// the user chose. Unset or empty: every running NIC.
pub const DEVICES_ENV: &str = "SOFTNIC_IBV_DEVICES";

/// A device that can be opened: a NIC control socket found in `$SOFTNIC_DIR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
    path: PathBuf,
}

impl Device {
    /// Every `*.sock` in `$SOFTNIC_DIR` (`ibv_get_device_list`), sorted by name; only
    /// those named in [`DEVICES_ENV`] if it is set. A stale socket of a dead NIC is
    /// listed too; opening it fails.
    pub fn list() -> Result<Vec<Device>> {
        let dir = control::softnic_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing $SOFTNIC_DIR")(e)),
        };
        let only = std::env::var(DEVICES_ENV).unwrap_or_default();
        let chosen = |name: &str| only.is_empty() || only.split(',').any(|n| n == name);
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "sock") {
                if let Some(stem) = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .filter(|s| chosen(s))
                {
                    out.push(Device {
                        name: stem.to_string(),
                        path,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The device called `name` (its socket need not exist yet).
    pub fn named(name: &str) -> Device {
        Device {
            name: name.to_string(),
            path: control::socket_path(name),
        }
    }

    /// The device whose control socket is `path`, wherever it lives: `$SOFTNIC_DIR` is
    /// not consulted, so a process can talk to NICs in several directories (tests give
    /// each NIC a private directory without touching the process-wide environment).
    /// The name is the socket's file stem, as [`Device::list`] derives it.
    pub fn at(path: impl Into<PathBuf>) -> Device {
        let path = path.into();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Device { name, path }
    }

    /// Opens the device whose control socket is `path` (see [`Device::at`]).
    pub fn open_at(path: impl Into<PathBuf>) -> Result<Context> {
        Device::at(path).open_context()
    }

    /// Device name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Control socket path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Opens the device called `name` (`ibv_open_device`).
    pub fn open(name: &str) -> Result<Context> {
        Device::named(name).open_context()
    }

    /// Opens this device.
    pub fn open_context(&self) -> Result<Context> {
        Context::open(self)
    }

    /// Asks the NIC for its attributes without opening the device (no client is
    /// counted): how `ibv_get_device_list` tells a running NIC from a stale socket and
    /// learns its address (for the node GUID) before any `ibv_open_device`.
    pub fn query(&self) -> Result<DeviceAttributes> {
        let sock = UnixStream::connect(&self.path).map_err(|source| Error::NoDevice {
            name: self.name.clone(),
            path: self.path.clone(),
            source,
        })?;
        match control::call(&sock, &Request::QueryDevice, &[])?.0 {
            Response::Ok(Reply::Device(d)) => Ok(d),
            Response::Ok(other) => Err(Error::Protocol(format!(
                "QueryDevice answered with {other:?}"
            ))),
            Response::Err { code, message } => Err(Error::Nic {
                verb: "ibv_query_device",
                code,
                message,
            }),
        }
    }
}

/// GID `index` of the NIC described by `attr` (rxe's layout, [`crate::gid`]).
pub fn gid_at(attr: &DeviceAttributes, index: u32) -> Result<Gid> {
    let table = crate::gid::gid_table(std::net::SocketAddr::new(attr.addr, attr.port));
    match index {
        crate::gid::ADDRESS_GID_INDEX => Ok(Gid(attr.gid)),
        i if i < crate::gid::GID_TABLE_LEN => Ok(table[i as usize]),
        _ => Err(Error::InvalidArgument(format!(
            "GID index {index} does not exist: softnic's table has {} entries \
             (0: link-local {}, 1: address {})",
            crate::gid::GID_TABLE_LEN,
            table[0],
            Gid(attr.gid)
        ))),
    }
}

pub(crate) struct ContextInner {
    sock: Mutex<UnixStream>,
    wake: OwnedFd,
    /// This connection's doorbell page (`abi::doorbell`), shared by all its QPs/SRQs,
    /// and the line its CQ pollers sleep on (`poll_idle`).
    pub(crate) doorbell: Doorbell,
    /// Hybrid polling's per-context state.
    pub(crate) poll: ContextPoll,
    attr: DeviceAttr,
    /// The NIC's life sign, mapped read-only: whether the NIC process has exited,
    /// without a syscall (`os::LifeSignView`).
    life: crate::os::LifeSignView,
}

impl ContextInner {
    /// Whether the NIC has closed this connection (it exited or restarted): the NIC
    /// writes the socket only to answer a request, so between calls it is readable
    /// only at end of file.
    pub(crate) fn peer_closed(&self) -> bool {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        crate::os::wait_readable(sock.as_fd(), Some(Duration::ZERO)).unwrap_or(true)
    }

    /// [`Error::NicGone`] if the NIC process has exited (killed, crashed or stopped):
    /// one load of its life sign, a word the kernel marks when the NIC's holder thread
    /// exits (`os::life_sign`). Why: a program that only polls would otherwise spin for ever
    /// when its NIC dies (stock `ib_write_bw` did); the async fd's
    /// `IBV_EVENT_DEVICE_FATAL` and a channel wait's EIO reach only programs that read
    /// them. An empty CQ's poll looks every time ([`crate::cq::CompletionQueue::poll`]),
    /// and so does every post, first, so that a work request given to a dead NIC fails
    /// whether or not the NIC was asleep (a wake-up then failed with ECONNREFUSED; a
    /// busy NIC's post "succeeded").
    pub(crate) fn check_nic_alive(&self) -> Result<()> {
        match self.life.owner_died() {
            true => Err(Error::NicGone),
            false => Ok(()),
        }
    }

    /// One request/response round trip; a NIC error becomes [`Error::Nic`].
    pub(crate) fn call(
        &self,
        verb: &'static str,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>)> {
        // A poisoned lock only means another thread panicked mid-call; the stream is
        // still a stream (a broken frame would surface as a control error).
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let (resp, fds) = control::call(&*sock, req, fds)?;
        match resp {
            Response::Ok(reply) => Ok((reply, fds)),
            Response::Err { code, message } => Err(Error::Nic {
                verb,
                code,
                message,
            }),
        }
    }

    /// Rings doorbell `slot` after a ring was published, and writes the wake pipe
    /// only if the NIC sleeps (NEED_WAKEUP): the usual post makes no syscall.
    pub(crate) fn ring_doorbell(&self, slot: u32) -> Result<()> {
        if self.doorbell.ring(slot) {
            // A NIC that is gone is an error here, never a SIGPIPE (`os::wake_signal`).
            crate::os::wake_signal(self.wake.as_fd()).map_err(io("waking the NIC"))?;
        }
        Ok(())
    }

    pub(crate) fn attr(&self) -> &DeviceAttr {
        &self.attr
    }
}

/// An open device (`struct ibv_context`). Cheap to clone; every object created from it
/// keeps the connection alive. `Send + Sync`: control calls are serialised by a lock
/// (they are the slow path; the data path never takes it).
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.attr.name)
            .finish()
    }
}

/// Device and port attributes (`ibv_query_device`, `ibv_query_port`).
pub type DeviceAttributes = DeviceAttr;

impl Context {
    /// Connects to the device's NIC and performs OpenDevice.
    pub fn open(device: &Device) -> Result<Context> {
        let sock = UnixStream::connect(&device.path).map_err(|source| Error::NoDevice {
            name: device.name.clone(),
            path: device.path.clone(),
            source,
        })?;
        let program = std::env::args()
            .next()
            .unwrap_or_default()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let req = Request::OpenDevice {
            abi_version: ABI_VERSION,
            pid: std::process::id(),
            program,
        };
        let db_fd = crate::os::memfd("softnic-doorbell", DOORBELL_SEGMENT_LEN)
            .map_err(io("creating the doorbell memfd"))?;
        let db_map = crate::os::map_shared(db_fd.as_fd(), DOORBELL_SEGMENT_LEN)
            .map_err(io("mapping the doorbell page"))?;
        let doorbell = Doorbell::new(Arc::new(db_map))?;
        let (resp, mut fds) = control::call(&sock, &req, &[db_fd.as_fd()])?;
        let device_attr = match resp {
            Response::Ok(Reply::Opened { device }) => device,
            Response::Ok(other) => {
                return Err(Error::Protocol(format!(
                    "OpenDevice answered with {other:?}"
                )))
            }
            Response::Err { code, message } => {
                return Err(Error::Nic {
                    verb: "ibv_open_device",
                    code,
                    message,
                })
            }
        };
        if fds.len() != 2 {
            return Err(Error::Protocol(format!(
                "OpenDevice reply carried {} descriptors, expected the wake pipe and the \
                 NIC's life sign",
                fds.len()
            )));
        }
        let life = crate::os::LifeSignView::map(fds[1].as_fd())
            .map_err(io("mapping the NIC's life sign"))?;
        let wake = fds.remove(0);
        Ok(Context {
            inner: Arc::new(ContextInner {
                sock: Mutex::new(sock),
                wake,
                doorbell,
                poll: ContextPoll::from_env(),
                attr: device_attr,
                life,
            }),
        })
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.inner.attr.name
    }

    /// Attributes as of OpenDevice (no round trip).
    pub fn attributes(&self) -> &DeviceAttributes {
        &self.inner.attr
    }

    /// Hybrid polling of this context's CQs ([`crate::CompletionQueue::idle`]): how long
    /// an idle poller spins after the last completion before it sleeps (`None`: never
    /// sleep; default 50 µs or `SOFTNIC_POLL_SPIN_US`), and the longest single sleep
    /// (default 1 ms). Takes effect at the next yield point of every poller.
    pub fn set_poll_spin(&self, window: Option<Duration>, max_sleep: Duration) {
        self.inner.poll.set(window, max_sleep);
    }

    /// Hybrid polling's naps ([`crate::poll_idle::nap_for`]): the shortest nap a poller
    /// of this context takes while much send work is queued ahead of the NIC (`None`:
    /// never nap; default 100 µs or `SOFTNIC_POLL_NAP_US`). No nap happens while
    /// [`Self::set_poll_spin`]'s window is `None`. Takes effect at the next yield point.
    pub fn set_poll_nap(&self, min: Option<Duration>) {
        self.inner.poll.set_nap(min);
    }

    /// Naps this context's pollers have taken so far (hybrid polling).
    pub fn poll_naps(&self) -> u64 {
        self.inner.poll.naps()
    }

    /// Asks the NIC for its attributes (`ibv_query_device` + `ibv_query_port`).
    pub fn query_device(&self) -> Result<DeviceAttributes> {
        match self
            .inner
            .call("ibv_query_device", &Request::QueryDevice, &[])?
            .0
        {
            Reply::Device(d) => Ok(d),
            other => Err(Error::Protocol(format!(
                "QueryDevice answered with {other:?}"
            ))),
        }
    }

    /// GID at `index` (`ibv_query_gid`), from rxe's table layout (see [`crate::gid`]):
    /// index 0 the link-local GID, index 1 ([`crate::gid::ADDRESS_GID_INDEX`]) the NIC's
    /// address (IPv4-mapped `::ffff:a.b.c.d` for IPv4), the one peers send to.
    pub fn query_gid(&self, index: u32) -> Result<Gid> {
        gid_at(&self.inner.attr, index)
    }

    /// The node GUID (host order; see [`crate::gid::node_guid`]).
    pub fn node_guid(&self) -> u64 {
        crate::gid::node_guid(std::net::SocketAddr::new(
            self.inner.attr.addr,
            self.inner.attr.port,
        ))
    }

    /// The NIC's counters (`softnic stats`), as `(name, value)` pairs.
    pub fn stats(&self) -> Result<Vec<(String, u64)>> {
        match self.inner.call("stats", &Request::Stats, &[])?.0 {
            Reply::Stats { counters } => Ok(counters),
            other => Err(Error::Protocol(format!("Stats answered with {other:?}"))),
        }
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        ProtectionDomain::alloc(self)
    }

    /// Creates a completion queue of at least `depth` entries (`ibv_create_cq`).
    pub fn create_cq(&self, depth: u32) -> Result<crate::cq::CompletionQueue> {
        crate::cq::CompletionQueue::create(self, depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_names_the_device_by_its_socket_stem() {
        let d = Device::at("/some/dir/nic7.sock");
        assert_eq!(d.name(), "nic7");
        assert_eq!(d.path(), std::path::Path::new("/some/dir/nic7.sock"));
        // Same as the `$SOFTNIC_DIR` lookup when the path is the one it would build.
        let named = Device::named("nic7");
        assert_eq!(Device::at(named.path()), named);
    }

    #[test]
    fn open_at_a_missing_socket_says_which_path() {
        let dir = std::env::temp_dir().join(format!("verbs-open-at-{}", std::process::id()));
        let path = dir.join("absent.sock");
        match Device::open_at(&path) {
            Err(Error::NoDevice { name, path: p, .. }) => {
                assert_eq!(name, "absent");
                assert_eq!(p, path);
            }
            other => panic!("expected NoDevice, got {other:?}"),
        }
    }

    #[test]
    fn open_at_connects_to_that_socket_not_softnic_dir() {
        // A listener in a private directory that answers OpenDevice with an error: the
        // error proves the request reached this socket (a NoDevice would mean the path
        // was ignored).
        let dir = std::env::temp_dir().join(format!("verbs-open-at-ok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("private.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let (req, _): (Request, Vec<OwnedFd>) = control::recv_msg(s.as_fd()).unwrap();
            assert!(matches!(req, Request::OpenDevice { .. }), "{req:?}");
            let resp = Response::Err {
                code: control::ErrorCode::InvalidArgument,
                message: "private listener".into(),
            };
            control::send_msg(s.as_fd(), &resp, &[]).unwrap();
        });
        let r = Device::open_at(&path);
        server.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        match r {
            Err(Error::Nic { message, .. }) => assert_eq!(message, "private listener"),
            other => panic!("expected the listener's error, got {other:?}"),
        }
    }
}
