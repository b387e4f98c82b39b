//! The out-of-band QP exchange of `ibv_rc_pingpong` (rdma-core
//! `libibverbs/examples/rc_pingpong.c`), so that a softnic program and a stock C peer
//! can connect their QPs over TCP.
//!
//! Each side sends exactly 52 bytes: `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the GID
//! as 32 hex digits (the 16 GID bytes in order), NUL-terminated. The client (the side
//! given a host name) sends first, the server answers — after moving its QP to RTR/RTS —
//! and the client then sends `"done"` (5 bytes with the NUL) once its own QP is ready.
//! Default TCP port 18515.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};

use crate::gid::Gid;
use crate::qp::QpEndpoint;

/// Default TCP port of `ibv_rc_pingpong`.
pub const DEFAULT_PORT: u16 = 18515;

/// Length of one address message (`sizeof "0000:000000:000000:" + 32 hex digits`).
pub const MSG_LEN: usize = 52;

/// The closing message (`sizeof "done"`: with its NUL).
pub const DONE: &[u8; 5] = b"done\0";

/// Why the exchange failed.
#[derive(Debug)]
pub enum OobError {
    /// TCP failed, or the peer closed early.
    Io(io::Error),
    /// The peer's message is not in the pingpong format.
    Malformed(String),
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OobError::Io(e) => write!(f, "out-of-band exchange: {e}"),
            OobError::Malformed(s) => write!(f, "out-of-band exchange: malformed message: {s}"),
        }
    }
}

impl std::error::Error for OobError {}

impl From<io::Error> for OobError {
    fn from(e: io::Error) -> Self {
        OobError::Io(e)
    }
}

/// Encodes `dest` as the 52-byte message.
pub fn encode(dest: &QpEndpoint) -> [u8; MSG_LEN] {
    let mut s = format!(
        "{:04x}:{:06x}:{:06x}:",
        dest.lid,
        dest.qpn & 0xFF_FFFF,
        dest.psn & 0xFF_FFFF
    );
    for b in dest.gid.0 {
        s.push_str(&format!("{b:02x}"));
    }
    let mut out = [0u8; MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes()); // 51 bytes; out[51] stays NUL
    out
}

fn hex_field(s: &str, what: &str, max_digits: usize) -> Result<u32, OobError> {
    if s.is_empty() || s.len() > max_digits {
        return Err(OobError::Malformed(format!(
            "{what} {s:?} is not 1..={max_digits} hex digits"
        )));
    }
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(OobError::Malformed(format!("{what} {s:?} is not hex")));
    }
    u32::from_str_radix(s, 16).map_err(|_| OobError::Malformed(format!("{what} {s:?} is not hex")))
}

/// Decodes a peer's message (as `sscanf("%x:%x:%x:%s")` + `wire_gid_to_gid` would,
/// but strictly: bad input is an error, not a zero).
pub fn decode(msg: &[u8]) -> Result<QpEndpoint, OobError> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text =
        std::str::from_utf8(&msg[..end]).map_err(|_| OobError::Malformed("not ASCII".into()))?;
    let mut parts = text.splitn(4, ':');
    let (lid, qpn, psn, gid) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), Some(c), Some(d)) => (a, b, c, d),
        _ => {
            return Err(OobError::Malformed(format!(
                "{text:?} is not LID:QPN:PSN:GID"
            )))
        }
    };
    let lid = hex_field(lid, "LID", 4)? as u16;
    let qpn = hex_field(qpn, "QPN", 6)?;
    let psn = hex_field(psn, "PSN", 6)?;
    if gid.len() != 32 || !gid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(OobError::Malformed(format!(
            "GID {gid:?} is not 32 hex digits"
        )));
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        let pair = gid.get(2 * i..2 * i + 2).unwrap_or("00");
        *b = u8::from_str_radix(pair, 16).map_err(|_| OobError::Malformed("GID".into()))?;
    }
    Ok(QpEndpoint {
        lid,
        qpn,
        psn,
        gid: Gid(g),
        udp_port: 0,
    })
}

/// Length of a memory-region message: `"%016x:%08x"` of address and rkey, with NUL.
/// (A softnic extension used by the WRITE/READ/atomics examples; the pingpong format
/// carries no region.)
pub const MR_MSG_LEN: usize = 16 + 1 + 8 + 1;

/// A remote memory region: what a peer needs for RDMA WRITE/READ/atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteMr {
    /// Address of the first byte (the region's iova).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes (not sent; filled by the caller if known).
    pub len: u64,
}

/// Encodes a region as `"%016x:%08x\0"`.
pub fn encode_mr(mr: &RemoteMr) -> [u8; MR_MSG_LEN] {
    let s = format!("{:016x}:{:08x}", mr.addr, mr.rkey);
    let mut out = [0u8; MR_MSG_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

/// Decodes [`encode_mr`]'s format.
pub fn decode_mr(msg: &[u8]) -> Result<RemoteMr, OobError> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text =
        std::str::from_utf8(&msg[..end]).map_err(|_| OobError::Malformed("not ASCII".into()))?;
    let (addr, rkey) = text
        .split_once(':')
        .ok_or_else(|| OobError::Malformed(format!("{text:?} is not ADDR:RKEY")))?;
    if addr.len() != 16 || rkey.len() != 8 {
        return Err(OobError::Malformed(format!(
            "{text:?} is not 16:8 hex digits"
        )));
    }
    let addr = u64::from_str_radix(addr, 16)
        .map_err(|_| OobError::Malformed(format!("address {addr:?} is not hex")))?;
    let rkey = hex_field(rkey, "rkey", 8)?;
    Ok(RemoteMr { addr, rkey, len: 0 })
}

/// Sends a region description.
pub fn write_mr(stream: &mut impl Write, mr: &RemoteMr) -> Result<(), OobError> {
    stream.write_all(&encode_mr(mr))?;
    Ok(())
}

/// Receives a region description.
pub fn read_mr(stream: &mut impl Read) -> Result<RemoteMr, OobError> {
    let mut buf = [0u8; MR_MSG_LEN];
    stream.read_exact(&mut buf)?;
    decode_mr(&buf)
}

/// Sends our address.
pub fn write_dest(stream: &mut impl Write, dest: &QpEndpoint) -> Result<(), OobError> {
    stream.write_all(&encode(dest))?;
    Ok(())
}

/// Receives the peer's address (exactly 52 bytes).
pub fn read_dest(stream: &mut impl Read) -> Result<QpEndpoint, OobError> {
    let mut buf = [0u8; MSG_LEN];
    stream.read_exact(&mut buf)?;
    decode(&buf)
}

/// Sends `"done"`.
pub fn write_done(stream: &mut impl Write) -> Result<(), OobError> {
    stream.write_all(DONE)?;
    Ok(())
}

/// Receives `"done"`.
pub fn read_done(stream: &mut impl Read) -> Result<(), OobError> {
    let mut buf = [0u8; DONE.len()];
    stream.read_exact(&mut buf)?;
    if &buf != DONE {
        return Err(OobError::Malformed(format!(
            "expected \"done\", got {buf:?}"
        )));
    }
    Ok(())
}

/// Opens the TCP connection to `host:port` (every resolved address in turn).
pub fn connect(host: &str, port: u16) -> Result<TcpStream, OobError> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"));
    for a in (host, port).to_socket_addrs()? {
        match TcpStream::connect(a) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(OobError::Io(last))
}

/// Client side: connect to `host:port`, send `local`, receive the server's address.
/// The caller connects its QP, then calls [`write_done`] on the returned stream.
pub fn client_connect(
    host: &str,
    port: u16,
    local: &QpEndpoint,
) -> Result<(TcpStream, QpEndpoint), OobError> {
    let mut s = connect(host, port)?;
    write_dest(&mut s, local)?;
    let remote = read_dest(&mut s)?;
    Ok((s, remote))
}

/// Server side: accept one client on `port`, receive its address, let `connect` bring
/// our QP to RTS with it, send `local`, and wait for `"done"`.
pub fn server_accept<E>(
    port: u16,
    local: &QpEndpoint,
    connect: impl FnOnce(&QpEndpoint) -> Result<(), E>,
) -> Result<QpEndpoint, ServerError<E>> {
    let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| ServerError::Oob(e.into()))?;
    let (mut s, _) = listener.accept().map_err(|e| ServerError::Oob(e.into()))?;
    let remote = read_dest(&mut s).map_err(ServerError::Oob)?;
    connect(&remote).map_err(ServerError::Connect)?;
    write_dest(&mut s, local).map_err(ServerError::Oob)?;
    read_done(&mut s).map_err(ServerError::Oob)?;
    Ok(remote)
}

/// Failure of [`server_accept`].
#[derive(Debug)]
pub enum ServerError<E> {
    /// The exchange failed.
    Oob(OobError),
    /// The caller's connect step failed.
    Connect(E),
}

impl<E: fmt::Display> fmt::Display for ServerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Oob(e) => write!(f, "{e}"),
            ServerError::Connect(e) => write!(f, "{e}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for ServerError<E> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn sample() -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from(Ipv4Addr::new(10, 0, 17, 1)),
            udp_port: 0,
        }
    }

    #[test]
    fn encodes_the_exact_52_bytes() {
        let m = encode(&sample());
        let want = b"0000:000011:abcdef:00000000000000000000ffff0a001101\0";
        assert_eq!(want.len(), 52);
        assert_eq!(&m, want);
    }

    #[test]
    fn decodes_what_it_encodes_and_what_c_sends() {
        assert_eq!(decode(&encode(&sample())).unwrap(), sample());
        // As rc_pingpong's sprintf of an IPv6 GID would produce.
        let c = b"002a:00abcd:000001:fe800000000000000211223344556677\0";
        let d = decode(c).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0x2a, 0xabcd, 1));
        assert_eq!(d.gid.to_string(), "fe80::211:2233:4455:6677");
    }

    #[test]
    fn refuses_malformed_messages() {
        for bad in [
            &b"0000:000011:abcdef\0"[..],
            b"0000:0000111:abcdef:00000000000000000000ffff0a001101\0",
            b"zzzz:000011:abcdef:00000000000000000000ffff0a001101\0",
            b"0000:000011:abcdef:00000000000000000000ffff0a0011\0\0\0",
            b"0000:000011:abcdef:00000000000000000000ffff0a00110g\0",
            b"\xff\xfe",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mr_message_exact_bytes_and_round_trip() {
        let mr = RemoteMr {
            addr: 0x7f12_3456_7000,
            rkey: 0xab00_0102,
            len: 0,
        };
        let m = encode_mr(&mr);
        assert_eq!(&m, b"00007f1234567000:ab000102\0");
        assert_eq!(decode_mr(&m).unwrap(), mr);
        assert!(decode_mr(b"7000:ab000102\0").is_err());
        assert!(decode_mr(b"00007f1234567000:+b000102\0").is_err());
        assert!(decode_mr(b"00007f1234567000ab000102\0\0").is_err());
    }

    #[test]
    fn exchange_over_loopback_tcp() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server_local = QpEndpoint {
            qpn: 0x22,
            psn: 0x1234,
            ..sample()
        };
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let remote = read_dest(&mut s).unwrap();
            write_dest(&mut s, &server_local).unwrap();
            read_done(&mut s).unwrap();
            remote
        });
        let (mut s, remote) = client_connect("127.0.0.1", port, &sample()).unwrap();
        write_done(&mut s).unwrap();
        assert_eq!(remote, server_local);
        assert_eq!(server.join().unwrap(), sample());
    }
}
