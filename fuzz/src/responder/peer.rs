//! The hostile peer: turns fuzz bytes into RoCEv2 datagrams aimed at the victim.
//!
//! Every field is drawn with a bias toward the values where bugs live: the PSN the
//! victim expects and the edges of its window (±1, ±2^23, wrap at 2^24), opcodes of the
//! right transport in and out of sequence, RETH and AtomicETH addresses at both ends of
//! every region and across them, DMA lengths of 0, 1, one path MTU, the region length
//! and 2^31, pad counts and payload lengths at the path-MTU edges, Q_Keys right and
//! wrong. Packets are emitted with `wire` and carry a correct ICRC unless the input
//! chooses to break it, so most of them pass the NIC's receive checks and reach the
//! transport.
//!
//! The peer keeps a model of a well-behaved requester (the next PSN it would send on
//! each QP) and remembers the victim's own recent requests, so that responses (ACKs,
//! NAKs, READ responses, atomic ACKs) can aim at PSNs the victim's requester is waiting
//! for.
//!
//! Toward the victim's XRC receive QP the peer is an XRC send QP (IBTA 9.2 table 38,
//! 9.3 XRCETH): its requests carry an XRCETH naming, mostly, one of the XRC SRQs of the
//! victim's domain (whose numbers it knows, as an `rdma_xclient` learns one), sometimes
//! the SRQ of another domain, 0, a neighbour of a real number or any 24-bit value; a
//! multi-packet message may name another SRQ in a later packet; and its keys lean
//! toward the region of the named SRQ's protection domain.

use core::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use arbitrary::{Result, Unstructured};
use softnic_transport::qp::QpType;
use wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, Header, IcrcParams,
    IethRepr, ImmDtRepr, IpParams, Msn, NakCode, Opcode, OpcodeInfo, Operation, PacketRepr,
    Position, Psn, Qpn, RethRepr, Syndrome, Transport, XrcEthRepr,
};

use super::memory::MRS;
use super::victim::{XRC_DOMAIN, XRC_SRQS};

/// The peer's address: where the victim's connected QPs send, and the source of most
/// packets.
pub const PEER: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 4791));

/// An off-path host that forges packets (same port, another address).
pub const SPOOF: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 66), 4791));

/// The victim NIC's own address.
pub const LOCAL: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 4791));

/// Most packets one `Message` action expands into.
pub const MAX_MESSAGE_PACKETS: usize = 8;

/// Largest payload the peer puts in one packet (4096-byte MTU plus a little).
pub const MAX_PAYLOAD: usize = 4096 + 64;

/// What the peer knows about one victim QP.
#[derive(Debug, Clone, Copy)]
pub struct QpView {
    /// Transport.
    pub qp_type: QpType,
    /// The victim's QPN.
    pub qpn: u32,
    /// The peer's QPN (the victim's `dest_qpn`).
    pub peer_qpn: u32,
    /// Path MTU (UD: port MTU).
    pub mtu: u32,
    /// UD Q_Key.
    pub qkey: u32,
    /// Next PSN a well-behaved peer requester would send.
    pub next_psn: u32,
    /// How many of [`MRS`] (from the front) its crafted packets name keys of.
    pub regions: usize,
}

/// Where a request's keys come from: the first `n` regions of [`MRS`], leaning toward
/// those of protection domain `pd` when the request names an XRC SRQ of that PD.
#[derive(Debug, Clone, Copy)]
struct Keys {
    n: usize,
    pd: Option<u32>,
}

/// A request the victim sent (seen on its output), that responses can aim at.
#[derive(Debug, Clone, Copy)]
pub struct Outstanding {
    /// First PSN.
    pub psn: u32,
    /// Operation.
    pub op: Operation,
    /// PSNs it spans (READ: response packets).
    pub npkts: u32,
}

/// The peer's state.
#[derive(Debug)]
pub struct Peer {
    /// Victim QPs, by index.
    pub qps: Vec<QpView>,
    /// The RC victim's recent requests (last [`Peer::RECENT`]).
    pub recent: Vec<Outstanding>,
}

/// A datagram for the victim's receive path.
#[derive(Debug, Clone)]
pub struct Datagram {
    /// UDP source.
    pub src: SocketAddr,
    /// UDP payload: BTH … ICRC.
    pub bytes: Vec<u8>,
}

impl Peer {
    /// Requests remembered.
    pub const RECENT: usize = 32;

    /// Remembers a request the victim sent.
    pub fn saw_request(&mut self, o: Outstanding) {
        if self.recent.len() == Self::RECENT {
            self.recent.remove(0);
        }
        self.recent.push(o);
    }

    /// One crafted packet to victim QP `qp` (or, rarely, to a QPN nobody has).
    pub fn packet(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<Datagram> {
        self.craft(u, qp, None, self.qps[qp].regions)
    }

    /// [`Peer::packet`] with a request opcode of transport `t` (another service's, or
    /// the QP's own) and keys of the first `regions` regions of [`MRS`].
    pub fn packet_of(
        &mut self,
        u: &mut Unstructured<'_>,
        qp: usize,
        t: Transport,
        regions: usize,
    ) -> Result<Datagram> {
        self.craft(u, qp, Some(t), regions)
    }

    fn craft(
        &mut self,
        u: &mut Unstructured<'_>,
        qp: usize,
        family: Option<Transport>,
        regions: usize,
    ) -> Result<Datagram> {
        let v = QpView {
            regions,
            ..self.qps[qp]
        };
        let info = match family {
            None => self.request_opcode(u, v.qp_type)?,
            Some(t) => *u.choose(&requests(t))?,
        };
        let dest = self.dest_qpn(u, v.qpn)?;
        let (psn, advance) = self.request_psn(u, qp)?;
        let mut repr = PacketRepr::new(bth(u, info.opcode, dest, psn)?);
        let payload_len = if info.payload {
            payload_len(u, v.mtu)?
        } else {
            0
        };
        fill_headers(u, &mut repr, info, v)?;
        repr.payload_len = payload_len;
        if advance {
            let n = match (info.operation, repr.reth) {
                (Operation::ReadRequest, Some(r)) => npkts(r.dma_len, v.mtu),
                _ => 1,
            };
            self.qps[qp].next_psn = Psn::new(psn).wrapping_add(n).value();
        }
        finish(u, &repr)
    }

    /// A well-formed multi-packet SEND or WRITE (RC/UC/XRC) from the modelled next PSN:
    /// First, Middle…, Last with exact path-MTU payloads, the RETH (biased) on the
    /// First. An XRC message names one SRQ in every packet's XRCETH, except that a
    /// later packet may name another (a switch the victim must refuse). The packets
    /// are returned in order; each may still have its ICRC broken.
    pub fn message(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<Vec<Datagram>> {
        let v = self.qps[qp];
        let t = v.qp_type.transport();
        let xrc = (t == Transport::Xrc).then(|| xrc_srqn(u)).transpose()?;
        let keys = Keys {
            n: v.regions,
            pd: xrc.and_then(|(_, pd)| pd),
        };
        let op = if u.ratio(1, 2)? {
            Operation::Send
        } else {
            Operation::Write
        };
        let imm = u.ratio(1, 3)?;
        let mtu = v.mtu as usize;
        let total = match u.int_in_range(0u8..=7)? {
            0 => 0,
            1 => 1,
            2 => mtu,
            3 => mtu + 1,
            4 => 2 * mtu,
            5 => 3 * mtu - 1,
            _ => u.int_in_range(0..=MAX_MESSAGE_PACKETS * mtu)?,
        };
        let n = total.div_ceil(mtu).clamp(1, MAX_MESSAGE_PACKETS);
        let total = total.min(n * mtu);
        let reth = if op == Operation::Write {
            let mut r = reth(u, v.mtu, keys)?;
            if u.ratio(3, 4)? {
                r.dma_len = total as u32;
            }
            Some(r)
        } else {
            None
        };
        let fill = u.arbitrary::<u8>()?;
        let mut out = Vec::with_capacity(n);
        for k in 0..n {
            let pos = match (n, k) {
                (1, _) => Position::Only,
                (_, 0) => Position::First,
                (_, k) if k + 1 == n => Position::Last,
                _ => Position::Middle,
            };
            let with = (imm && pos.ends()).then_some(Header::ImmDt);
            let Some(opcode) = Opcode::find(t, op, pos, with) else {
                continue;
            };
            let psn = self.qps[qp].next_psn;
            self.qps[qp].next_psn = Psn::new(psn).next().value();
            let mut b = bth(u, opcode, Qpn::new(v.qpn), psn)?;
            b.ack_req = pos.ends() || u.ratio(1, 8)?;
            let mut repr = PacketRepr::new(b);
            if pos.starts() {
                repr.reth = reth;
            }
            if let Some((srqn, _)) = xrc {
                let srqn = if !pos.starts() && u.ratio(1, 8)? {
                    xrc_srqn(u)?.0
                } else {
                    srqn
                };
                repr.xrceth = Some(XrcEthRepr { srqn });
            }
            if with.is_some() {
                repr.immdt = Some(ImmDtRepr {
                    imm: 0x1100_0000 | k as u32,
                });
            }
            repr.payload_len = if pos.ends() { total - k * mtu } else { mtu };
            out.push(finish_with(u, &repr, fill)?);
        }
        Ok(out)
    }

    /// The responses a correct peer would send to one of the RC victim's recent
    /// requests: every READ response packet (First, Middle…, Last with path-MTU
    /// payloads, capped at [`MAX_MESSAGE_PACKETS`]), an ATOMIC WRITE's zero-length READ
    /// response, an atomic ACK, or an ACK. Each may still have its ICRC broken.
    pub fn answer(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<Vec<Datagram>> {
        let v = self.qps[qp];
        if self.recent.is_empty() {
            return Ok(Vec::new());
        }
        let o = *u.choose(&self.recent)?;
        let mtu = v.mtu as usize;
        let aeth = |msn: u32| AethRepr {
            syndrome: Syndrome::Ack { credits: 31 },
            msn: Msn::new(msn),
        };
        let msn = u.int_in_range(0..=64)?;
        let mut out = Vec::new();
        match o.op {
            Operation::ReadRequest => {
                let n = (o.npkts as usize).min(MAX_MESSAGE_PACKETS);
                let last_len = u.int_in_range(1..=mtu)?;
                let fill = u.arbitrary::<u8>()?;
                for k in 0..n {
                    let pos = match (n, k) {
                        (1, _) => Position::Only,
                        (_, 0) => Position::First,
                        (_, k) if k + 1 == n => Position::Last,
                        _ => Position::Middle,
                    };
                    let Some(opcode) =
                        Opcode::find(Transport::Rc, Operation::ReadResponse, pos, None)
                    else {
                        continue;
                    };
                    let psn = Psn::new(o.psn).wrapping_add(k as u32).value();
                    let mut repr = PacketRepr::new(bth(u, opcode, Qpn::new(v.qpn), psn)?);
                    repr.bth.pkey = 0xFFFF;
                    if pos != Position::Middle {
                        repr.aeth = Some(aeth(msn));
                    }
                    repr.payload_len = if pos.ends() { last_len } else { mtu };
                    out.push(finish_with(u, &repr, fill)?);
                }
            }
            // IBTA A19 (as rxe answers it): a READ Response Only of zero length.
            Operation::AtomicWrite => {
                let Some(opcode) =
                    Opcode::find(Transport::Rc, Operation::ReadResponse, Position::Only, None)
                else {
                    return Ok(out);
                };
                let mut repr = PacketRepr::new(bth(u, opcode, Qpn::new(v.qpn), o.psn)?);
                repr.bth.pkey = 0xFFFF;
                repr.aeth = Some(aeth(msn));
                out.push(finish(u, &repr)?);
            }
            op => {
                let atomic = matches!(op, Operation::CompareSwap | Operation::FetchAdd);
                let (opcode, last) = if atomic {
                    (Opcode::RC_ATOMIC_ACKNOWLEDGE, o.psn)
                } else {
                    (
                        Opcode::RC_ACKNOWLEDGE,
                        Psn::new(o.psn).wrapping_add(o.npkts - 1).value(),
                    )
                };
                let mut repr = PacketRepr::new(bth(u, opcode, Qpn::new(v.qpn), last)?);
                repr.bth.pkey = 0xFFFF;
                repr.aeth = Some(aeth(msn));
                if atomic {
                    repr.atomic_ack_eth = Some(AtomicAckEthRepr {
                        orig: u.arbitrary()?,
                    });
                }
                out.push(finish(u, &repr)?);
            }
        }
        Ok(out)
    }

    /// A response to the RC victim's requester: ACK/NAK/RNR NAK, READ response, or
    /// atomic ACK, at a PSN near one of its recent requests.
    pub fn response(&mut self, u: &mut Unstructured<'_>, qp: usize) -> Result<Datagram> {
        let v = self.qps[qp];
        let op = *u.choose(&[
            Operation::Acknowledge,
            Operation::Acknowledge,
            Operation::ReadResponse,
            Operation::AtomicAcknowledge,
        ])?;
        let base = if self.recent.is_empty() {
            None
        } else {
            Some(*u.choose(&self.recent)?)
        };
        let psn = match base {
            Some(o) => {
                let within = u.int_in_range(0..=o.npkts.saturating_sub(1).min(64))?;
                let p = Psn::new(o.psn).wrapping_add(within);
                match u.int_in_range(0u8..=9)? {
                    6 => p.wrapping_sub(1).value(),
                    7 => p.wrapping_add(1).value(),
                    8 => p.wrapping_add(1 << 23).value(),
                    9 => u.int_in_range(0..=0x00FF_FFFF)?,
                    _ => p.value(),
                }
            }
            None => u.int_in_range(0..=0x00FF_FFFF)?,
        };
        let pos = match op {
            Operation::ReadResponse => *u.choose(&[
                Position::Only,
                Position::First,
                Position::Middle,
                Position::Last,
            ])?,
            _ => Position::Only,
        };
        let opcode = Opcode::find(Transport::Rc, op, pos, None).unwrap_or(Opcode(0x11));
        let info = opcode.info().ok_or(arbitrary::Error::IncorrectFormat)?;
        let mut repr = PacketRepr::new(bth(u, opcode, Qpn::new(v.qpn), psn)?);
        fill_headers(u, &mut repr, info, v)?;
        if info.payload {
            repr.payload_len = payload_len(u, v.mtu)?;
        }
        finish(u, &repr)
    }

    /// A request opcode for a QP of type `t`: mostly one of its own transport's
    /// requests, sometimes any known opcode (responses, other transports, CNP), rarely
    /// an unknown byte (which the NIC's parser must drop).
    fn request_opcode(&self, u: &mut Unstructured<'_>, t: QpType) -> Result<&'static OpcodeInfo> {
        let all: Vec<&'static OpcodeInfo> = Opcode::all().collect();
        let own = requests(t.transport());
        let pick = u.int_in_range(0u8..=19)?;
        Ok(match pick {
            0..=16 if !own.is_empty() => *u.choose(&own)?,
            _ => *u.choose(&all)?,
        })
    }

    fn dest_qpn(&self, u: &mut Unstructured<'_>, qpn: u32) -> Result<Qpn> {
        Ok(match u.int_in_range(0u8..=31)? {
            30 => Qpn::new(u.int_in_range(0..=0x00FF_FFFF)?),
            31 => Qpn::new(qpn ^ 1),
            _ => Qpn::new(qpn),
        })
    }

    /// A PSN for a request on `qp`, and whether it is the modelled next PSN (which
    /// then advances).
    fn request_psn(&self, u: &mut Unstructured<'_>, qp: usize) -> Result<(u32, bool)> {
        let next = Psn::new(self.qps[qp].next_psn);
        Ok(match u.int_in_range(0u8..=15)? {
            8 => (next.wrapping_sub(1).value(), false),
            9 => (next.wrapping_add(1).value(), false),
            10 => (next.wrapping_sub(u.int_in_range(2..=64)?).value(), false),
            11 => (next.wrapping_add(u.int_in_range(2..=64)?).value(), false),
            12 => (next.wrapping_sub(1 << 23).value(), false),
            13 => (next.wrapping_add((1 << 23) - 1).value(), false),
            14 => (next.wrapping_add(1 << 23).value(), false),
            15 => (u.int_in_range(0..=0x00FF_FFFF)?, false),
            _ => (next.value(), true),
        })
    }
}

/// The request opcodes of transport `t`.
fn requests(t: Transport) -> Vec<&'static OpcodeInfo> {
    Opcode::all()
        .filter(|i| i.transport == t && i.is_request())
        .collect()
}

/// An XRC SRQ number for a request to the victim's XRC receive QP, with the PD of the
/// SRQ it names if that is one of the victim's domain: mostly such a number, else
/// another domain's SRQ, 0 (which no SRQ has), a neighbour of a real number, a small
/// number or any 24-bit one.
fn xrc_srqn(u: &mut Unstructured<'_>) -> Result<(u32, Option<u32>)> {
    let s = *u.choose(&XRC_SRQS)?;
    let srqn = match u.int_in_range(0u8..=15)? {
        0..=10 => s.num,
        11 => 0,
        12 => s.num ^ 1,
        13 => u.int_in_range(0..=15)?,
        _ => u.int_in_range(0..=0x00FF_FFFF)?,
    };
    let pd = XRC_SRQS
        .iter()
        .find(|s| s.num == srqn && s.domain == XRC_DOMAIN)
        .map(|s| s.pd);
    Ok((srqn, pd))
}

/// Response PSNs of a READ of `dma_len` bytes (at least one).
pub fn npkts(dma_len: u32, mtu: u32) -> u32 {
    dma_len.div_ceil(mtu.max(1)).max(1)
}

fn bth(u: &mut Unstructured<'_>, opcode: Opcode, dest: Qpn, psn: u32) -> Result<BthRepr> {
    let flags = u.arbitrary::<u8>()?;
    let pkey = match u.int_in_range(0u8..=15)? {
        13 => 0x7FFF,
        14 => u.arbitrary()?,
        15 => 0x8001,
        _ => 0xFFFF,
    };
    Ok(BthRepr {
        opcode,
        solicited: flags & 1 != 0,
        mig_req: flags & 2 != 0,
        pad_count: 0,
        pkey,
        fecn: flags & 4 != 0,
        becn: flags & 8 != 0,
        dest_qpn: dest,
        ack_req: flags & 0x30 != 0,
        psn: Psn::new(psn),
    })
}

fn payload_len(u: &mut Unstructured<'_>, mtu: u32) -> Result<usize> {
    let mtu = mtu as usize;
    Ok(match u.int_in_range(0u8..=11)? {
        0 => 0,
        1 => 1,
        2 => mtu - 1,
        3 | 4 => mtu,
        5 => mtu + 1,
        6 => 8,
        7 => 3,
        _ => u.int_in_range(0..=(mtu + 8).min(MAX_PAYLOAD))?,
    })
}

/// A region choice: one of the first `k.n` of [`MRS`] (index), or `None` for a key
/// nobody has; two times in three one of PD `k.pd`'s, when given.
fn region(u: &mut Unstructured<'_>, k: Keys) -> Result<Option<usize>> {
    if let Some(pd) = k.pd {
        if u.ratio(2, 3)? {
            let of_pd: Vec<usize> = (0..k.n).filter(|&r| MRS[r].pd == pd).collect();
            if !of_pd.is_empty() {
                return Ok(Some(*u.choose(&of_pd)?));
            }
        }
    }
    let i = u.int_in_range(0..=k.n)?;
    Ok((i < k.n).then_some(i))
}

fn rkey_for(u: &mut Unstructured<'_>, r: Option<usize>) -> Result<u32> {
    Ok(match (r, u.int_in_range(0u8..=15)?) {
        (_, 13) => 0,
        (_, 14) => u.arbitrary()?,
        (Some(r), 15) => MRS[r].lkey,
        (Some(r), _) => MRS[r].rkey,
        (None, _) => u.arbitrary()?,
    })
}

/// A VA for `len` bytes in region `r`, biased to the edges.
fn va_for(u: &mut Unstructured<'_>, r: Option<usize>, len: u64) -> Result<u64> {
    let Some(r) = r else {
        return u.arbitrary();
    };
    let (base, rlen) = (MRS[r].iova, MRS[r].len as u64);
    Ok(match u.int_in_range(0u8..=11)? {
        0 => base,
        1 => base.wrapping_add(rlen.saturating_sub(len)),
        2 => base.wrapping_add(rlen.saturating_sub(len)).wrapping_add(1),
        3 => base.wrapping_sub(1),
        4 => base.wrapping_add(rlen),
        5 => base.wrapping_add(rlen).wrapping_sub(1),
        6 => u64::MAX,
        7 => u.arbitrary()?,
        _ => base.wrapping_add(u.int_in_range(0..=rlen.max(1))?),
    })
}

fn reth(u: &mut Unstructured<'_>, mtu: u32, k: Keys) -> Result<RethRepr> {
    let r = region(u, k)?;
    let rlen = r.map_or(4096, |r| MRS[r].len as u32);
    let dma_len = match u.int_in_range(0u8..=13)? {
        0 => 0,
        1 => 1,
        2 => 8,
        3 => rlen,
        4 => rlen + 1,
        5 => mtu,
        6 => 2 * mtu,
        7 => 1 << 31,
        8 => u32::MAX,
        9 => (1 << 31) + 1,
        _ => u.int_in_range(0..=rlen.max(1) + 16)?,
    };
    Ok(RethRepr {
        va: va_for(u, r, u64::from(dma_len))?,
        rkey: rkey_for(u, r)?,
        dma_len,
    })
}

fn atomic_eth(u: &mut Unstructured<'_>, k: Keys) -> Result<AtomicEthRepr> {
    let r = region(u, k)?;
    let mut va = va_for(u, r, 8)?;
    if u.ratio(3, 4)? {
        va &= !7;
    }
    Ok(AtomicEthRepr {
        va,
        rkey: rkey_for(u, r)?,
        swap_add: u.arbitrary()?,
        compare: u.arbitrary()?,
    })
}

fn syndrome(u: &mut Unstructured<'_>) -> Result<Syndrome> {
    Ok(match u.int_in_range(0u8..=9)? {
        3 => Syndrome::RnrNak {
            timer: u.int_in_range(0..=31)?,
        },
        4 => Syndrome::Nak(NakCode::PsnSequenceError),
        5 => Syndrome::Nak(NakCode::InvalidRequest),
        6 => Syndrome::Nak(NakCode::RemoteAccessError),
        7 => Syndrome::Nak(NakCode::RemoteOperationalError),
        8 => Syndrome::from_u8(u.arbitrary()?),
        9 => Syndrome::Ack {
            credits: u.int_in_range(0..=31)?,
        },
        _ => Syndrome::Ack { credits: 31 },
    })
}

/// Fills every extension header the opcode carries. The XRCETH comes first in every
/// XRC request (IBTA 9.2 table 38, 9.3 XRCETH), so the keys that follow may lean toward
/// the named SRQ's protection domain.
fn fill_headers(
    u: &mut Unstructured<'_>,
    repr: &mut PacketRepr,
    info: &OpcodeInfo,
    v: QpView,
) -> Result<()> {
    let mut keys = Keys {
        n: v.regions,
        pd: None,
    };
    for &h in info.headers {
        match h {
            Header::Reth => repr.reth = Some(reth(u, v.mtu, keys)?),
            Header::Aeth => {
                repr.aeth = Some(AethRepr {
                    syndrome: syndrome(u)?,
                    msn: Msn::new(u.int_in_range(0..=0x00FF_FFFF)?),
                })
            }
            Header::Deth => {
                let qkey = match u.int_in_range(0u8..=7)? {
                    5 => u.arbitrary()?,
                    6 => v.qkey ^ 1,
                    7 => wire::deth::GSI_QKEY,
                    _ => v.qkey,
                };
                repr.deth = Some(DethRepr {
                    qkey,
                    src_qpn: Qpn::new(u.int_in_range(0..=0x00FF_FFFF)?),
                })
            }
            Header::ImmDt => {
                repr.immdt = Some(ImmDtRepr {
                    imm: u.arbitrary()?,
                })
            }
            Header::Ieth => {
                let r = region(u, keys)?;
                repr.ieth = Some(IethRepr {
                    rkey: rkey_for(u, r)?,
                })
            }
            Header::AtomicEth => repr.atomic_eth = Some(atomic_eth(u, keys)?),
            Header::AtomicAckEth => {
                repr.atomic_ack_eth = Some(AtomicAckEthRepr {
                    orig: u.arbitrary()?,
                })
            }
            Header::Feth => {
                repr.feth = Some(FethRepr {
                    selectivity: u.int_in_range(0..=3)?,
                    placement: u.int_in_range(0..=3)?,
                })
            }
            Header::CnpPad => {}
            Header::XrcEth if v.qp_type == QpType::XrcRecv => {
                let (srqn, pd) = xrc_srqn(u)?;
                keys.pd = pd;
                repr.xrceth = Some(XrcEthRepr { srqn })
            }
            Header::XrcEth => {
                // To a QP of another service: small SRQ numbers or any 24-bit one.
                let srqn = if u.ratio(3, 4)? {
                    u.int_in_range(0..=15)?
                } else {
                    u.int_in_range(0..=0x00FF_FFFF)?
                };
                repr.xrceth = Some(XrcEthRepr { srqn })
            }
        }
    }
    Ok(())
}

fn finish(u: &mut Unstructured<'_>, repr: &PacketRepr) -> Result<Datagram> {
    let fill = u.arbitrary::<u8>()?;
    finish_with(u, repr, fill)
}

/// Emits `repr` with a payload of `fill`-derived bytes, applies the input's chosen
/// malformation (rarely), picks the source, and fills the ICRC for that source —
/// correctly, unless the input chooses to corrupt it.
fn finish_with(u: &mut Unstructured<'_>, repr: &PacketRepr, fill: u8) -> Result<Datagram> {
    let payload: Vec<u8> = (0..repr.payload_len)
        .map(|k| fill ^ (k as u8).wrapping_mul(13))
        .collect();
    let len = repr
        .total_len()
        .map_err(|_| arbitrary::Error::IncorrectFormat)?;
    let mut bytes = vec![0u8; len];
    repr.emit(&mut bytes, &payload)
        .map_err(|_| arbitrary::Error::IncorrectFormat)?;
    match u.int_in_range(0u8..=31)? {
        // A pad count that disagrees with the payload (the parser shifts the payload
        // boundary or refuses the packet).
        28 => bytes[1] = (bytes[1] & !0x30) | (u.int_in_range(0u8..=3)? << 4),
        // Cut or extend the datagram by a few bytes (ICRC refilled over the result).
        29 => {
            let k = u.int_in_range(1..=8)?;
            bytes.truncate(bytes.len().saturating_sub(k));
        }
        30 => {
            let k = u.int_in_range(1..=8)?;
            bytes.extend(std::iter::repeat_n(0, k));
        }
        // Non-zero TVer, or the reserved bits set.
        31 => bytes[1] |= u.int_in_range(1u8..=15)?,
        _ => {}
    }
    let src = match u.int_in_range(0u8..=15)? {
        14 => SPOOF,
        15 => SocketAddr::new(PEER.ip(), u.arbitrary()?),
        _ => PEER,
    };
    if bytes.len() >= wire::ICRC_LEN {
        let _ = icrc_params(src, LOCAL).fill(&mut bytes);
    }
    match u.int_in_range(0u8..=31)? {
        30 if !bytes.is_empty() => {
            let bit = u.int_in_range(0..=bytes.len() * 8 - 1)?;
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        31 => {
            // Right bytes, ICRC computed for another source port.
            let other = SocketAddr::new(src.ip(), src.port() ^ 1);
            let _ = icrc_params(other, LOCAL).fill(&mut bytes);
        }
        _ => {}
    }
    Ok(Datagram { src, bytes })
}

/// The ICRC parameters of a datagram from `src` to `dst` as a softnic peer sends it
/// (IPv4 ID 0 with DF set: the first path of the NIC's `rx_icrc::verify`).
pub fn icrc_params(src: SocketAddr, dst: SocketAddr) -> IcrcParams {
    let ip = match (src.ip(), dst.ip()) {
        (core::net::IpAddr::V4(s), core::net::IpAddr::V4(d)) => IpParams::V4 {
            src: s,
            dst: d,
            id: 0,
            dont_fragment: true,
        },
        (s, d) => IpParams::V6 {
            src: match s {
                core::net::IpAddr::V6(x) => x,
                core::net::IpAddr::V4(x) => x.to_ipv6_mapped(),
            },
            dst: match d {
                core::net::IpAddr::V6(x) => x,
                core::net::IpAddr::V4(x) => x.to_ipv6_mapped(),
            },
        },
    };
    IcrcParams {
        ip,
        src_port: src.port(),
        dst_port: dst.port(),
    }
}
