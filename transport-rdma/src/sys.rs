//! The [`Verbs`] seam on a real device, through rdma-sys (libibverbs). Port 1 and GID index 0
//! (RoCE: the address is global; InfiniBand: the LID routes). Every queue pair gets its own
//! completion queue, as the seam promises.
//!
//! This machine has no RDMA device, so this file is compiled and clippy-checked here but runs
//! only where a device exists (see the README's device test).

use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr;
use std::sync::Mutex;

use rdma_sys::*;

use crate::verbs::{
    Access, Completion, DeviceCaps, MemoryKeys, Opcode, QpEndpoint, QpState, Verbs, VerbsError,
    WcStatus, WorkRequest,
};

const PORT: u8 = 1;
const GID_INDEX: u8 = 0;
/// `IBV_LINK_LAYER_ETHERNET` (a `#define`, not in the generated bindings).
const LINK_LAYER_ETHERNET: u8 = 2;

struct QueuePair {
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
}

/// An opened device with one protection domain.
pub struct SysVerbs {
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    caps: DeviceCaps,
    lid: u16,
    gid: [u8; 16],
    global: bool,
    mtu: ibv_mtu::Type,
    regions: Mutex<HashMap<u32, usize>>,
    qps: Mutex<HashMap<u32, QueuePair>>,
}

// SAFETY: libibverbs objects may be used from any thread; the maps are behind locks, and a
// queue pair is posted to and polled by one transfer at a time (the pool's lease).
unsafe impl Send for SysVerbs {}
// SAFETY: as above.
unsafe impl Sync for SysVerbs {}

fn os_error(what: &str) -> VerbsError {
    VerbsError::new(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl SysVerbs {
    /// Opens the device called `name`.
    pub fn open(name: &str) -> Result<SysVerbs, VerbsError> {
        let mut count = 0;
        // SAFETY: plain libibverbs calls; the list is freed on every path below.
        unsafe {
            let list = ibv_get_device_list(&mut count);
            if list.is_null() {
                return Err(os_error("ibv_get_device_list"));
            }
            let mut context = ptr::null_mut();
            for i in 0..usize::try_from(count).unwrap_or(0) {
                let device = *list.add(i);
                let device_name = CStr::from_ptr(ibv_get_device_name(device));
                if device_name.to_bytes() == name.as_bytes() {
                    context = ibv_open_device(device);
                    break;
                }
            }
            ibv_free_device_list(list);
            if context.is_null() {
                return Err(VerbsError::new(format!("cannot open RDMA device {name}")));
            }
            Self::on(context, name).inspect_err(|_| {
                ibv_close_device(context);
            })
        }
    }

    /// # Safety
    /// `context` is an open device context.
    unsafe fn on(context: *mut ibv_context, name: &str) -> Result<SysVerbs, VerbsError> {
        // SAFETY: `context` is open; the attribute structs are plain data the calls fill.
        unsafe {
            let mut device: ibv_device_attr = std::mem::zeroed();
            if ibv_query_device(context, &mut device) != 0 {
                return Err(os_error("ibv_query_device"));
            }
            let mut port: ibv_port_attr = std::mem::zeroed();
            if ___ibv_query_port(context, PORT, &mut port) != 0 {
                return Err(os_error("ibv_query_port"));
            }
            let mut gid: ibv_gid = std::mem::zeroed();
            if ibv_query_gid(context, PORT, i32::from(GID_INDEX), &mut gid) != 0 {
                return Err(os_error("ibv_query_gid"));
            }
            let pd = ibv_alloc_pd(context);
            if pd.is_null() {
                return Err(os_error("ibv_alloc_pd"));
            }
            Ok(SysVerbs {
                context,
                pd,
                caps: DeviceCaps {
                    name: name.to_string(),
                    max_msg_size: u64::from(port.max_msg_sz),
                    max_sge: u32::try_from(device.max_sge).unwrap_or(1).min(16),
                    max_qp_wr: u32::try_from(device.max_qp_wr).unwrap_or(1),
                },
                lid: port.lid,
                gid: gid.raw,
                global: port.link_layer == LINK_LAYER_ETHERNET,
                mtu: port.active_mtu,
                regions: Mutex::new(HashMap::new()),
                qps: Mutex::new(HashMap::new()),
            })
        }
    }

    fn with_qp<T>(
        &self,
        qpn: u32,
        f: impl FnOnce(&QueuePair) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        let qp = qps
            .get(&qpn)
            .ok_or_else(|| VerbsError::new(format!("no queue pair {qpn}")))?;
        f(qp)
    }
}

impl Drop for SysVerbs {
    fn drop(&mut self) {
        // SAFETY: every handle below was created on this context and is destroyed once.
        unsafe {
            for (_, qp) in self
                .qps
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .drain()
            {
                ibv_destroy_qp(qp.qp);
                ibv_destroy_cq(qp.cq);
            }
            for (_, mr) in self
                .regions
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .drain()
            {
                ibv_dereg_mr(mr as *mut ibv_mr);
            }
            ibv_dealloc_pd(self.pd);
            ibv_close_device(self.context);
        }
    }
}

impl Verbs for SysVerbs {
    fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MemoryKeys, VerbsError> {
        let mut flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if access.remote_read {
            flags |= ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        }
        if access.remote_write {
            flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        let len = usize::try_from(len).map_err(|_| VerbsError::new("length too large"))?;
        // SAFETY: the caller keeps the bytes allocated until deregistration.
        let mr = unsafe { ibv_reg_mr(self.pd, addr as *mut _, len, flags.0 as i32) };
        if mr.is_null() {
            return Err(os_error("ibv_reg_mr"));
        }
        // SAFETY: `mr` is a live registration.
        let keys = unsafe {
            MemoryKeys {
                lkey: (*mr).lkey,
                rkey: (*mr).rkey,
            }
        };
        self.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.lkey, mr as usize);
        Ok(keys)
    }

    fn deregister(&self, lkey: u32) {
        let mr = self
            .regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lkey);
        if let Some(mr) = mr {
            // SAFETY: a registration made by `register`, removed from the map once.
            unsafe { ibv_dereg_mr(mr as *mut ibv_mr) };
        }
    }

    fn create_qp(&self, depth: u32) -> Result<u32, VerbsError> {
        // SAFETY: libibverbs calls on this open context and protection domain; the cq is
        // destroyed if the queue pair cannot be made.
        unsafe {
            let cq = ibv_create_cq(
                self.context,
                i32::try_from(depth).unwrap_or(i32::MAX),
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            );
            if cq.is_null() {
                return Err(os_error("ibv_create_cq"));
            }
            let mut init: ibv_qp_init_attr = std::mem::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.sq_sig_all = 0;
            init.cap.max_send_wr = depth;
            init.cap.max_recv_wr = 1;
            init.cap.max_send_sge = self.caps.max_sge;
            init.cap.max_recv_sge = 1;
            let qp = ibv_create_qp(self.pd, &mut init);
            if qp.is_null() {
                let e = os_error("ibv_create_qp");
                ibv_destroy_cq(cq);
                return Err(e);
            }
            let qpn = (*qp).qp_num;
            self.qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qpn, QueuePair { qp, cq });
            Ok(qpn)
        }
    }

    fn endpoint(&self, qpn: u32) -> Result<QpEndpoint, VerbsError> {
        self.with_qp(qpn, |_| {
            Ok(QpEndpoint {
                qpn,
                lid: self.lid,
                gid: self.gid,
                // Queue pair numbers are not reused while live: a PSN derived from one is as
                // good as a random one for telling stale packets apart.
                psn: qpn.wrapping_mul(2_654_435_761) & 0xff_ffff,
            })
        })
    }

    fn modify_qp(
        &self,
        qpn: u32,
        state: QpState,
        remote: Option<&QpEndpoint>,
    ) -> Result<(), VerbsError> {
        let local_psn = self.endpoint(qpn)?.psn;
        self.with_qp(qpn, |qp| {
            // SAFETY: `attr` is plain data; the queue pair is live while the map holds it.
            unsafe {
                let mut attr: ibv_qp_attr = std::mem::zeroed();
                let mut mask = ibv_qp_attr_mask::IBV_QP_STATE;
                match state {
                    QpState::Reset => attr.qp_state = ibv_qp_state::IBV_QPS_RESET,
                    QpState::Error => attr.qp_state = ibv_qp_state::IBV_QPS_ERR,
                    QpState::Init => {
                        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
                        attr.pkey_index = 0;
                        attr.port_num = PORT;
                        attr.qp_access_flags = (ibv_access_flags::IBV_ACCESS_REMOTE_READ
                            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                            .0;
                        mask = mask
                            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                            | ibv_qp_attr_mask::IBV_QP_PORT
                            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
                    }
                    QpState::ReadyToReceive => {
                        let remote = remote.ok_or_else(|| {
                            VerbsError::new("moving to RTR needs the remote endpoint")
                        })?;
                        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
                        attr.path_mtu = self.mtu;
                        attr.dest_qp_num = remote.qpn;
                        attr.rq_psn = remote.psn;
                        attr.max_dest_rd_atomic = 16;
                        attr.min_rnr_timer = 12;
                        attr.ah_attr.dlid = remote.lid;
                        attr.ah_attr.port_num = PORT;
                        if self.global {
                            attr.ah_attr.is_global = 1;
                            attr.ah_attr.grh.dgid.raw = remote.gid;
                            attr.ah_attr.grh.sgid_index = GID_INDEX;
                            attr.ah_attr.grh.hop_limit = 64;
                        }
                        mask = mask
                            | ibv_qp_attr_mask::IBV_QP_AV
                            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
                    }
                    QpState::ReadyToSend => {
                        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
                        attr.sq_psn = local_psn;
                        // About 0.5 s per try (4.096 us * 2^17), 7 tries: a dead peer is
                        // reported in a few seconds, under the transfer's own deadline.
                        attr.timeout = 17;
                        attr.retry_cnt = 7;
                        attr.rnr_retry = 7;
                        attr.max_rd_atomic = 16;
                        mask = mask
                            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
                    }
                }
                if ibv_modify_qp(qp.qp, &mut attr, mask.0 as i32) != 0 {
                    return Err(os_error(&format!("ibv_modify_qp to {state:?}")));
                }
                Ok(())
            }
        })
    }

    fn qp_state(&self, qpn: u32) -> Result<QpState, VerbsError> {
        self.with_qp(qpn, |qp| {
            // SAFETY: plain data filled by the call on a live queue pair.
            let state = unsafe {
                let mut attr: ibv_qp_attr = std::mem::zeroed();
                let mut init: ibv_qp_init_attr = std::mem::zeroed();
                if ibv_query_qp(
                    qp.qp,
                    &mut attr,
                    ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                    &mut init,
                ) != 0
                {
                    return Err(os_error("ibv_query_qp"));
                }
                attr.qp_state
            };
            Ok(match state {
                ibv_qp_state::IBV_QPS_RESET => QpState::Reset,
                ibv_qp_state::IBV_QPS_INIT => QpState::Init,
                ibv_qp_state::IBV_QPS_RTR => QpState::ReadyToReceive,
                ibv_qp_state::IBV_QPS_RTS => QpState::ReadyToSend,
                _ => QpState::Error,
            })
        })
    }

    unsafe fn post_send(&self, qpn: u32, requests: &[WorkRequest]) -> Result<(), VerbsError> {
        if requests.is_empty() {
            return Ok(());
        }
        // The scatter lists and the chain live here until the post returns; the device copies
        // the descriptors, and the caller keeps the memory they name valid.
        let mut sges: Vec<Vec<ibv_sge>> = requests
            .iter()
            .map(|wr| {
                wr.sges
                    .iter()
                    .map(|s| ibv_sge {
                        addr: s.addr,
                        length: s.len,
                        lkey: s.lkey,
                    })
                    .collect()
            })
            .collect();
        // SAFETY: zeroed `ibv_send_wr` is a valid empty request; every pointer set below
        // points into `sges` or `chain`, which outlive the call.
        let mut chain: Vec<ibv_send_wr> = requests
            .iter()
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (i, wr) in requests.iter().enumerate() {
            let native = &mut chain[i];
            native.wr_id = wr.wr_id;
            native.sg_list = sges[i].as_mut_ptr();
            native.num_sge = sges[i].len() as i32;
            native.opcode = match wr.opcode {
                Opcode::Read => ibv_wr_opcode::IBV_WR_RDMA_READ,
                Opcode::Write => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            };
            native.send_flags = if wr.signaled {
                ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            native.wr.rdma = rdma_t {
                remote_addr: wr.remote_addr,
                rkey: wr.rkey,
            };
        }
        for i in 0..chain.len() - 1 {
            let next: *mut ibv_send_wr = &mut chain[i + 1];
            chain[i].next = next;
        }
        self.with_qp(qpn, |qp| {
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: the chain is well formed (above); the caller keeps the memory valid.
            let rc = unsafe { ibv_post_send(qp.qp, chain.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                return Err(VerbsError::new(format!(
                    "ibv_post_send: {}",
                    std::io::Error::from_raw_os_error(rc)
                )));
            }
            Ok(())
        })
    }

    fn poll_cq(&self, qpn: u32, max: usize, out: &mut Vec<Completion>) -> usize {
        let polled = self.with_qp(qpn, |qp| {
            // SAFETY: `wcs` has room for `max` entries; the cq is live.
            let mut wcs: Vec<ibv_wc> = (0..max).map(|_| unsafe { std::mem::zeroed() }).collect();
            let n = unsafe {
                ibv_poll_cq(
                    qp.cq,
                    i32::try_from(max).unwrap_or(i32::MAX),
                    wcs.as_mut_ptr(),
                )
            };
            let n = usize::try_from(n).unwrap_or(0);
            for wc in &wcs[..n] {
                out.push(Completion {
                    wr_id: wc.wr_id,
                    status: match wc.status {
                        ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
                        ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
                        ibv_wc_status::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
                        ibv_wc_status::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
                        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
                        other => WcStatus::Other(other),
                    },
                });
            }
            Ok(n)
        });
        polled.unwrap_or(0)
    }

    fn destroy_qp(&self, qpn: u32) {
        let removed = self
            .qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
        if let Some(qp) = removed {
            // SAFETY: created by `create_qp`, removed from the map once.
            unsafe {
                ibv_destroy_qp(qp.qp);
                ibv_destroy_cq(qp.cq);
            }
        }
    }
}
