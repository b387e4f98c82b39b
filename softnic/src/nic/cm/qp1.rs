//! CM MADs on the wire: a UD SEND Only packet to QP1 with a DETH carrying the GSI Q_Key
//! and source QP 1 (IBTA 13.5.2.1), its 256-byte payload the MAD. softnic sets
//! AckReq and counts QP1's PSN up per packet, as rxe does (see the rxe-lab capture).

use std::net::SocketAddr;

use softnic_transport::time::Instant;
use wire::cm::{CmMadRepr, MAD_LEN};
use wire::deth::GSI_QKEY;
use wire::{BthRepr, DethRepr, Opcode, PacketRepr, ParsedPacket, Qpn};

use super::NicCm;

impl NicCm {
    /// A packet addressed to QP1: checks it is a UD SEND Only with the GSI Q_Key and a
    /// CM MAD, and hands the MAD to the CM. Everything else is dropped and counted.
    pub fn handle_packet(&mut self, now: Instant, peer: SocketAddr, pkt: &ParsedPacket<'_>) {
        let r = &pkt.repr;
        let gsi =
            r.bth.opcode == Opcode::UD_SEND_ONLY && r.deth.is_some_and(|d| d.qkey == GSI_QKEY);
        if !gsi {
            self.counters.rx_drop_not_gsi += 1;
            return;
        }
        match CmMadRepr::parse(pkt.payload) {
            Ok(mad) => self.cm.handle_mad(now, peer, &mad),
            Err(_) => self.counters.rx_drop_bad_mad += 1,
        }
    }

    /// Writes the packet (BTH … payload, ICRC space left for the runtime) carrying
    /// `mad` into `buf`; its length, or `None` if `buf` is too small.
    pub fn qp1_packet(&mut self, mad: &CmMadRepr, buf: &mut [u8]) -> Option<usize> {
        let mut payload = [0u8; MAD_LEN];
        mad.emit(&mut payload).ok()?;
        let repr = gsi_send(self.qp1_psn, GSI_QKEY, MAD_LEN);
        let n = repr.emit(buf, &payload).ok()?;
        self.qp1_psn = self.qp1_psn.next();
        Some(n)
    }
}

/// The headers of a UD SEND Only to QP1 with PSN `psn`, Q_Key `qkey` (the GSI's, or a
/// wrong one in tests) and a `len`-byte payload: BTH with AckReq and P_Key 0xFFFF, DETH
/// from source QP 1.
pub fn gsi_send(psn: wire::Psn, qkey: u32, len: usize) -> PacketRepr {
    let mut repr = PacketRepr::new(BthRepr {
        ack_req: true,
        ..BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, psn)
    });
    repr.deth = Some(DethRepr {
        qkey,
        src_qpn: Qpn::GSI,
    });
    repr.payload_len = len;
    repr
}
