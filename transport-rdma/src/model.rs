//! A software HCA: the [`Verbs`] seam implemented with memcpy, behaving like a device where
//! the transport's correctness depends on it. Queue pairs go through RESET, INIT, RTR, RTS and
//! ERR and refuse what their state forbids; every request is checked against the local key and
//! the peer's remote key, access rights and bounds; completions come in order per queue pair;
//! successful unsignaled requests produce none; after an error every later request completes
//! as flushed without executing. Faults are injected by script (tests) or by seeded rates (the
//! simulation): remote access errors, retry exceeded, stalls (completions that come late) and
//! queue pairs dying part way through a batch.
//!
//! Devices on one [`Fabric`] reach each other's memory; all of it lives in this process (unit
//! tests, the simulation), so a transfer is a copy between two registrations. Requests execute
//! when their queue pair's completion queue is polled, so a stalled or slow peer is a poll
//! that finds nothing yet.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::verbs::{
    Access, Completion, DeviceCaps, MemoryKeys, Opcode, QpEndpoint, QpState, Verbs, VerbsError,
    WcStatus, WorkRequest,
};

/// A fault the model applies to a request it is about to execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The peer refuses the request (as for a bad rkey); the queue pair goes to ERR.
    RemoteAccess,
    /// The peer never answers; the queue pair goes to ERR.
    RetryExceeded,
    /// Nothing on this queue pair executes or completes for the next `polls` polls.
    Stall {
        /// How many polls find nothing.
        polls: u32,
    },
}

/// Per-request probabilities of each fault, for the simulation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    /// Chance a request meets [`Fault::RemoteAccess`].
    pub remote_access: f64,
    /// Chance a request meets [`Fault::RetryExceeded`] (its queue pair dies mid-batch).
    pub retry_exceeded: f64,
    /// Chance a request stalls its queue pair.
    pub stall: f64,
    /// How many polls a stall lasts.
    pub stall_polls: u32,
}

/// Counts of what the model did, for coverage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCounts {
    /// Requests executed successfully.
    pub executed: u64,
    /// Requests refused by the peer (bad key, bounds, access, injected).
    pub remote_access: u64,
    /// Requests that found no live peer (or had retry exceeded injected).
    pub retry_exceeded: u64,
    /// Requests flushed by a queue pair in ERR.
    pub flushed: u64,
    /// Stalls applied.
    pub stalls: u64,
    /// Requests refused for a bad local key or range.
    pub local_protection: u64,
}

/// The network the model devices share.
#[derive(Clone, Default)]
pub struct Fabric {
    state: Arc<Mutex<FabricState>>,
}

#[derive(Default)]
struct FabricState {
    devices: Vec<DeviceState>,
    scripted: VecDeque<Scripted>,
    rates: FaultRates,
    rng: u64,
    counts: ModelCounts,
    // Host pairs that cannot reach each other (a partition), by device name.
    blocked: BTreeSet<(String, String)>,
}

struct Scripted {
    device: Option<usize>,
    skip: u32,
    fault: Fault,
}

#[derive(Default)]
struct DeviceState {
    name: String,
    alive: bool,
    regions: BTreeMap<u32, Region>,
    rkeys: BTreeMap<u32, u32>,
    qps: BTreeMap<u32, Qp>,
    next_key: u32,
    next_qpn: u32,
}

#[derive(Clone, Copy)]
struct Region {
    addr: u64,
    len: u64,
    access: Access,
    rkey: u32,
}

struct Qp {
    state: QpState,
    depth: u32,
    psn: u32,
    remote: Option<(usize, u32)>,
    send_queue: VecDeque<WorkRequest>,
    // Posted requests not yet retired by a polled completion (theirs or a later one's): the
    // send queue slots they hold.
    outstanding: VecDeque<u64>,
    completions: VecDeque<Completion>,
    stalled_polls: u32,
}

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Fabric {
        Fabric::default()
    }

    /// Adds a device named `name` with `caps` limits (its name is replaced by `name`).
    pub fn device(&self, name: &str, mut caps: DeviceCaps) -> ModelVerbs {
        caps.name = name.to_string();
        let mut state = self.lock();
        state.devices.push(DeviceState {
            name: name.to_string(),
            alive: true,
            next_key: 0x100,
            next_qpn: 0x10,
            ..DeviceState::default()
        });
        ModelVerbs {
            fabric: self.clone(),
            device: state.devices.len() - 1,
            caps,
        }
    }

    /// Queues `fault` for the request after the next `skip` ones that any device (or only
    /// `device`'s, by its lid) executes.
    pub fn inject(&self, device: Option<u16>, skip: u32, fault: Fault) {
        self.lock().scripted.push_back(Scripted {
            device: device.map(|lid| usize::from(lid) - 1),
            skip,
            fault,
        });
    }

    /// Applies `rates` to every request from now on, drawing from a generator seeded with
    /// `seed` (so a simulation seed replays the same faults).
    pub fn set_rates(&self, rates: FaultRates, seed: u64) {
        let mut state = self.lock();
        state.rates = rates;
        state.rng = seed | 1;
    }

    /// Cuts the link from the devices named `from` to those named `to`: requests between
    /// them (either way: a one-sided request needs its answer) exceed their retries.
    pub fn block(&self, from: &str, to: &str) {
        self.lock()
            .blocked
            .insert((from.to_string(), to.to_string()));
    }

    /// Restores the link [`Fabric::block`] cut.
    pub fn unblock(&self, from: &str, to: &str) {
        self.lock()
            .blocked
            .remove(&(from.to_string(), to.to_string()));
    }

    /// What the model has done so far.
    pub fn counts(&self) -> ModelCounts {
        self.lock().counts
    }

    /// Takes the device with local id `lid` off the fabric, as a crashed host: its queue pairs
    /// go to ERR, its registrations end, and peers' requests to it exceed their retries.
    pub fn kill(&self, lid: u16) {
        let mut state = self.lock();
        if let Some(device) = state.devices.get_mut(usize::from(lid) - 1) {
            kill_device(device);
        }
    }

    fn lock(&self) -> MutexGuard<'_, FabricState> {
        // A panic elsewhere never leaves the model half-updated in a way later calls could
        // misread: every mutation completes before the guard drops.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn kill_device(device: &mut DeviceState) {
    device.alive = false;
    device.regions.clear();
    device.rkeys.clear();
    for qp in device.qps.values_mut() {
        qp.state = QpState::Error;
    }
}

/// One device on a [`Fabric`].
pub struct ModelVerbs {
    fabric: Fabric,
    device: usize,
    caps: DeviceCaps,
}

impl ModelVerbs {
    /// Limits like a common 100 Gb/s NIC's, with `max_msg_size` for tests of splitting.
    pub fn caps(max_msg_size: u64) -> DeviceCaps {
        DeviceCaps {
            name: String::new(),
            max_msg_size,
            max_sge: 4,
            max_qp_wr: 256,
        }
    }

    /// This device's local id on the fabric.
    pub fn lid(&self) -> u16 {
        u16::try_from(self.device + 1).expect("fewer than 65535 model devices")
    }

    /// The fabric it is on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }
}

impl Drop for ModelVerbs {
    fn drop(&mut self) {
        // A closed device's memory may be freed right after: nothing may reach it any more.
        let mut state = self.fabric.lock();
        if let Some(device) = state.devices.get_mut(self.device) {
            kill_device(device);
        }
    }
}

fn gid_of(device: usize) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[..2].copy_from_slice(&[0xfe, 0x80]);
    gid[8..].copy_from_slice(&(device as u64).to_be_bytes());
    gid
}

fn err<T>(message: impl Into<String>) -> Result<T, VerbsError> {
    Err(VerbsError::new(message))
}

impl Verbs for ModelVerbs {
    fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MemoryKeys, VerbsError> {
        let mut state = self.fabric.lock();
        let device = &mut state.devices[self.device];
        if !device.alive {
            return err("the device is gone");
        }
        if len == 0 || addr.checked_add(len).is_none() {
            return err(format!("cannot register {len} bytes at {addr:#x}"));
        }
        device.next_key += 1;
        let lkey = device.next_key;
        // Remote keys are not guessable from local ones on real devices either.
        let rkey = lkey.wrapping_mul(0x9E37_79B1) | 1;
        device.regions.insert(
            lkey,
            Region {
                addr,
                len,
                access,
                rkey,
            },
        );
        if access.remote_read || access.remote_write {
            device.rkeys.insert(rkey, lkey);
        }
        Ok(MemoryKeys { lkey, rkey })
    }

    fn deregister(&self, lkey: u32) {
        let mut state = self.fabric.lock();
        let device = &mut state.devices[self.device];
        if let Some(region) = device.regions.remove(&lkey) {
            device.rkeys.remove(&region.rkey);
        }
    }

    fn create_qp(&self, depth: u32) -> Result<u32, VerbsError> {
        if depth == 0 || depth > self.caps.max_qp_wr {
            return err(format!(
                "queue depth {depth} outside 1..={}",
                self.caps.max_qp_wr
            ));
        }
        let mut state = self.fabric.lock();
        let device = &mut state.devices[self.device];
        if !device.alive {
            return err("the device is gone");
        }
        device.next_qpn += 1;
        let qpn = device.next_qpn;
        device.qps.insert(
            qpn,
            Qp {
                state: QpState::Reset,
                depth,
                psn: qpn.wrapping_mul(2_654_435_761) & 0xff_ffff,
                remote: None,
                send_queue: VecDeque::new(),
                outstanding: VecDeque::new(),
                completions: VecDeque::new(),
                stalled_polls: 0,
            },
        );
        Ok(qpn)
    }

    fn endpoint(&self, qpn: u32) -> Result<QpEndpoint, VerbsError> {
        let state = self.fabric.lock();
        let qp = state.devices[self.device]
            .qps
            .get(&qpn)
            .ok_or_else(|| VerbsError::new(format!("no queue pair {qpn}")))?;
        Ok(QpEndpoint {
            qpn,
            lid: self.lid(),
            gid: gid_of(self.device),
            psn: qp.psn,
        })
    }

    fn modify_qp(
        &self,
        qpn: u32,
        to: QpState,
        remote: Option<&QpEndpoint>,
    ) -> Result<(), VerbsError> {
        let mut state = self.fabric.lock();
        let device_count = state.devices.len();
        let device = &mut state.devices[self.device];
        let qp = device
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| VerbsError::new(format!("no queue pair {qpn}")))?;
        let from = qp.state;
        let allowed = matches!(
            (from, to),
            (_, QpState::Reset)
                | (_, QpState::Error)
                | (QpState::Reset, QpState::Init)
                | (QpState::Init, QpState::ReadyToReceive)
                | (QpState::ReadyToReceive, QpState::ReadyToSend)
        );
        if !allowed {
            return err(format!(
                "queue pair {qpn} cannot go from {from:?} to {to:?}"
            ));
        }
        match to {
            QpState::ReadyToReceive => {
                let remote = remote
                    .ok_or_else(|| VerbsError::new("moving to RTR needs the remote endpoint"))?;
                let peer = usize::from(remote.lid).wrapping_sub(1);
                if peer >= device_count || gid_of(peer) != remote.gid {
                    return err(format!("no port with lid {} on the fabric", remote.lid));
                }
                qp.remote = Some((peer, remote.qpn));
            }
            QpState::Reset => {
                qp.send_queue.clear();
                qp.outstanding.clear();
                qp.completions.clear();
                qp.remote = None;
                qp.stalled_polls = 0;
            }
            _ => {}
        }
        qp.state = to;
        Ok(())
    }

    fn qp_state(&self, qpn: u32) -> Result<QpState, VerbsError> {
        let state = self.fabric.lock();
        state.devices[self.device]
            .qps
            .get(&qpn)
            .map(|qp| qp.state)
            .ok_or_else(|| VerbsError::new(format!("no queue pair {qpn}")))
    }

    unsafe fn post_send(&self, qpn: u32, requests: &[WorkRequest]) -> Result<(), VerbsError> {
        let caps = &self.caps;
        for wr in requests {
            if wr.sges.len() > caps.max_sge as usize {
                return err(format!("{} scatter entries exceed max_sge", wr.sges.len()));
            }
            if wr.len() > caps.max_msg_size {
                return err(format!("{} bytes exceed max_msg_size", wr.len()));
            }
        }
        let mut state = self.fabric.lock();
        let qp = state.devices[self.device]
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| VerbsError::new(format!("no queue pair {qpn}")))?;
        if !matches!(qp.state, QpState::ReadyToSend | QpState::Error) {
            return err(format!(
                "queue pair {qpn} is in {:?}: posts need RTS",
                qp.state
            ));
        }
        if qp.outstanding.len() + requests.len() > qp.depth as usize {
            return err(format!(
                "send queue full ({} of {} slots held)",
                qp.outstanding.len(),
                qp.depth
            ));
        }
        for wr in requests {
            qp.outstanding.push_back(wr.wr_id);
            qp.send_queue.push_back(wr.clone());
        }
        Ok(())
    }

    fn poll_cq(&self, qpn: u32, max: usize, out: &mut Vec<Completion>) -> usize {
        let mut state = self.fabric.lock();
        state.progress(self.device, qpn);
        let Some(qp) = state.devices[self.device].qps.get_mut(&qpn) else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(c) = qp.completions.pop_front() else {
                break;
            };
            // A completion retires its request and every unsignaled one before it.
            while let Some(id) = qp.outstanding.pop_front() {
                if id == c.wr_id {
                    break;
                }
            }
            out.push(c);
            n += 1;
        }
        n
    }

    fn destroy_qp(&self, qpn: u32) {
        self.fabric.lock().devices[self.device].qps.remove(&qpn);
    }
}

impl FabricState {
    /// Executes what `qpn`'s send queue holds, in order, unless it is stalled.
    fn progress(&mut self, device: usize, qpn: u32) {
        let Some(qp) = self.devices[device].qps.get_mut(&qpn) else {
            return;
        };
        if qp.stalled_polls > 0 && qp.state != QpState::Error {
            qp.stalled_polls -= 1;
            return;
        }
        while let Some(wr) = self.devices[device]
            .qps
            .get_mut(&qpn)
            .and_then(|qp| qp.send_queue.pop_front())
        {
            let qp_state = self.devices[device].qps[&qpn].state;
            let status = if qp_state == QpState::Error {
                self.counts.flushed += 1;
                WcStatus::Flushed
            } else {
                match self.next_fault(device) {
                    Some(Fault::Stall { polls }) => {
                        self.counts.stalls += 1;
                        let qp = self.devices[device].qps.get_mut(&qpn).expect("polled qp");
                        qp.send_queue.push_front(wr);
                        qp.stalled_polls = polls;
                        return;
                    }
                    Some(Fault::RemoteAccess) => {
                        self.counts.remote_access += 1;
                        WcStatus::RemoteAccess
                    }
                    Some(Fault::RetryExceeded) => {
                        self.counts.retry_exceeded += 1;
                        WcStatus::RetryExceeded
                    }
                    None => self.execute(device, qpn, &wr),
                }
            };
            let qp = self.devices[device].qps.get_mut(&qpn).expect("polled qp");
            if status != WcStatus::Success {
                qp.state = QpState::Error;
            }
            if status != WcStatus::Success || wr.signaled {
                qp.completions.push_back(Completion {
                    wr_id: wr.wr_id,
                    status,
                });
            }
        }
    }

    fn next_fault(&mut self, device: usize) -> Option<Fault> {
        if let Some(i) = self
            .scripted
            .iter()
            .position(|s| s.device.is_none_or(|d| d == device))
        {
            let s = &mut self.scripted[i];
            if s.skip == 0 {
                return self.scripted.remove(i).map(|s| s.fault);
            }
            s.skip -= 1;
        }
        let rates = self.rates;
        if rates == FaultRates::default() {
            return None;
        }
        let draw = self.draw();
        let mut edge = rates.remote_access;
        if draw < edge {
            return Some(Fault::RemoteAccess);
        }
        edge += rates.retry_exceeded;
        if draw < edge {
            return Some(Fault::RetryExceeded);
        }
        edge += rates.stall;
        if draw < edge {
            return Some(Fault::Stall {
                polls: rates.stall_polls.max(1),
            });
        }
        None
    }

    fn draw(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Checks and performs one request, as the two HCAs would between them.
    fn execute(&mut self, device: usize, qpn: u32, wr: &WorkRequest) -> WcStatus {
        let Some((peer, peer_qpn)) = self.devices[device].qps[&qpn].remote else {
            self.counts.retry_exceeded += 1;
            return WcStatus::RetryExceeded;
        };
        let responder_ready = self.devices.get(peer).is_some_and(|d| {
            d.alive
                && d.qps.get(&peer_qpn).is_some_and(|q| {
                    matches!(q.state, QpState::ReadyToReceive | QpState::ReadyToSend)
                        && q.remote == Some((device, qpn))
                })
        });
        let cut = responder_ready && {
            let (here, there) = (&self.devices[device].name, &self.devices[peer].name);
            self.blocked.contains(&(here.clone(), there.clone()))
                || self.blocked.contains(&(there.clone(), here.clone()))
        };
        if !responder_ready || cut {
            self.counts.retry_exceeded += 1;
            return WcStatus::RetryExceeded;
        }
        // Local memory: every scatter entry inside the registration it names.
        let local = &self.devices[device].regions;
        let locals_ok = wr.sges.iter().all(|s| {
            local
                .get(&s.lkey)
                .is_some_and(|r| contains(r, s.addr, u64::from(s.len)))
        });
        if !locals_ok {
            self.counts.local_protection += 1;
            return WcStatus::LocalProtection;
        }
        // Remote memory: the rkey names a registration granting this access and holding the
        // whole range.
        let remote = &self.devices[peer];
        let remote_ok = remote
            .rkeys
            .get(&wr.rkey)
            .and_then(|lkey| remote.regions.get(lkey))
            .is_some_and(|r| {
                let granted = match wr.opcode {
                    Opcode::Read => r.access.remote_read,
                    Opcode::Write => r.access.remote_write,
                };
                granted && contains(r, wr.remote_addr, wr.len())
            });
        if !remote_ok {
            // The responder NAKs and its queue pair fails too.
            if let Some(q) = self.devices[peer].qps.get_mut(&peer_qpn) {
                q.state = QpState::Error;
            }
            self.counts.remote_access += 1;
            return WcStatus::RemoteAccess;
        }
        let mut remote_addr = wr.remote_addr;
        for s in &wr.sges {
            let (src, dst) = match wr.opcode {
                Opcode::Read => (remote_addr, s.addr),
                Opcode::Write => (s.addr, remote_addr),
            };
            // SAFETY: both ranges lie inside live registrations (checked above under the
            // fabric lock, which deregistration and device teardown also take), and
            // registering promised the bytes stay allocated while registered.
            unsafe {
                std::ptr::copy(src as *const u8, dst as *mut u8, s.len as usize);
            }
            remote_addr += u64::from(s.len);
        }
        self.counts.executed += 1;
        WcStatus::Success
    }
}

fn contains(region: &Region, addr: u64, len: u64) -> bool {
    addr >= region.addr
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= region.addr + region.len)
}
