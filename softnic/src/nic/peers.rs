//! The RTT estimate of each peer NIC (`softnic_transport::qp::PeerRtt`): one per remote
//! UDP endpoint, handed to every QP connected to it, so that a QP which sends only now
//! and then times its resends on what the path does now, not on its own old sample.

use core::net::SocketAddr;
use std::collections::HashMap;

use softnic_transport::qp::PeerRtt;

/// Sweeps never run below this many entries.
const MIN_SWEEP: usize = 64;

/// Peer estimates by remote endpoint.
#[derive(Debug, Default)]
pub struct PeerRtts {
    map: HashMap<SocketAddr, PeerRtt>,
    /// The table is swept of entries no QP holds when it reaches this size.
    sweep_at: usize,
}

impl PeerRtts {
    /// The estimate shared by the QPs connected to `remote`. Entries no QP holds any
    /// more are dropped whenever the table has doubled since the last sweep, so a
    /// client that cycles through remotes keeps it at most about twice the peers in use
    /// (amortized O(1) per call).
    pub fn get(&mut self, remote: SocketAddr) -> PeerRtt {
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, p| p.is_shared());
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
        }
        self.map.entry(remote).or_default().clone()
    }

    /// Remotes in the table.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no remote is in the table.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_estimate_per_remote_and_unused_ones_are_swept() {
        let mut t = PeerRtts::default();
        assert!(t.is_empty());
        let a: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let held = t.get(a);
        assert!(held.is_shared(), "the table and the QP hold it");
        for port in 1..=1000 {
            drop(t.get(SocketAddr::new(a.ip(), port)));
        }
        assert!(t.len() <= MIN_SWEEP + 1, "{} entries", t.len());
        // The held one survived every sweep and is the one handed out again.
        assert!(t.get(a).ptr_eq(&held));
    }
}
