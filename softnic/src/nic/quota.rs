//! Per-user quotas on the objects clients make the NIC hold, and on the bytes of client
//! memory it maps.
//!
//! Quotas are per user (the peer uid of the control connection, from `SO_PEERCRED`),
//! summed over all of that user's connections: a per-connection quota is no quota, as
//! a client can open as many connections as it likes. Mapped bytes cover memory
//! regions and the ring segments of CQs and QPs; they bound the NIC's virtual address
//! space that one user can take (x86-64 gives a process 128 TiB, so without a bound a
//! few registrations of 1 TiB regions leave nothing for anyone else).
//!
//! This is the one owner of the counts: the object table ([`super::state`]) takes a
//! unit before it creates an object and gives it back when the object goes.

use std::collections::HashMap;

/// What one user may hold at once. Defaults: generous for a real user, finite for an
/// attacker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Protection domains.
    pub pds: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Memory regions.
    pub mrs: u32,
    /// RDMA CM ids (each may hold a port and the connection requests queued on it).
    pub cm_ids: u32,
    /// Bytes of client memory mapped (regions plus ring segments).
    pub mapped_bytes: u64,
}

/// Default PDs, CQs and QPs per user.
pub const DEFAULT_OBJECTS: u32 = 4096;
/// Default memory regions per user.
pub const DEFAULT_MRS: u32 = 1 << 16;
/// Default mapped bytes per user: 1 TiB, the largest single region.
pub const DEFAULT_MAPPED_BYTES: u64 = 1 << 40;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pds: DEFAULT_OBJECTS,
            cqs: DEFAULT_OBJECTS,
            qps: DEFAULT_OBJECTS,
            mrs: DEFAULT_MRS,
            cm_ids: DEFAULT_OBJECTS,
            mapped_bytes: DEFAULT_MAPPED_BYTES,
        }
    }
}

/// A kind of object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Protection domain.
    Pd,
    /// Completion queue.
    Cq,
    /// Queue pair.
    Qp,
    /// Memory region.
    Mr,
    /// RDMA CM id (`rdma_create_id`).
    CmId,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pd => "protection domains",
            Kind::Cq => "completion queues",
            Kind::Qp => "queue pairs",
            Kind::Mr => "memory regions",
            Kind::CmId => "rdma_cm ids",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Kind::Pd => "--max-pds-per-user",
            Kind::Cq => "--max-cqs-per-user",
            Kind::Qp => "--max-qps-per-user",
            Kind::Mr => "--max-mrs-per-user",
            Kind::CmId => "--max-cm-ids-per-user",
        }
    }
}

/// What one user holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Protection domains.
    pub pds: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Memory regions.
    pub mrs: u32,
    /// RDMA CM ids.
    pub cm_ids: u32,
    /// Mapped bytes.
    pub mapped_bytes: u64,
}

impl Usage {
    fn count(&mut self, kind: Kind) -> &mut u32 {
        match kind {
            Kind::Pd => &mut self.pds,
            Kind::Cq => &mut self.cqs,
            Kind::Qp => &mut self.qps,
            Kind::Mr => &mut self.mrs,
            Kind::CmId => &mut self.cm_ids,
        }
    }

    fn is_empty(&self) -> bool {
        *self == Usage::default()
    }
}

/// A request over quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaError {
    /// The user holds `limit` objects of this kind already.
    Objects {
        /// User.
        uid: u32,
        /// Kind.
        kind: Kind,
        /// The limit.
        limit: u32,
    },
    /// Mapping `want` more bytes would take the user past `limit`.
    Bytes {
        /// User.
        uid: u32,
        /// Bytes asked for.
        want: u64,
        /// Bytes mapped already.
        used: u64,
        /// The limit.
        limit: u64,
    },
}

impl std::fmt::Display for QuotaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            QuotaError::Objects { uid, kind, limit } => write!(
                f,
                "user {uid} holds {limit} {} over all its connections, the most this NIC allows ({} {limit})",
                kind.name(),
                kind.flag()
            ),
            QuotaError::Bytes {
                uid,
                want,
                used,
                limit,
            } => write!(
                f,
                "user {uid} has {used} bytes mapped over all its connections; {want} more would pass the limit of {limit} (--max-mapped-bytes-per-user)"
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

/// Every user's usage against one set of limits.
#[derive(Debug, Default)]
pub struct Quotas {
    limits: Limits,
    users: HashMap<u32, Usage>,
}

impl Quotas {
    /// No usage yet.
    pub fn new(limits: Limits) -> Self {
        Quotas {
            limits,
            users: HashMap::new(),
        }
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What `uid` holds.
    pub fn usage(&self, uid: u32) -> Usage {
        self.users.get(&uid).copied().unwrap_or_default()
    }

    /// Takes one object of `kind` mapping `bytes` for `uid`, or says why not (and
    /// takes nothing).
    pub fn take(&mut self, uid: u32, kind: Kind, bytes: u64) -> Result<(), QuotaError> {
        let limit = match kind {
            Kind::Pd => self.limits.pds,
            Kind::Cq => self.limits.cqs,
            Kind::Qp => self.limits.qps,
            Kind::Mr => self.limits.mrs,
            Kind::CmId => self.limits.cm_ids,
        };
        let u = self.users.entry(uid).or_default();
        if *u.count(kind) >= limit {
            return Err(QuotaError::Objects { uid, kind, limit });
        }
        let total = u.mapped_bytes.checked_add(bytes);
        if !matches!(total, Some(t) if t <= self.limits.mapped_bytes) {
            return Err(QuotaError::Bytes {
                uid,
                want: bytes,
                used: u.mapped_bytes,
                limit: self.limits.mapped_bytes,
            });
        }
        *u.count(kind) += 1;
        u.mapped_bytes += bytes;
        Ok(())
    }

    /// Gives back what [`Quotas::take`] took.
    pub fn give_back(&mut self, uid: u32, kind: Kind, bytes: u64) {
        if let Some(u) = self.users.get_mut(&uid) {
            let c = u.count(kind);
            *c = c.saturating_sub(1);
            u.mapped_bytes = u.mapped_bytes.saturating_sub(bytes);
            if u.is_empty() {
                self.users.remove(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_bytes_are_per_user_and_given_back() {
        let mut q = Quotas::new(Limits {
            mrs: 2,
            mapped_bytes: 100,
            ..Limits::default()
        });
        q.take(7, Kind::Mr, 40).unwrap();
        q.take(7, Kind::Mr, 40).unwrap();
        let e = q.take(7, Kind::Mr, 1).unwrap_err();
        assert!(matches!(
            e,
            QuotaError::Objects {
                uid: 7,
                kind: Kind::Mr,
                limit: 2
            }
        ));
        assert!(e.to_string().contains("--max-mrs-per-user 2"), "{e}");
        // Another user is not affected.
        q.take(8, Kind::Mr, 100).unwrap();
        q.give_back(7, Kind::Mr, 40);
        let e = q.take(7, Kind::Mr, 61).unwrap_err();
        assert!(matches!(e, QuotaError::Bytes { used: 40, .. }), "{e:?}");
        assert!(e.to_string().contains("--max-mapped-bytes-per-user"));
        q.take(7, Kind::Mr, 60).unwrap();
        assert_eq!(q.usage(7).mrs, 2);
        assert_eq!(q.usage(7).mapped_bytes, 100);
        // A refused take takes nothing; u64 overflow is refused, not wrapped.
        assert!(q.take(7, Kind::Cq, u64::MAX).is_err());
        assert_eq!(q.usage(7).cqs, 0);
        for _ in 0..2 {
            q.give_back(7, Kind::Mr, 50);
        }
        assert_eq!(q.usage(7), Usage::default());
        assert!(!q.users.contains_key(&7), "empty entries are dropped");
    }
}
