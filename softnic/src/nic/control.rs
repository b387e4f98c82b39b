//! The control socket server (Seam 3, `verbs_api::abi::control`): the slow path.
//!
//! ```text
//!  accept thread ──spawns──► one thread per client: blocking read of a frame
//!                                │  ControlMsg::Request {client, req, fds, reply}
//!                                ▼  (crossbeam channel) + write(wake eventfd)
//!                         data-plane thread: executes it between packet batches,
//!                                │  answers on the per-client reply channel
//!                                ▼
//!                         client thread: sendmsg(frame + fds)
//! ```
//!
//! The data-plane thread owns every object, so the hot path takes no lock; a client
//! thread only moves bytes and descriptors. When a connection ends — a clean close, a
//! crash, a protocol error, or a panic of its thread — [`ControlMsg::Disconnect`] is
//! sent and the data plane destroys everything that client created. Other clients are not
//! affected.
//!
//! # Who may connect
//! Anyone who can open the socket file may connect, so the accept thread bounds what
//! connections cost: each is tagged with its peer's user id (`SO_PEERCRED`, which the
//! kernel fills in and the peer cannot forge), and a connection beyond
//! [`ConnLimits::per_user`] for its user, or beyond [`ConnLimits::total`], is answered
//! with one `NoResources` error frame and closed without a thread (counted in
//! [`ConnCounters`]). Object quotas are then per user, across connections
//! ([`super::quota`]). Connection ids come from a [`HandleAlloc`], so after 2^32
//! connections a new one never takes the id of one still open.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam::channel::{bounded, Receiver, Sender};
use verbs_api::abi::control::{send_msg, ControlError, ErrorCode, FrameReader, Request, Response};

use super::handles::HandleAlloc;

/// A message from a client thread to the data plane.
#[derive(Debug)]
pub enum ControlMsg {
    /// A request and the descriptors that came with it.
    Request {
        /// Connection id.
        client: u32,
        /// User id of the connection's peer.
        uid: u32,
        /// The request.
        req: Request,
        /// Descriptors received with it.
        fds: Vec<OwnedFd>,
        /// Where to send the answer.
        reply: Sender<(Response, Vec<OwnedFd>)>,
    },
    /// The connection is gone.
    Disconnect {
        /// Connection id.
        client: u32,
    },
}

/// Bounds on control connections (`softnic run --max-connections`,
/// `--max-connections-per-user`). Each open connection holds an OS thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections in all.
    pub total: u32,
    /// Open connections of one user.
    pub per_user: u32,
}

/// Default `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1024;
/// Default `--max-connections-per-user`.
pub const DEFAULT_MAX_CONNECTIONS_PER_USER: u32 = 256;

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            total: DEFAULT_MAX_CONNECTIONS,
            per_user: DEFAULT_MAX_CONNECTIONS_PER_USER,
        }
    }
}

/// What the accept thread refused (read by `softnic stats`).
#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Connections refused: the NIC had `total` open.
    pub refused_total: AtomicU64,
    /// Connections refused: the peer's user had `per_user` open.
    pub refused_user: AtomicU64,
    /// Connections refused: the peer's credentials could not be read.
    pub refused_no_cred: AtomicU64,
}

/// The open connections: the accept thread adds, each client thread removes its own.
#[derive(Debug)]
struct Conns {
    limits: ConnLimits,
    /// Connection id → user id.
    live: HashMap<u32, u32>,
    /// User id → open connections.
    per_user: HashMap<u32, u32>,
    ids: HandleAlloc,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Total(u32),
    User(u32),
}

impl Conns {
    fn new(limits: ConnLimits, ids: HandleAlloc) -> Self {
        Conns {
            limits,
            live: HashMap::new(),
            per_user: HashMap::new(),
            ids,
        }
    }

    /// Admits a connection of `uid`: its id, or why not.
    fn admit(&mut self, uid: u32) -> Result<u32, Refusal> {
        if self.live.len() >= self.limits.total as usize {
            return Err(Refusal::Total(self.limits.total));
        }
        let n = self.per_user.get(&uid).copied().unwrap_or(0);
        if n >= self.limits.per_user {
            return Err(Refusal::User(self.limits.per_user));
        }
        let live = &self.live;
        // `total` < 2^32 connections are open, so a free id exists.
        let id = self
            .ids
            .alloc(|h| live.contains_key(&h))
            .ok_or(Refusal::Total(self.limits.total))?;
        self.live.insert(id, uid);
        *self.per_user.entry(uid).or_default() += 1;
        Ok(id)
    }

    /// Connection `id` is gone (after its Disconnect was queued, so a later connection
    /// reusing the id cannot overtake it).
    fn release(&mut self, id: u32) {
        if let Some(uid) = self.live.remove(&id) {
            if let Some(n) = self.per_user.get_mut(&uid) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_user.remove(&uid);
                }
            }
        }
    }
}

/// The user id of the process at the other end of `s`, as the kernel recorded it at
/// `connect(2)` (`SO_PEERCRED`; BSD and macOS would use `getpeereid(3)`).
#[cfg(target_os = "linux")]
pub fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    peer_cred(s).map(|c| c.uid)
}

/// The credentials of the process at the other end of `s`, as the kernel recorded them
/// at `connect(2)` or, for a client's socket, at the server's `listen(2)`
/// (`SO_PEERCRED`).
#[cfg(target_os = "linux")]
pub fn peer_cred(s: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(SO_PEERCRED) writes at most `len` bytes — the size of `cred`,
    // a plain C struct we own — and updates `len`; the descriptor is live (borrowed
    // from `s`).
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "SO_PEERCRED returned a short ucred",
        ));
    }
    Ok(cred)
}

/// Handle to the running server.
pub struct ControlServer {
    path: PathBuf,
}

impl ControlServer {
    /// Binds `path` (creating its directory, replacing a stale socket file — one that no
    /// NIC answers on), and starts the accept thread, which admits connections within
    /// `limits` and counts refusals in `counters`. Messages go to `tx`; after sending
    /// one, a thread writes `wake` so a sleeping data plane wakes up.
    pub fn start(
        path: &Path,
        limits: ConnLimits,
        counters: Arc<ConnCounters>,
        tx: Sender<ControlMsg>,
        wake: Arc<OwnedFd>,
    ) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is served by a running NIC", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        let conns = Arc::new(Mutex::new(Conns::new(limits, HandleAlloc::new())));
        std::thread::Builder::new()
            .name("softnic-accept".into())
            .spawn(move || accept_loop(listener, conns, counters, tx, wake))?;
        Ok(ControlServer {
            path: path.to_path_buf(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An admitted connection's place in [`Conns`]. Dropped when its thread ends — however
/// it ends, a panic or a failed spawn included — it first tells the data plane that the
/// client is gone, then frees the id, so a later connection given the same id can never
/// act as this client.
struct Slot {
    conns: Arc<Mutex<Conns>>,
    id: u32,
    tx: Sender<ControlMsg>,
    wake: Arc<OwnedFd>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.tx.send(ControlMsg::Disconnect { client: self.id });
        wake_data_plane(&self.wake);
        lock(&self.conns).release(self.id);
    }
}

fn lock(conns: &Mutex<Conns>) -> std::sync::MutexGuard<'_, Conns> {
    // A panicking client thread cannot leave the table half-updated (each update is a
    // few map operations), so a poisoned lock is still consistent.
    conns.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Answers a refused connection with one error frame and closes it. Non-blocking, so a
/// peer that never reads cannot stall the accept thread; the frame fits in an empty
/// socket buffer.
fn refuse(stream: UnixStream, message: String) {
    let _ = stream.set_nonblocking(true);
    let r = Response::Err {
        code: ErrorCode::NoResources,
        message,
    };
    let _ = send_msg(stream.as_fd(), &r, &[]);
}

fn accept_loop(
    listener: UnixListener,
    conns: Arc<Mutex<Conns>>,
    counters: Arc<ConnCounters>,
    tx: Sender<ControlMsg>,
    wake: Arc<OwnedFd>,
) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                // Avoid a hot loop on persistent errors (e.g. EMFILE).
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let uid = match peer_uid(&stream) {
            Ok(u) => u,
            Err(e) => {
                counters.refused_no_cred.fetch_add(1, Ordering::Relaxed);
                refuse(stream, format!("cannot read the peer's credentials: {e}"));
                continue;
            }
        };
        let client = match lock(&conns).admit(uid) {
            Ok(c) => c,
            Err(r) => {
                let message = match r {
                    Refusal::Total(n) => {
                        counters.refused_total.fetch_add(1, Ordering::Relaxed);
                        format!("the NIC has {n} control connections open, the most it allows (--max-connections {n})")
                    }
                    Refusal::User(n) => {
                        counters.refused_user.fetch_add(1, Ordering::Relaxed);
                        format!("user {uid} has {n} control connections open, the most one user may (--max-connections-per-user {n})")
                    }
                };
                tracing::debug!(uid, %message, "connection refused");
                refuse(stream, message);
                continue;
            }
        };
        let slot = Slot {
            conns: conns.clone(),
            id: client,
            tx: tx.clone(),
            wake: wake.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("softnic-client-{client}"))
            .spawn(move || {
                client_loop(client, uid, stream, &slot.tx, &slot.wake);
                drop(slot);
            });
        if let Err(e) = spawned {
            // The closure, and with it the slot, was dropped: the slot is free again.
            tracing::warn!(error = %e, "cannot start a client thread");
        }
    }
}

fn wake_data_plane(wake: &OwnedFd) {
    let _ = verbs_api::os::eventfd_signal(wake.as_fd());
}

/// Serves one connection until it ends; the caller's [`Slot`] then reports the
/// disconnect.
fn client_loop(client: u32, uid: u32, stream: UnixStream, tx: &Sender<ControlMsg>, wake: &OwnedFd) {
    let (reply_tx, reply_rx): (Sender<_>, Receiver<_>) = bounded(1);
    let mut reader = FrameReader::new();
    tracing::debug!(client, uid, "control connection");
    // Bounded by the connection: each iteration handles one frame or ends it.
    loop {
        let (req, fds) = match reader.read_msg::<Request>(stream.as_fd()) {
            Ok(Some(m)) => m,
            // A blocking socket never reports "would block"; treat it as the end.
            Ok(None) => break,
            Err(ControlError::Json(e)) => {
                // The frame was consumed whole; the stream is still in sync.
                let r = Response::Err {
                    code: ErrorCode::Protocol,
                    message: format!("malformed request: {e}"),
                };
                if send_msg(stream.as_fd(), &r, &[]).is_err() {
                    break;
                }
                continue;
            }
            Err(ControlError::Closed) => break,
            Err(e) => {
                tracing::debug!(client, error = %e, "control connection error");
                break;
            }
        };
        let msg = ControlMsg::Request {
            client,
            uid,
            req,
            fds,
            reply: reply_tx.clone(),
        };
        if tx.send(msg).is_err() {
            break; // data plane stopped
        }
        wake_data_plane(wake);
        let Ok((resp, out_fds)) = reply_rx.recv() else {
            break;
        };
        let borrowed: Vec<_> = out_fds.iter().map(|f| f.as_fd()).collect();
        if let Err(e) = send_msg(stream.as_fd(), &resp, &borrowed) {
            tracing::debug!(client, error = %e, "cannot answer the client");
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_bounded_per_user_and_in_total() {
        let mut c = Conns::new(
            ConnLimits {
                total: 5,
                per_user: 3,
            },
            HandleAlloc::new(),
        );
        let a: Vec<u32> = (0..3).map(|_| c.admit(1000).unwrap()).collect();
        assert_eq!(c.admit(1000), Err(Refusal::User(3)));
        let b0 = c.admit(1001).unwrap();
        c.admit(1001).unwrap();
        assert_eq!(c.admit(1002), Err(Refusal::Total(5)));
        c.release(a[0]);
        c.admit(1000).unwrap();
        c.release(b0);
        c.release(b0); // twice: no effect
        assert_eq!(c.per_user[&1001], 1);
        assert!(c.admit(1002).is_ok());
    }

    #[test]
    fn connection_ids_never_alias_an_open_connection() {
        // Ids wrap at 4: with 1 and 3 still open, new connections get 2 and 4, then
        // (after 2 closes) 2 again — never 1 or 3.
        let mut c = Conns::new(
            ConnLimits {
                total: 10,
                per_user: 10,
            },
            HandleAlloc::with_max(4),
        );
        let ids: Vec<u32> = (0..4).map(|_| c.admit(0).unwrap()).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        c.release(2);
        c.release(4);
        assert_eq!(c.admit(0), Ok(2));
        assert_eq!(c.admit(0), Ok(4));
        c.release(2);
        assert_eq!(c.admit(0), Ok(2));
        assert!(c.admit(0).is_err(), "all four ids open");
    }

    #[test]
    fn peer_uid_is_this_process_uid() {
        let (a, _b) = UnixStream::pair().unwrap();
        // SAFETY: getuid(2) has no preconditions.
        let me = unsafe { libc::getuid() };
        assert_eq!(peer_uid(&a).unwrap(), me);
    }
}
