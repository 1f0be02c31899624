//! The initiating side: batched one-sided READs and WRITEs into peers' registered memory.
//! Local buffers are found among the client's registrations (its long-lived buffers) or
//! registered for the one transfer; a batch is planned into work requests, striped over the
//! peer's pooled queue pairs and run to completion or to a drained failure.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use mooring_core::Result;
use mooring_core::client::FenceRule;
use mooring_proto::transport::{ReadOp, WriteOp};
use tokio::time::Instant;

use crate::peer::{Handshake, Peer, transfer_error};
use crate::plan::{PlanLimits, Span, plan};
use crate::transfer::{PollConfig, run};
use crate::verbs::{Access, Opcode, Verbs};

/// How a client uses its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Queue pairs per peer (transfers to one peer run on this many at once).
    pub queue_pairs_per_peer: usize,
    /// Send-queue slots per queue pair.
    pub queue_depth: u32,
    /// Most bytes per work request (below the device's max message size, so large transfers
    /// split into pieces that can stripe).
    pub stripe_unit: u64,
    /// Bytes per queue pair before a transfer is striped over another.
    pub stripe_min: u64,
    /// Longest a transfer may take before it is cancelled.
    pub timeout: Duration,
    /// Posting and polling.
    pub poll: PollConfig,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            queue_pairs_per_peer: 4,
            queue_depth: 128,
            stripe_unit: 1 << 20,
            stripe_min: 1 << 20,
            timeout: Duration::from_secs(2),
            poll: PollConfig::default(),
        }
    }
}

/// Issues one-sided transfers from this process's memory.
pub struct RdmaClient<V: Verbs> {
    verbs: Arc<V>,
    config: RdmaConfig,
    // Long-lived registrations by start address: (end, lkey).
    registered: RwLock<BTreeMap<u64, (u64, u32)>>,
}

impl<V: Verbs> RdmaClient<V> {
    /// A client on `verbs` (an opened device and protection domain).
    pub fn new(verbs: Arc<V>, config: RdmaConfig) -> Self {
        RdmaClient {
            verbs,
            config,
            registered: RwLock::new(BTreeMap::new()),
        }
    }

    /// The device.
    pub fn verbs(&self) -> &Arc<V> {
        &self.verbs
    }

    /// A pool of queue pairs to the peer that `handshake` reaches.
    pub fn peer(&self, handshake: Arc<dyn Handshake>) -> Peer<V> {
        Peer::new(
            self.verbs.clone(),
            handshake,
            self.config.queue_depth.min(self.verbs.caps().max_qp_wr),
            self.config.queue_pairs_per_peer,
        )
    }

    /// Registers a buffer the caller will transfer to and from many times, so transfers
    /// using it skip registering it each time.
    ///
    /// # Safety
    /// The `len` bytes at `addr` must stay allocated until [`RdmaClient::unregister`].
    pub unsafe fn register(&self, addr: u64, len: u64) -> Result<()> {
        // SAFETY: forwarded from the caller.
        let keys = unsafe { self.verbs.register(addr, len, Access::LOCAL) }.map_err(|e| {
            transfer_error(format!(
                "cannot register {len} bytes for RDMA: {e} (is the memlock limit, ulimit -l, \
                 large enough?)"
            ))
        })?;
        let replaced = self.write_lock().insert(addr, (addr + len, keys.lkey));
        if let Some((_, old)) = replaced {
            self.verbs.deregister(old);
        }
        Ok(())
    }

    /// Ends the registration of the buffer at `addr`.
    pub fn unregister(&self, addr: u64) {
        if let Some((_, lkey)) = self.write_lock().remove(&addr) {
            self.verbs.deregister(lkey);
        }
    }

    /// The local key of a registration holding `len` bytes at `addr`.
    fn registered_key(&self, addr: u64, len: u64) -> Option<u32> {
        let map = self.registered.read().unwrap_or_else(|e| e.into_inner());
        let (_, &(end, lkey)) = map.range(..=addr).next_back()?;
        (addr.checked_add(len)? <= end).then_some(lkey)
    }

    /// Reads every op's bytes from `peer`'s memory registered under `rkey`.
    pub async fn read(&self, peer: &Peer<V>, rkey: u32, ops: &mut [ReadOp<'_>]) -> Result<()> {
        let mut temporary = TemporaryRegistrations::new(&*self.verbs);
        let pieces = ops
            .iter_mut()
            .map(|op| (op.dest.as_mut_ptr() as u64, op.dest.len() as u64, op.addr));
        // SAFETY: every `dest` is borrowed mutably until this future ends, and the transfer
        // drains before it does.
        let spans = unsafe { self.spans(&mut temporary, pieces) }?;
        let deadline = Instant::now() + self.config.timeout;
        self.transfer(peer, Opcode::Read, rkey, &spans, deadline)
            .await
    }

    /// Writes every op's bytes to `peer`'s memory registered under `rkey`, with no byte
    /// landing later than `valid_for` from now (the writer's fence).
    pub async fn write(
        &self,
        peer: &Peer<V>,
        rkey: u32,
        ops: &[WriteOp<'_>],
        valid_for: Duration,
    ) -> Result<()> {
        let mut temporary = TemporaryRegistrations::new(&*self.verbs);
        let pieces = ops
            .iter()
            .map(|op| (op.src.as_ptr() as u64, op.src.len() as u64, op.addr));
        // SAFETY: every `src` is borrowed until this future ends, and the transfer drains
        // before it does; the device only reads it.
        let spans = unsafe { self.spans(&mut temporary, pieces) }?;
        // Cancel (and drain) with a quarter of the fence to spare: no node checks a one-sided
        // write's arrival.
        let usable = FenceRule::self_checked_validity(valid_for.as_micros() as u64);
        let budget = self.config.timeout.min(Duration::from_micros(usable));
        let deadline = Instant::now() + budget;
        self.transfer(peer, Opcode::Write, rkey, &spans, deadline)
            .await
    }

    /// The spans of `pieces` (local address, length, remote address), empty ones left out,
    /// each with the local key of a registration covering it.
    ///
    /// # Safety
    /// The local bytes must stay allocated until `temporary` drops.
    unsafe fn spans(
        &self,
        temporary: &mut TemporaryRegistrations<'_, V>,
        pieces: impl Iterator<Item = (u64, u64, u64)>,
    ) -> Result<Vec<Span>> {
        let mut spans = Vec::new();
        for (local_addr, len, remote_addr) in pieces.filter(|&(_, len, _)| len > 0) {
            // SAFETY: forwarded from the caller.
            let lkey = unsafe { self.key_for(temporary, local_addr, len) }?;
            spans.push(Span {
                local_addr,
                lkey,
                remote_addr,
                len,
            });
        }
        Ok(spans)
    }

    /// # Safety
    /// The bytes must stay allocated until `temporary` drops.
    unsafe fn key_for(
        &self,
        temporary: &mut TemporaryRegistrations<'_, V>,
        addr: u64,
        len: u64,
    ) -> Result<u32> {
        if let Some(lkey) = self.registered_key(addr, len) {
            return Ok(lkey);
        }
        // SAFETY: forwarded from the caller.
        unsafe { temporary.register(addr, len) }
    }

    async fn transfer(
        &self,
        peer: &Peer<V>,
        opcode: Opcode,
        rkey: u32,
        spans: &[Span],
        deadline: Instant,
    ) -> Result<()> {
        if spans.is_empty() {
            return Ok(());
        }
        let caps = self.verbs.caps();
        let limits = PlanLimits {
            max_request: self.config.stripe_unit.min(caps.max_msg_size),
            max_sge: caps.max_sge,
            stripes: self.config.queue_pairs_per_peer,
            stripe_min: self.config.stripe_min,
        };
        let plan = plan(opcode, spans, rkey, limits);
        let mut lease = peer.take(plan.len()).await?;
        // Fewer queue pairs than planned (the rest busy): fold the extra stripes in.
        let plan = fold(plan, lease.qps.len());
        let depth = self.config.queue_depth.min(caps.max_qp_wr);
        run(
            &*self.verbs,
            &mut lease.qps,
            plan,
            depth,
            self.config.poll,
            deadline,
        )
        .await
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, (u64, u32)>> {
        self.registered.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V: Verbs> Drop for RdmaClient<V> {
    fn drop(&mut self) {
        for (_, (_, lkey)) in std::mem::take(&mut *self.write_lock()) {
            self.verbs.deregister(lkey);
        }
    }
}

/// Appends the stripes past `count` to the first `count`, keeping each one's order.
fn fold(
    mut plan: Vec<Vec<crate::verbs::WorkRequest>>,
    count: usize,
) -> Vec<Vec<crate::verbs::WorkRequest>> {
    while plan.len() > count.max(1) {
        let extra = plan.pop().expect("more than one stripe");
        let i = plan.len() % count.max(1);
        plan[i].extend(extra);
    }
    plan
}

/// Registrations made for one transfer, ended when it is (they drop after the transfer's
/// in-flight requests are drained, being declared before it).
struct TemporaryRegistrations<'a, V: Verbs> {
    verbs: &'a V,
    lkeys: Vec<u32>,
}

impl<'a, V: Verbs> TemporaryRegistrations<'a, V> {
    fn new(verbs: &'a V) -> Self {
        TemporaryRegistrations {
            verbs,
            lkeys: Vec::new(),
        }
    }

    /// # Safety
    /// The bytes must stay allocated until this drops.
    unsafe fn register(&mut self, addr: u64, len: u64) -> Result<u32> {
        // SAFETY: forwarded from the caller.
        let keys = unsafe { self.verbs.register(addr, len, Access::LOCAL) }.map_err(|e| {
            transfer_error(format!(
                "cannot register a {len}-byte buffer for RDMA: {e} (register long-lived \
                 buffers once, or raise the memlock limit, ulimit -l)"
            ))
        })?;
        self.lkeys.push(keys.lkey);
        Ok(keys.lkey)
    }
}

impl<V: Verbs> Drop for TemporaryRegistrations<'_, V> {
    fn drop(&mut self) {
        for lkey in self.lkeys.drain(..) {
            self.verbs.deregister(lkey);
        }
    }
}
