//! perftest's out-of-band TCP exchange (perftest 4.5, `src/perftest_communication.c`),
//! byte for byte, so that `softnic perf` pairs with stock `ib_write_bw` & co.
//!
//! Every exchange is symmetric: the client (the side given a host) writes its bytes and
//! then reads the peer's; the server reads first and then writes. The pieces are:
//!
//! * versions: 16 bytes each, the NUL-padded version string (`char version[16]`);
//! * system data (peer version ≥ 5.32): cycle buffer and cache line size, each a
//!   4-byte big-endian int; both sides then use the maximum;
//! * MTU (peer version ≥ 5.1): `sprintf("%d", enum ibv_mtu)` sent as 2 bytes (peer
//!   version ≥ 5.31); both use the smaller valid one;
//! * the address message (`ctx_hand_shake`): 108 bytes with a GID
//!   (`KEY_PRINT_FMT_GID`) — what every RoCE peer sends — or 59 without;
//! * the BW report (`xchg_bw_reports`): size (8 bytes), iterations (8 bytes from
//!   version 5.33 on), peak, average and message rate, each a separate exchange of
//!   big-endian integers / byte-swapped IEEE doubles;
//! * closing (`ctx_close_connection`): one more address exchange, then `"done"` with
//!   its NUL, never read by the peer.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The version string softnic announces: perftest 4.5-0.17's `VERSION` (its
/// configure.ac says 6.06). Peers older than 5.70 refuse to run, so it must be ≥ 5.70;
/// ≥ 5.33 makes the report's iteration count 8 bytes.
pub const VERSION: &str = "6.06";

/// `MAX_VERSION`: size of the version buffer on the wire.
pub const VERSION_LEN: usize = 16;

/// `KEY_MSG_SIZE_GID`: the address message with a GID (107 characters + NUL).
pub const KEY_MSG_SIZE_GID: usize = 108;

/// `KEY_MSG_SIZE`: the address message without a GID (58 characters + NUL).
pub const KEY_MSG_SIZE: usize = 59;

/// The closing message: `"done"` with its NUL (`sizeof "done"`).
pub const DONE: &[u8; 5] = b"done\0";

/// What one side tells the other about one QP (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READ/atomics this side's QP handles (`out_reads`).
    pub out_reads: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// Remote key of the buffer the peer targets.
    pub rkey: u32,
    /// Virtual address the peer targets.
    pub vaddr: u64,
    /// GID of the QP's port.
    pub gid: [u8; 16],
    /// SRQ number (XRC/DC only; 0 here).
    pub srqn: u32,
}

/// Why an exchange failed.
#[derive(Debug)]
pub enum ExchangeError {
    /// TCP failed, timed out, or the peer closed.
    Io(io::Error),
    /// The peer's bytes are not in perftest's format.
    Malformed(String),
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::Io(e) => write!(f, "perftest exchange: {e}"),
            ExchangeError::Malformed(s) => write!(f, "perftest exchange: malformed message: {s}"),
        }
    }
}

impl std::error::Error for ExchangeError {}

impl From<io::Error> for ExchangeError {
    fn from(e: io::Error) -> Self {
        ExchangeError::Io(e)
    }
}

type Result<T> = std::result::Result<T, ExchangeError>;

/// Encodes `d` as `KEY_PRINT_FMT_GID`:
/// `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:"`, NUL-terminated.
/// Fields are masked to their printed widths so the message is always 108 bytes.
pub fn encode_dest_gid(d: &Dest) -> [u8; KEY_MSG_SIZE_GID] {
    let mut s = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
        d.lid,
        d.out_reads & 0xffff,
        d.qpn & 0xff_ffff,
        d.psn & 0xff_ffff,
        d.rkey,
        d.vaddr
    );
    for b in d.gid {
        s.push_str(&format!("{b:02x}:"));
    }
    s.push_str(&format!("{:08x}:", d.srqn));
    let mut out = [0u8; KEY_MSG_SIZE_GID];
    let n = s.len().min(KEY_MSG_SIZE_GID - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Encodes `d` as `KEY_PRINT_FMT` (no GID): `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"`.
pub fn encode_dest_nogid(d: &Dest) -> [u8; KEY_MSG_SIZE] {
    let s = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:{:08x}",
        d.lid,
        d.out_reads & 0xffff,
        d.qpn & 0xff_ffff,
        d.psn & 0xff_ffff,
        d.rkey,
        d.vaddr,
        d.srqn
    );
    let mut out = [0u8; KEY_MSG_SIZE];
    let n = s.len().min(KEY_MSG_SIZE - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// The text of a message up to its NUL, as ASCII.
fn message_text(msg: &[u8]) -> Result<&str> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    let text = msg.get(..end).unwrap_or_default();
    std::str::from_utf8(text).map_err(|_| ExchangeError::Malformed("not ASCII".into()))
}

/// One hex field as perftest's `strtol(…, 16)` reads it, but strict: 1..=`max_digits`
/// hex digits, nothing else.
fn hex(field: &str, what: &str, max_digits: usize) -> Result<u64> {
    if field.is_empty() || field.len() > max_digits || !field.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(ExchangeError::Malformed(format!(
            "{what} {field:?} is not 1..={max_digits} hex digits"
        )));
    }
    u64::from_str_radix(field, 16)
        .map_err(|_| ExchangeError::Malformed(format!("{what} {field:?} is not hex")))
}

/// The six leading fields shared by both formats.
fn decode_head(fields: &[&str]) -> Result<Dest> {
    let get = |i: usize| fields.get(i).copied().unwrap_or("");
    Ok(Dest {
        lid: hex(get(0), "LID", 4)? as u16,
        out_reads: hex(get(1), "OUT_READS", 4)? as u32,
        qpn: hex(get(2), "QPN", 6)? as u32,
        psn: hex(get(3), "PSN", 6)? as u32,
        rkey: hex(get(4), "RKEY", 8)? as u32,
        vaddr: hex(get(5), "VADDR", 16)?,
        gid: [0; 16],
        srqn: 0,
    })
}

/// Decodes a 108-byte GID message (what `ethernet_read_keys` parses).
pub fn decode_dest_gid(msg: &[u8]) -> Result<Dest> {
    let text = message_text(msg)?;
    // 6 head fields, 16 GID bytes, SRQN, and the empty tail after the final ':'.
    let fields: Vec<&str> = text.split(':').collect();
    if fields.len() != 24 || fields.last() != Some(&"") {
        return Err(ExchangeError::Malformed(format!(
            "{text:?} is not LID:OUT:QPN:PSN:RKEY:VADDR:16 GID bytes:SRQN:"
        )));
    }
    let mut d = decode_head(&fields)?;
    for (i, b) in d.gid.iter_mut().enumerate() {
        *b = hex(fields.get(6 + i).copied().unwrap_or(""), "GID byte", 2)? as u8;
    }
    d.srqn = hex(fields.get(22).copied().unwrap_or(""), "SRQN", 8)? as u32;
    Ok(d)
}

/// Decodes a 59-byte message without GID (`sscanf(KEY_PRINT_FMT)`).
pub fn decode_dest_nogid(msg: &[u8]) -> Result<Dest> {
    let text = message_text(msg)?;
    let fields: Vec<&str> = text.split(':').collect();
    if fields.len() != 7 {
        return Err(ExchangeError::Malformed(format!(
            "{text:?} is not LID:OUT:QPN:PSN:RKEY:VADDR:SRQN"
        )));
    }
    let mut d = decode_head(&fields)?;
    d.srqn = hex(fields.get(6).copied().unwrap_or(""), "SRQN", 8)? as u32;
    Ok(d)
}

/// The version buffer: the string, NUL-padded to 16 bytes (`strncpy`).
pub fn encode_version(v: &str) -> [u8; VERSION_LEN] {
    let mut out = [0u8; VERSION_LEN];
    let n = v.len().min(VERSION_LEN - 1);
    out[..n].copy_from_slice(&v.as_bytes()[..n]);
    out
}

/// The peer's version as perftest's `atof` reads it (leading decimal number; 0 when
/// there is none).
pub fn parse_version(buf: &[u8]) -> f64 {
    let text = message_text(buf).unwrap_or("");
    let t = text.trim_start();
    let end = t
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (c == '.' && !t[..i].contains('.'))))
        .map_or(t.len(), |(i, _)| i);
    t[..end].parse().unwrap_or(0.0)
}

/// `enum ibv_mtu` value of a byte count (IBV_MTU_256 = 1 … IBV_MTU_4096 = 5).
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// Bytes of an `enum ibv_mtu` value (`MTU_SIZE`).
pub fn mtu_bytes(e: u32) -> Option<u32> {
    (1..=5).contains(&e).then(|| 128u32 << e)
}

/// The 2-byte MTU message: `sprintf(cur, "%d", mtu)` of a one-digit enum value.
pub fn encode_mtu(mtu_enum: u32) -> [u8; 2] {
    [b'0' + (mtu_enum % 10) as u8, 0]
}

/// The peer's MTU message as `strtol(rem, NULL, 10)` reads it (None if no number).
pub fn decode_mtu(buf: &[u8]) -> Option<u32> {
    let text = message_text(buf).ok()?;
    text.parse().ok()
}

/// One side's BW report (`struct bw_report_data`, the exchanged fields).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Iterations (all QPs).
    pub iters: u64,
    /// Peak bandwidth, MB/s (2^20 bytes).
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Average message rate, Mpps.
    pub msg_rate: f64,
}

/// A connected perftest control socket, with its role.
pub struct Comm {
    stream: TcpStream,
    /// True on the side that connected (perftest's `servername` is set).
    pub is_client: bool,
}

impl Comm {
    /// Client: connect to `host:port` (IPv4, as perftest's `AF_INET` resolver). Unlike
    /// perftest, a refused connection is retried (every 100 ms, up to `timeout`) so the
    /// client may start before the server listens.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Comm> {
        let deadline = std::time::Instant::now() + timeout;
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()?
            .filter(|a| a.is_ipv4())
            .collect();
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("no IPv4 address for {host}"),
        );
        // Bounded by the deadline.
        loop {
            for a in &addrs {
                match TcpStream::connect_timeout(a, timeout) {
                    Ok(s) => return Comm::new(s, true, timeout),
                    Err(e) => last = e,
                }
            }
            if last.kind() != io::ErrorKind::ConnectionRefused
                || std::time::Instant::now() >= deadline
            {
                return Err(ExchangeError::Io(io::Error::new(
                    last.kind(),
                    format!("Couldn't connect to {host}:{port}: {last}"),
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Server: listen on `0.0.0.0:port` (SO_REUSEADDR, as perftest; port 0: a free
    /// port, handed to `listening` before the wait so the caller can tell the client)
    /// and accept one client, waiting at most `timeout` for it.
    pub fn accept(port: u16, timeout: Duration, listening: impl FnOnce(u16)) -> Result<Comm> {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        sock.set_reuse_address(true)?;
        let addr: std::net::SocketAddr = ([0, 0, 0, 0], port).into();
        sock.bind(&addr.into()).map_err(|e| {
            io::Error::new(e.kind(), format!("Couldn't listen to port {port}: {e}"))
        })?;
        sock.listen(1)?;
        let listener: TcpListener = sock.into();
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        listening(port);
        let deadline = std::time::Instant::now() + timeout;
        // Bounded by the deadline: one accept attempt every 10 ms.
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    return Comm::new(s, false, timeout);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= deadline {
                        return Err(ExchangeError::Io(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no client connected to port {port} within {timeout:?}"),
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn new(stream: TcpStream, is_client: bool, timeout: Duration) -> Result<Comm> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Comm { stream, is_client })
    }

    /// `ctx_xchg_data_ethernet`: client writes then reads, server reads then writes.
    /// `mine` goes out in one write(2), as perftest sends it.
    pub fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<()> {
        if self.is_client {
            self.stream.write_all(mine)?;
            self.stream.read_exact(theirs)?;
        } else {
            self.stream.read_exact(theirs)?;
            self.stream.write_all(mine)?;
        }
        Ok(())
    }

    /// `exchange_versions`: returns the peer's version number.
    pub fn exchange_versions(&mut self) -> Result<f64> {
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(&encode_version(VERSION), &mut theirs)?;
        Ok(parse_version(&theirs))
    }

    /// `check_sys_data`: exchanges (cycle buffer, cache line size) and returns the
    /// maxima. Skipped (returns ours) for peers older than 5.32.
    pub fn exchange_sys_data(
        &mut self,
        rem_version: f64,
        cycle_buffer: u32,
        cache_line: u32,
    ) -> Result<(u32, u32)> {
        if rem_version < 5.32 {
            return Ok((cycle_buffer, cache_line));
        }
        let mut a = [0u8; 4];
        self.xchg(&cycle_buffer.to_be_bytes(), &mut a)?;
        let mut b = [0u8; 4];
        self.xchg(&cache_line.to_be_bytes(), &mut b)?;
        let rem_cycle = i32::from_be_bytes(a);
        let rem_cache = i32::from_be_bytes(b);
        let pick = |mine: u32, rem: i32| if rem > mine as i32 { rem as u32 } else { mine };
        Ok((pick(cycle_buffer, rem_cycle), pick(cache_line, rem_cache)))
    }

    /// `check_mtu`: exchanges our MTU enum and returns the one both use (the smaller,
    /// if the peer's is valid).
    pub fn exchange_mtu(&mut self, rem_version: f64, mine: u32) -> Result<u32> {
        if rem_version < 5.1 {
            return Ok(mine);
        }
        let msg = encode_mtu(mine);
        // Peers before 5.31 send sizeof(int) bytes.
        let len = if rem_version >= 5.31 { 2 } else { 4 };
        let mut out = [0u8; 4];
        out[..2].copy_from_slice(&msg);
        let mut theirs = [0u8; 4];
        self.xchg(&out[..len], &mut theirs[..len])?;
        Ok(match decode_mtu(&theirs[..len]) {
            Some(r) if (1..=5).contains(&r) && mine > r => r,
            _ => mine,
        })
    }

    /// `ctx_hand_shake` with the GID message format.
    pub fn hand_shake(&mut self, mine: &Dest) -> Result<Dest> {
        let mut theirs = [0u8; KEY_MSG_SIZE_GID];
        self.xchg(&encode_dest_gid(mine), &mut theirs)?;
        decode_dest_gid(&theirs)
    }

    /// `xchg_bw_reports`: five (or four, for peers before 5.33) separate exchanges.
    pub fn exchange_bw_reports(&mut self, rem_version: f64, mine: &BwReport) -> Result<BwReport> {
        let mut r = BwReport::default();
        let mut b8 = [0u8; 8];
        self.xchg(&mine.size.to_be_bytes(), &mut b8)?;
        r.size = u64::from_be_bytes(b8);
        if rem_version >= 5.33 {
            self.xchg(&mine.iters.to_be_bytes(), &mut b8)?;
            r.iters = u64::from_be_bytes(b8);
        } else {
            let mut b4 = [0u8; 4];
            self.xchg(&(mine.iters as u32).to_be_bytes(), &mut b4)?;
            r.iters = u64::from(u32::from_be_bytes(b4));
        }
        for (m, t) in [
            (mine.bw_peak, &mut r.bw_peak),
            (mine.bw_avg, &mut r.bw_avg),
            (mine.msg_rate, &mut r.msg_rate),
        ] {
            self.xchg(&m.to_bits().to_be_bytes(), &mut b8)?;
            *t = f64::from_bits(u64::from_be_bytes(b8));
        }
        Ok(r)
    }

    /// `ctx_close_connection`: one last hand shake, then `"done"`. The peer never reads
    /// our `"done"`; we read theirs (briefly, ignoring failures) so that closing with
    /// unread bytes does not reset the connection under the peer.
    pub fn close(&mut self, mine: &Dest) -> Result<()> {
        self.hand_shake(mine)?;
        self.stream.write_all(DONE)?;
        let _ = self.stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; DONE.len()];
        let _ = self.stream.read_exact(&mut buf);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Dest {
        Dest {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x7f12_3456_7000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2],
            srqn: 0,
        }
    }

    /// The bytes C's sprintf(KEY_PRINT_FMT_GID, …) produces for `sample()`, written out
    /// by hand from the format string.
    const SAMPLE_GID_MSG: &[u8; 108] = b"0000:0010:000011:abcdef:12345678:00007f1234567000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:00:02:00000000:\0";

    #[test]
    fn gid_message_is_the_exact_108_bytes() {
        assert_eq!(SAMPLE_GID_MSG.len(), KEY_MSG_SIZE_GID);
        assert_eq!(&encode_dest_gid(&sample()), SAMPLE_GID_MSG);
        assert_eq!(decode_dest_gid(SAMPLE_GID_MSG).unwrap(), sample());
    }

    #[test]
    fn nogid_message_is_the_exact_59_bytes() {
        let want = b"0000:0010:000011:abcdef:12345678:00007f1234567000:00000000\0";
        assert_eq!(want.len(), KEY_MSG_SIZE);
        assert_eq!(&encode_dest_nogid(&sample()), want);
        let d = decode_dest_nogid(want).unwrap();
        assert_eq!(
            d,
            Dest {
                gid: [0; 16],
                ..sample()
            }
        );
    }

    #[test]
    fn fields_are_masked_to_their_widths() {
        let d = Dest {
            qpn: 0x1ff_ffff,
            psn: 0xf00_0001,
            out_reads: 0x1_0002,
            ..sample()
        };
        let m = encode_dest_gid(&d);
        assert_eq!(&m[..24], b"0000:0002:ffffff:000001:");
        assert_eq!(m[107], 0);
    }

    #[test]
    fn decodes_an_ipv6_gid_and_srqn_as_c_sends_them() {
        let c = b"0001:0080:0000a5:000001:00000201:000055d0c0ffee00:\
fe:80:00:00:00:00:00:00:02:11:22:ff:fe:33:44:55:0000002a:\0";
        let d = decode_dest_gid(c).unwrap();
        assert_eq!((d.lid, d.out_reads, d.qpn, d.psn), (1, 0x80, 0xa5, 1));
        assert_eq!((d.rkey, d.vaddr, d.srqn), (0x201, 0x55d0_c0ff_ee00, 0x2a));
        assert_eq!(d.gid[0], 0xfe);
        assert_eq!(d.gid[15], 0x55);
    }

    #[test]
    fn refuses_malformed_messages() {
        let good = *SAMPLE_GID_MSG;
        let mut short = good;
        short[50] = 0;
        let mut bad_hex = good;
        bad_hex[2] = b'g';
        let mut no_tail = good;
        no_tail[106] = 0;
        for bad in [
            &short[..],
            &bad_hex[..],
            &no_tail[..],
            b"\xff\xfe",
            b"",
            b"::::",
        ] {
            assert!(decode_dest_gid(bad).is_err(), "{bad:?}");
        }
        assert!(decode_dest_nogid(&good).is_err());
    }

    #[test]
    fn version_and_mtu_messages() {
        assert_eq!(&encode_version(VERSION), b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(parse_version(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0"), 6.06);
        assert_eq!(parse_version(b"5.70-beta\0"), 5.70);
        assert_eq!(parse_version(b"garbage\0"), 0.0);
        assert_eq!(encode_mtu(3), *b"3\0");
        assert_eq!(decode_mtu(b"5\0"), Some(5));
        assert_eq!(decode_mtu(b"x\0"), None);
        assert_eq!(mtu_enum(1024), Some(3));
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(0), None);
    }

    /// Runs `client` and `server` against each other over loopback TCP.
    fn pair<A: Send + 'static, B>(
        server: impl FnOnce(&mut Comm) -> A + Send + 'static,
        client: impl FnOnce(&mut Comm) -> B,
    ) -> (A, B) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut c = Comm::new(s, false, Duration::from_secs(10)).unwrap();
            server(&mut c)
        });
        let mut c = Comm::connect("127.0.0.1", port, Duration::from_secs(10)).unwrap();
        let b = client(&mut c);
        (t.join().unwrap(), b)
    }

    #[test]
    fn preamble_takes_the_maxima_and_the_smaller_mtu() {
        let (s, c) = pair(
            |c| {
                let v = c.exchange_versions().unwrap();
                let sys = c.exchange_sys_data(v, 4096, 128).unwrap();
                let mtu = c.exchange_mtu(v, 5).unwrap();
                (v, sys, mtu)
            },
            |c| {
                let v = c.exchange_versions().unwrap();
                let sys = c.exchange_sys_data(v, 8192, 64).unwrap();
                let mtu = c.exchange_mtu(v, 3).unwrap();
                (v, sys, mtu)
            },
        );
        assert_eq!(s, (6.06, (8192, 128), 3));
        assert_eq!(c, (6.06, (8192, 128), 3));
    }

    #[test]
    fn bw_reports_travel_big_endian() {
        let mine = BwReport {
            size: 65536,
            iters: 2000,
            bw_peak: 1234.5,
            bw_avg: 1000.25,
            msg_rate: 0.016,
        };
        let (s, c) = pair(
            move |c| c.exchange_bw_reports(6.06, &BwReport::default()).unwrap(),
            |c| c.exchange_bw_reports(6.06, &mine).unwrap(),
        );
        assert_eq!(s, mine);
        assert_eq!(c, BwReport::default());
        assert_eq!(1000.25f64.to_bits().to_be_bytes()[0], 0x40);
    }
}
