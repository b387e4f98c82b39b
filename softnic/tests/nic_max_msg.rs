//! The NIC reports in `max_msg_sz` the longest message a connected QP carries at
//! every path MTU, and refuses a longer post: 2^31 − 256 bytes, because at MTU 256 a
//! 2^31-byte message would take 2^23 PSNs (issue 9, item 4). The transport's own
//! tests (`softnic-transport`, tests/psn_window.rs) check every MTU's boundary.

mod nic_support;

use nic_support::*;
use verbs_api::Device;

#[test]
fn device_reports_the_largest_message_every_mtu_carries() {
    let nic = NicProc::start("maxmsg-a", "127.0.0.91", 0, &[]);
    let ctx = Device::open(&nic.name).expect("open device");
    let expect = (1u32 << 31) - 256;
    assert_eq!(ctx.attributes().max_msg_sz, expect);
    assert_eq!(ctx.query_device().expect("query").max_msg_sz, expect);
    assert_eq!(
        softnic_transport::qp::max_msg_len(256),
        expect,
        "the transport refuses longer posts at MTU 256"
    );
}
