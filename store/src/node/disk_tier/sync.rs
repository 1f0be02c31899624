//! The disk sync: the node's one RPC with the master about its disk. Each round reports what
//! happened since the last (copies written, failed, deleted, evicted, recovered after a
//! mount), carries out the master's tombstones, and copies the master's offload orders out of
//! the segment, groups them, makes room (disk eviction) and writes them.

use std::sync::Arc;
use std::time::Duration;

use mooring_core::{
    ClientId, DiskReport, DiskSyncAck, Error, ErrorCode, OffloadOrder, Result, SegmentId, WriteId,
};
use mooring_disk::RecordBuf;
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::DiskSync;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{TierInner, io_error};
use crate::coverage::{self, Path};
use crate::node::Node;

/// Offloaded values copied out of the segment, each straight into its record's place in an
/// aligned buffer (the one copy between segment and disk), waiting to be written as one group.
#[derive(Default)]
struct Group {
    copies: Vec<(OffloadOrder, RecordBuf)>,
    bytes: u64,
}

/// Syncs with the master until aborted.
pub(super) async fn sync_loop(
    tier: Arc<TierInner>,
    node: Node,
    client: ClientId,
    control: Arc<dyn ControlPlane>,
) {
    let mut pending = DiskReport::default();
    let mut group = Group::default();
    let mut synced_mount: Option<SegmentId> = None;
    loop {
        let Some(segment) = node.segment() else {
            tokio::time::sleep(tier.config.sync_interval).await;
            continue;
        };
        if synced_mount != Some(segment) {
            // A new mount: the master knows none of our copies, and orders taken under the
            // old one are void.
            if !group.copies.is_empty() {
                warn!(
                    count = group.copies.len(),
                    "dropping offload copies taken before a remount"
                );
                group = Group::default();
            }
            pending.recovered = tier.copies().report();
        }
        tier.retry_doomed().await;
        pending.evicted.extend(tier.copies().take_damaged());
        pending.want = tier.config.batch;
        let sent = Instant::now();
        let ack = match call_sync(&control, client, segment, pending.clone()).await {
            Ok(ack) => ack,
            Err(e) => {
                warn!("disk sync failed, retrying: {e}");
                tokio::time::sleep(tier.config.sync_interval).await;
                continue;
            }
        };
        synced_mount = Some(segment);
        pending = DiskReport::default();
        let busy = ack.offload.len() as u32 >= tier.config.batch.max(1);
        carry_out_tombstones(&tier, ack.delete, &mut pending).await;
        let lease = Duration::from_millis(ack.lease_ttl.as_millis());
        let align = tier.store.record_alignment();
        let copies = copy_orders(&node, ack.offload, align, sent, lease, &mut pending);
        let target = Sink {
            tier: &tier,
            client,
            control: &control,
            segment,
            memory: node.memory().len() as u64,
        };
        for (order, bytes) in copies {
            if group.copies.len() >= tier.config.group_keys.max(1)
                || group.bytes + order.size > target.group_limit()
            {
                target
                    .write_group(std::mem::take(&mut group), &mut pending)
                    .await;
            }
            // A group holds distinct keys: a newer order of a key supersedes the older one.
            if let Some(pos) = group.copies.iter().position(|(o, _)| o.key == order.key) {
                let (older, _) = group.copies.swap_remove(pos);
                group.bytes -= older.size;
                pending.failed.push((older.key, older.write));
            }
            group.bytes += order.size;
            group.copies.push((order, bytes));
        }
        // Leftovers wait for the next sync while orders keep coming (grouping backends).
        if (!busy || !tier.store.groups_writes()) && !group.copies.is_empty() {
            target
                .write_group(std::mem::take(&mut group), &mut pending)
                .await;
        }
        if !busy {
            tokio::time::sleep(tier.config.sync_interval).await;
        }
    }
}

async fn call_sync(
    control: &Arc<dyn ControlPlane>,
    client: ClientId,
    segment: SegmentId,
    report: DiskReport,
) -> Result<DiskSyncAck> {
    control
        .call(DiskSync {
            client,
            segment,
            report,
        })
        .await
}

/// Carries out tombstones: a key is deleted only if it holds that write.
async fn carry_out_tombstones(
    tier: &Arc<TierInner>,
    tombstones: Vec<(String, WriteId)>,
    pending: &mut DiskReport,
) {
    let held = tier.copies().take_writes(&tombstones);
    let writes: Vec<(String, u64)> = held.iter().map(|(k, c)| (k.clone(), c.version)).collect();
    match tier.delete(&writes).await {
        Ok(()) => {
            tier.copies().deletion_finished(&writes, true);
            pending.deleted.extend(tombstones);
        }
        Err(e) => {
            // Back into the index, so the master's next resend finds them.
            warn!("tombstones not carried out, will retry: {e}");
            tier.copies().restore(held);
        }
    }
}

/// Copies every order's bytes out of the segment while their lease holds, each straight into
/// its record (padded to `align`); orders that cannot be copied in time are reported failed.
fn copy_orders(
    node: &Node,
    orders: Vec<OffloadOrder>,
    align: usize,
    sent: Instant,
    lease: Duration,
    pending: &mut DiskReport,
) -> Vec<(OffloadOrder, RecordBuf)> {
    let copies: Vec<(OffloadOrder, Option<RecordBuf>)> = orders
        .into_iter()
        .map(|order| {
            // The order names bytes of this node's segment: anything else (a confused or
            // damaged reply) is refused before a buffer of its size is allocated.
            if node.memory().range(order.addr, order.size).is_none() {
                warn!(key = %order.key, addr = order.addr, size = order.size, "offload order names bytes outside this node's segment; refused");
                return (order, None);
            }
            let record = RecordBuf::with_value(
                &order.key,
                order.write.0,
                order.size as usize,
                align,
                |value| node.memory().copy_out(order.addr, value),
            );
            let record = record.unwrap_or_else(|e| {
                warn!(key = %order.key, "offload order cannot be stored: {e}");
                None
            });
            // A damaged memory copy must not become a disk copy (it would outlive the memory
            // one); the record's checksum comes from building it, at no extra pass.
            let record = record.filter(|r| {
                let intact = r.checksum() == order.checksum;
                if !intact {
                    warn!(key = %order.key, "the value in memory fails its checksum; not offloading it");
                }
                intact
            });
            (order, record)
        })
        .collect();
    let in_time = sent.elapsed() < lease;
    copies
        .into_iter()
        .filter_map(|(order, record)| match record {
            Some(record) if in_time => Some((order, record)),
            // Refused above (and said why), or copied too late.
            refused_or_late => {
                if refused_or_late.is_some() {
                    warn!(key = %order.key, "offload order not copied within its lease");
                }
                pending.failed.push((order.key, order.write));
                None
            }
        })
        .collect()
}

/// Where groups of copies go: the backend, after disk eviction made room.
struct Sink<'a> {
    tier: &'a Arc<TierInner>,
    client: ClientId,
    control: &'a Arc<dyn ControlPlane>,
    segment: SegmentId,
    /// Bytes of the node's segment.
    memory: u64,
}

impl Sink<'_> {
    /// Most bytes in one group: a group never needs more room than the disk has, and never
    /// keeps more than a quarter of the node's memory waiting for it (objects being offloaded
    /// cannot be evicted).
    fn group_limit(&self) -> u64 {
        let memory = (self.memory / 4).max(1);
        match self.tier.config.capacity {
            0 => self.tier.config.group_bytes.min(memory),
            capacity => self.tier.config.group_bytes.min(capacity).min(memory),
        }
    }

    /// Makes room for `group` (disk eviction), writes it, and reports the outcome.
    async fn write_group(&self, group: Group, pending: &mut DiskReport) {
        let capacity = self.tier.config.capacity;
        let (items, too_large): (Vec<_>, Vec<_>) = group
            .copies
            .into_iter()
            .partition(|(order, _)| capacity == 0 || order.size <= capacity);
        for (order, _) in too_large {
            warn!(key = %order.key, size = order.size, capacity, "a value larger than the disk tier is not offloaded");
            pending.failed.push((order.key, order.write));
        }
        let (orders, records): (Vec<OffloadOrder>, Vec<RecordBuf>) = items.into_iter().unzip();
        let failed = |pending: &mut DiskReport, e: &Error| {
            warn!(count = orders.len(), "offload failed: {e}");
            pending
                .failed
                .extend(orders.iter().map(|o| (o.key.clone(), o.write)));
        };
        let need = orders.iter().map(|order| order.size).sum();
        if let Err(e) = self.make_room(need, pending).await {
            return failed(pending, &e);
        }
        match self.tier.store.put(records).await {
            Ok(held) => {
                let mut copies = self.tier.copies();
                for copy in held {
                    pending
                        .offloaded
                        .push((copy.key.clone(), WriteId(copy.version)));
                    copies.insert(copy.key, copy.version, copy.len, copy.checksum, copy.unit);
                }
            }
            Err(e) => failed(
                pending,
                &io_error(ErrorCode::FILE_WRITE_FAIL, "disk write failed", e),
            ),
        }
    }

    /// Disk eviction: chooses victims, tells the master, then takes them out of the index and
    /// deletes them (readers the master sent to them meanwhile still find them). A victim
    /// written earlier in this round and not reported yet is withdrawn from the report (as a
    /// failed order) instead: the master does not know it, so an eviction report would be
    /// ignored and the next sync would record a copy whose file is gone.
    async fn make_room(&self, need: u64, pending: &mut DiskReport) -> Result<()> {
        let capacity = self.tier.config.capacity;
        if capacity == 0 {
            return Ok(());
        }
        let victims =
            self.tier
                .copies()
                .choose_victims(need, capacity, self.tier.config.eviction.into());
        if victims.is_empty() {
            return Ok(());
        }
        coverage::hit(Path::NODE_DISK_EVICTION);
        let (withdrawn, evicted): (Vec<_>, Vec<_>) = victims
            .iter()
            .cloned()
            .partition(|write| pending.offloaded.contains(write));
        let report = DiskReport {
            evicted,
            ..DiskReport::default()
        };
        let told = if report.evicted.is_empty() {
            Ok(DiskSyncAck::default())
        } else {
            // Readers the master sends to the victims until it hears of them still find them,
            // however long telling it takes.
            crate::buggify::hold(crate::buggify::Site::NODE_BEFORE_DISK_EVICTION_REPORT).await;
            call_sync(self.control, self.client, self.segment, report).await
        };
        if let Err(e) = told {
            // The master may still point at them: they stay.
            return Err(Error::new(
                e.code,
                format!("could not tell the master about disk eviction: {e}"),
            ));
        }
        pending.offloaded.retain(|write| !withdrawn.contains(write));
        pending.failed.extend(withdrawn);
        let taken = self.tier.copies().take_writes(&victims);
        debug!(count = taken.len(), "disk eviction");
        let writes = taken.into_iter().map(|(k, c)| (k, c.version)).collect();
        self.tier.delete_for_good(writes).await;
        Ok(())
    }
}
