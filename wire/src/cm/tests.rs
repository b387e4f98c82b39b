//! Round trips with every field set, and hostile input: truncation, other classes,
//! and arbitrary bytes never panic.

use super::*;
use proptest::prelude::*;

fn path(seed: u8) -> PathRepr {
    PathRepr {
        local_lid: 0xFFFF,
        remote_lid: 0x1234,
        local_gid: [seed; 16],
        remote_gid: [seed.wrapping_add(1); 16],
        flow_label: 0x85,
        packet_rate: 8,
        traffic_class: 0x20,
        hop_limit: 64,
        sl: 3,
        subnet_local: true,
        local_ack_timeout: 19,
    }
}

fn req() -> ReqRepr {
    ReqRepr {
        local_comm_id: 0xcbb0_4282,
        vendor_id: 0x02c9,
        service_id: ip_service_id(0x0106, 7174),
        local_ca_guid: 0x5054_00ff_fe12_3412,
        local_qkey: 0,
        local_qpn: 0x11,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: 0,
        end_to_end_flow_control: true,
        starting_psn: 0x7449cc,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: true,
        extended_transport_type: 0,
        primary: path(1),
        alternate: path(9),
        sap_supported: true,
        private_data: [0x5a; 92],
    }
}

fn all_messages() -> Vec<CmMessage> {
    vec![
        CmMessage::Req(req()),
        CmMessage::Mra(MraRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: MessageKind::Rep,
            service_timeout: 17,
            private_data: [3; 222],
        }),
        CmMessage::Rej(RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0x1122_3344,
            message_rejected: MessageKind::Req,
            reject_info_length: 72,
            reason: RejReason::INVALID_SERVICE_ID,
            ari: [7; 72],
            private_data: [8; 148],
        }),
        CmMessage::Rep(RepRepr {
            local_comm_id: 5,
            remote_comm_id: 6,
            local_qkey: 0,
            local_qpn: 0x12,
            local_eecn: 0,
            starting_psn: 0xabcdef,
            vendor_id: 0x01_0203,
            responder_resources: 4,
            initiator_depth: 4,
            target_ack_delay: 15,
            failover_accepted: 2,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0200_7f00_0001_12b7,
            private_data: [9; 196],
        }),
        CmMessage::Rtu(RtuRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [1; 224],
        }),
        CmMessage::Dreq(DreqRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: 0xFF_FFFF,
            private_data: [2; 220],
        }),
        CmMessage::Drep(DrepRepr {
            local_comm_id: 3,
            remote_comm_id: 4,
            private_data: [4; 224],
        }),
        CmMessage::SidrReq(SidrReqRepr {
            request_id: 9,
            pkey: 0xFFFF,
            service_id: ip_service_id(0x0111, 7174),
            private_data: [6; 216],
        }),
        CmMessage::SidrRep(SidrRepRepr {
            request_id: 9,
            status: SidrStatus::OK,
            additional_info_length: 0,
            vendor_id: 0x0a0b0c,
            qpn: 0x33,
            service_id: ip_service_id(0x0111, 7174),
            qkey: 0x0123_4567,
            additional_info: [0; 72],
            private_data: [5; 136],
        }),
    ]
}

#[test]
fn every_message_round_trips_with_every_field_set() {
    for msg in all_messages() {
        let mad = CmMadRepr::new(0x0000_0002_8242_b0cb, msg);
        let mut buf = [0xEEu8; MAD_LEN + 8];
        assert_eq!(mad.emit(&mut buf).unwrap(), MAD_LEN);
        assert_eq!(
            &buf[MAD_LEN..],
            &[0xEE; 8],
            "{}: wrote past the MAD",
            msg.name()
        );
        let back = CmMadRepr::parse(&buf[..MAD_LEN]).unwrap();
        assert_eq!(back, mad, "{}", msg.name());
        // A second emit of the parsed MAD is byte-identical.
        let mut again = [0u8; MAD_LEN];
        back.emit(&mut again).unwrap();
        assert_eq!(again[..], buf[..MAD_LEN], "{}", msg.name());
    }
}

#[test]
fn field_positions_match_ibta_tables() {
    let mut b = [0u8; MAD_LEN];
    CmMadRepr::new(1, CmMessage::Req(req()))
        .emit(&mut b)
        .unwrap();
    let d = &b[MAD_HEADER_LEN..];
    assert_eq!(&b[..4], &[1, 7, 2, 3]);
    assert_eq!(&b[16..18], &[0x00, 0x10]);
    assert_eq!(&d[0..4], &[0xcb, 0xb0, 0x42, 0x82]);
    assert_eq!(&d[5..8], &[0x00, 0x02, 0xc9]); // vendor ID
    assert_eq!(&d[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
    assert_eq!(&d[32..36], &[0, 0, 0x11, 1]); // QPN, responder resources
    assert_eq!(d[43], 0xA1); // timeout 20, RC, flow control
    assert_eq!(&d[44..48], &[0x74, 0x49, 0xcc, 0xA7]); // PSN, timeout 20, retry 7
    assert_eq!(d[50], 0x37); // MTU 3, RNR retry 7
    assert_eq!(d[51], 0xF8); // 15 CM retries, SRQ
    assert_eq!(&d[88..92], &[0x00, 0x08, 0x50, 0x08]); // flow label 0x85, rate 8
    assert_eq!(d[94], 0x38); // SL 3, subnet local
    assert_eq!(d[95], 19 << 3);
    assert_eq!(d[139], (19 << 3) | 0x04); // alternate ACK timeout, SAP
    assert_eq!(&d[140..], &[0x5a; 92]);
}

#[test]
fn truncated_and_foreign_mads_are_refused() {
    let mut b = [0u8; MAD_LEN];
    CmMadRepr::new(1, all_messages()[4]).emit(&mut b).unwrap();
    for n in [0, 1, 23, 24, 100, MAD_LEN - 1] {
        assert!(
            matches!(
                CmMadRepr::parse(&b[..n]),
                Err(Error::Truncated {
                    layer: Layer::Mad,
                    ..
                })
            ),
            "{n} bytes"
        );
    }
    for (at, v) in [(0, 2), (1, 0x81), (2, 1), (3, 0x83), (17, 0x19), (17, 0x20)] {
        let mut g = b;
        g[at] = v;
        assert!(
            matches!(CmMadRepr::parse(&g), Err(Error::BadMad(_))),
            "byte {at} = {v:#x}"
        );
    }
    let mut short = [0u8; MAD_LEN - 1];
    assert!(matches!(
        CmMadRepr::new(1, all_messages()[0]).emit(&mut short),
        Err(Error::BufferTooSmall { need: MAD_LEN, .. })
    ));
}

#[test]
fn cma_header_round_trips_both_families() {
    let v4 = CmaHeader {
        cma_version: 0,
        src: "198.18.0.12".parse().unwrap(),
        dst: "198.18.0.11".parse().unwrap(),
        src_port: 0x8786,
    };
    let mut b = [0xFFu8; CMA_HEADER_LEN];
    v4.emit(&mut b);
    assert_eq!(&b[..4], &[0, 0x40, 0x87, 0x86]);
    assert_eq!(
        &b[4..20],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 12]
    );
    assert_eq!(CmaHeader::parse(&b), Some(v4));
    let v6 = CmaHeader {
        src: "fd00::1".parse().unwrap(),
        dst: "fd00::2".parse().unwrap(),
        ..v4
    };
    v6.emit(&mut b);
    assert_eq!(b[1], 0x60);
    assert_eq!(CmaHeader::parse(&b), Some(v6));
    assert_eq!(CmaHeader::parse(&b[..35]), None);
    b[1] = 0x50;
    assert_eq!(CmaHeader::parse(&b), None);
    assert_eq!(
        service_port_space(ip_service_id(0x0106, 7174)),
        Some((0x0106, 7174))
    );
    assert_eq!(service_port_space(0x1000_0000_0106_1c06), None);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), attr in 0x10u16..0x1b) {
        let mut b = bytes.clone();
        if b.len() >= 18 {
            b[..4].copy_from_slice(&[1, 7, 2, 3]);
            b[16..18].copy_from_slice(&attr.to_be_bytes());
        }
        if let Ok(m) = CmMadRepr::parse(&b) {
            let mut out = [0u8; MAD_LEN];
            m.emit(&mut out).unwrap();
            // Re-parsing what we wrote gives the same message back.
            prop_assert_eq!(CmMadRepr::parse(&out).unwrap(), m);
        }
        let _ = CmaHeader::parse(&bytes);
    }
}
