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
//! crash, or a protocol error — the client thread sends [`ControlMsg::Disconnect`] and
//! the data plane destroys everything that client created. Other clients are not
//! affected.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crossbeam::channel::{bounded, Receiver, Sender};
use verbs_api::abi::control::{send_msg, ControlError, ErrorCode, FrameReader, Request, Response};

/// A message from a client thread to the data plane.
#[derive(Debug)]
pub enum ControlMsg {
    /// A request and the descriptors that came with it.
    Request {
        /// Connection id.
        client: u32,
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

/// Handle to the running server.
pub struct ControlServer {
    path: PathBuf,
}

impl ControlServer {
    /// Binds `path` (creating its directory, replacing a stale socket file — one that no
    /// NIC answers on), and starts the accept thread. Messages go to `tx`; after sending
    /// one, a thread writes `wake` so a sleeping data plane wakes up.
    pub fn start(path: &Path, tx: Sender<ControlMsg>, wake: Arc<OwnedFd>) -> io::Result<Self> {
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
        std::thread::Builder::new()
            .name("softnic-accept".into())
            .spawn(move || accept_loop(listener, tx, wake))?;
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

fn accept_loop(listener: UnixListener, tx: Sender<ControlMsg>, wake: Arc<OwnedFd>) {
    static NEXT_CLIENT: AtomicU32 = AtomicU32::new(1);
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
        let client = NEXT_CLIENT.fetch_add(1, Ordering::Relaxed);
        let tx = tx.clone();
        let wake = wake.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("softnic-client-{client}"))
            .spawn(move || client_loop(client, stream, tx, wake));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a client thread");
        }
    }
}

fn wake_data_plane(wake: &OwnedFd) {
    let _ = verbs_api::os::eventfd_signal(wake.as_fd());
}

fn client_loop(client: u32, stream: UnixStream, tx: Sender<ControlMsg>, wake: Arc<OwnedFd>) {
    let (reply_tx, reply_rx): (Sender<_>, Receiver<_>) = bounded(1);
    let mut reader = FrameReader::new();
    tracing::debug!(client, "control connection");
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
            req,
            fds,
            reply: reply_tx.clone(),
        };
        if tx.send(msg).is_err() {
            break; // data plane stopped
        }
        wake_data_plane(&wake);
        let Ok((resp, out_fds)) = reply_rx.recv() else {
            break;
        };
        let borrowed: Vec<_> = out_fds.iter().map(|f| f.as_fd()).collect();
        if let Err(e) = send_msg(stream.as_fd(), &resp, &borrowed) {
            tracing::debug!(client, error = %e, "cannot answer the client");
            break;
        }
    }
    let _ = tx.send(ControlMsg::Disconnect { client });
    wake_data_plane(&wake);
}
