//! One rsocket's life: created, bound, listening or connecting, connected, failed —
//! each state holding the verbs-api objects it needs — and the socket table that
//! maps the numbers programs hold to them.
//!
//! A socket's number is a descriptor of its own (an eventfd), so it never collides
//! with the program's other descriptors and is freed by `rclose`. The CM runs as for
//! any id (`verbs_api::cm`): an active socket has its own event channel; a listener's
//! channel carries its connection requests and the events of the connections it
//! accepted (softnic cannot move an id to another channel), which the listener drops:
//! an accepted stream learns of its end in-band or from its flushed receives.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use verbs_api::cm::{CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, EventChannel, PortSpace};

use super::proto::ConnData;
use super::stream::{Endpoint, Sizes, Stream};
use crate::channel::errno_of;

/// What the socket is doing.
pub enum State {
    /// Created, perhaps bound (`rbind`).
    Idle {
        /// The socket's own event channel.
        channel: EventChannel,
        /// Its CM id.
        id: CmId,
    },
    /// `rlisten` done: connection requests wait in `pending`.
    Listening {
        /// The channel of the listener and of the connections it accepts.
        channel: EventChannel,
        /// The listening id.
        id: CmId,
        /// CONNECT_REQUEST events not yet accepted.
        pending: VecDeque<CmEvent>,
    },
    /// `rconnect` sent the REQ; the REP (or a refusal) is awaited.
    Connecting {
        /// The socket's own event channel.
        channel: EventChannel,
        /// Its CM id.
        id: CmId,
        /// The connection's verbs objects.
        ep: Box<Endpoint>,
    },
    /// Connected (or ended after being connected: the stream says which).
    Connected {
        /// The active side's own channel (none for an accepted stream).
        channel: Option<EventChannel>,
        /// The stream.
        stream: Box<Stream>,
    },
    /// A connect failed (`SO_ERROR` tells why); nothing more can be done with it.
    Failed,
}

/// An rsocket.
pub struct Socket {
    /// The descriptor whose number names the socket.
    fd: OwnedFd,
    /// `O_NONBLOCK` and the rest of `F_SETFL`.
    pub fs_flags: c_int,
    /// `F_SETFD` flags.
    pub fd_flags: c_int,
    /// Buffer and queue sizes for the connection to come.
    pub sizes: Sizes,
    /// `SOL_SOCKET` options set (bit = option number), as rdma-core keeps them.
    pub so_opts: u64,
    /// `IPPROTO_TCP` options set.
    pub tcp_opts: u64,
    /// `IPPROTO_IPV6` options set.
    pub ipv6_opts: u64,
    /// `IP_TOS`.
    pub ip_tos: c_int,
    /// `TCP_KEEPIDLE`, seconds.
    pub keepalive_time: c_int,
    /// Pending error for `SO_ERROR`.
    pub err: c_int,
    /// The state.
    pub state: State,
}

/// A shared socket.
pub type SocketRef = Arc<Mutex<Socket>>;

static SOCKETS: Mutex<Option<HashMap<c_int, SocketRef>>> = Mutex::new(None);

fn table<T>(f: impl FnOnce(&mut HashMap<c_int, SocketRef>) -> T) -> T {
    f(SOCKETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new))
}

/// The socket numbered `fd`.
pub fn lookup(fd: c_int) -> Option<SocketRef> {
    table(|t| t.get(&fd).cloned())
}

/// Takes socket `fd` out of the table (`rclose`).
pub fn remove(fd: c_int) -> Option<SocketRef> {
    table(|t| t.remove(&fd))
}

fn new_fd() -> Result<OwnedFd, c_int> {
    // SAFETY: eventfd has no pointer arguments; a non-negative result is a fresh
    // descriptor owned by nobody else.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: see above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is readable now (verbs-api's `poll(2)` seam, without waiting).
fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    verbs_api::os::wait_readable(fd, Some(Duration::ZERO)).unwrap_or(false)
}

fn api(r: verbs_api::Result<()>) -> Result<(), c_int> {
    r.map_err(|e| errno_of(&e))
}

impl Socket {
    /// A new socket in the table, with `inherit`'s sizes and flags when it is a
    /// listener's connection.
    fn insert(state: State, inherit: Option<&Socket>) -> Result<c_int, c_int> {
        let fd = new_fd()?;
        let n = fd.as_raw_fd();
        let mut s = Socket {
            fd,
            fs_flags: 0,
            fd_flags: 0,
            sizes: Sizes::default(),
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            ip_tos: 0,
            keepalive_time: 0,
            err: 0,
            state,
        };
        if let Some(p) = inherit {
            s.fs_flags = p.fs_flags;
            s.fd_flags = p.fd_flags;
            s.sizes = p.sizes;
            s.so_opts = p.so_opts;
            s.tcp_opts = p.tcp_opts;
        }
        table(|t| t.insert(n, Arc::new(Mutex::new(s))));
        Ok(n)
    }

    /// `rsocket(domain, SOCK_STREAM, 0)` with `flags` (`SOCK_NONBLOCK`, `SOCK_CLOEXEC`).
    pub fn create(nonblock: bool, cloexec: bool) -> Result<c_int, c_int> {
        let channel = EventChannel::new().map_err(|e| errno_of(&e))?;
        let id = CmId::new(&channel, PortSpace::Tcp).map_err(|e| errno_of(&e))?;
        let n = Self::insert(State::Idle { channel, id }, None)?;
        let s = lookup(n).ok_or(libc::EBADF)?;
        let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
        if nonblock {
            s.fs_flags |= libc::O_NONBLOCK;
        }
        if cloexec {
            s.fd_flags |= libc::FD_CLOEXEC;
        }
        Ok(n)
    }

    /// The socket's number.
    pub fn number(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Non-blocking by `O_NONBLOCK` or by the call's `MSG_DONTWAIT`.
    pub fn nonblocking(&self, msg_flags: c_int) -> bool {
        self.fs_flags & libc::O_NONBLOCK != 0 || msg_flags & libc::MSG_DONTWAIT != 0
    }

    /// The CM id, whatever the state.
    pub fn id(&self) -> Option<&CmId> {
        match &self.state {
            State::Idle { id, .. } | State::Listening { id, .. } | State::Connecting { id, .. } => {
                Some(id)
            }
            State::Connected { stream, .. } => Some(&stream.id),
            State::Failed => None,
        }
    }

    /// The CM id, mutable, whatever the state.
    pub fn id_mut(&mut self) -> Option<&mut CmId> {
        match &mut self.state {
            State::Idle { id, .. } | State::Listening { id, .. } | State::Connecting { id, .. } => {
                Some(id)
            }
            State::Connected { stream, .. } => Some(&mut stream.id),
            State::Failed => None,
        }
    }

    /// `rbind`.
    pub fn bind(&mut self, addr: SocketAddr) -> Result<(), c_int> {
        let State::Idle { id, .. } = &mut self.state else {
            return Err(libc::EINVAL);
        };
        let a = crate::id::narrowed(Some(addr)).unwrap_or(addr);
        api(id.bind_addr(a))
    }

    /// `rlisten`.
    pub fn listen(&mut self, backlog: c_int) -> Result<(), c_int> {
        if matches!(self.state, State::Listening { .. }) {
            return Ok(());
        }
        let State::Idle { id, .. } = &mut self.state else {
            return Err(libc::EINVAL);
        };
        let backlog = if backlog <= 0 { 1024 } else { backlog as u32 };
        api(id.listen(backlog))?;
        let State::Idle { channel, id } = std::mem::replace(&mut self.state, State::Failed) else {
            unreachable!("matched above");
        };
        self.state = State::Listening {
            channel,
            id,
            pending: VecDeque::new(),
        };
        Ok(())
    }

    /// Moves the listener's channel's events into `pending` (connection requests) or
    /// drops them (events of the connections already accepted). Never waits.
    fn pump(&mut self) -> Result<(), c_int> {
        let State::Listening {
            channel, pending, ..
        } = &mut self.state
        else {
            return Err(libc::EINVAL);
        };
        // A channel with nothing pending is not readable: no need to ask the NIC (a
        // program polling a listener with a zero timeout would ask it in a loop).
        if !readable(channel.fd()) {
            return Ok(());
        }
        // Bounded by the events the NIC queued, and by the backlog's limit.
        while pending.len() < 4096 {
            match channel.try_get_event().map_err(|e| errno_of(&e))? {
                Some(ev) if ev.kind == CmEventKind::ConnectRequest => pending.push_back(ev),
                Some(_) => {}
                None => break,
            }
        }
        Ok(())
    }

    /// Whether a connection request waits (listener readiness).
    pub fn acceptable(&mut self) -> bool {
        let _ = self.pump();
        matches!(&self.state, State::Listening { pending, .. } if !pending.is_empty())
    }

    /// `raccept` without waiting: the next connection, accepted with this side's
    /// connection data (EAGAIN when none waits); a request that is not an rsocket's is
    /// refused and the next one taken.
    pub fn accept(&mut self) -> Result<c_int, c_int> {
        if !matches!(self.state, State::Listening { .. }) {
            return Err(libc::EINVAL);
        }
        self.pump()?;
        // Bounded: each pass takes one request off the queue (refused ones included).
        loop {
            let State::Listening { pending, .. } = &mut self.state else {
                return Err(libc::EINVAL);
            };
            let Some(mut ev) = pending.pop_front() else {
                return Err(libc::EAGAIN);
            };
            let Some(new_id) = ev.new_id.take() else {
                continue;
            };
            let CmEventParam::Conn(req) = &ev.param else {
                continue;
            };
            // Dropping `new_id` unaccepted refuses the connection (consumer reject).
            let Ok(peer) = ConnData::parse(&req.private_data) else {
                continue;
            };
            match self.accept_one(new_id, &peer, req) {
                Ok(n) => return Ok(n),
                Err(_) => continue,
            }
        }
    }

    fn accept_one(
        &self,
        mut id: CmId,
        peer: &ConnData,
        req: &verbs_api::cm::ConnEventParam,
    ) -> Result<c_int, c_int> {
        let ctx = id.context().ok_or(libc::ENODEV)?.clone();
        let ep = Endpoint::create(&ctx, &id, self.sizes).map_err(|e| errno_of(&e))?;
        let param = ConnParam {
            private_data: ep.conn_data().to_bytes().to_vec(),
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            flow_control: req.flow_control,
            srq: false,
        };
        api(id.accept(ep.qp(), &param))?;
        let stream = Box::new(Stream::new(id, ep, peer));
        Self::insert(
            State::Connected {
                channel: None,
                stream,
            },
            Some(self),
        )
    }

    /// `rconnect`'s first half: resolves, creates the connection's objects and sends
    /// the REQ, answering EINPROGRESS; the outcome is collected by [`Socket::drive`]
    /// (the caller waits for it on a blocking socket). A connect already under way:
    /// EALREADY.
    pub fn connect(&mut self, dst: SocketAddr) -> Result<(), c_int> {
        match &self.state {
            State::Idle { .. } => {}
            State::Connecting { .. } => return Err(libc::EALREADY),
            State::Connected { .. } => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
        let sizes = self.sizes;
        let State::Idle { channel, id } = &mut self.state else {
            unreachable!("matched above");
        };
        let src = crate::id::narrowed(id.local_addr());
        let wait = Duration::from_secs(2);
        api(id.resolve_addr(src, dst, crate::id::peer_udp_port(), wait))?;
        api(id.resolve_route(wait))?;
        // Both resolutions are local: their events are already queued.
        while channel.try_get_event().map_err(|e| errno_of(&e))?.is_some() {}
        let ctx = id.context().ok_or(libc::ENODEV)?.clone();
        let ep = Box::new(Endpoint::create(&ctx, id, sizes).map_err(|e| errno_of(&e))?);
        let param = ConnParam {
            private_data: ep.conn_data().to_bytes().to_vec(),
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: true,
            srq: false,
        };
        api(id.connect(ep.qp(), &param))?;
        let State::Idle { channel, id } = std::mem::replace(&mut self.state, State::Failed) else {
            unreachable!("matched above");
        };
        self.state = State::Connecting { channel, id, ep };
        // Even if the answer is already in: as rdma-core, whose outcome comes only
        // with a later call.
        Err(libc::EINPROGRESS)
    }

    /// Collects a connect's outcome without waiting (`rs_do_connect` in the
    /// connecting state): EAGAIN while it is pending; the failure's errno, also kept
    /// for `SO_ERROR`. A connected or failed socket answers at once.
    pub fn drive(&mut self) -> Result<(), c_int> {
        let State::Connecting { channel, .. } = &self.state else {
            return match self.state {
                State::Connected { .. } => Ok(()),
                State::Failed => Err(libc::ENOTCONN),
                _ => Err(libc::ENOTCONN),
            };
        };
        // Bounded: each pass takes one event of this socket's own channel, or returns.
        let outcome = loop {
            if !readable(channel.fd()) {
                return Err(libc::EAGAIN);
            }
            let Some(ev) = channel.try_get_event().map_err(|e| errno_of(&e))? else {
                return Err(libc::EAGAIN);
            };
            match ev.kind {
                CmEventKind::Established => {
                    break match &ev.param {
                        CmEventParam::Conn(p) => {
                            ConnData::parse(&p.private_data).map_err(|_| libc::ENOTSUP)
                        }
                        _ => Err(libc::EPROTO),
                    };
                }
                CmEventKind::Rejected => break Err(libc::ECONNREFUSED),
                CmEventKind::Unreachable | CmEventKind::ConnectError => {
                    break Err(if ev.status < 0 {
                        -ev.status
                    } else {
                        libc::ECONNREFUSED
                    });
                }
                _ => continue,
            }
        };
        let State::Connecting {
            channel,
            mut id,
            ep,
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            unreachable!("matched above");
        };
        match outcome {
            Ok(peer) => {
                self.state = State::Connected {
                    channel: Some(channel),
                    stream: Box::new(Stream::new(id, *ep, &peer)),
                };
                Ok(())
            }
            Err(e) => {
                let _ = id.disconnect();
                self.err = e;
                Err(e)
            }
        }
    }

    /// The connected stream, after collecting a pending connect's outcome: ENOTCONN
    /// when there is none, EAGAIN while a connect is pending.
    pub fn stream(&mut self) -> Result<&mut Stream, c_int> {
        if matches!(self.state, State::Connecting { .. }) {
            self.drive()?;
        }
        match &mut self.state {
            State::Connected { stream, .. } => Ok(stream),
            _ => Err(libc::ENOTCONN),
        }
    }

    /// `rshutdown`: in-band SHUTDOWN or DISCONNECT, then (both directions closed) the
    /// CM's disconnect.
    pub fn shutdown(&mut self, how: c_int) -> Result<(), c_int> {
        if ![libc::SHUT_RD, libc::SHUT_WR, libc::SHUT_RDWR].contains(&how) {
            return Err(libc::EINVAL);
        }
        let State::Connected { stream, .. } = &mut self.state else {
            return Ok(());
        };
        let r = stream.shutdown(how);
        if stream.disconnected || !stream.connected {
            let _ = stream.id.disconnect();
        }
        r
    }

    /// `rclose`: a connected stream is shut down both ways first.
    pub fn close(mut self) {
        if let State::Connected { stream, .. } = &mut self.state {
            if stream.connected {
                let _ = stream.shutdown(libc::SHUT_RDWR);
            }
            let _ = stream.id.disconnect();
        }
    }

    /// Poll readiness (`rs_poll_rs`) and, when nothing is ready, the descriptor to
    /// sleep on (armed) — `None` when the socket must be looked at again at once.
    pub fn poll_state(&mut self, events: i16) -> (i16, Option<RawFd>) {
        if matches!(self.state, State::Connecting { .. }) {
            // The outcome, if any, is now in the state (and a failure in SO_ERROR).
            let _ = self.drive();
        }
        match &mut self.state {
            State::Connected { stream, .. } => {
                let r = stream.revents(events);
                if r != 0 {
                    return (r, None);
                }
                // Not ready: a program polling with a zero timeout spins here; let the
                // NIC have the core now and then.
                stream.idle();
                if stream.arm() {
                    (0, Some(stream.wait_fd()))
                } else {
                    (0, None)
                }
            }
            State::Listening { .. } => {
                if self.acceptable() {
                    return (events & libc::POLLIN, None);
                }
                let State::Listening { channel, .. } = &self.state else {
                    return (0, None);
                };
                (0, Some(channel.fd().as_raw_fd()))
            }
            State::Connecting { channel, .. } => (0, Some(channel.fd().as_raw_fd())),
            State::Failed => (
                (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR,
                None,
            ),
            State::Idle { .. } => (0, Some(self.fd.as_raw_fd())),
        }
    }

    /// After a sleep on the descriptor [`Socket::poll_state`] gave: takes the CQ's
    /// event (a connected stream).
    pub fn woke(&mut self) {
        if let State::Connected { stream, .. } = &self.state {
            stream.take_event();
        }
    }
}
