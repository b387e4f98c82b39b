//! Unreliable Datagram receive (IBTA 9.8.2, 10.2.4).
//!
//! A UD message is one SEND Only packet with a DETH. The Q_Key in the DETH must equal
//! the QP's Q_Key, or the packet is silently dropped (IBTA 10.2.4). There are no
//! ACKs and no PSN checks.
//!
//! **GRH.** Verbs applications expect the first 40 bytes of every UD receive buffer
//! to hold the Global Route Header and the payload to start at offset 40; `byte_len`
//! counts those 40 bytes (IBTA 11.4.1.2, `ibv_post_recv(3)`). For RoCEv2 there is no
//! GRH on the wire; Linux rxe copies the received IP header there, and so does softnic,
//! from what its socket reports ([`ReceivedIp`]): for IPv4, bytes 0..20 are zero and
//! bytes 20..40 hold the IPv4 header (version 4, IHL 5, the TOS, total length, the
//! Identification, DF, the TTL, protocol UDP, a valid header checksum, source,
//! destination); for IPv6 the 40 bytes are the IPv6 header (the traffic class, flow
//! label 0, payload length, next header UDP, the hop limit, source, destination).
//! libibverbs' `ibv_init_ah_from_wc` reads the TOS and TTL from there into the reply's
//! address. The destination is the address given to `Qp::set_local_addr` (zero if
//! none), or the multicast group for a datagram sent to one.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use wire::{IpParams, ParsedPacket, ICRC_LEN};

use super::{Qp, GRH_LEN};
use crate::memory::Memory;
use crate::sgl;
use crate::wr::{Completion, Queue, WcOpcode, WcStatus};

/// The IP header fields of a received datagram that its UD receive reports in the GRH,
/// as far as the NIC's socket saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivedIp {
    /// The multicast group the datagram was sent to, when it came to one the QP is
    /// attached to (the GRH's destination; else the QP's own address).
    pub group: Option<IpAddr>,
    /// IPv4 TOS / IPv6 traffic class (DSCP and ECN).
    pub tos: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 Identification (the ICRC check solves it: `rx_icrc.rs`); 0 over IPv6.
    pub ipv4_id: u16,
}

impl Default for ReceivedIp {
    /// What a datagram between two hosts carries by default: TOS 0, TTL 64, ID 0.
    fn default() -> Self {
        ReceivedIp {
            group: None,
            tos: 0,
            ttl: 64,
            ipv4_id: 0,
        }
    }
}

/// The 40-byte GRH stand-in for a datagram of `udp_payload_len` bytes from `src` to
/// `dst` with the header fields `ip` (see the module documentation): the IP header as a
/// Linux sender writes it (`wire::frame::emit_ip_header`), IPv4 in bytes 20..40.
pub fn synth_grh(
    src: IpAddr,
    dst: Option<IpAddr>,
    ip: &ReceivedIp,
    udp_payload_len: usize,
) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = (udp_payload_len + 8) as u16;
    let (params, at) = match src {
        IpAddr::V4(src) => (
            IpParams::V4 {
                src,
                dst: match dst {
                    Some(IpAddr::V4(d)) => d,
                    _ => Ipv4Addr::UNSPECIFIED,
                },
                id: ip.ipv4_id,
                dont_fragment: true,
            },
            20,
        ),
        IpAddr::V6(src) => (
            IpParams::V6 {
                src,
                dst: match dst {
                    Some(IpAddr::V6(d)) => d,
                    _ => Ipv6Addr::UNSPECIFIED,
                },
            },
            0,
        ),
    };
    // 20 or 40 bytes from `at`: they fit the 40.
    let _ = wire::frame::emit_ip_header(&params, (ip.tos, ip.ttl), udp_len, &mut g[at..]);
    g
}

impl Qp {
    pub(super) fn handle_ud_request(
        &mut self,
        src: SocketAddr,
        ip: &ReceivedIp,
        pkt: &ParsedPacket<'_>,
        mem: &mut dyn Memory,
    ) {
        let Some(deth) = pkt.repr.deth else {
            self.counters.drop_bad_opcode += 1;
            return;
        };
        if deth.qkey != self.attrs.qkey {
            self.counters.drop_bad_qkey += 1;
            return;
        }
        if pkt.payload.len() > self.mtu() as usize {
            self.counters.drop_bad_opcode += 1;
            return;
        }
        let Some(recv) = self.resp.rq.pop_front() else {
            self.counters.drop_no_recv_wqe += 1;
            return;
        };
        let sges = sgl::used(&recv.sges, recv.num_sge);
        let total = u64::from(GRH_LEN) + pkt.payload.len() as u64;
        let mut completion = Completion {
            queue: Queue::Recv,
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            imm: pkt.repr.immdt.map(|i| i.imm),
            src_qp: deth.src_qpn.value(),
            srqn: 0,
        };
        if total > sgl::total_len(sges) {
            // IBTA 10.7.3.1: a receive buffer too small is a local length error.
            completion.status = WcStatus::LocLenErr;
            completion.byte_len = 0;
            self.push_completion(completion);
            return;
        }
        let pad = usize::from(pkt.repr.bth.pad_count);
        let udp_payload_len = pkt.header_len + pkt.payload.len() + pad + ICRC_LEN;
        let dst = ip.group.or(self.local.map(|l| l.ip()));
        let grh = synth_grh(src.ip(), dst, ip, udp_payload_len);
        let placed = sgl::scatter(self.pd, sges, 0, &grh, mem)
            .and_then(|()| sgl::scatter(self.pd, sges, u64::from(GRH_LEN), pkt.payload, mem));
        if placed.is_err() {
            completion.status = WcStatus::LocProtErr;
            completion.byte_len = 0;
        } else {
            self.counters.bytes_received += pkt.payload.len() as u64;
        }
        self.push_completion(completion);
    }
}
