//! 24-bit sequence and queue-pair numbers.
//!
//! PSNs and MSNs are 24-bit counters that wrap; comparing them needs modular arithmetic
//! (IBTA 9.7.1: a PSN is "ahead" of another when the forward distance is less than half
//! the PSN space, 2^23). QPNs are 24-bit identifiers with no order.

use core::fmt;

/// Mask of a 24-bit field.
pub const MASK_24: u32 = 0x00FF_FFFF;

/// Half the 24-bit space: the window within which one PSN is "after" another.
const HALF_24: u32 = 1 << 23;

macro_rules! seq24 {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            /// The value 0.
            pub const ZERO: Self = Self(0);

            /// Makes a value from the low 24 bits of `v` (higher bits are discarded).
            pub const fn new(v: u32) -> Self {
                Self(v & MASK_24)
            }

            /// The 24-bit value.
            pub const fn value(self) -> u32 {
                self.0
            }

            /// `self + n` modulo 2^24.
            #[must_use]
            pub const fn wrapping_add(self, n: u32) -> Self {
                Self(self.0.wrapping_add(n) & MASK_24)
            }

            /// `self - n` modulo 2^24.
            #[must_use]
            pub const fn wrapping_sub(self, n: u32) -> Self {
                Self(self.0.wrapping_sub(n) & MASK_24)
            }

            /// The next value (`self + 1` modulo 2^24).
            #[must_use]
            pub const fn next(self) -> Self {
                self.wrapping_add(1)
            }

            /// Signed distance from `self` to `other`: positive when `other` is ahead
            /// of `self`, in the range -2^23 ..= 2^23 - 1.
            pub const fn distance_to(self, other: Self) -> i32 {
                let d = other.0.wrapping_sub(self.0) & MASK_24;
                if d >= HALF_24 {
                    d as i32 - (1 << 24)
                } else {
                    d as i32
                }
            }

            /// True when `self` comes strictly before `other` in modular order.
            pub const fn is_before(self, other: Self) -> bool {
                self.distance_to(other) > 0
            }

            /// True when `self` comes strictly after `other` in modular order.
            pub const fn is_after(self, other: Self) -> bool {
                self.distance_to(other) < 0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#08x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v.0
            }
        }
    };
}

seq24!(
    /// Packet Sequence Number (IBTA 9.2, BTH bits 104..127).
    Psn
);
seq24!(
    /// Message Sequence Number carried in the AETH (IBTA 9.7.5.1.1).
    Msn
);

/// Queue Pair Number: the 24-bit destination QP of a BTH or source QP of a DETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// QP1, the General Services Interface QP that carries CM MADs (IBTA 3.5.1).
    pub const GSI: Qpn = Qpn(1);

    /// Makes a QPN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Qpn(v & MASK_24)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl From<Qpn> for u32 {
    fn from(v: Qpn) -> u32 {
        v.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_at_2_pow_24() {
        let p = Psn::new(MASK_24);
        assert_eq!(p.next(), Psn::ZERO);
        assert_eq!(Psn::ZERO.wrapping_sub(1), p);
        assert!(p.is_before(Psn::ZERO));
        assert!(Psn::ZERO.is_after(p));
        assert_eq!(p.distance_to(Psn::new(4)), 5);
        assert_eq!(Psn::new(4).distance_to(p), -5);
    }

    #[test]
    fn psn_half_window() {
        let a = Psn::new(0);
        assert!(a.is_before(Psn::new(HALF_24 - 1)));
        // Exactly half-way is ambiguous; each side sees the other as behind.
        assert!(!a.is_before(Psn::new(HALF_24)));
        assert!(!Psn::new(HALF_24).is_before(a));
        assert_eq!(a.distance_to(Psn::new(HALF_24)), -(HALF_24 as i32));
    }

    #[test]
    fn new_masks_high_bits() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Qpn::new(0xFF00_0011).value(), 0x11);
    }
}
