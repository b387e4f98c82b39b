//! A mock NIC for the client tests: a thread that speaks the control protocol and
//! attaches the shared segments exactly as the real NIC must (layouts computed from the
//! request, memfds checked and mapped, ring headers checked). It proves that both sides
//! of the ABI agree, without the softnic runtime.

#![allow(dead_code)] // each test file uses part of this

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex, OnceLock};

use memmap2::MmapRaw;
use verbs_api::abi::control::{
    self, DeviceAttr, ErrorCode, QpAttr as WireAttr, Reply, Request, Response,
};
use verbs_api::abi::{Consumer, CqLayout, Cqe, Producer, QpLayout, RecvWqe, Ring, SendWqe};
use verbs_api::Gid;

#[derive(Default)]
pub struct Nic {
    pub wake: Option<OwnedFd>,
    /// The client's doorbell page (mapped as the NIC maps it).
    pub doorbell: Option<verbs_api::abi::Doorbell>,
    pub mrs: Vec<(u32, Arc<MmapRaw>)>,
    pub cqs: Vec<(u32, Producer<Cqe>, verbs_api::os::SignalPipe)>,
    pub qps: Vec<(u32, Consumer<SendWqe>, Consumer<RecvWqe>)>,
    pub modifies: Vec<(u32, WireAttr)>,
    pub destroyed: Vec<String>,
}

fn device_attr(name: &str) -> DeviceAttr {
    DeviceAttr {
        name: name.into(),
        gid: Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 9)).0,
        addr: "127.0.0.9".parse().unwrap(),
        port: 4791,
        mtu: 4096,
        max_qp: 64,
        max_qp_wr: 4096,
        max_sge: 4,
        max_cqe: 4096,
        max_inline: 256,
        max_mr: 64,
        max_mr_size: 1 << 30,
        max_qp_rd_atom: 16,
        max_msg_sz: (1 << 31) - 256,
    }
}

fn err(message: &str) -> Response {
    Response::Err {
        code: ErrorCode::InvalidArgument,
        message: message.into(),
    }
}

/// Handles one request the way the NIC must; returns the response and fds to send.
fn handle(
    nic: &Mutex<Nic>,
    name: &str,
    req: Request,
    mut fds: Vec<OwnedFd>,
) -> (Response, Vec<OwnedFd>) {
    let mut n = nic.lock().unwrap();
    match req {
        Request::OpenDevice { abi_version, .. } => {
            assert_eq!(abi_version, verbs_api::abi::ABI_VERSION);
            let fd = fds.pop().expect("doorbell memfd");
            let len = verbs_api::abi::DOORBELL_SEGMENT_LEN;
            let map = Arc::new(verbs_api::os::map_peer_shm(fd.as_fd(), len).unwrap());
            n.doorbell = Some(verbs_api::abi::Doorbell::new(map).unwrap());
            let e = verbs_api::os::eventfd().unwrap();
            let client_copy = e.try_clone().unwrap();
            n.wake = Some(e);
            // The mock is this process: its life sign says "alive" while the test runs.
            let life = verbs_api::os::life_sign()
                .unwrap()
                .fd()
                .try_clone_to_owned();
            (
                Response::Ok(Reply::Opened {
                    device: device_attr(name),
                }),
                vec![client_copy, life.unwrap()],
            )
        }
        Request::QueryDevice => (Response::Ok(Reply::Device(device_attr(name))), vec![]),
        Request::AllocPd => (Response::Ok(Reply::Pd { pd: 7 }), vec![]),
        Request::RegMr { len, iova, .. } => {
            let Some(fd) = fds.pop() else {
                return (err("RegMr needs the region's memfd"), vec![]);
            };
            let seg = verbs_api::abi::layout::mr_segment_len(len as usize).unwrap();
            let map = Arc::new(verbs_api::os::map_peer_shm(fd.as_fd(), seg).unwrap());
            assert_ne!(iova, 0);
            let lkey = 0x100 + n.mrs.len() as u32;
            n.mrs.push((lkey, map));
            (
                Response::Ok(Reply::Mr {
                    mr: lkey,
                    lkey,
                    rkey: lkey | 0xAB00_0000,
                }),
                vec![],
            )
        }
        Request::CreateCq { depth } => {
            let fd = fds.pop().expect("CQ memfd");
            let l = CqLayout::new(depth).unwrap();
            let map = Arc::new(verbs_api::os::map_peer_shm(fd.as_fd(), l.len).unwrap());
            let ring = Ring::<Cqe>::new(map, l.offset, l.capacity).unwrap();
            ring.check_header().unwrap();
            let e = verbs_api::os::SignalPipe::new().unwrap();
            let client_copy = e.reader().unwrap();
            let handle = 30 + n.cqs.len() as u32;
            n.cqs.push((handle, ring.into_producer(), e));
            (
                Response::Ok(Reply::Cq {
                    cq: handle,
                    capacity: l.capacity,
                }),
                vec![client_copy],
            )
        }
        Request::CreateQp { caps, qp_type, .. } => {
            let fd = fds.pop().expect("QP memfd");
            let l =
                QpLayout::new(caps.max_send_wr, caps.max_recv_wr, caps.sq_shape(qp_type)).unwrap();
            let map = Arc::new(verbs_api::os::map_peer_shm(fd.as_fd(), l.len).unwrap());
            let (sq, rq) = l.rings(map).unwrap();
            sq.check_header().unwrap();
            rq.check_header().unwrap();
            let qpn = 0x11 + n.qps.len() as u32;
            n.qps.push((qpn, sq.into_consumer(), rq.into_consumer()));
            // Slot k for the k-th QP.
            let doorbell = n.qps.len() as u32 - 1;
            (
                Response::Ok(Reply::Qp {
                    qpn,
                    caps,
                    doorbell,
                }),
                vec![],
            )
        }
        Request::ModifyQp { qpn, attr } => {
            n.modifies.push((qpn, attr));
            (Response::Ok(Reply::Done), vec![])
        }
        Request::DestroyQp { qpn } => {
            n.destroyed.push(format!("qp {qpn:#x}"));
            (Response::Ok(Reply::Done), vec![])
        }
        other => {
            n.destroyed.push(format!("{other:?}"));
            (Response::Ok(Reply::Done), vec![])
        }
    }
}

/// Starts a mock NIC named `name` serving one client; returns its state.
pub fn start(name: &str) -> Arc<Mutex<Nic>> {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("softnic-mock-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // Set once, before any test reads it; every test uses the same directory.
        std::env::set_var(control::SOFTNIC_DIR_ENV, &d);
        d
    });
    let path = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&path);
    assert_eq!(path, control::socket_path(name));
    let listener = UnixListener::bind(&path).unwrap();
    let nic = Arc::new(Mutex::new(Nic::default()));
    let state = nic.clone();
    let name = name.to_string();
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        loop {
            let (req, fds): (Request, _) = match control::recv_msg(conn.as_fd()) {
                Ok(v) => v,
                Err(_) => return, // client gone
            };
            let (resp, out) = handle(&state, &name, req, fds);
            let borrowed: Vec<_> = out.iter().map(|f| f.as_fd()).collect();
            if control::send_msg(conn.as_fd(), &resp, &borrowed).is_err() {
                return;
            }
        }
    });
    nic
}
