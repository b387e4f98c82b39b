//! The control requests for memory windows (`AllocMw`, `DeallocMw`, `BindMw`,
//! `InvalidateMw`): ownership checks against the NIC's objects, then [`super::mw`].

use softnic_transport::memory::Accessor;
use softnic_transport::qp::{QpState, QpType};
use verbs_api::abi::control::{ErrorCode, Handle, Reply};

use super::mw::{Bind, MwError, Under};
use super::state::{err, ok, Answer, Nic};

fn refused(e: MwError) -> Answer {
    let code = match e {
        MwError::NotFound(_) => ErrorCode::NotFound,
        MwError::Invalid(_) => ErrorCode::InvalidArgument,
        MwError::NoResources => ErrorCode::NoResources,
    };
    err(code, e.to_string())
}

impl Nic {
    /// `AllocMw`.
    pub(super) fn alloc_mw(&mut self, client: u32, pd: Handle, mw_type: u8) -> Answer {
        if let Err(a) = self.pd_of(client, pd) {
            return *a;
        }
        let mrs = &mut self.mrs;
        let taken: Vec<u32> = mrs.keys().map(|k| k >> 8).collect();
        match mrs
            .windows
            .alloc(client, pd, mw_type, |i| !taken.contains(&i))
        {
            Ok((mw, rkey)) => ok(Reply::Mw { mw, rkey }),
            Err(e) => refused(e),
        }
    }

    /// `DeallocMw`.
    pub(super) fn dealloc_mw(&mut self, client: u32, mw: Handle) -> Answer {
        match self.mrs.windows.dealloc(client, mw) {
            Ok(()) => ok(Reply::Done),
            Err(e) => refused(e),
        }
    }

    /// `client`'s RC, UC or XRC send QP `qpn` in RTS (where binds and invalidations
    /// may be posted; IBTA 10.6.7.2.1), as its PD and number. Not a UD QP, nor an XRC
    /// receive QP: it has no send queue to post them to, and no PD of its own (each
    /// request uses its XRC SRQ's).
    fn poster(&self, client: u32, qpn: u32) -> Result<Accessor, Box<Answer>> {
        let e = self
            .qps
            .get(&qpn)
            .filter(|e| e.client == client)
            .ok_or_else(|| Box::new(err(ErrorCode::NotFound, format!("no QP {qpn:#x}"))))?;
        if matches!(e.qp.qp_type(), QpType::Ud | QpType::XrcRecv) {
            return Err(Box::new(err(
                ErrorCode::InvalidArgument,
                "memory windows are bound and invalidated on RC, UC and XRC send QPs only",
            )));
        }
        if e.qp.state() != QpState::Rts {
            return Err(Box::new(err(
                ErrorCode::InvalidState,
                format!("QP {qpn:#x} is not in RTS"),
            )));
        }
        Ok(e.qp.accessor())
    }

    /// `BindMw`.
    pub(super) fn bind_mw(&mut self, client: u32, qpn: u32, mr: Handle, b: &Bind) -> Answer {
        let qp = match self.poster(client, qpn) {
            Ok(qp) => qp,
            Err(a) => return *a,
        };
        let under = self.mrs.get(client, mr).map(|r| Under {
            handle: mr,
            pd: r.pd,
            iova: r.iova,
            len: r.len,
            access: r.access,
        });
        match self.mrs.windows.bind(client, qp, b, under) {
            Ok(()) => ok(Reply::Done),
            Err(e) => refused(e),
        }
    }

    /// `InvalidateMw`.
    pub(super) fn invalidate_mw(&mut self, client: u32, qpn: u32, rkey: u32) -> Answer {
        let qp = match self.poster(client, qpn) {
            Ok(qp) => qp,
            Err(a) => return *a,
        };
        match self.mrs.windows.invalidate(Some(client), qp, rkey) {
            Ok(()) => ok(Reply::Done),
            Err(e) => refused(e),
        }
    }
}
