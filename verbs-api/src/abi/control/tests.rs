use super::*;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

fn sample_requests() -> Vec<Request> {
    vec![
        Request::OpenDevice {
            abi_version: crate::abi::ABI_VERSION,
            pid: 42,
            program: "t".into(),
        },
        Request::RegMr {
            pd: 1,
            len: 4096,
            access: 7,
            iova: 0x7f00_0000_1000,
        },
        Request::ModifyQp {
            qpn: 0x11,
            attr: QpAttr {
                state: Some(QpState::Rtr),
                dest_qpn: Some(0x22),
                remote: Some("127.0.0.2:4791".parse().unwrap()),
                ..QpAttr::default()
            },
        },
        Request::CreateQp {
            pd: 1,
            qp_type: QpType::Rc,
            send_cq: 2,
            recv_cq: 3,
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 500,
                max_sge: 4,
                max_inline: 64,
            },
            srq: Some(4),
            xrcd: None,
        },
        Request::Stats,
        Request::CreateSrq {
            pd: 1,
            attr: SrqAttr {
                max_wr: 64,
                max_sge: 2,
                srq_limit: 8,
            },
            xrc: None,
        },
        Request::ModifySrq {
            srq: 5,
            max_wr: None,
            srq_limit: Some(3),
        },
        Request::QuerySrq { srq: 5 },
        Request::DestroySrq { srq: 5 },
        Request::GetAsyncEvents,
        Request::AsyncEventChannel,
    ]
}

#[test]
fn messages_round_trip_through_a_socket_with_fds() {
    let (a, b) = UnixStream::pair().unwrap();
    for req in sample_requests() {
        let e = crate::os::eventfd().unwrap();
        send_msg(a.as_fd(), &req, &[e.as_fd()]).unwrap();
        let (got, fds): (Request, _) = recv_msg(b.as_fd()).unwrap();
        assert_eq!(got, req);
        assert_eq!(fds.len(), 1);
        // The received fd is the same eventfd.
        crate::os::eventfd_signal(fds[0].as_fd()).unwrap();
        assert_eq!(crate::os::eventfd_drain(e.as_fd()).unwrap(), 1);
    }
    let resp = Response::Err {
        code: ErrorCode::InvalidState,
        message: "QP 0x11: RESET -> RTS is not a legal transition".into(),
    };
    send_msg(b.as_fd(), &resp, &[]).unwrap();
    let (got, fds): (Response, _) = recv_msg(a.as_fd()).unwrap();
    assert_eq!(got, resp);
    assert!(fds.is_empty());
}

#[test]
fn frame_is_length_prefixed_json() {
    let f = encode(&Request::AllocPd).unwrap();
    let body = br#""AllocPd""#;
    assert_eq!(&f[..4], &(body.len() as u32).to_le_bytes());
    assert_eq!(&f[4..], body);
}

#[test]
fn oversized_length_is_refused_before_allocating() {
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut r = FrameReader::new();
    assert!(matches!(
        r.read(b.as_fd()),
        Err(ControlError::BadLength { len: u32::MAX })
    ));
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(&0u32.to_le_bytes()).unwrap();
    assert!(matches!(
        FrameReader::new().read(b.as_fd()),
        Err(ControlError::BadLength { len: 0 })
    ));
}

#[test]
fn too_many_fds_are_refused_and_closed() {
    let (a, b) = UnixStream::pair().unwrap();
    let es: Vec<OwnedFd> = (0..MAX_FDS + 2)
        .map(|_| crate::os::eventfd().unwrap())
        .collect();
    let borrowed: Vec<BorrowedFd<'_>> = es.iter().map(|e| e.as_fd()).collect();
    // Bypass send_msg's own check to act as a hostile client.
    let frame = encode(&Request::AllocPd).unwrap();
    crate::os::send_with_fds(a.as_fd(), &frame, &borrowed).unwrap();
    assert!(matches!(
        FrameReader::new().read(b.as_fd()),
        Err(ControlError::TooManyFds)
    ));
    assert!(matches!(
        send_msg(a.as_fd(), &Request::AllocPd, &borrowed),
        Err(ControlError::TooManyFds)
    ));
}

#[test]
fn partial_frames_on_a_nonblocking_socket_resume() {
    let (mut a, b) = UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let frame = encode(&Request::DestroyQp { qpn: 7 }).unwrap();
    let mut r = FrameReader::new();
    assert!(r.read(b.as_fd()).unwrap().is_none());
    a.write_all(&frame[..2]).unwrap();
    assert!(r.read(b.as_fd()).unwrap().is_none());
    assert!(r.in_frame());
    a.write_all(&frame[2..7]).unwrap();
    assert!(r.read(b.as_fd()).unwrap().is_none());
    a.write_all(&frame[7..]).unwrap();
    let (m, fds) = r.read_msg::<Request>(b.as_fd()).unwrap().unwrap();
    assert_eq!(m, Request::DestroyQp { qpn: 7 });
    assert!(fds.is_empty());
    assert!(!r.in_frame());
}

#[test]
fn close_between_and_inside_frames() {
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    assert!(matches!(
        FrameReader::new().read(b.as_fd()),
        Err(ControlError::Closed)
    ));
    let (mut a, b) = UnixStream::pair().unwrap();
    let frame = encode(&Request::Stats).unwrap();
    a.write_all(&frame[..6]).unwrap();
    drop(a);
    assert!(matches!(
        FrameReader::new().read(b.as_fd()),
        Err(ControlError::Truncated { have: 6, .. })
    ));
}

#[test]
fn garbage_json_is_an_error_not_a_panic() {
    let (mut a, b) = UnixStream::pair().unwrap();
    let body = b"{\"RegMr\":{\"pd\":\"x\"}}";
    a.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
    a.write_all(body).unwrap();
    assert!(matches!(
        recv_msg::<Request>(b.as_fd()),
        Err(ControlError::Json(_))
    ));
}

#[test]
fn socket_path_uses_softnic_dir() {
    // Only reads the environment; the default applies when it is unset.
    let p = socket_path("softnic0");
    assert_eq!(p.file_name().unwrap(), "softnic0.sock");
    assert_eq!(p.parent().unwrap(), softnic_dir());
}
