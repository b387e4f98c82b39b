//! Event channels: a bounded queue of [`CmEventMsg`]s and the pipe that says it is not
//! empty. The NIC writes one byte to the pipe when an event is queued on an empty queue;
//! the client reads the pipe empty and drains the queue with `GetEvents`.
//!
//! The pipe is the NIC's ([`verbs_api::os::SignalPipe`]): the client gets only its read
//! end and the NIC writes through a non-blocking write end of its own, so nothing the
//! client does to its descriptor can make the NIC wait, and a client that never reads
//! costs one write per `GetEvents` at most (a full pipe is skipped). Channels used to be
//! the client's own eventfd, written with a plain `write(2)` per event: a blocking
//! eventfd near its maximum, or a full blocking pipe sent in its place, held the NIC.

use std::collections::VecDeque;

use verbs_api::os::SignalPipe;

use softnic_transport::cm::{Event, IdHandle, PeerParams};
use verbs_api::abi::control::cm::{CmEventConn, CmEventMsg, CmEventUd, MAX_EVENTS_PER_REPLY};
use verbs_api::abi::control::Handle;
use wire::cm::{CmaHeader, CMA_HEADER_LEN};

use super::{IdOwner, NicCm};

/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: u16 = 0x0111;

/// Most events a channel holds; more are dropped (and counted) until the client reads.
pub const MAX_EVENTS: usize = 4096;

/// One client's event channel.
#[derive(Debug)]
pub struct Channel {
    /// The client connection.
    pub client: u32,
    /// Written when an event is queued on an empty queue.
    pub pipe: SignalPipe,
    /// Events not yet fetched.
    pub queue: VecDeque<CmEventMsg>,
}

impl Channel {
    /// What a `GetEvents` answers: the oldest events, at most [`MAX_EVENTS_PER_REPLY`]
    /// so that the answer fits a control frame. The client reads the pipe empty before
    /// asking, so an event queued after this writes it again; so does this when it
    /// leaves events behind, and the client asks again.
    pub fn take_events(&mut self) -> Vec<CmEventMsg> {
        let n = self.queue.len().min(MAX_EVENTS_PER_REPLY);
        let v: Vec<_> = self.queue.drain(..n).collect();
        if !self.queue.is_empty() {
            self.pipe.notify();
        }
        v
    }
}

/// `enum rdma_cm_event_type` values.
mod kind {
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
    pub const TIMEWAIT_EXIT: u32 = 15;
}

const ETIMEDOUT: i32 = 110;
const ECONNREFUSED: i32 = 111;

fn conn(p: &PeerParams, private_data: &[u8]) -> CmEventConn {
    CmEventConn {
        private_data: private_data.to_vec(),
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq,
        qp_num: p.qpn,
        psn: p.psn,
    }
}

fn msg(id: IdHandle, kind: u32, status: i32) -> CmEventMsg {
    CmEventMsg {
        id,
        listen_id: None,
        kind,
        status,
        conn: None,
        peer: None,
        local: None,
        space: None,
        ud: None,
    }
}

impl NicCm {
    /// Routes a CM event to its id's channel (registering the new id of a connection
    /// request under its listener's owner).
    pub(super) fn route_event(&mut self, ev: Event) {
        let m = match ev {
            Event::ConnectRequest { listener, id, peer } => {
                let Some(owner) = self.ids.get(&listener).copied() else {
                    // The listener is gone: refuse the connection.
                    let _ = self.cm.reject(id, &[]);
                    self.cm
                        .destroy_id(softnic_transport::time::Instant::ZERO, id);
                    return;
                };
                self.ids.insert(
                    id,
                    IdOwner {
                        quota_uid: None,
                        listening: None,
                        listen_qp_type: None,
                        bound: None,
                        own_qp: false,
                        accept_psn: None,
                        // Linux's CM does not pass a listener's option on to the
                        // connections it accepts (their traffic class is the REQ's).
                        ack_timeout: None,
                        tos: 0,
                        ..owner
                    },
                );
                let cma = CmaHeader::parse(&peer.private_data);
                let user = peer.private_data.get(CMA_HEADER_LEN..).unwrap_or(&[]);
                let mut m = msg(id, kind::CONNECT_REQUEST, 0);
                m.listen_id = Some(listener);
                m.space = owner
                    .listening
                    .zip(owner.listen_qp_type)
                    .map(|((ps, _), t)| (ps, t));
                m.conn = Some(conn(&peer, user));
                m.peer = cma.map(|h| std::net::SocketAddr::new(h.src, h.src_port));
                m.local = cma
                    .zip(owner.listening)
                    .map(|(h, (_, port))| std::net::SocketAddr::new(h.dst, port));
                if owner.listening.is_some_and(|(ps, _)| ps == RDMA_PS_UDP) {
                    m.ud = self.cm.peer(id).map(|dest| CmEventUd {
                        qp_num: 0,
                        qkey: 0,
                        dest,
                        traffic_class: 0,
                    });
                }
                m
            }
            Event::UdResolved {
                id,
                qpn,
                qkey,
                dest,
                private_data,
            } => {
                let mut m = msg(id, kind::ESTABLISHED, 0);
                m.conn = Some(CmEventConn {
                    private_data,
                    qp_num: qpn,
                    ..CmEventConn::default()
                });
                m.ud = Some(CmEventUd {
                    qp_num: qpn,
                    qkey,
                    dest,
                    // The id's TOS: Linux's CM builds this address from the route,
                    // whose traffic class is the id's (`cma_sidr_rep_handler`).
                    traffic_class: self.ids.get(&id).map_or(0, |o| o.tos),
                });
                m
            }
            Event::Established { id, peer } => {
                let mut m = msg(id, kind::ESTABLISHED, 0);
                m.conn = Some(conn(&peer, &peer.private_data));
                m
            }
            Event::Rejected {
                id,
                reason,
                private_data,
            } => {
                let mut m = msg(id, kind::REJECTED, i32::from(reason));
                m.conn = Some(CmEventConn {
                    private_data,
                    ..CmEventConn::default()
                });
                m
            }
            Event::Unreachable { id } => msg(id, kind::UNREACHABLE, -ETIMEDOUT),
            Event::ConnectError { id } => msg(id, kind::CONNECT_ERROR, -ECONNREFUSED),
            Event::Disconnected { id } => msg(id, kind::DISCONNECTED, 0),
            Event::TimewaitExit { id } => msg(id, kind::TIMEWAIT_EXIT, 0),
        };
        self.queue(m);
    }

    /// Moves `id` to channel `to` (`CmRequest::MigrateId`, checked by the caller):
    /// its queued events, and the connection requests queued for it as a listener,
    /// leave their channel for `to`'s queue, in order, and the new ids of those
    /// requests move with them, as Linux's `ucma_migrate_id` moves a context's
    /// events. Events beyond `to`'s room are dropped and counted, as on arrival.
    pub(super) fn migrate(&mut self, id: IdHandle, to: Handle) {
        let Some(from) = self.ids.get(&id).map(|o| o.channel) else {
            return;
        };
        if from == to {
            return;
        }
        let ours = |m: &CmEventMsg| m.id == id || m.listen_id == Some(id);
        let mut moved = Vec::new();
        if let Some(ch) = self.channels.get_mut(&from) {
            let (go, stay): (VecDeque<_>, VecDeque<_>) = ch.queue.drain(..).partition(ours);
            ch.queue = stay;
            moved.extend(go);
        }
        if let Some(o) = self.ids.get_mut(&id) {
            o.channel = to;
        }
        // A connection request's new id belongs to the listener's channel until it is
        // migrated itself: it moves with the listener, before its event is queued there.
        for m in moved {
            if m.listen_id == Some(id) {
                if let Some(o) = self.ids.get_mut(&m.id) {
                    o.channel = to;
                }
            }
            self.queue(m);
        }
    }

    fn queue(&mut self, m: CmEventMsg) {
        let Some(owner) = self.ids.get(&m.id) else {
            return; // the id was destroyed: nobody to tell
        };
        let Some(ch) = self.channels.get_mut(&owner.channel) else {
            return;
        };
        if ch.queue.len() >= MAX_EVENTS {
            self.counters.events_dropped += 1;
            return;
        }
        if ch.queue.is_empty() {
            ch.pipe.notify();
        }
        ch.queue.push_back(m);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// Adds channel `h` of client 1; the read end of its pipe.
    fn add_channel(cm: &mut NicCm, h: Handle) -> std::os::fd::OwnedFd {
        let pipe = SignalPipe::new().unwrap();
        let reader = pipe.reader().unwrap();
        let queue = VecDeque::new();
        cm.channels.insert(
            h,
            Channel {
                client: 1,
                pipe,
                queue,
            },
        );
        reader
    }

    /// A NIC-side CM with one channel of client 1 and one id on it.
    fn cm_with_channel() -> (NicCm, std::os::fd::OwnedFd, IdHandle) {
        let mut cm = NicCm::new("127.0.0.1:4791".parse().unwrap(), 1, 1024);
        let reader = add_channel(&mut cm, 7);
        let id = cm.cm.create_id();
        let owner = IdOwner {
            client: 1,
            channel: 7,
            quota_uid: None,
            listening: None,
            listen_qp_type: None,
            bound: None,
            own_qp: false,
            accept_psn: None,
            ack_timeout: None,
            tos: 0,
        };
        cm.ids.insert(id, owner);
        (cm, reader, id)
    }

    /// `rdma_migrate_id`: the id's queued events, and the connection requests queued
    /// for it as a listener, move to the new channel in order (their new ids with
    /// them); another id's events stay; the new channel's pipe is written.
    #[test]
    fn a_migrated_id_takes_its_queued_events_and_requests_along() {
        let (mut cm, old_reader, id) = cm_with_channel();
        let new_reader = add_channel(&mut cm, 9);
        let other = cm.cm.create_id();
        let child = cm.cm.create_id();
        let owner = cm.ids[&id];
        cm.ids.insert(other, owner);
        cm.ids.insert(child, owner);
        let mut request = msg(child, kind::CONNECT_REQUEST, 0);
        request.listen_id = Some(id);
        cm.queue(msg(id, kind::ESTABLISHED, 0));
        cm.queue(msg(other, kind::DISCONNECTED, 0));
        cm.queue(request);
        cm.queue(msg(id, kind::DISCONNECTED, 0));
        let take = |r: &std::os::fd::OwnedFd| verbs_api::os::pipe_take(r.as_fd()).unwrap();
        assert_eq!(take(&old_reader), Some(1));

        cm.migrate(id, 9);
        let kinds = |c: &Channel| c.queue.iter().map(|m| (m.id, m.kind)).collect::<Vec<_>>();
        assert_eq!(
            kinds(&cm.channels[&9]),
            [
                (id, kind::ESTABLISHED),
                (child, kind::CONNECT_REQUEST),
                (id, kind::DISCONNECTED)
            ]
        );
        assert_eq!(kinds(&cm.channels[&7]), [(other, kind::DISCONNECTED)]);
        assert_eq!(take(&new_reader), Some(1));
        assert_eq!((cm.ids[&id].channel, cm.ids[&child].channel), (9, 9));
        assert_eq!(cm.ids[&other].channel, 7);
        // From now on its events go to the new channel.
        cm.queue(msg(id, kind::TIMEWAIT_EXIT, 0));
        assert_eq!(cm.channels[&9].queue.len(), 4);
        assert_eq!(cm.channels[&7].queue.len(), 1);
    }

    #[test]
    fn the_pipe_is_written_when_the_queue_stops_being_empty() {
        let (mut cm, reader, id) = cm_with_channel();
        let take = |r: &std::os::fd::OwnedFd| verbs_api::os::pipe_take(r.as_fd()).unwrap();
        assert_eq!(take(&reader), Some(0));
        cm.queue(msg(id, kind::DISCONNECTED, 0));
        cm.queue(msg(id, kind::TIMEWAIT_EXIT, 0));
        assert_eq!(take(&reader), Some(1), "one byte for two events");
        assert_eq!(cm.channels[&7].queue.len(), 2);
        // GetEvents empties the queue; the next event writes again.
        cm.channels.get_mut(&7).unwrap().queue.clear();
        cm.queue(msg(id, kind::DISCONNECTED, 0));
        assert_eq!(take(&reader), Some(1));
    }

    /// A long queue is answered in frame-sized parts, oldest first, the pipe written
    /// again after each part that leaves events behind and not after the last.
    #[test]
    fn events_are_taken_in_parts_that_fit_a_frame() {
        let (mut cm, reader, id) = cm_with_channel();
        let take = |r: &std::os::fd::OwnedFd| verbs_api::os::pipe_take(r.as_fd()).unwrap();
        let total = 2 * MAX_EVENTS_PER_REPLY + 5;
        for i in 0..total {
            cm.queue(msg(id, kind::DISCONNECTED, -(i as i32)));
        }
        let mut seen = Vec::new();
        let ch = cm.channels.get_mut(&7).unwrap();
        for expect in [MAX_EVENTS_PER_REPLY, MAX_EVENTS_PER_REPLY, 5] {
            assert_eq!(take(&reader), Some(1), "the pipe says there is more");
            let part = ch.take_events();
            assert_eq!(part.len(), expect);
            seen.extend(part.iter().map(|m| -m.status as usize));
        }
        assert_eq!(take(&reader), Some(0), "nothing left, nothing written");
        assert_eq!(seen, (0..total).collect::<Vec<_>>(), "in order, each once");
        assert!(ch.take_events().is_empty());
    }

    #[test]
    fn a_client_that_never_reads_its_channel_cannot_block_the_nic() {
        let (mut cm, reader, id) = cm_with_channel();
        verbs_api::os::set_nonblocking(reader.as_fd(), false).unwrap();
        for _ in 0..200_000 {
            cm.queue(msg(id, kind::DISCONNECTED, 0));
            cm.channels.get_mut(&7).unwrap().queue.clear();
        }
        verbs_api::os::set_nonblocking(reader.as_fd(), true).unwrap();
        let held = verbs_api::os::pipe_take(reader.as_fd()).unwrap().unwrap();
        assert!((1..200_000).contains(&held), "{held}: full, then skipped");
    }
}
