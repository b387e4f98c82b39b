//! A finding on disk: the packet sequence that preceded a dead or hung peer, as a pcap
//! (what was sent, ICRCs as sent, readable by `softnic decode` and Wireshark) and as a
//! replay file (JSON) that `softnic fuzz replay FILE` sends again on a fresh connection,
//! rebased onto the QPN and region the restarted peer announces.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::engine::Probe;
use super::link::Exchange;
use super::seq::{Ctx, Pkt};
use crate::nic::pcap::PcapWriter;

/// Format version of the replay file.
pub const REPLAY_VERSION: u32 = 1;

/// Everything needed to send a finding's sequence again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Replay {
    /// [`REPLAY_VERSION`].
    pub softnic_fuzz_replay: u32,
    /// Why this is a finding (what the liveness probe saw).
    pub why: String,
    /// The exchange server, `host:port`.
    pub target: String,
    /// Its exchange.
    pub exchange: Exchange,
    /// The fuzzer's RoCEv2 address (IP; bound on `udp_port`).
    pub local: IpAddr,
    /// The RoCEv2 UDP port (both sides).
    pub udp_port: u16,
    /// The fuzzer's QPN.
    pub our_qpn: u32,
    /// The path MTU the run asked for (perftest's exchange carries it).
    pub mtu: u32,
    /// The run's liveness probe (files written before it existed: `Auto`).
    #[serde(default)]
    pub probe: Probe,
    /// The connection the packets were made for (`base_psn` = our first PSN).
    pub ctx: Ctx,
    /// The run's seed.
    pub seed: u64,
    /// The packets, in order, as made (ICRC slot zero; `icrc_xor` marks a spoiled one).
    pub packets: Vec<Pkt>,
}

impl Replay {
    /// Writes `STEM.json` and `STEM.pcap` (the packets as sent to `peer`); returns the
    /// JSON path.
    pub fn save(&self, stem: &Path, peer: SocketAddr) -> Result<PathBuf, String> {
        let json = stem.with_extension("json");
        let pcap = stem.with_extension("pcap");
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&json, text).map_err(|e| format!("{}: {e}", json.display()))?;
        let mut w = PcapWriter::create(&pcap).map_err(|e| format!("{}: {e}", pcap.display()))?;
        let local = SocketAddr::new(self.local, self.udp_port);
        if let Some(params) = crate::nic::rx_icrc::params(peer, local, 0) {
            for p in &self.packets {
                w.record(&params, 0, &p.wire_bytes(&params))
                    .map_err(|e| format!("{}: {e}", pcap.display()))?;
            }
        }
        w.flush().map_err(|e| format!("{}: {e}", pcap.display()))?;
        Ok(json)
    }

    /// Reads a replay file.
    pub fn load(path: &Path) -> Result<Replay, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let r: Replay =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if r.softnic_fuzz_replay != REPLAY_VERSION {
            return Err(format!(
                "{}: replay format {} (this softnic reads {REPLAY_VERSION})",
                path.display(),
                r.softnic_fuzz_replay
            ));
        }
        Ok(r)
    }
}
