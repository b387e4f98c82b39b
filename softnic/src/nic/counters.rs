//! NIC-wide counters, and the list `softnic stats` prints.
//!
//! Three sources, one flat list of `(name, value)`:
//! * [`NicCounters`] — what the runtime itself saw: datagrams and bytes in and out,
//!   which ICRC path verified each received packet, and every drop by reason;
//! * the sum of every QP's [`QpCounters`] (retransmissions, NAKs by kind, RNR retries,
//!   per-QP drops), including QPs already destroyed, so totals never go backwards;
//! * the fault injector's [`FaultCounters`].

use softnic_transport::qp::QpCounters;

use super::fault::FaultCounters;

macro_rules! counters {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* $f:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: u64,)* }
        impl $name {
            /// `(name, value)` of every field, in declaration order.
            pub fn list(&self, out: &mut Vec<(String, u64)>, prefix: &str) {
                $( out.push((format!("{prefix}{}", stringify!($f)), self.$f)); )*
            }
        }
    };
}

counters! {
    /// Counters of the NIC runtime.
    pub struct NicCounters {
        /// Datagrams received on the UDP socket.
        rx_datagrams,
        /// Bytes of those datagrams (UDP payload).
        rx_bytes,
        /// Datagrams sent (after fault injection).
        tx_datagrams,
        /// Bytes sent.
        tx_bytes,
        /// GSO sends (each carried several datagrams).
        tx_gso_sends,
        /// IPv4 packets whose ICRC matched with IPv4 ID 0 (full 32-bit check).
        rx_icrc_id0,
        /// IPv4 packets whose ICRC matched under the ID of their position in a GRO
        /// buffer (GSO segment k carries ID k; full 32-bit check).
        rx_icrc_segment_id,
        /// IPv4 packets whose ICRC matched under a solved non-zero ID (16-bit check).
        rx_icrc_solved,
        /// IPv6 packets whose ICRC matched (full check).
        rx_icrc_ipv6,
        /// Packets whose payload was written into memory in the pass that hashed it,
        /// before their ICRC was checked, and whose ICRC then matched (the receiver's
        /// single pass, `rx_place.rs`; counted among the paths above too).
        rx_placed_fused,
        /// Packets whose payload was written so, and whose ICRC then failed: dropped
        /// and counted in `rx_drop_bad_icrc` as any other (its bytes lie where the
        /// message in progress writes: `softnic_transport::qp::placement`).
        rx_placed_bad_icrc,
        /// Of the placed packets whose ICRC matched, those whose handling did not make the placed write: the
        /// transport's placement query and its handling disagree (a bug; 0).
        rx_placed_mismatch,
        /// Dropped: bad ICRC.
        rx_drop_bad_icrc,
        /// Dropped: datagram larger than the receive slot (truncated by the kernel).
        rx_drop_truncated,
        /// Dropped: no source address, or a source of the other IP family.
        rx_drop_bad_source,
        /// Dropped: shorter than a header it needs.
        rx_drop_parse_truncated,
        /// Dropped: unknown, reserved or unsupported opcode.
        rx_drop_parse_unknown_opcode,
        /// Dropped: BTH transport version not 0.
        rx_drop_parse_bad_tver,
        /// Dropped: pad count inconsistent with the payload.
        rx_drop_parse_bad_pad,
        /// Dropped: payload on an opcode that carries none.
        rx_drop_parse_unexpected_payload,
        /// Dropped: any other parse error.
        rx_drop_parse_other,
        /// Dropped: no QP with the BTH destination QPN.
        rx_drop_unknown_qpn,
        /// Datagrams received on a multicast group's socket with the multicast QPN, each
        /// handed to every QP attached to the group (`mcast.rs`).
        rx_mcast_datagrams,
        /// Dropped: sent to a multicast group but not to the multicast QPN 0xFFFFFF
        /// (IBTA 9.6.1.1).
        rx_drop_mcast_qpn,
        /// Dropped: for a connected (RC/UC) QP, from an IP address other than its peer's
        /// (spoofed or stray; see `source.rs`).
        rx_drop_source_address,
        /// Dropped: for a connected QP whose peer is a softnic NIC on a port other than
        /// 4791, from another UDP source port.
        rx_drop_source_port,
        /// For an XRC receive QP, an XRC request whose XRCETH names no XRC SRQ of the
        /// QP's XRC domain (an unknown SRQ number, or an SRQ of another domain). The QP
        /// refuses it once it passes the state and PSN checks: NAK Remote Access Error
        /// and Err (`qp_nak_remote_access_sent`; Linux's XRC patches for rxe answer an
        /// invalid XRCETH so). Only the QP's connected peer gets this far (`source.rs`).
        rx_xrc_srq_refused,
        /// Not sent: the socket buffer stayed full.
        tx_drop_socket_full,
        /// Not sent: the kernel refused the datagram.
        tx_drop_send_error,
        /// Not sent: the destination is of the other IP family.
        tx_drop_bad_dest,
        /// Work requests refused when taken from a ring (completed with LOC_QP_OP_ERR).
        wqe_invalid,
        /// Doorbell bits a client set for a slot that is none of its rings (ignored).
        doorbell_unknown_slot,
        /// Rings found corrupt (impossible indices); their QP was moved to ERR.
        ring_corrupt,
        /// Completions that found their CQ full; the QP was moved to ERR.
        cq_overrun,
        /// Completions dropped because their CQ is gone: a receive completion of an
        /// XRC receive QP whose XRC SRQ (and so its CQ) was destroyed while the QP held
        /// one of its WQEs (an XRC receive QP holds no use of the XRC SRQs it takes
        /// WQEs from; `srq.rs` `remove_srq`).
        cqe_drop_no_cq,
        /// Times the runtime went to sleep in poll(2).
        sleeps,
        /// Passes of the loop (`Runtime::iterate`), busy or not.
        loop_passes,
        /// Of those, passes that found nothing to do (then the loop yields, or sleeps
        /// after `SPIN`): with `loop_passes`, the share of the NIC's polling that waited.
        loop_idle_passes,
        /// Times the loop found its core held by a thread that does not yield (three
        /// yields in a row kept it off the core for over a millisecond each, e.g. a
        /// program polling its memory): each starts 100 ms of sleeping when idle
        /// instead of spinning (`starved.rs`).
        spin_starved,
        /// Clients' CQ pollers woken from their hybrid-polling sleep (one `futex_wake`
        /// each, at a CQ flush; `verbs_api::poll_idle`).
        poller_wakes,
        /// Control requests served.
        control_requests,
        /// GetAsyncEvents requests served (the C library asks only when the NIC has
        /// written its readiness pipe: none while a context is idle).
        async_event_requests,
        /// Objects GetAsyncEvents looked at: one per object with events waiting, not
        /// every object of the client (`async_events.rs`).
        async_event_visits,
        /// Clients connected so far.
        clients_opened,
        /// Clients gone (closed or crashed) and cleaned up.
        clients_closed,
        /// Control connections refused: `--max-connections` were open.
        control_refused_connections_total,
        /// Control connections refused: the peer's user had
        /// `--max-connections-per-user` open.
        control_refused_connections_user,
        /// Control connections refused: the peer's credentials were unreadable.
        control_refused_no_credentials,
        /// Requests refused: the user holds its quota of PDs, CQs, QPs or MRs.
        control_refused_quota_objects,
        /// Requests refused: the user's mapped bytes would pass its quota.
        control_refused_quota_bytes,
    }
}

/// Counts a parse error under its kind.
pub fn count_parse_error(c: &mut NicCounters, e: &wire::Error) {
    use wire::Error as E;
    let slot = match e {
        E::Truncated { .. } => &mut c.rx_drop_parse_truncated,
        E::UnknownOpcode(_) => &mut c.rx_drop_parse_unknown_opcode,
        E::BadTver(_) => &mut c.rx_drop_parse_bad_tver,
        E::BadPad { .. } => &mut c.rx_drop_parse_bad_pad,
        E::UnexpectedPayload { .. } => &mut c.rx_drop_parse_unexpected_payload,
        _ => &mut c.rx_drop_parse_other,
    };
    *slot += 1;
}

/// The full list `softnic stats` prints: NIC counters, QP totals (prefixed `qp_`),
/// fault-injection counters (prefixed `fault_`), and gauges.
pub fn report(
    nic: &NicCounters,
    qps: &QpCounters,
    fault: &FaultCounters,
    gauges: &[(&str, u64)],
) -> Vec<(String, u64)> {
    let mut out = Vec::with_capacity(80);
    nic.list(&mut out, "");
    qps.for_each(|n, v| out.push((format!("qp_{n}"), v)));
    for (n, v) in [
        ("fault_dropped", fault.dropped),
        ("fault_corrupted", fault.corrupted),
        ("fault_duplicated", fault.duplicated),
        ("fault_reordered", fault.reordered),
        ("fault_queue_full", fault.queue_full),
    ] {
        out.push((n.to_string(), v));
    }
    for (n, v) in gauges {
        out.push(((*n).to_string(), *v));
    }
    out
}

/// Formats counters one `name value` per line.
pub fn to_text(list: &[(String, u64)]) -> String {
    let mut s = String::new();
    for (n, v) in list {
        s.push_str(n);
        s.push(' ');
        s.push_str(&v.to_string());
        s.push('\n');
    }
    s
}

/// Formats counters as one JSON object `{"name": value, ...}` (declaration order).
pub fn to_json(list: &[(String, u64)]) -> String {
    let mut s = String::from("{");
    for (i, (n, v)) in list.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        // Names are escaped by serde_json; values are plain integers.
        s.push_str(&serde_json::Value::from(n.as_str()).to_string());
        s.push(':');
        s.push_str(&v.to_string());
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_and_report_lists_every_source() {
        let mut t = QpCounters::default();
        let c = QpCounters {
            retransmitted_packets: 3,
            nak_rnr_received: 2,
            ..QpCounters::default()
        };
        t.add(&c);
        t.add(&c);
        let nic = NicCounters {
            rx_icrc_solved: 7,
            ..NicCounters::default()
        };
        let f = FaultCounters {
            dropped: 4,
            ..FaultCounters::default()
        };
        let list = report(&nic, &t, &f, &[("qps", 2)]);
        let get = |n: &str| list.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
        assert_eq!(get("qp_retransmitted_packets"), Some(6));
        assert_eq!(get("qp_nak_rnr_received"), Some(4));
        assert_eq!(get("rx_icrc_solved"), Some(7));
        // Every transport counter is listed (the list comes from the same macro).
        let mut n = 0;
        t.for_each(|name, _| {
            assert!(get(&format!("qp_{name}")).is_some(), "{name}");
            n += 1;
        });
        assert!(get("qp_retries_suppressed").is_some() && n > 30);
        assert_eq!(get("fault_dropped"), Some(4));
        assert_eq!(get("qps"), Some(2));
        let text = to_text(&list);
        assert!(text.contains("\nqp_retransmitted_packets 6\n"));
        let json: serde_json::Value = serde_json::from_str(&to_json(&list)).unwrap();
        assert_eq!(json["rx_icrc_solved"], 7);
    }

    #[test]
    fn parse_errors_are_counted_by_kind() {
        let mut c = NicCounters::default();
        count_parse_error(&mut c, &wire::Error::UnknownOpcode(0xFF));
        count_parse_error(&mut c, &wire::Error::BadTver(1));
        count_parse_error(&mut c, &wire::Error::NotRoce("x"));
        assert_eq!(c.rx_drop_parse_unknown_opcode, 1);
        assert_eq!(c.rx_drop_parse_bad_tver, 1);
        assert_eq!(c.rx_drop_parse_other, 1);
    }
}
