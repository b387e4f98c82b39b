//! The opcode table: for every BTH opcode softnic speaks, its IBTA name, transport,
//! operation, position in a message and the extension headers that follow the BTH, in
//! wire order.
//!
//! This is data, not code (the model is `rxe_opcode.c`): parsing, emitting, the requester's
//! opcode sequencing and the decoder all read the same rows. The opcode byte is split by
//! IBTA 9.2 into a 3-bit transport prefix (RC 000, UC 001, RD 010, UD 011, CNP 100,
//! XRC 101) and a 5-bit operation. RD is not implemented and its opcodes are parse
//! errors, as are reserved codes. XRC rows mirror the RC rows, with the XRCETH (the
//! target's SRQ number) right after the BTH of every request.

use core::fmt;

/// An 8-bit BTH opcode. Any value can be held; [`Opcode::info`] says whether it is known.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// Transport service of an opcode (the top 3 bits, IBTA 9.2 table 38).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
    /// RoCEv2 Congestion Notification Packet (Annex A17.9.3).
    Cnp,
    /// eXtended Reliable Connected: RC's rules, but one connection serves every SRQ of
    /// the target's XRC domain, so each request names its SRQ in an XRCETH.
    Xrc,
}

/// What a packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (optionally with immediate data or invalidate).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// Acknowledge (ACK or NAK).
    Acknowledge,
    /// Atomic acknowledge.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// FLUSH (IBTA 1.5 memory placement extensions).
    Flush,
    /// ATOMIC WRITE (IBTA 1.5 memory placement extensions).
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Where a packet sits in its message (IBTA 9.4: First, Middle, Last, or Only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// A middle packet.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// True for First and Only: this packet starts a message.
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// True for Last and Only: this packet ends a message.
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// An extension header that can follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Header {
    /// RDMA Extended Transport Header, 16 bytes.
    Reth,
    /// ACK Extended Transport Header, 4 bytes.
    Aeth,
    /// Datagram Extended Transport Header, 8 bytes.
    Deth,
    /// Immediate data, 4 bytes.
    ImmDt,
    /// Invalidate Extended Transport Header, 4 bytes.
    Ieth,
    /// Atomic Extended Transport Header, 28 bytes.
    AtomicEth,
    /// Atomic ACK Extended Transport Header, 8 bytes.
    AtomicAckEth,
    /// Flush Extended Transport Header, 4 bytes.
    Feth,
    /// CNP body: 16 reserved bytes.
    CnpPad,
    /// XRC Extended Transport Header, 4 bytes: the XRC SRQ number.
    XrcEth,
}

impl Header {
    /// This header's bit in a set of headers (`1 << discriminant`).
    pub const fn bit(self) -> u16 {
        1 << self as u16
    }

    /// The set of `headers` as [`Header::bit`]s.
    pub const fn mask_of(headers: &[Header]) -> u16 {
        let mut m = 0;
        let mut i = 0;
        while i < headers.len() {
            m |= headers[i].bit();
            i += 1;
        }
        m
    }

    /// Total length of `headers`.
    const fn len_of(headers: &[Header]) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < headers.len() {
            n += headers[i].size();
            i += 1;
        }
        n
    }

    /// Length of the header in bytes.
    pub const fn size(self) -> usize {
        match self {
            Header::Reth => 16,
            Header::Aeth | Header::ImmDt | Header::Ieth | Header::Feth | Header::XrcEth => 4,
            Header::Deth | Header::AtomicAckEth => 8,
            Header::AtomicEth => 28,
            Header::CnpPad => 16,
        }
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode value.
    pub opcode: Opcode,
    /// IBTA name, as Wireshark and rxe print it (without the transport prefix).
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub operation: Operation,
    /// Position in its message.
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: &'static [Header],
    /// Whether the packet may carry payload bytes.
    pub payload: bool,
    /// `headers`, precomputed: their total length and one bit per [`Header`]
    /// ([`Header::bit`]), so the per-packet paths do not walk the list.
    ext_len: u8,
    mask: u16,
}

impl OpcodeInfo {
    /// Total length of the extension headers.
    pub const fn ext_len(&self) -> usize {
        self.ext_len as usize
    }

    /// The extension headers as a set of [`Header::bit`]s.
    pub const fn header_mask(&self) -> u16 {
        self.mask
    }

    /// Offset of `h` from the start of the BTH, if this opcode carries it.
    pub fn offset_of(&self, h: Header) -> Option<usize> {
        let mut off = crate::bth::HEADER_LEN;
        for &x in self.headers {
            if x == h {
                return Some(off);
            }
            off += x.size();
        }
        None
    }

    /// Whether this opcode carries header `h`.
    pub const fn has(&self, h: Header) -> bool {
        self.mask & h.bit() != 0
    }

    /// True for packets sent by a requester (as opposed to responses: ACKs, read
    /// responses, atomic ACKs; and CNPs, which are neither).
    pub const fn is_request(&self) -> bool {
        !matches!(
            self.operation,
            Operation::ReadResponse
                | Operation::Acknowledge
                | Operation::AtomicAcknowledge
                | Operation::Cnp
        )
    }

    /// True when the packet carries immediate data.
    pub fn has_immediate(&self) -> bool {
        self.has(Header::ImmDt)
    }

    /// True when the responder needs a receive WQE for this packet: every SEND packet,
    /// and an RDMA WRITE carrying immediate data (IBTA 9.4.3, 9.7.4.1.4: a WRITE with
    /// immediate consumes a receive WQE to report the immediate; a plain WRITE, a READ
    /// or an atomic never touches the receive queue).
    pub fn consumes_recv_wqe(&self) -> bool {
        match self.operation {
            Operation::Send => true,
            Operation::Write => self.has_immediate(),
            _ => false,
        }
    }
}

use Header::*;
use Operation as O;
use Position::*;
use Transport as T;

macro_rules! row {
    ($code:expr, $name:expr, $t:expr, $op:expr, $pos:expr, [$($h:expr),*], $payload:expr) => {
        OpcodeInfo {
            opcode: Opcode($code),
            name: $name,
            transport: $t,
            operation: $op,
            position: $pos,
            headers: &[$($h),*],
            payload: $payload,
            ext_len: Header::len_of(&[$($h),*]) as u8,
            mask: Header::mask_of(&[$($h),*]),
        }
    };
}

/// Every opcode softnic knows, sorted by value. RC, UC and XRC rows follow IBTA 9.2
/// table 38 (and rxe_opcode.c for FLUSH and ATOMIC WRITE); UD follows the same table;
/// the CNP follows Annex A17.9.3.
pub const OPCODES: &[OpcodeInfo] = &[
    // Reliable Connected, 0x00..=0x1D.
    row!(0x00, "SEND_FIRST", T::Rc, O::Send, First, [], true),
    row!(0x01, "SEND_MIDDLE", T::Rc, O::Send, Middle, [], true),
    row!(0x02, "SEND_LAST", T::Rc, O::Send, Last, [], true),
    row!(
        0x03,
        "SEND_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::Send,
        Last,
        [ImmDt],
        true
    ),
    row!(0x04, "SEND_ONLY", T::Rc, O::Send, Only, [], true),
    row!(
        0x05,
        "SEND_ONLY_WITH_IMMEDIATE",
        T::Rc,
        O::Send,
        Only,
        [ImmDt],
        true
    ),
    row!(
        0x06,
        "RDMA_WRITE_FIRST",
        T::Rc,
        O::Write,
        First,
        [Reth],
        true
    ),
    row!(0x07, "RDMA_WRITE_MIDDLE", T::Rc, O::Write, Middle, [], true),
    row!(0x08, "RDMA_WRITE_LAST", T::Rc, O::Write, Last, [], true),
    row!(
        0x09,
        "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::Write,
        Last,
        [ImmDt],
        true
    ),
    row!(0x0A, "RDMA_WRITE_ONLY", T::Rc, O::Write, Only, [Reth], true),
    row!(
        0x0B,
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Rc,
        O::Write,
        Only,
        [Reth, ImmDt],
        true
    ),
    row!(
        0x0C,
        "RDMA_READ_REQUEST",
        T::Rc,
        O::ReadRequest,
        Only,
        [Reth],
        false
    ),
    row!(
        0x0D,
        "RDMA_READ_RESPONSE_FIRST",
        T::Rc,
        O::ReadResponse,
        First,
        [Aeth],
        true
    ),
    row!(
        0x0E,
        "RDMA_READ_RESPONSE_MIDDLE",
        T::Rc,
        O::ReadResponse,
        Middle,
        [],
        true
    ),
    row!(
        0x0F,
        "RDMA_READ_RESPONSE_LAST",
        T::Rc,
        O::ReadResponse,
        Last,
        [Aeth],
        true
    ),
    row!(
        0x10,
        "RDMA_READ_RESPONSE_ONLY",
        T::Rc,
        O::ReadResponse,
        Only,
        [Aeth],
        true
    ),
    row!(
        0x11,
        "ACKNOWLEDGE",
        T::Rc,
        O::Acknowledge,
        Only,
        [Aeth],
        false
    ),
    row!(
        0x12,
        "ATOMIC_ACKNOWLEDGE",
        T::Rc,
        O::AtomicAcknowledge,
        Only,
        [Aeth, AtomicAckEth],
        false
    ),
    row!(
        0x13,
        "COMPARE_SWAP",
        T::Rc,
        O::CompareSwap,
        Only,
        [AtomicEth],
        false
    ),
    row!(
        0x14,
        "FETCH_ADD",
        T::Rc,
        O::FetchAdd,
        Only,
        [AtomicEth],
        false
    ),
    row!(
        0x16,
        "SEND_LAST_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        Last,
        [Ieth],
        true
    ),
    row!(
        0x17,
        "SEND_ONLY_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        Only,
        [Ieth],
        true
    ),
    row!(0x1C, "FLUSH", T::Rc, O::Flush, Only, [Feth, Reth], false),
    row!(
        0x1D,
        "ATOMIC_WRITE",
        T::Rc,
        O::AtomicWrite,
        Only,
        [Reth],
        true
    ),
    // Unreliable Connected, 0x20..=0x2B.
    row!(0x20, "SEND_FIRST", T::Uc, O::Send, First, [], true),
    row!(0x21, "SEND_MIDDLE", T::Uc, O::Send, Middle, [], true),
    row!(0x22, "SEND_LAST", T::Uc, O::Send, Last, [], true),
    row!(
        0x23,
        "SEND_LAST_WITH_IMMEDIATE",
        T::Uc,
        O::Send,
        Last,
        [ImmDt],
        true
    ),
    row!(0x24, "SEND_ONLY", T::Uc, O::Send, Only, [], true),
    row!(
        0x25,
        "SEND_ONLY_WITH_IMMEDIATE",
        T::Uc,
        O::Send,
        Only,
        [ImmDt],
        true
    ),
    row!(
        0x26,
        "RDMA_WRITE_FIRST",
        T::Uc,
        O::Write,
        First,
        [Reth],
        true
    ),
    row!(0x27, "RDMA_WRITE_MIDDLE", T::Uc, O::Write, Middle, [], true),
    row!(0x28, "RDMA_WRITE_LAST", T::Uc, O::Write, Last, [], true),
    row!(
        0x29,
        "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Uc,
        O::Write,
        Last,
        [ImmDt],
        true
    ),
    row!(0x2A, "RDMA_WRITE_ONLY", T::Uc, O::Write, Only, [Reth], true),
    row!(
        0x2B,
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Uc,
        O::Write,
        Only,
        [Reth, ImmDt],
        true
    ),
    // Unreliable Datagram, 0x64..=0x65.
    row!(0x64, "SEND_ONLY", T::Ud, O::Send, Only, [Deth], true),
    row!(
        0x65,
        "SEND_ONLY_WITH_IMMEDIATE",
        T::Ud,
        O::Send,
        Only,
        [Deth, ImmDt],
        true
    ),
    // RoCEv2 CNP.
    row!(0x81, "CNP", T::Cnp, O::Cnp, Only, [CnpPad], false),
    // eXtended Reliable Connected, 0xA0..=0xB7 (0xB5 reserved): the RC rows 0x00..=0x17
    // with the XRCETH first after the BTH of every request (IBTA 9.2 table 38); the
    // responses (READ responses, ACKs, atomic ACKs) are RC's and carry none.
    row!(0xA0, "SEND_FIRST", T::Xrc, O::Send, First, [XrcEth], true),
    row!(0xA1, "SEND_MIDDLE", T::Xrc, O::Send, Middle, [XrcEth], true),
    row!(0xA2, "SEND_LAST", T::Xrc, O::Send, Last, [XrcEth], true),
    row!(
        0xA3,
        "SEND_LAST_WITH_IMMEDIATE",
        T::Xrc,
        O::Send,
        Last,
        [XrcEth, ImmDt],
        true
    ),
    row!(0xA4, "SEND_ONLY", T::Xrc, O::Send, Only, [XrcEth], true),
    row!(
        0xA5,
        "SEND_ONLY_WITH_IMMEDIATE",
        T::Xrc,
        O::Send,
        Only,
        [XrcEth, ImmDt],
        true
    ),
    row!(
        0xA6,
        "RDMA_WRITE_FIRST",
        T::Xrc,
        O::Write,
        First,
        [XrcEth, Reth],
        true
    ),
    row!(
        0xA7,
        "RDMA_WRITE_MIDDLE",
        T::Xrc,
        O::Write,
        Middle,
        [XrcEth],
        true
    ),
    row!(
        0xA8,
        "RDMA_WRITE_LAST",
        T::Xrc,
        O::Write,
        Last,
        [XrcEth],
        true
    ),
    row!(
        0xA9,
        "RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Xrc,
        O::Write,
        Last,
        [XrcEth, ImmDt],
        true
    ),
    row!(
        0xAA,
        "RDMA_WRITE_ONLY",
        T::Xrc,
        O::Write,
        Only,
        [XrcEth, Reth],
        true
    ),
    row!(
        0xAB,
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Xrc,
        O::Write,
        Only,
        [XrcEth, Reth, ImmDt],
        true
    ),
    row!(
        0xAC,
        "RDMA_READ_REQUEST",
        T::Xrc,
        O::ReadRequest,
        Only,
        [XrcEth, Reth],
        false
    ),
    row!(
        0xAD,
        "RDMA_READ_RESPONSE_FIRST",
        T::Xrc,
        O::ReadResponse,
        First,
        [Aeth],
        true
    ),
    row!(
        0xAE,
        "RDMA_READ_RESPONSE_MIDDLE",
        T::Xrc,
        O::ReadResponse,
        Middle,
        [],
        true
    ),
    row!(
        0xAF,
        "RDMA_READ_RESPONSE_LAST",
        T::Xrc,
        O::ReadResponse,
        Last,
        [Aeth],
        true
    ),
    row!(
        0xB0,
        "RDMA_READ_RESPONSE_ONLY",
        T::Xrc,
        O::ReadResponse,
        Only,
        [Aeth],
        true
    ),
    row!(
        0xB1,
        "ACKNOWLEDGE",
        T::Xrc,
        O::Acknowledge,
        Only,
        [Aeth],
        false
    ),
    row!(
        0xB2,
        "ATOMIC_ACKNOWLEDGE",
        T::Xrc,
        O::AtomicAcknowledge,
        Only,
        [Aeth, AtomicAckEth],
        false
    ),
    row!(
        0xB3,
        "COMPARE_SWAP",
        T::Xrc,
        O::CompareSwap,
        Only,
        [XrcEth, AtomicEth],
        false
    ),
    row!(
        0xB4,
        "FETCH_ADD",
        T::Xrc,
        O::FetchAdd,
        Only,
        [XrcEth, AtomicEth],
        false
    ),
    row!(
        0xB6,
        "SEND_LAST_WITH_INVALIDATE",
        T::Xrc,
        O::Send,
        Last,
        [XrcEth, Ieth],
        true
    ),
    row!(
        0xB7,
        "SEND_ONLY_WITH_INVALIDATE",
        T::Xrc,
        O::Send,
        Only,
        [XrcEth, Ieth],
        true
    ),
];

/// Number of rows in [`OPCODES`].
const ROWS: usize = OPCODES.len();

/// `INDEX[op]` is 1 + the row of `op` in [`OPCODES`], or 0 when unknown: one load per
/// lookup on the hot path.
static INDEX: [u8; 256] = build_index();

const fn build_index() -> [u8; 256] {
    let mut idx = [0u8; 256];
    let mut i = 0;
    while i < ROWS {
        idx[OPCODES[i].opcode.0 as usize] = (i + 1) as u8;
        i += 1;
    }
    idx
}

/// Variants of [`Transport`], [`Operation`] and [`Position`], for [`find_key`].
const TRANSPORTS: usize = 5;
const OPERATIONS: usize = 11;
const POSITIONS: usize = 4;

/// Index into [`FIND`]: `w` is 0 (no ImmDt or IETH), 1 (ImmDt) or 2 (IETH).
const fn find_key(t: Transport, op: Operation, pos: Position, w: usize) -> usize {
    ((t as usize * OPERATIONS + op as usize) * POSITIONS + pos as usize) * 3 + w
}

/// `FIND[find_key(..)]` is 1 + the first row of [`OPCODES`] that [`Opcode::find`]'s
/// linear search would return, or 0 when none matches.
static FIND: [u8; TRANSPORTS * OPERATIONS * POSITIONS * 3] = build_find();

const fn build_find() -> [u8; TRANSPORTS * OPERATIONS * POSITIONS * 3] {
    let mut t = [0u8; TRANSPORTS * OPERATIONS * POSITIONS * 3];
    let mut i = ROWS;
    // Backwards, so that the first matching row is the one left.
    while i > 0 {
        i -= 1;
        let r = &OPCODES[i];
        let w = if r.has(ImmDt) {
            1
        } else if r.has(Ieth) {
            2
        } else {
            0
        };
        t[find_key(r.transport, r.operation, r.position, w)] = (i + 1) as u8;
    }
    t
}

impl Opcode {
    /// RC SEND Only.
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC RDMA WRITE Only.
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0A);
    /// RC RDMA READ Request.
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0C);
    /// RC Acknowledge.
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// RC Atomic Acknowledge.
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// RC Compare & Swap.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC Fetch & Add.
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// UD SEND Only.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// RoCEv2 Congestion Notification Packet.
    pub const CNP: Opcode = Opcode(0x81);
    /// XRC SEND Only.
    pub const XRC_SEND_ONLY: Opcode = Opcode(0xA4);
    /// XRC RDMA WRITE Only.
    pub const XRC_RDMA_WRITE_ONLY: Opcode = Opcode(0xAA);
    /// XRC RDMA READ Request.
    pub const XRC_RDMA_READ_REQUEST: Opcode = Opcode(0xAC);
    /// XRC Acknowledge.
    pub const XRC_ACKNOWLEDGE: Opcode = Opcode(0xB1);
    /// XRC Atomic Acknowledge.
    pub const XRC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0xB2);
    /// XRC Compare & Swap.
    pub const XRC_COMPARE_SWAP: Opcode = Opcode(0xB3);
    /// XRC Fetch & Add.
    pub const XRC_FETCH_ADD: Opcode = Opcode(0xB4);

    /// The table row of this opcode, or `None` when it is unknown.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match INDEX[self.0 as usize] {
            0 => None,
            i => OPCODES.get(i as usize - 1),
        }
    }

    /// Finds the opcode of `transport`, `operation` and `position`, with immediate data
    /// or invalidate when `with` names that header. This is how a requester picks
    /// opcodes: from the table, never from hand-written constants.
    pub fn find(
        transport: Transport,
        operation: Operation,
        position: Position,
        with: Option<Header>,
    ) -> Option<Opcode> {
        // The common questions (no header, ImmDt or IETH) are answered by one load.
        let w = match with {
            None => Some(0),
            Some(ImmDt) => Some(1),
            Some(Ieth) => Some(2),
            Some(_) => None,
        };
        if let Some(w) = w {
            return match FIND[find_key(transport, operation, position, w)] {
                0 => None,
                i => OPCODES.get(i as usize - 1).map(|r| r.opcode),
            };
        }
        OPCODES
            .iter()
            .find(|r| {
                r.transport == transport
                    && r.operation == operation
                    && r.position == position
                    && match with {
                        Some(h) => r.has(h),
                        None => !r.has(ImmDt) && !r.has(Ieth),
                    }
            })
            .map(|r| r.opcode)
    }

    /// All known opcodes, in value order.
    pub fn all() -> impl Iterator<Item = &'static OpcodeInfo> {
        OPCODES.iter()
    }

    /// The table name (without transport prefix), or `None` when unknown.
    pub fn name(self) -> Option<&'static str> {
        self.info().map(|i| i.name)
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Opcode {
    /// Full IBTA-style name with the transport prefix, e.g. `RC_SEND_ONLY`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => {
                let prefix = match i.transport {
                    T::Rc => "RC_",
                    T::Uc => "UC_",
                    T::Ud => "UD_",
                    T::Cnp => "",
                    T::Xrc => "XRC_",
                };
                write!(f, "{prefix}{}", i.name)
            }
            None => write!(f, "UNKNOWN_{:#04x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sends_and_writes_with_immediate_consume_a_receive_wqe() {
        for i in Opcode::all() {
            let expect = i.operation == Operation::Send
                || (i.operation == Operation::Write && i.headers.contains(&Header::ImmDt));
            assert_eq!(i.consumes_recv_wqe(), expect, "{}", i.name);
        }
        let consumes = |code: u8| Opcode(code).info().unwrap().consumes_recv_wqe();
        // RC WRITE_ONLY_WITH_IMMEDIATE and UD SEND_ONLY do; RC WRITE_ONLY and READ don't.
        assert!(consumes(0x0B) && consumes(0x64));
        assert!(!consumes(0x0A) && !consumes(0x0C));
    }

    #[test]
    fn table_is_sorted_and_unique() {
        for w in OPCODES.windows(2) {
            assert!(w[0].opcode < w[1].opcode, "{:?} before {:?}", w[0], w[1]);
        }
        // 25 RC, 12 UC, 2 UD, 1 CNP, 23 XRC.
        assert_eq!(Opcode::all().count(), 63);
    }

    /// The lookup table answers exactly as the linear search over the rows.
    #[test]
    fn find_table_agrees_with_the_rows() {
        use Operation::*;
        let ts = [
            Transport::Rc,
            Transport::Uc,
            Transport::Ud,
            Transport::Cnp,
            Transport::Xrc,
        ];
        let ops = [
            Send,
            Write,
            ReadRequest,
            ReadResponse,
            Acknowledge,
            AtomicAcknowledge,
            CompareSwap,
            FetchAdd,
            Flush,
            AtomicWrite,
            Cnp,
        ];
        let mut found = 0;
        for t in ts {
            for op in ops {
                for pos in [First, Middle, Last, Only] {
                    for with in [None, Some(ImmDt), Some(Ieth)] {
                        let slow = OPCODES
                            .iter()
                            .find(|r| {
                                r.transport == t
                                    && r.operation == op
                                    && r.position == pos
                                    && match with {
                                        Some(h) => r.headers.contains(&h),
                                        None => {
                                            !r.headers.contains(&ImmDt)
                                                && !r.headers.contains(&Ieth)
                                        }
                                    }
                            })
                            .map(|r| r.opcode);
                        assert_eq!(Opcode::find(t, op, pos, with), slow, "{t:?} {op:?} {pos:?}");
                        found += usize::from(slow.is_some());
                    }
                }
            }
        }
        assert_eq!(found, OPCODES.len(), "every row is found");
        for r in OPCODES.iter() {
            let len: usize = r.headers.iter().map(|h| h.size()).sum();
            assert_eq!(r.ext_len(), len, "{r:?}");
            for h in [
                Reth,
                Aeth,
                Deth,
                ImmDt,
                Ieth,
                AtomicEth,
                AtomicAckEth,
                Feth,
                CnpPad,
                XrcEth,
            ] {
                assert_eq!(r.has(h), r.headers.contains(&h), "{r:?} {h:?}");
            }
        }
    }

    #[test]
    fn transport_prefix_matches_ibta_bits() {
        for r in Opcode::all() {
            let prefix = r.opcode.0 >> 5;
            let want = match r.transport {
                T::Rc => 0,
                T::Uc => 1,
                T::Ud => 3,
                T::Cnp => 4,
                T::Xrc => 5,
            };
            assert_eq!(prefix, want, "{}", r.opcode);
        }
    }

    #[test]
    fn uc_rows_mirror_rc_rows() {
        for uc in Opcode::all().filter(|r| r.transport == T::Uc) {
            let rc = Opcode(uc.opcode.0 & 0x1F).info().expect("RC twin");
            assert_eq!(
                (rc.name, rc.operation, rc.position),
                (uc.name, uc.operation, uc.position)
            );
            assert_eq!(rc.headers, uc.headers);
        }
    }

    /// XRC is RC plus the XRCETH (IBTA 9.2 table 38): each XRC row has the RC row of the
    /// same low 5 bits as its twin, with the same name, operation, position and payload
    /// rule; a request carries the XRCETH first and then the RC headers, a response
    /// carries exactly the RC headers.
    #[test]
    fn xrc_rows_mirror_rc_rows_with_the_xrceth_first_on_requests() {
        let mut n = 0;
        for x in Opcode::all().filter(|r| r.transport == T::Xrc) {
            n += 1;
            assert_eq!(x.opcode.0 >> 5, 0b101, "{}", x.opcode);
            let rc = Opcode(x.opcode.0 & 0x1F).info().expect("RC twin");
            assert_eq!(rc.transport, T::Rc);
            assert_eq!(
                (rc.name, rc.operation, rc.position, rc.payload),
                (x.name, x.operation, x.position, x.payload)
            );
            if x.is_request() {
                assert_eq!(x.headers.first(), Some(&XrcEth), "{}", x.opcode);
                assert_eq!(&x.headers[1..], rc.headers, "{}", x.opcode);
                assert_eq!(x.offset_of(XrcEth), Some(crate::bth::HEADER_LEN));
                assert_eq!(x.ext_len(), rc.ext_len() + 4);
            } else {
                assert!(!x.has(XrcEth), "{}", x.opcode);
                assert_eq!(x.headers, rc.headers, "{}", x.opcode);
            }
            assert_eq!(x.consumes_recv_wqe(), rc.consumes_recv_wqe());
        }
        // Every RC opcode of 0x00..=0x17 has its twin; FLUSH and ATOMIC WRITE do not.
        assert_eq!(n, 23);
        for rc in Opcode::all().filter(|r| r.transport == T::Rc) {
            let twin = Opcode(rc.opcode.0 | 0xA0).info();
            assert_eq!(twin.is_some(), rc.opcode.0 <= 0x17, "{}", rc.opcode);
        }
        // Only XRC requests carry it.
        for r in Opcode::all().filter(|r| r.has(XrcEth)) {
            assert!(r.transport == T::Xrc && r.is_request(), "{}", r.opcode);
        }
    }

    #[test]
    fn find_returns_xrc_rows() {
        for x in Opcode::all().filter(|r| r.transport == T::Xrc) {
            let with = if x.has(ImmDt) {
                Some(ImmDt)
            } else if x.has(Ieth) {
                Some(Ieth)
            } else {
                None
            };
            assert_eq!(
                Opcode::find(T::Xrc, x.operation, x.position, with),
                Some(x.opcode)
            );
        }
        assert_eq!(
            Opcode::find(T::Xrc, O::Send, Only, None),
            Some(Opcode::XRC_SEND_ONLY)
        );
        assert_eq!(
            Opcode::find(T::Xrc, O::Write, First, None),
            Some(Opcode(0xA6))
        );
        assert_eq!(
            Opcode::find(T::Xrc, O::Acknowledge, Only, None),
            Some(Opcode::XRC_ACKNOWLEDGE)
        );
        assert_eq!(
            Opcode::find(T::Xrc, O::Send, Last, Some(Ieth)),
            Some(Opcode(0xB6))
        );
        // The slow path (a header other than ImmDt or IETH) finds them too.
        assert_eq!(
            Opcode::find(T::Xrc, O::FetchAdd, Only, Some(AtomicEth)),
            Some(Opcode::XRC_FETCH_ADD)
        );
        assert_eq!(
            Opcode::find(T::Xrc, O::ReadRequest, Only, Some(XrcEth)),
            Some(Opcode::XRC_RDMA_READ_REQUEST)
        );
        // RC's memory placement extensions have no XRC rows here.
        assert_eq!(Opcode::find(T::Xrc, O::Flush, Only, None), None);
        assert_eq!(Opcode::find(T::Xrc, O::AtomicWrite, Only, None), None);
        for (c, k) in [
            (Opcode::XRC_SEND_ONLY, "XRC_SEND_ONLY"),
            (Opcode::XRC_RDMA_WRITE_ONLY, "XRC_RDMA_WRITE_ONLY"),
            (Opcode::XRC_RDMA_READ_REQUEST, "XRC_RDMA_READ_REQUEST"),
            (Opcode::XRC_ACKNOWLEDGE, "XRC_ACKNOWLEDGE"),
            (Opcode::XRC_ATOMIC_ACKNOWLEDGE, "XRC_ATOMIC_ACKNOWLEDGE"),
            (Opcode::XRC_COMPARE_SWAP, "XRC_COMPARE_SWAP"),
            (Opcode::XRC_FETCH_ADD, "XRC_FETCH_ADD"),
        ] {
            assert_eq!(c.to_string(), k);
        }
    }

    #[test]
    fn unknown_opcodes() {
        for op in [
            0x15u8, 0x18, 0x1E, 0x1F, 0x2C, 0x40, 0x60, 0x63, 0x66, 0x80, 0x9F, 0xB5, 0xB8, 0xBC,
            0xBD, 0xC0, 0xFF,
        ] {
            assert!(Opcode(op).info().is_none(), "{op:#x}");
        }
    }

    #[test]
    fn find_picks_from_the_table() {
        assert_eq!(
            Opcode::find(T::Rc, O::Write, Only, Some(ImmDt)),
            Some(Opcode(0x0B))
        );
        assert_eq!(
            Opcode::find(T::Rc, O::Send, Middle, None),
            Some(Opcode(0x01))
        );
        assert_eq!(
            Opcode::find(T::Uc, O::Send, Last, Some(ImmDt)),
            Some(Opcode(0x23))
        );
        assert_eq!(
            Opcode::find(T::Rc, O::Send, Only, Some(Ieth)),
            Some(Opcode(0x17))
        );
        assert_eq!(
            Opcode::find(T::Ud, O::Send, Only, Some(ImmDt)),
            Some(Opcode(0x65))
        );
        assert_eq!(Opcode::find(T::Uc, O::ReadRequest, Only, None), None);
    }

    #[test]
    fn offsets() {
        let w = Opcode(0x0B).info().unwrap();
        assert_eq!(w.offset_of(Reth), Some(12));
        assert_eq!(w.offset_of(ImmDt), Some(28));
        assert_eq!(w.ext_len(), 20);
        let a = Opcode(0x12).info().unwrap();
        assert_eq!(a.offset_of(AtomicAckEth), Some(16));
        let f = Opcode(0x1C).info().unwrap();
        assert_eq!(f.offset_of(Reth), Some(16));
        let x = Opcode(0xAB).info().unwrap();
        assert_eq!(x.offset_of(XrcEth), Some(12));
        assert_eq!(x.offset_of(Reth), Some(16));
        assert_eq!(x.offset_of(ImmDt), Some(32));
        assert_eq!(x.ext_len(), 24);
        assert_eq!(
            format!("{}", Opcode(0xAB)),
            "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"
        );
        assert_eq!(format!("{}", Opcode(0x64)), "UD_SEND_ONLY");
        assert_eq!(format!("{}", Opcode(0x81)), "CNP");
    }
}
