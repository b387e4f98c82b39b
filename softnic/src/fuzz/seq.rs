//! Packet sequences as the fuzzer keeps them: whole RoCEv2 UDP payloads (BTH … ICRC
//! slot) made for one connection, and the rebasing that makes the same sequence hit
//! another connection (a corpus entry reused later, a finding replayed or minimised on a
//! fresh connection to a restarted peer).
//!
//! A packet is stored with the destination QPN, PSNs, R_Key and virtual addresses the
//! connection it was made for used. [`rebase`] maps those onto another connection's
//! values: the QPN the peer announced, the PSN the peer expects, the region it
//! announced. Anything a mutation set to a value unrelated to the connection (a random
//! QPN, a wild R_Key) is left as it is, so a replay sends what the finding sent.

use serde::{Deserialize, Serialize};
use wire::icrc::IcrcParams;
use wire::{Header, Opcode};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;

/// One packet: its bytes and whether its ICRC is deliberately wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pkt {
    /// The UDP payload, BTH through the 4-byte ICRC slot (filled at send time).
    #[serde(with = "hex_bytes")]
    pub bytes: Vec<u8>,
    /// XORed into the correct ICRC when sending: 0 sends a correct ICRC. This is the
    /// only way a fuzzer packet carries a wrong ICRC (the ICRC mutation).
    #[serde(default)]
    pub icrc_xor: u32,
}

/// What a packet's connection-specific fields are relative to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ctx {
    /// The peer's QPN (from the exchange).
    pub peer_qpn: u32,
    /// The PSN the sequence's PSNs are counted from (the peer's expected PSN then).
    pub base_psn: u32,
    /// The peer's R_Key (0 when the exchange gives none).
    pub rkey: u32,
    /// The peer's buffer address (0 when the exchange gives none).
    pub va: u64,
}

impl Pkt {
    /// A packet with a correct ICRC.
    pub fn new(bytes: Vec<u8>) -> Self {
        Pkt { bytes, icrc_xor: 0 }
    }

    /// The opcode byte (0 for a packet too short to have one).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.bytes.first().copied().unwrap_or(0))
    }

    /// The BTH PSN, if the packet has a whole BTH.
    pub fn psn(&self) -> Option<u32> {
        let b = self.bytes.get(9..12)?;
        Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
    }

    /// Sets the BTH PSN (no-op on a packet shorter than a BTH).
    pub fn set_psn(&mut self, psn: u32) {
        if let Some(b) = self.bytes.get_mut(9..12) {
            b.copy_from_slice(&(psn & 0xFF_FFFF).to_be_bytes()[1..]);
        }
    }

    /// The BTH destination QPN.
    pub fn dest_qpn(&self) -> Option<u32> {
        let b = self.bytes.get(5..8)?;
        Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
    }

    /// Sets the BTH destination QPN.
    pub fn set_dest_qpn(&mut self, qpn: u32) {
        if let Some(b) = self.bytes.get_mut(5..8) {
            b.copy_from_slice(&(qpn & 0xFF_FFFF).to_be_bytes()[1..]);
        }
    }

    /// The AckReq bit.
    pub fn ack_req(&self) -> bool {
        self.bytes.get(8).is_some_and(|b| b & 0x80 != 0)
    }

    /// The packet as it goes on the wire: its ICRC computed for `params`, then XORed
    /// with `icrc_xor`. A packet too short for an ICRC goes as it is.
    pub fn wire_bytes(&self, params: &IcrcParams) -> Vec<u8> {
        let mut b = self.bytes.clone();
        if params.fill(&mut b).is_ok() && self.icrc_xor != 0 {
            let n = b.len();
            for (i, x) in self.icrc_xor.to_le_bytes().iter().enumerate() {
                b[n - 4 + i] ^= x;
            }
        }
        b
    }
}

/// Offset of header `h` in a packet whose opcode byte carries it, if the packet is long
/// enough to hold it.
fn header_at(p: &Pkt, h: Header) -> Option<usize> {
    let info = p.opcode().info()?;
    let off = info.offset_of(h)?;
    (p.bytes.len() >= off + h.size()).then_some(off)
}

/// Maps an address made against `from`'s region onto `to`'s; addresses more than 4 GiB
/// away from the region were not derived from it and stay.
fn rebase_va(va: u64, from: &Ctx, to: &Ctx) -> u64 {
    let d = i128::from(va) - i128::from(from.va);
    if from.va != 0 && d.unsigned_abs() < 1 << 32 {
        to.va.wrapping_add(d as u64)
    } else {
        va
    }
}

/// Rewrites `p`, made against `from`, for the connection `to` (see the module doc).
pub fn rebase(p: &mut Pkt, from: &Ctx, to: &Ctx) {
    if p.dest_qpn() == Some(from.peer_qpn) {
        p.set_dest_qpn(to.peer_qpn);
    }
    if let Some(psn) = p.psn() {
        p.set_psn(psn.wrapping_sub(from.base_psn).wrapping_add(to.base_psn));
    }
    for h in [Header::Reth, Header::AtomicEth] {
        let Some(off) = header_at(p, h) else { continue };
        let b = &mut p.bytes[off..off + 12];
        let va = u64::from_be_bytes(b[0..8].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(b[8..12].try_into().unwrap_or_default());
        if rkey == from.rkey && from.rkey != to.rkey {
            b[8..12].copy_from_slice(&to.rkey.to_be_bytes());
        }
        b[0..8].copy_from_slice(&rebase_va(va, from, to).to_be_bytes());
    }
}

/// Rebases every packet of `seq`.
pub fn rebase_all(seq: &mut [Pkt], from: &Ctx, to: &Ctx) {
    for p in seq {
        rebase(p, from, to);
    }
}

/// Serde helper: bytes as one lowercase hex string.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut t = String::with_capacity(b.len() * 2);
        for x in b {
            t.push_str(&format!("{x:02x}"));
        }
        s.serialize_str(&t)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let t = String::deserialize(d)?;
        if t.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd number of hex digits"));
        }
        (0..t.len())
            .step_by(2)
            .map(|i| {
                t.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom("not hex"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_only(qpn: u32, psn: u32, rkey: u32, va: u64) -> Pkt {
        let mut b = vec![0u8; BTH_LEN + 16 + 4 + 4];
        b[0] = 0x0A;
        let mut p = Pkt::new(b);
        p.set_dest_qpn(qpn);
        p.set_psn(psn);
        p.bytes[12..20].copy_from_slice(&va.to_be_bytes());
        p.bytes[20..24].copy_from_slice(&rkey.to_be_bytes());
        p
    }

    #[test]
    fn rebase_moves_connection_fields_and_keeps_wild_ones() {
        let from = Ctx {
            peer_qpn: 0x11,
            base_psn: 0xFF_FFF0,
            rkey: 0xAAAA,
            va: 0x1000,
        };
        let to = Ctx {
            peer_qpn: 0x22,
            base_psn: 5,
            rkey: 0xBBBB,
            va: 0x9000,
        };
        let mut p = write_only(0x11, 0xFF_FFF0 + 0x20, 0xAAAA, 0x1008);
        rebase(&mut p, &from, &to);
        assert_eq!(p.dest_qpn(), Some(0x22));
        assert_eq!(p.psn(), Some(0x25));
        assert_eq!(&p.bytes[12..20], &0x9008u64.to_be_bytes());
        assert_eq!(&p.bytes[20..24], &0xBBBBu32.to_be_bytes());
        // A random QPN, a wild R_Key and a far address are the mutation: kept.
        let mut q = write_only(0x33, 0xFF_FFF0, 0x1234, u64::MAX);
        rebase(&mut q, &from, &to);
        assert_eq!(q.dest_qpn(), Some(0x33));
        assert_eq!(&q.bytes[20..24], &0x1234u32.to_be_bytes());
        assert_eq!(&q.bytes[12..20], &u64::MAX.to_be_bytes());
        assert_eq!(q.psn(), Some(5));
    }

    #[test]
    fn packets_round_trip_through_json() {
        let p = Pkt {
            bytes: vec![0, 1, 0xab, 0xff],
            icrc_xor: 7,
        };
        let s = serde_json::to_string(&p).unwrap();
        assert!(s.contains("\"0001abff\""), "{s}");
        assert_eq!(serde_json::from_str::<Pkt>(&s).unwrap(), p);
    }
}
