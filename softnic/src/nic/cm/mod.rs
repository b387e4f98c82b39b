//! The NIC's connection manager: QP1 (the GSI QP, a UD QP with Q_Key `0x80010000`,
//! IBTA 13.5.2.1) carrying CM MADs, around the sans-IO [`softnic_transport::cm::Cm`].
//!
//! * [`qp1`] — CM MADs in and out of UD SEND Only packets on QP1;
//! * [`events`] — per-client event channels (a bounded queue and a NIC-owned pipe);
//! * [`requests`] — the control requests of `verbs_api::cm` (listen, connect, …);
//! * [`apply`] — the CM's QP transitions applied to the client's QPs, its events
//!   routed to channels, its MADs sent.

pub mod apply;
pub mod events;
pub mod qp1;
pub mod requests;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use softnic_transport::cm::{Cm, CmConfig, IdHandle};
use softnic_transport::time::Duration;
use verbs_api::abi::control::{Handle, QpType};

use events::Channel;

/// The CM response timeout the NIC advertises and waits for (4.096 µs × 2^16 ≈
/// 268 ms; Linux uses 2^20 ≈ 4.3 s). Loopback and LAN peers answer in well under it.
pub const CM_RESPONSE_TIMEOUT: u8 = 16;
/// Resends of a REQ, REP or DREQ before giving up (Linux: 15). With the timeout above
/// an unreachable peer is reported after about 2.1 s.
pub const MAX_CM_RETRIES: u8 = 7;
/// How long a closed connection's comm ID stays reserved.
pub const TIMEWAIT: Duration = Duration::from_millis(500);

/// Who owns a CM id.
#[derive(Debug, Clone, Copy)]
pub struct IdOwner {
    /// The client connection.
    pub client: u32,
    /// The channel its events go to.
    pub channel: Handle,
    /// The user whose `--max-cm-ids-per-user` quota it counts against: an id the client
    /// made (`CmRequest::CreateId`); none for the ids the NIC makes for incoming
    /// connection requests (bounded by their listener's backlog).
    pub quota_uid: Option<u32>,
    /// `(port space, port)` it listens on.
    pub listening: Option<(u16, u16)>,
    /// A listener's QP type (`CmRequest::Listen`), which its connections' ids take.
    pub listen_qp_type: Option<QpType>,
    /// `(port space, port)` it reserved at bind (`CmRequest::Bind`), listening or not.
    pub bound: Option<(u16, u16)>,
    /// The program moves the connection's QP itself (`CmRequest::OwnQp`): the CM's
    /// QP transitions are not applied.
    pub own_qp: bool,
    /// A passive connection's starting PSN, drawn when first needed (an
    /// `rdma_init_qp_attr` before the accept must name the PSN the REP will carry).
    pub accept_psn: Option<u32>,
    /// The local ACK timeout the program set for this id's QP
    /// (`CmRequest::SetAckTimeout`), in place of the peer's offer at RTS.
    pub ack_timeout: Option<u8>,
    /// The traffic class (IP TOS) the program set for this id's connection
    /// (`CmRequest::SetTos`): the REQ's primary path carries it, and both sides' QPs
    /// send with it. 0 without.
    pub tos: u8,
}

impl IdOwner {
    /// The starting PSN of a passive connection's REP: drawn once, so that what
    /// `rdma_init_qp_attr` answered before the accept is what the REP carries.
    pub fn accept_psn(&mut self) -> u32 {
        *self.accept_psn.get_or_insert_with(requests::draw_psn)
    }
}

/// Drops and events of the NIC-side CM (the transport's [`softnic_transport::cm::CmCounters`]
/// count the protocol's).
#[derive(Debug, Clone, Copy, Default)]
pub struct NicCmCounters {
    /// Packets to QP1 that are not UD SEND Only with the GSI Q_Key.
    pub rx_drop_not_gsi: u64,
    /// Packets to QP1 whose payload is not a CM MAD softnic reads.
    pub rx_drop_bad_mad: u64,
    /// Events not queued because the channel's queue was full.
    pub events_dropped: u64,
    /// QP transitions the CM asked for that the QP refused.
    pub qp_action_failures: u64,
}

/// The NIC's CM state.
#[derive(Debug)]
pub struct NicCm {
    /// The protocol machine.
    pub cm: Cm,
    /// Event channels by handle.
    pub(super) channels: BTreeMap<Handle, Channel>,
    /// Owners of ids.
    pub(super) ids: BTreeMap<IdHandle, IdOwner>,
    /// Listening ports → id.
    pub(super) ports: BTreeMap<(u16, u16), IdHandle>,
    next_channel: Handle,
    next_ephemeral: u16,
    /// QP1's next send PSN.
    pub(super) qp1_psn: wire::Psn,
    /// Counters.
    pub counters: NicCmCounters,
}

impl NicCm {
    /// The CM of a NIC at `local` with node GUID `guid` and active MTU `mtu` bytes.
    pub fn new(local: SocketAddr, guid: u64, mtu: u32) -> NicCm {
        let seed = u64::from(crate::nic::secret::u32().unwrap_or(0x5eed)) << 32
            | u64::from(crate::nic::secret::u32().unwrap_or(0xc0de));
        let path_mtu = match mtu {
            ..=256 => 1,
            257..=512 => 2,
            513..=1024 => 3,
            1025..=2048 => 4,
            _ => 5,
        };
        let cfg = CmConfig {
            local,
            ca_guid: guid,
            cm_response_timeout: CM_RESPONSE_TIMEOUT,
            max_cm_retries: MAX_CM_RETRIES,
            path_mtu,
            timewait: TIMEWAIT,
        };
        NicCm {
            cm: Cm::new(cfg, seed),
            channels: BTreeMap::new(),
            ids: BTreeMap::new(),
            ports: BTreeMap::new(),
            next_channel: 1,
            next_ephemeral: 0,
            qp1_psn: wire::Psn::new(0),
            counters: NicCmCounters::default(),
        }
    }

    fn channel_handle(&mut self) -> Handle {
        loop {
            let h = self.next_channel;
            self.next_channel = self.next_channel.wrapping_add(1).max(1);
            if !self.channels.contains_key(&h) {
                return h;
            }
        }
    }

    /// A free port in the IANA dynamic range for `ps` (`rdma_bind_addr` with port 0).
    fn ephemeral_port(&mut self, ps: u16) -> Option<u16> {
        for _ in 0..16384u32 {
            self.next_ephemeral = self.next_ephemeral.wrapping_add(1) % 16384;
            let port = 49152 + self.next_ephemeral;
            if !self.ports.contains_key(&(ps, port)) {
                return Some(port);
            }
        }
        None
    }

    /// Counter list for `softnic stats`.
    pub fn stats(&self) -> Vec<(&'static str, u64)> {
        let c = self.cm.counters();
        let n = &self.counters;
        vec![
            ("cm_rx_mads", c.rx_mads),
            ("cm_tx_mads", c.tx_mads),
            ("cm_tx_retries", c.tx_retries),
            ("cm_tx_drop_queue_full", c.tx_drop_queue_full),
            ("cm_rx_drop_unknown_comm_id", c.rx_drop_unknown_comm_id),
            ("cm_rx_drop_wrong_peer", c.rx_drop_wrong_peer),
            (
                "cm_rx_drop_wrong_remote_comm_id",
                c.rx_drop_wrong_remote_comm_id,
            ),
            ("cm_rx_drop_unexpected", c.rx_drop_unexpected),
            ("cm_rx_drop_bad_req", c.rx_drop_bad_req),
            ("cm_rx_drop_backlog", c.rx_drop_backlog),
            ("cm_rej_no_listener", c.rej_no_listener),
            ("cm_rej_wrong_transport", c.rej_wrong_transport),
            ("cm_rx_duplicates", c.rx_duplicates),
            ("cm_timeouts", c.timeouts),
            ("cm_rx_drop_not_gsi", n.rx_drop_not_gsi),
            ("cm_rx_drop_bad_mad", n.rx_drop_bad_mad),
            ("cm_events_dropped", n.events_dropped),
            ("cm_qp_action_failures", n.qp_action_failures),
            // A gauge, not a counter: the interop harness waits for a softnic-side
            // server's listen with it (a CM listen opens no TCP port to look for).
            (
                "cm_listening",
                self.ids.values().filter(|o| o.listening.is_some()).count() as u64,
            ),
        ]
    }
}
