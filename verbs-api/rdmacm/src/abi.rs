//! `#[repr(C)]` mirrors of the `<rdma/rdma_cma.h>` structs programs read and write,
//! and the layout table `tests/layout.rs` checks against Debian's header
//! (x86_64: `rdma_cm_id` 416 bytes, `rdma_cm_event` 80, `rdma_addrinfo` 96).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

use libc::{sockaddr, sockaddr_storage, socklen_t};
use softnic_ibverbs::abi::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, FieldLayout,
    SizeRule, StructSize,
};

/// `enum rdma_cm_event_type`: the values are `verbs_api::cm::CmEventKind as u32`.
pub type rdma_cm_event_type = c_int;

/// `enum rdma_port_space`: `RDMA_PS_TCP` (RC).
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_PS_UDP` (UD).
pub const RDMA_PS_UDP: c_int = 0x0111;
/// `RDMA_PS_IB` (the id's QP type: softnic serves RC and XRC there).
pub const RDMA_PS_IB: c_int = 0x013F;
/// `RDMA_PS_IPOIB` (not served).
pub const RDMA_PS_IPOIB: c_int = 0x0002;

/// `enum ibv_qp_type`: RC.
pub const IBV_QPT_RC: c_int = 2;
/// UC.
pub const IBV_QPT_UC: c_int = 3;
/// UD.
pub const IBV_QPT_UD: c_int = 4;
/// XRC initiator.
pub const IBV_QPT_XRC_SEND: c_int = 9;
/// XRC target.
pub const IBV_QPT_XRC_RECV: c_int = 10;

/// The verbs-api QP type of an `enum ibv_qp_type` value.
pub fn qp_type_of(t: c_int) -> Option<verbs_api::QpType> {
    use verbs_api::QpType as T;
    Some(match t {
        IBV_QPT_RC => T::Rc,
        IBV_QPT_UC => T::Uc,
        IBV_QPT_UD => T::Ud,
        IBV_QPT_XRC_SEND => T::XrcSend,
        IBV_QPT_XRC_RECV => T::XrcRecv,
        _ => return None,
    })
}

/// The `enum ibv_qp_type` value of a verbs-api QP type.
pub fn ibv_qp_type(t: verbs_api::QpType) -> c_int {
    use verbs_api::QpType as T;
    match t {
        T::Rc => IBV_QPT_RC,
        T::Uc => IBV_QPT_UC,
        T::Ud => IBV_QPT_UD,
        T::XrcSend => IBV_QPT_XRC_SEND,
        T::XrcRecv => IBV_QPT_XRC_RECV,
    }
}

/// `struct rdma_ib_addr` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ib_addr {
    /// Source GID (our NIC's address GID).
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key, network order.
    pub pkey: u16,
}

/// `struct rdma_addr` (296 bytes): source and destination as `sockaddr_storage`
/// (the header's unions), then the IB address.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// `src_addr` / `src_sin` / `src_sin6` / `src_storage`.
    pub src_storage: sockaddr_storage,
    /// `dst_addr` / … / `dst_storage`.
    pub dst_storage: sockaddr_storage,
    /// `addr.ibaddr`.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route` (312 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// Addresses.
    pub addr: rdma_addr,
    /// `struct ibv_sa_path_rec *`: NULL (RoCE resolves no path records here).
    pub path_rec: *mut c_void,
    /// 0 or 1.
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`: just the fd programs poll.
#[repr(C)]
pub struct rdma_event_channel {
    /// Readable while an event is pending.
    pub fd: c_int,
}

/// `struct rdma_cm_id` (416 bytes).
#[repr(C)]
pub struct rdma_cm_id {
    /// The device context, once bound (`ibv_context` of softnic's libibverbs).
    pub verbs: *mut ibv_context,
    /// Where the id's events go.
    pub channel: *mut rdma_event_channel,
    /// The program's context pointer.
    pub context: *mut c_void,
    /// The QP from `rdma_create_qp`, if any.
    pub qp: *mut ibv_qp,
    /// Addresses.
    pub route: rdma_route,
    /// `enum rdma_port_space`.
    pub ps: c_int,
    /// Port (1) once bound.
    pub port_num: u8,
    /// The last event fetched by the synchronous calls (`rdma_create_ep` ids).
    pub event: *mut rdma_cm_event,
    /// Completion channel of `send_cq` (`rdma_create_qp` with no CQs given).
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Completion channel of `recv_cq`.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (never: softnic's libibverbs has no SRQs in its C layer yet).
    pub srq: *mut c_void,
    /// The PD the QP was created on.
    pub pd: *mut ibv_pd,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
}

/// `struct rdma_conn_param` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Flow control.
    pub flow_control: u8,
    /// Retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// SRQ in use.
    pub srq: u8,
    /// QP number (when the id has no QP).
    pub qp_num: u32,
}

/// `struct rdma_ud_param` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// How to address the peer (`ibv_create_ah`).
    pub ah_attr: ibv_ah_attr,
    /// Peer QPN.
    pub qp_num: u32,
    /// Peer Q_Key.
    pub qkey: u32,
}

/// `struct rdma_cm_join_mc_attr_ex` (16 bytes): `rdma_join_multicast_ex`'s attributes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*`: which fields are set.
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub join_flags: u32,
    /// The group.
    pub addr: *mut libc::sockaddr,
}

/// `rdma_cm_event.param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_event_param {
    /// RC.
    pub conn: rdma_conn_param,
    /// UD.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event` (80 bytes).
#[repr(C)]
pub struct rdma_cm_event {
    /// The id the event is for (a new id for CONNECT_REQUEST).
    pub id: *mut rdma_cm_id,
    /// The listening id (CONNECT_REQUEST).
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: rdma_cm_event_type,
    /// 0, a REJ reason, or a negative errno.
    pub status: c_int,
    /// Parameters.
    pub param: rdma_event_param,
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*`.
    pub ai_flags: c_int,
    /// `AF_INET` / `AF_INET6`.
    pub ai_family: c_int,
    /// `enum ibv_qp_type`.
    pub ai_qp_type: c_int,
    /// `enum rdma_port_space`.
    pub ai_port_space: c_int,
    /// Length of `ai_src_addr`.
    pub ai_src_len: socklen_t,
    /// Length of `ai_dst_addr`.
    pub ai_dst_len: socklen_t,
    /// Source address.
    pub ai_src_addr: *mut sockaddr,
    /// Destination address.
    pub ai_dst_addr: *mut sockaddr,
    /// Not set.
    pub ai_src_canonname: *mut c_char,
    /// Not set.
    pub ai_dst_canonname: *mut c_char,
    /// Not set.
    pub ai_route_len: usize,
    /// Not set.
    pub ai_route: *mut c_void,
    /// Not set.
    pub ai_connect_len: usize,
    /// Not set.
    pub ai_connect: *mut c_void,
    /// Next result.
    pub ai_next: *mut rdma_addrinfo,
}

/// `RAI_PASSIVE`: the address is for listening.
pub const RAI_PASSIVE: c_int = 1;
/// `RAI_NUMERICHOST`: no name lookup.
pub const RAI_NUMERICHOST: c_int = 2;
/// `RAI_NOROUTE`.
pub const RAI_NOROUTE: c_int = 4;
/// `RAI_FAMILY`: `ai_family` is the caller's.
pub const RAI_FAMILY: c_int = 8;

/// Every field programs touch, for the C layout test.
pub fn layout_table() -> Vec<FieldLayout> {
    let mut v = Vec::new();
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_cm_id {
            verbs,
            channel,
            context,
            qp,
            route,
            ps,
            port_num,
            event,
            send_cq_channel,
            send_cq,
            recv_cq_channel,
            recv_cq,
            srq,
            pd,
            qp_type
        }
    );
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_route {
            addr,
            path_rec,
            num_paths
        }
    );
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_addr {
            src_storage,
            dst_storage,
            ibaddr as "addr.ibaddr"
        }
    );
    softnic_ibverbs::fields!(v, Offset, rdma_ib_addr { sgid, dgid, pkey });
    softnic_ibverbs::fields!(v, Offset, rdma_event_channel { fd });
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_cm_event {
            id,
            listen_id,
            event,
            status,
            param
        }
    );
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_conn_param {
            private_data,
            private_data_len,
            responder_resources,
            initiator_depth,
            flow_control,
            retry_count,
            rnr_retry_count,
            srq,
            qp_num
        }
    );
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_ud_param {
            private_data,
            private_data_len,
            ah_attr,
            qp_num,
            qkey
        }
    );
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_cm_join_mc_attr_ex {
            comp_mask,
            join_flags,
            addr
        }
    );
    softnic_ibverbs::fields!(
        v,
        Offset,
        rdma_addrinfo {
            ai_flags,
            ai_family,
            ai_qp_type,
            ai_port_space,
            ai_src_len,
            ai_dst_len,
            ai_src_addr,
            ai_dst_addr,
            ai_src_canonname,
            ai_dst_canonname,
            ai_route_len,
            ai_route,
            ai_connect_len,
            ai_connect,
            ai_next
        }
    );
    v
}

/// The struct sizes the layout test compares (all exact: programs allocate and copy
/// these).
pub fn size_table() -> Vec<StructSize> {
    use std::mem::size_of;
    [
        ("rdma_cm_id", size_of::<rdma_cm_id>()),
        ("rdma_route", size_of::<rdma_route>()),
        ("rdma_addr", size_of::<rdma_addr>()),
        ("rdma_ib_addr", size_of::<rdma_ib_addr>()),
        ("rdma_event_channel", size_of::<rdma_event_channel>()),
        ("rdma_cm_event", size_of::<rdma_cm_event>()),
        ("rdma_conn_param", size_of::<rdma_conn_param>()),
        ("rdma_ud_param", size_of::<rdma_ud_param>()),
        ("rdma_addrinfo", size_of::<rdma_addrinfo>()),
        (
            "rdma_cm_join_mc_attr_ex",
            size_of::<rdma_cm_join_mc_attr_ex>(),
        ),
    ]
    .into_iter()
    .map(|(strukt, size)| StructSize {
        strukt,
        size,
        rule: SizeRule::Exact,
    })
    .collect()
}
