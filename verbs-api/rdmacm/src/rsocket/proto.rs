//! rsockets' wire protocol, version 1 — what rdma-core's `librdmacm/rsocket.c` puts in
//! the connection's private data and in the immediate data of its RDMA WRITEs, so a
//! stream between softnic's rsockets and rdma-core's (over rxe or a hardware RNIC)
//! speaks the same bytes. Pure data: encodings and checks, no verbs.
//!
//! The protocol in one paragraph: each side of a connection registers a receive
//! buffer (two halves) and a two-entry "target SGL" array the peer may write. The
//! connection's private data ([`ConnData`]) tells the peer where both are, and how many
//! receive WQEs it may consume (credits). Data moves as RDMA WRITE with immediate into
//! the peer's current target half, the immediate naming the length ([`OP_DATA`]); each
//! such write consumes one of the peer's receive WQEs (zero-length ones: the data is
//! placed by the WRITE). As its reader frees a half, the receiver grants it back with
//! an RDMA WRITE with immediate of one [`Sge`] into the sender's target SGL entry and
//! [`OP_SGL`] carrying the new credit limit; a credit-only update is a zero-length
//! WRITE with [`OP_SGL`]. [`OP_CTRL`] messages close one direction or both.

/// Protocol version carried in [`ConnData`]; a peer offering another is refused.
pub const VERSION: u8 = 1;
/// `RS_CONN_FLAG_NET`: the sender is big-endian (its SGL updates come in its order).
pub const CONN_FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: the target SGL array is followed by an iomap array.
pub const CONN_FLAG_IOMAP: u8 = 1 << 1;
/// Bytes of [`ConnData`] on the wire.
pub const CONN_DATA_LEN: usize = 40;
/// Bytes of one [`Sge`] (`struct rs_sge`).
pub const SGE_LEN: usize = 16;
/// Bytes of one [`IoMap`] (`struct rs_iomap`).
pub const IOMAP_LEN: usize = 24;
/// Entries of the target SGL array (`RS_SGL_SIZE`).
pub const SGL_SIZE: u32 = 2;
/// Control messages in flight at most (`RS_QP_CTRL_SIZE`); send queue slots kept for them.
pub const QP_CTRL_SIZE: u32 = 4;
/// Least free send-buffer space for a send to start (`RS_SNDLOWAT`).
pub const SNDLOWAT: u32 = 2048;
/// First transfer of a send; each following one doubles up to [`MAX_TRANSFER`].
pub const OLAP_START_SIZE: u32 = 2048;
/// Largest single data transfer (`RS_MAX_TRANSFER`).
pub const MAX_TRANSFER: u32 = 65536;
/// Queue sizes are clamped to this range (`RS_QP_MIN_SIZE`, `RS_QP_MAX_SIZE`).
pub const QP_MIN_SIZE: u32 = 16;
/// See [`QP_MIN_SIZE`].
pub const QP_MAX_SIZE: u32 = 0xFFFE;

/// Immediate data: bits 31..29 the operation, 28..0 its argument.
pub const OP_DATA: u32 = 0;
/// Not sent on the network (rdma-core's marker for a direct `riowrite`).
pub const OP_WRITE: u32 = 2;
/// Credit update; the argument is the new limit of the sender's message count, and a
/// 16-byte write carries a newly granted buffer half ([`Sge`]).
pub const OP_SGL: u32 = 4;
/// An iomap entry was written; the argument is its index in the receiver's iomap array.
pub const OP_IOMAP_SGL: u32 = 6;
/// Control message, argument [`CTRL_DISCONNECT`], [`CTRL_KEEPALIVE`] or [`CTRL_SHUTDOWN`].
pub const OP_CTRL: u32 = 7;
/// Both directions closed.
pub const CTRL_DISCONNECT: u32 = 0;
/// Keepalive (rdma-core sends it as a zero-length WRITE without immediate).
pub const CTRL_KEEPALIVE: u32 = 1;
/// The peer closed its sending direction.
pub const CTRL_SHUTDOWN: u32 = 2;

/// The immediate data of operation `op` with argument `data` (`rs_msg_set`).
pub const fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

/// The operation of `msg` (`rs_msg_op`).
pub const fn msg_op(msg: u32) -> u32 {
    msg >> 29
}

/// The argument of `msg` (`rs_msg_data`).
pub const fn msg_data(msg: u32) -> u32 {
    msg & 0x1FFF_FFFF
}

/// `struct rs_sge`: a remote buffer (address, R_Key, length); in memory `addr`, `key`,
/// `length`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address in the peer's region.
    pub addr: u64,
    /// R_Key of that region.
    pub key: u32,
    /// Bytes.
    pub length: u32,
}

impl Sge {
    /// Big-endian fields (the connection data's order).
    pub fn to_be_bytes(self) -> [u8; SGE_LEN] {
        let mut b = [0u8; SGE_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// From big-endian fields.
    pub fn from_be_bytes(b: [u8; SGE_LEN]) -> Sge {
        let (a, k, l) = split(b);
        Sge {
            addr: u64::from_be_bytes(a),
            key: u32::from_be_bytes(k),
            length: u32::from_be_bytes(l),
        }
    }

    /// A grant as the peer's reader expects it: rdma-core writes an SGL update in its
    /// own byte order, byte-swapped when the peer's [`CONN_FLAG_NET`] differs from its
    /// own (`RS_OPT_SWAP_SGL`), i.e. always in the reader's order.
    pub fn to_peer_bytes(self, peer_big_endian: bool) -> [u8; SGE_LEN] {
        if peer_big_endian {
            self.to_be_bytes()
        } else {
            let mut b = [0u8; SGE_LEN];
            b[..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..].copy_from_slice(&self.length.to_le_bytes());
            b
        }
    }

    /// A grant written by the peer into our target SGL: in our own byte order.
    pub fn from_ne_bytes(b: [u8; SGE_LEN]) -> Sge {
        let (a, k, l) = split(b);
        Sge {
            addr: u64::from_ne_bytes(a),
            key: u32::from_ne_bytes(k),
            length: u32::from_ne_bytes(l),
        }
    }
}

/// `struct rs_iomap`: a window of the writer's memory the reader may `riowrite` into:
/// the offset it answers to, then where it is (in memory `offset`, then the [`Sge`]).
/// Written by `riomap`'s side into the peer's iomap array, in the peer's byte order
/// (as grants are).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoMap {
    /// The first offset of the window (`riomap`'s result).
    pub offset: u64,
    /// The registered bytes behind it.
    pub sge: Sge,
}

impl IoMap {
    /// The entry as the peer's reader expects it (see [`Sge::to_peer_bytes`]).
    pub fn to_peer_bytes(self, peer_big_endian: bool) -> [u8; IOMAP_LEN] {
        let mut b = [0u8; IOMAP_LEN];
        b[..8].copy_from_slice(&if peer_big_endian {
            self.offset.to_be_bytes()
        } else {
            self.offset.to_le_bytes()
        });
        b[8..].copy_from_slice(&self.sge.to_peer_bytes(peer_big_endian));
        b
    }

    /// An entry written by the peer into our iomap array: in our own byte order.
    pub fn from_ne_bytes(b: [u8; IOMAP_LEN]) -> IoMap {
        let mut o = [0u8; 8];
        let mut g = [0u8; SGE_LEN];
        o.copy_from_slice(&b[..8]);
        g.copy_from_slice(&b[8..]);
        IoMap {
            offset: u64::from_ne_bytes(o),
            sge: Sge::from_ne_bytes(g),
        }
    }

    /// Where byte `offset` of the window is, and how many bytes of it follow from
    /// there; None when `offset` is outside it (or the peer's entry wraps around).
    pub fn locate(&self, offset: u64) -> Option<(u64, u32)> {
        let end = self.offset.checked_add(u64::from(self.sge.length))?;
        if offset < self.offset || offset >= end {
            return None;
        }
        let into = offset - self.offset;
        let addr = self.sge.addr.checked_add(into)?;
        Some((addr, (end - offset) as u32))
    }
}

/// An 8-bit scaled count as the connection data carries the iomap size
/// (`rs_value_to_scale(value, 8)`): up to 128 as is, beyond in units of 256 with the
/// top bit set. Values that do not fit lose their low bits, as in rdma-core.
pub const fn value_to_scale(value: u32) -> u8 {
    if value <= 128 {
        value as u8
    } else {
        (0x80 | (value >> 8)) as u8
    }
}

/// The count an 8-bit scale stands for (`rs_scale_to_value(value, 8)`).
pub const fn scale_to_value(scale: u8) -> u32 {
    if scale <= 128 {
        scale as u32
    } else {
        ((scale & 0x7F) as u32) << 8
    }
}

fn split(b: [u8; SGE_LEN]) -> ([u8; 8], [u8; 4], [u8; 4]) {
    let mut a = [0u8; 8];
    let mut k = [0u8; 4];
    let mut l = [0u8; 4];
    a.copy_from_slice(&b[..8]);
    k.copy_from_slice(&b[8..12]);
    l.copy_from_slice(&b[12..]);
    (a, k, l)
}

/// `struct rs_conn_data`, the private data of the REQ and of the REP (for an AF_INET or
/// AF_INET6 id it starts the private data; all fields big-endian):
/// version (1), flags, credits (u16), 3 reserved bytes, the iomap size (scaled),
/// the target SGL array, the first receive-buffer half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// [`CONN_FLAG_NET`], [`CONN_FLAG_IOMAP`].
    pub flags: u8,
    /// Receive WQEs the peer may consume before the first credit update.
    pub credits: u16,
    /// Iomap entries after the target SGL array (rdma-core's 8-bit scale; 0 = none).
    pub target_iomap_size: u8,
    /// The target SGL array: `length` counts entries, not bytes.
    pub target_sgl: Sge,
    /// The first receive-buffer half the peer may write.
    pub data_buf: Sge,
}

/// Why a peer's connection data is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnDataError {
    /// Shorter than [`CONN_DATA_LEN`].
    Short,
    /// Not [`VERSION`].
    Version(u8),
    /// A target SGL of no entries, or more than one R_Key region can describe.
    TargetSgl,
    /// No credits, or an empty first buffer.
    Empty,
}

impl ConnData {
    /// The wire bytes.
    pub fn to_bytes(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0] = VERSION;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        b[8..24].copy_from_slice(&self.target_sgl.to_be_bytes());
        b[24..40].copy_from_slice(&self.data_buf.to_be_bytes());
        b
    }

    /// Parses and checks a peer's connection data (untrusted: a refused one refuses the
    /// connection).
    pub fn parse(b: &[u8]) -> Result<ConnData, ConnDataError> {
        let b: &[u8; CONN_DATA_LEN] = b
            .get(..CONN_DATA_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(ConnDataError::Short)?;
        if b[0] != VERSION {
            return Err(ConnDataError::Version(b[0]));
        }
        let sge = |at: usize| {
            let mut s = [0u8; SGE_LEN];
            s.copy_from_slice(&b[at..at + SGE_LEN]);
            Sge::from_be_bytes(s)
        };
        let c = ConnData {
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        };
        if c.target_sgl.length == 0 || c.target_sgl.length > 256 {
            return Err(ConnDataError::TargetSgl);
        }
        if c.credits == 0 || c.data_buf.length == 0 {
            return Err(ConnDataError::Empty);
        }
        Ok(c)
    }

    /// The peer writes its SGL updates big-endian.
    pub fn big_endian(&self) -> bool {
        self.flags & CONN_FLAG_NET != 0
    }

    /// The peer's iomap array, which our `riomap`s fill: right after its target SGL
    /// array, in the same region, `length` counting entries (none without
    /// [`CONN_FLAG_IOMAP`]).
    pub fn iomap_array(&self) -> Sge {
        if self.flags & CONN_FLAG_IOMAP == 0 {
            return Sge::default();
        }
        Sge {
            addr: self
                .target_sgl
                .addr
                .wrapping_add(SGE_LEN as u64 * u64::from(self.target_sgl.length)),
            key: self.target_sgl.key,
            length: scale_to_value(self.target_iomap_size),
        }
    }
}

/// Whether this host is big-endian (rdma-core's `rs_host_is_net`).
pub const HOST_IS_NET: bool = cfg!(target_endian = "big");

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of `struct rs_conn_data` (rsocket.c), byte for byte: version 1 at 0,
    /// flags at 1, credits big-endian at 2, reserved 4..7, the iomap size at 7, then
    /// each `rs_sge` as addr (8 bytes), key, length, all big-endian.
    #[test]
    fn conn_data_is_rdma_cores_layout() {
        let c = ConnData {
            flags: CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 0x1122_3344_5566_7788,
                key: 0xAABB_CCDD,
                length: 2,
            },
            data_buf: Sge {
                addr: 0x0102_0304_0506_0708,
                key: 0x0A0B_0C0D,
                length: 0x10000,
            },
        };
        let b = c.to_bytes();
        let want: [u8; 40] = [
            1, 2, 0x01, 0x80, 0, 0, 0, 0, //
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 2,
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0A, 0x0B, 0x0C, 0x0D, 0, 1, 0, 0,
        ];
        assert_eq!(b, want);
        assert_eq!(ConnData::parse(&b), Ok(c));
        // Longer private data (the REP's field is padded) parses the same.
        let mut long = b.to_vec();
        long.extend_from_slice(&[0xEE; 20]);
        assert_eq!(ConnData::parse(&long), Ok(c));
    }

    #[test]
    fn hostile_conn_data_is_refused() {
        let good = ConnData {
            flags: 0,
            credits: 16,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 1,
                key: 2,
                length: 2,
            },
            data_buf: Sge {
                addr: 3,
                key: 4,
                length: 4096,
            },
        }
        .to_bytes();
        assert_eq!(ConnData::parse(&good[..39]), Err(ConnDataError::Short));
        let mut b = good;
        b[0] = 2;
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::Version(2)));
        let mut b = good;
        b[20..24].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::TargetSgl));
        let mut b = good;
        b[2..4].copy_from_slice(&[0, 0]);
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::Empty));
        let mut b = good;
        b[36..40].copy_from_slice(&[0; 4]);
        assert_eq!(ConnData::parse(&b), Err(ConnDataError::Empty));
    }

    #[test]
    fn immediate_data_splits_op_and_argument() {
        assert_eq!(msg(OP_SGL, 400), 0x8000_0190);
        assert_eq!(msg(OP_CTRL, CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(msg_op(0xE000_0002), OP_CTRL);
        assert_eq!(msg_data(0xE000_0002), CTRL_SHUTDOWN);
        assert_eq!(msg(OP_DATA, 65536), 65536);
        // An argument wider than 29 bits cannot leak into the operation.
        assert_eq!(msg_op(msg(OP_DATA, u32::MAX)), OP_DATA);
    }

    /// rdma-core's `rs_value_to_scale`/`rs_scale_to_value` with 8 bits, and the round
    /// trip `RDMA_IOMAPSIZE` makes of a requested size.
    #[test]
    fn iomap_sizes_scale_as_rdma_core() {
        for (v, s, back) in [
            (0, 0, 0),
            (1, 1, 1),
            (128, 128, 128),
            (129, 0x80, 128),
            (256, 0x81, 256),
            (1000, 0x83, 768),
            (32512, 0xFF, 32512),
        ] {
            assert_eq!(value_to_scale(v), s, "{v}");
            assert_eq!(scale_to_value(s), back, "{v}");
        }
    }

    /// `struct rs_iomap` for a little-endian reader: offset, addr, key, length; the
    /// array starts after the target SGL's entries.
    #[test]
    fn iomap_entries_are_rdma_cores_layout() {
        let m = IoMap {
            offset: 0x1000,
            sge: Sge {
                addr: 0x7f00_0000_2000,
                key: 0xAABB_CCDD,
                length: 0x3000,
            },
        };
        let b = m.to_peer_bytes(false);
        assert_eq!(&b[..8], &0x1000u64.to_le_bytes());
        assert_eq!(&b[8..16], &0x7f00_0000_2000u64.to_le_bytes());
        assert_eq!(&b[16..20], &0xAABB_CCDDu32.to_le_bytes());
        assert_eq!(&b[20..], &0x3000u32.to_le_bytes());
        if !HOST_IS_NET {
            assert_eq!(IoMap::from_ne_bytes(b), m);
        }
        assert_eq!(m.locate(0x1000), Some((0x7f00_0000_2000, 0x3000)));
        assert_eq!(m.locate(0x3fff), Some((0x7f00_0000_4fff, 1)));
        assert_eq!(m.locate(0x4000), None);
        assert_eq!(m.locate(0xfff), None);
        let wraps = IoMap {
            offset: u64::MAX - 1,
            sge: Sge {
                addr: 0,
                key: 0,
                length: 8,
            },
        };
        assert_eq!(wraps.locate(u64::MAX - 1), None);
        let c = ConnData {
            flags: CONN_FLAG_IOMAP,
            credits: 1,
            target_iomap_size: 0x81,
            target_sgl: Sge {
                addr: 0x1000,
                key: 7,
                length: 2,
            },
            data_buf: Sge::default(),
        };
        assert_eq!(
            c.iomap_array(),
            Sge {
                addr: 0x1020,
                key: 7,
                length: 256
            }
        );
        let none = ConnData { flags: 0, ..c };
        assert_eq!(none.iomap_array().length, 0);
    }

    #[test]
    fn grants_travel_in_the_readers_order() {
        let s = Sge {
            addr: 0x0102_0304_0506_0708,
            key: 0x1112_1314,
            length: 0x2122_2324,
        };
        assert_eq!(Sge::from_be_bytes(s.to_peer_bytes(true)), s);
        let le = s.to_peer_bytes(false);
        assert_eq!(le[0], 0x08);
        if !HOST_IS_NET {
            assert_eq!(Sge::from_ne_bytes(le), s);
        }
    }
}
