//! The fuzzer's two channels to the peer: the TCP exchange a stock server speaks
//! (which tells us its QPN, PSN, GID and, with the region extension, R_Key and
//! address), and one UDP socket that sends crafted RoCEv2 datagrams and receives the
//! answers — no NIC in between.
//!
//! The UDP socket is the NIC's own [`UdpIo`] (unconnected, DF set), so every datagram
//! leaves with IPv4 ID 0 and its ICRC can be computed before it is sent; answers are
//! checked with the NIC's receive-side ICRC verification, which also recovers the
//! non-zero IDs rxe puts on its packets.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use verbs_api::oob;
use verbs_api::{Gid, QpEndpoint};
use wire::icrc::IcrcParams;

use super::seq::{Ctx, Pkt};
use crate::nic::rx_icrc::{self, IdSolver};
use crate::nic::udp::{PacketIo, RecvBatch, UdpIo};

/// Which out-of-band exchange the server on the target speaks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum Exchange {
    /// `ibv_rc_pingpong`'s: QPN, PSN and GID only (no region: RDMA WRITE/READ/atomics
    /// can reach only the R_Key checks).
    Pingpong,
    /// The pingpong message followed by a region message (`"%016x:%08x"` address and
    /// R_Key), as softnic's `rdma_write`/`rdma_read`/`atomics` examples exchange.
    PingpongMr,
    /// perftest's (`ib_write_bw`, `ib_read_bw`, `ib_atomic_bw` servers): versions,
    /// system data, MTU, then the address messages, which carry the R_Key and buffer
    /// address. Closing the connection makes the server fail its next exchange and exit.
    Perftest,
}

/// One received datagram.
#[derive(Debug, Clone)]
pub struct Received {
    /// The UDP payload.
    pub bytes: Vec<u8>,
    /// Its sender.
    pub from: SocketAddr,
    /// Whether its ICRC verified (under ID 0 or a solved ID), and the parameters it
    /// verified under (for a capture).
    pub icrc: Option<IcrcParams>,
}

/// The UDP side.
pub struct Link {
    io: UdpIo,
    batch: RecvBatch,
    queue: VecDeque<Received>,
    solver: IdSolver,
    local: SocketAddr,
}

impl Link {
    /// Binds the fuzzer's RoCEv2 address (a peer answers to the GID we announce and
    /// its UDP port, so this is normally `LOCAL_IP:4791`).
    pub fn bind(local: SocketAddr) -> io::Result<Link> {
        let io = UdpIo::bind(local)?;
        let local = io.local_addr();
        Ok(Link {
            io,
            batch: RecvBatch::new(),
            queue: VecDeque::new(),
            solver: IdSolver::new(),
            local,
        })
    }

    /// The bound address.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// The ICRC parameters of our datagrams to `to`.
    pub fn tx_params(&self, to: SocketAddr) -> Option<IcrcParams> {
        rx_icrc::params(to, self.local, UdpIo::IPV4_ID)
    }

    /// Sends `p` to `to` (ICRC filled, then spoiled if that is the mutation). Returns the
    /// bytes as sent, for the record.
    pub fn send(&mut self, p: &Pkt, to: SocketAddr) -> Vec<u8> {
        let bytes = match self.tx_params(to) {
            Some(params) => p.wire_bytes(&params),
            None => p.bytes.clone(),
        };
        let _ = self.io.send(&bytes, to, 0);
        bytes
    }

    fn fill(&mut self) {
        while let Ok(n) = self.io.recv_batch(&mut self.batch) {
            if n == 0 {
                break;
            }
            for i in 0..n {
                let Some((bytes, from, truncated, _)) = self.batch.get(i) else {
                    continue;
                };
                let (Some(from), false) = (from, truncated) else {
                    continue;
                };
                let icrc = rx_icrc::verify(&mut self.solver, self.local, from, bytes).map(|v| v.0);
                self.queue.push_back(Received {
                    bytes: bytes.to_vec(),
                    from,
                    icrc,
                });
            }
        }
    }

    /// The next datagram, waiting until `deadline` at most.
    pub fn recv_until(&mut self, deadline: Instant) -> Option<Received> {
        loop {
            if let Some(r) = self.queue.pop_front() {
                return Some(r);
            }
            self.fill();
            if !self.queue.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep((deadline - now).min(Duration::from_micros(200)));
        }
    }
}

/// One connection to the server on the target, after the exchange.
pub struct Conn {
    /// The TCP connection; dropping it closes it (servers that watch it end the QP).
    pub tcp: Box<dyn std::any::Any + Send>,
    /// The connection's fields: the peer's QPN, the PSN it expects first (ours), its
    /// region if the exchange gave one.
    pub ctx: Ctx,
    /// The peer QP's RoCEv2 address (its GID's IP, the RoCEv2 port).
    pub peer: SocketAddr,
    /// The PSN the peer's own requests start at.
    pub peer_psn: u32,
}

/// What [`connect`] needs.
#[derive(Debug, Clone)]
pub struct ConnectSpec {
    /// The exchange server, `host:port`.
    pub target: String,
    /// The exchange.
    pub exchange: Exchange,
    /// Our RoCEv2 address (announced as our GID).
    pub local: IpAddr,
    /// The peer's RoCEv2 UDP port.
    pub udp_port: u16,
    /// Our QPN.
    pub our_qpn: u32,
    /// How long to keep retrying the TCP connection (a server restarting in a loop).
    pub timeout: Duration,
    /// The path MTU we ask for (perftest exchanges it).
    pub mtu: u32,
}

/// Opens a TCP connection to `target`, retrying refused connections until `deadline`.
fn tcp_connect(target: &str, deadline: Instant) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = target.to_socket_addrs()?.collect();
    loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("no address for {target}"));
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(a, left.max(Duration::from_millis(10))) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Connects as the exchange's client: sends our (fake) QP's address, reads the
/// server's, sends `"done"`. The server's QP is then connected to ours: ready for us.
pub fn connect(spec: &ConnectSpec, our_psn: u32) -> Result<Conn, String> {
    if spec.exchange == Exchange::Perftest {
        return connect_perftest(spec, our_psn);
    }
    let deadline = Instant::now() + spec.timeout;
    let mut s = tcp_connect(&spec.target, deadline)
        .map_err(|e| format!("connect to {}: {e}", spec.target))?;
    let _ = s.set_read_timeout(Some(spec.timeout.max(Duration::from_secs(1))));
    let _ = s.set_nodelay(true);
    let my = QpEndpoint {
        lid: 0,
        qpn: spec.our_qpn,
        psn: our_psn,
        gid: Gid::from_ip(spec.local),
        udp_port: 0,
    };
    // Region message of our own: the fuzzer has no memory; it announces an empty one.
    let my_mr = oob::RemoteMr::default();
    let e = |e: oob::OobError| format!("exchange with {}: {e}", spec.target);
    oob::write_dest(&mut s, &my).map_err(e)?;
    if spec.exchange == Exchange::PingpongMr {
        oob::write_mr(&mut s, &my_mr).map_err(e)?;
    }
    let rem = oob::read_dest(&mut s).map_err(e)?;
    let mr = match spec.exchange {
        Exchange::PingpongMr => oob::read_mr(&mut s).map_err(e)?,
        Exchange::Pingpong | Exchange::Perftest => oob::RemoteMr::default(),
    };
    oob::write_done(&mut s).map_err(e)?;
    Ok(Conn {
        tcp: Box::new(s),
        ctx: Ctx {
            peer_qpn: rem.qpn,
            base_psn: our_psn,
            rkey: mr.rkey,
            va: mr.addr,
        },
        peer: rem.gid.to_socket_addr(spec.udp_port),
        peer_psn: rem.psn,
    })
}

/// perftest's client side for the RDMA bandwidth tests (what `softnic perf` and
/// perftest's `ib_*_bw -c RC` do before the first packet): versions, system data, MTU,
/// the address hand shake, the second hand shake after connecting, and the sync.
fn connect_perftest(spec: &ConnectSpec, our_psn: u32) -> Result<Conn, String> {
    use crate::perf::exchange::{mtu_enum, Comm, Dest};
    let (host, port) = spec
        .target
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("{}: not HOST:PORT", spec.target))?;
    let e = |e| format!("perftest exchange with {}: {e}", spec.target);
    let mut comm = Comm::connect(host, port, spec.timeout).map_err(e)?;
    let v = comm.exchange_versions().map_err(e)?;
    comm.exchange_sys_data(v, 4096, 64).map_err(e)?;
    let mtu = mtu_enum(spec.mtu).ok_or_else(|| format!("MTU {} is not an IB MTU", spec.mtu))?;
    comm.exchange_mtu(v, mtu).map_err(e)?;
    let my = Dest {
        lid: 0,
        out_reads: 1,
        qpn: spec.our_qpn,
        psn: our_psn,
        rkey: 0,
        vaddr: 0,
        gid: Gid::from_ip(spec.local).0,
        srqn: 0,
    };
    let rem = comm.hand_shake(&my).map_err(e)?;
    comm.hand_shake(&my).map_err(e)?;
    comm.hand_shake(&my).map_err(e)?;
    Ok(Conn {
        tcp: Box::new(comm),
        ctx: Ctx {
            peer_qpn: rem.qpn,
            base_psn: our_psn,
            rkey: rem.rkey,
            va: rem.vaddr,
        },
        peer: Gid(rem.gid).to_socket_addr(spec.udp_port),
        peer_psn: rem.psn,
    })
}
