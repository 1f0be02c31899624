//! The disk tier: the harness plays each segment name's node disk, as the real node adapter
//! (`store/src/node/disk_tier/`) does but in memory. Each disk is the core's own node-side policy
//! ([`DiskCopies`]) with a small capacity, plus the bytes of every copy (standing in for
//! files). A disk belongs to a segment *name* and survives unmounts, so a remounted name
//! recovers what it held.
//!
//! One [`Op::DiskSync`](super::Op::DiskSync) is one round of the node's sync loop: it carries
//! out the tombstones the last acknowledgement handed out, copies the last orders' bytes out
//! of the segment while their lease lasts (judging that the leased bytes are still the
//! ordered value), makes room by disk eviction (told to the master in a sync of its own,
//! deleted only after it is acknowledged), writes the copies, and reports everything,
//! including, after every mount, all it holds as recovered. The model predicts what the
//! master records from each report (disk copies, failed offloads, evictions of disk-only
//! objects, tombstones, recovery adoption) and the acknowledgement's tombstones exactly, and
//! judges each order's legality.

use std::collections::BTreeMap;

use super::memory;
use super::{Harness, ensure, segment_name};
use crate::checksum::Checksum;
use crate::disk_copies::{DiskCopies, DiskEvictionOrder};
use crate::ids::{ClientId, SegmentId, WriteId};
use crate::object::{Medium, ReplicaDescriptor, ReplicaStatus};
use crate::offload::{DiskReport, DiskSyncAck, OffloadOrder};
use crate::time::Millis;

/// Bytes each node's disk holds at most: a few values, so disk eviction is frequent.
pub const DISK_CAPACITY: u64 = 12 * 1024;

/// A disk's files: by (key, write), the version the bytes are of, and the bytes.
pub(super) type Files = BTreeMap<(String, u64), (u64, Vec<u8>)>;

/// An order handed out by the last sync, waiting to be carried out.
#[derive(Clone, Debug)]
struct PendingOrder {
    order: OffloadOrder,
    /// The value's version, as the model knew it when the order was issued.
    version: u64,
    /// The segment (mount) the order was issued for.
    segment: SegmentId,
    /// The order's lease: the bytes must be copied before this.
    lease_until: Millis,
}

/// What one round works on.
struct Round<'a> {
    /// The segment name (the disk's).
    name: &'a str,
    /// The mount and its owner.
    seg: (SegmentId, ClientId),
    /// Every write fails.
    fail: bool,
    /// Evict down to half the capacity.
    evict: bool,
}

/// One segment name's disk.
#[derive(Default)]
pub(super) struct NodeDisk {
    /// What the disk holds (the core's node-side policy).
    copies: DiskCopies,
    /// The copies' bytes, by (key, write): the version the bytes are of, and the bytes.
    files: Files,
    /// The mount the last sync was for: a new one means reporting everything as recovered.
    synced_mount: Option<SegmentId>,
    /// What the next sync reports (copies written, failed, tombstones carried out).
    pending: DiskReport,
    /// Orders from the last acknowledgement left for the next round.
    orders: Vec<PendingOrder>,
    /// Copies written so far: each write is one eviction unit (a bucket).
    units: u64,
}

impl NodeDisk {
    /// The bytes of write `write` of `key`, as a reader staging it would get them, or None if
    /// the disk does not hold that copy.
    fn read(&mut self, key: &str, write: u64, size: u64) -> Option<(u64, Vec<u8>)> {
        let ticket = self.copies.begin_read(key, write, size).ok()?;
        self.copies.end_read(ticket);
        self.files.get(&(key.to_string(), write)).cloned()
    }

    /// Phase two: copies that left the index are deleted for good.
    fn delete_files(&mut self, writes: &[(String, u64)]) {
        for w in writes {
            self.files.remove(w);
        }
        self.copies.deletion_finished(writes, true);
    }
}

impl Harness {
    /// The bytes of a disk replica, read through its node's disk: None if that disk no
    /// longer holds the copy (or its segment is gone).
    pub(super) fn read_disk(
        &mut self,
        key: &str,
        replica: &ReplicaDescriptor,
    ) -> Result<Option<Vec<u8>>, String> {
        let Some(name) = self
            .model
            .segment_by_id(replica.segment)
            .map(|(n, _)| n.clone())
        else {
            return Ok(None);
        };
        let Some(disk) = self.disks.get_mut(&name) else {
            return Err(format!(
                "disk replica {replica:?} on {name:?}, which never synced"
            ));
        };
        Ok(disk.read(key, replica.addr, replica.len).map(|(_, b)| b))
    }

    /// One round of a node's disk sync loop for segment `segment` (see the module docs).
    /// `want % 5` orders are asked for; from `want >= 128` the node takes them but copies
    /// them only at its next round (late, perhaps after their lease). `fail` makes the disk
    /// fail every write of this round; `evict` makes it evict down to half its capacity.
    pub(super) fn disk_sync(
        &mut self,
        segment: u8,
        want: u8,
        fail: bool,
        evict: bool,
    ) -> Result<(), String> {
        let name = segment_name(segment);
        let Some(seg) = self.model.segments.get(&name).map(|s| (s.id, s.owner)) else {
            return Ok(()); // no mount, no sync
        };
        let mut disk = self.disks.remove(&name).unwrap_or_default();
        let round = Round {
            name: &name,
            seg,
            fail,
            evict,
        };
        let result = self.disk_round(&round, &mut disk, want);
        self.disks.insert(name, disk);
        result
    }

    fn disk_round(&mut self, round: &Round, disk: &mut NodeDisk, want: u8) -> Result<(), String> {
        let now = self.now;
        let remounted = disk.synced_mount != Some(round.seg.0);
        if remounted {
            // A new mount, perhaps a restarted node: orders taken under another mount are
            // void, reports not sent yet are lost, and everything held is reported.
            disk.orders.clear();
            disk.pending = DiskReport {
                recovered: disk.copies.report(),
                ..DiskReport::default()
            };
            if !disk.pending.recovered.is_empty() {
                self.hit("disk-recovery-report");
            }
        }
        if !remounted {
            // Orders taken at the last round but not carried out then (the recovery report
            // goes first after a mount: nothing is evicted before it).
            let late = std::mem::take(&mut disk.orders);
            self.carry_out(round, disk, late)?;
        }
        let mut report = std::mem::take(&mut disk.pending);
        report.want = u32::from(want % 5);
        let ack = self.sync_and_judge(round, report, &disk.files)?;
        disk.synced_mount = Some(round.seg.0);
        // Tombstones: a copy goes only if it is that write; all are confirmed next time.
        let taken = disk.copies.take_writes(&ack.delete);
        let writes: Vec<(String, u64)> = taken.into_iter().map(|(k, c)| (k, c.version)).collect();
        if !writes.is_empty() {
            self.hit("disk-tombstone-carried-out");
        }
        disk.delete_files(&writes);
        disk.pending.deleted = ack.delete;
        let orders: Vec<PendingOrder> = ack
            .offload
            .into_iter()
            .map(|order| PendingOrder {
                version: self.model.objects[&order.key]
                    .version
                    .expect("judged complete"),
                order,
                segment: round.seg.0,
                lease_until: now + ack.lease_ttl,
            })
            .collect();
        if want >= 128 {
            disk.orders = orders;
            Ok(())
        } else {
            self.carry_out(round, disk, orders)
        }
    }

    /// Carries out orders: copies their bytes out of the segment while their lease lasts,
    /// makes room by disk eviction (phase one told to the master in a sync of its own, the
    /// files deleted only after its acknowledgement), writes the copies, and notes the
    /// outcome for the next sync.
    fn carry_out(
        &mut self,
        round: &Round,
        disk: &mut NodeDisk,
        orders: Vec<PendingOrder>,
    ) -> Result<(), String> {
        let now = self.now;
        let mut copies = Vec::new();
        for p in orders {
            let (key, write) = (p.order.key.clone(), p.order.write);
            if round.fail || now >= p.lease_until || p.order.size > DISK_CAPACITY {
                self.hit(if now >= p.lease_until {
                    "disk-order-late"
                } else {
                    "disk-order-failed"
                });
                disk.pending.failed.push((key, write));
                continue;
            }
            let replica = ReplicaDescriptor {
                segment: p.segment,
                addr: p.order.addr,
                len: p.order.size,
                status: ReplicaStatus::Complete,
                medium: Medium::Memory,
            };
            let bytes = self
                .memory
                .read(&replica)
                .ok_or_else(|| format!("offload order {:?} outside its segment", p.order))?;
            ensure(memory::identify(&bytes, &[p.version]).is_some(), || {
                format!(
                    "offload order {:?}: the leased bytes are no longer version {}",
                    p.order, p.version
                )
            })?;
            copies.push((p, bytes));
        }
        if copies.is_empty() && !round.evict {
            return Ok(());
        }
        let need: u64 = copies.iter().map(|(p, _)| p.order.size).sum();
        let capacity = if round.evict {
            DISK_CAPACITY / 2
        } else {
            DISK_CAPACITY
        };
        let order = if self.config.seed % 2 == 1 {
            DiskEvictionOrder::Lru
        } else {
            DiskEvictionOrder::Fifo
        };
        let victims: Vec<(String, WriteId)> = disk.copies.choose_victims(need, capacity, order);
        // A victim written since the last sync is unknown to the master, which would ignore
        // its eviction and then record it from the pending report: it is withdrawn from that
        // report instead (as failed: the disk had no room to keep it).
        let (unreported, evicted): (Vec<_>, Vec<_>) = victims
            .iter()
            .cloned()
            .partition(|v| disk.pending.offloaded.contains(v));
        if !unreported.is_empty() {
            self.hit("disk-evict-unreported");
            disk.pending.offloaded.retain(|c| !unreported.contains(c));
            disk.pending.failed.extend(unreported);
        }
        if !evicted.is_empty() {
            let phase_one = DiskReport {
                evicted,
                ..DiskReport::default()
            };
            self.sync_and_judge(round, phase_one, &disk.files)?;
        }
        let writes: Vec<(String, u64)> = disk
            .copies
            .take_writes(&victims)
            .into_iter()
            .map(|(k, c)| (k, c.version))
            .collect();
        disk.delete_files(&writes);
        // One unit per batch, like a bucket.
        disk.units += 1;
        for (p, bytes) in copies {
            let (key, write) = (p.order.key, p.order.write);
            if let Some(old) = disk.copies.get(&key) {
                disk.files.remove(&(key.clone(), old.version));
            }
            // The node's checksum is of the bytes it copied, as a real record's is.
            let sum = Checksum::of(&bytes);
            disk.copies
                .insert(key.clone(), write.0, p.order.size, sum, disk.units);
            disk.files
                .insert((key.clone(), write.0), (p.version, bytes));
            disk.pending.offloaded.push((key, write));
        }
        Ok(())
    }

    /// Sends one disk sync and judges it: the model applies the report as the master should,
    /// then the events, the orders and the tombstones handed back are checked against it.
    fn sync_and_judge(
        &mut self,
        round: &Round,
        report: DiskReport,
        files: &Files,
    ) -> Result<DiskSyncAck, String> {
        let (name, (seg, owner), now) = (round.name, round.seg, self.now);
        self.note(format!("    disk sync {name} {report:?}"));
        let got = self.master.disk_sync(owner, seg, report.clone(), now);
        self.model.touch(owner, now);
        let events = self.master.drain_events();
        let ack = got.map_err(|e| format!("disk sync of {name} failed: {e}"))?;
        self.note(format!("    ack {ack:?}"));
        self.model.disk_segments.insert(seg);
        let expected_events = self.model_disk_report(name, (seg, owner), &report, files)?;
        ensure(events == expected_events, || {
            format!("disk sync events {events:?}, expected {expected_events:?}")
        })?;
        ensure(ack.offload.len() <= report.want as usize, || {
            format!("{} orders, {} wanted", ack.offload.len(), report.want)
        })?;
        ensure(ack.lease_ttl == self.config.lease_ttl, || {
            "order lease ttl".into()
        })?;
        for order in &ack.offload {
            self.judge_order(order, seg)?;
        }
        let tombstones: Vec<(String, WriteId)> = self
            .model
            .tombstones
            .get(name)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        ensure(ack.delete == tombstones, || {
            format!(
                "tombstones for {name}: {:?}, expected {tombstones:?}",
                ack.delete
            )
        })?;
        Ok(ack)
    }

    /// An order must be for the current, complete value of its key, with no disk copy yet,
    /// from a complete replica on the syncing segment. It leases the object.
    fn judge_order(&mut self, order: &OffloadOrder, seg: SegmentId) -> Result<(), String> {
        let (now, ttl) = (self.now, self.config.lease_ttl);
        let object = self
            .model
            .objects
            .get_mut(&order.key)
            .ok_or_else(|| format!("order {order:?} for a missing key"))?;
        ensure(
            object.writing.is_none()
                && object.version.is_some()
                && object.write_id == order.write
                && object.size == order.size
                && object.disk.is_none()
                && object
                    .replicas
                    .iter()
                    .any(|r| r.complete && r.segment == seg && r.addr == order.addr),
            || format!("illegal order {order:?} for {object:?}"),
        )?;
        let version = object.version.expect("checked above");
        let sum = Checksum::of(&memory::pattern(version, order.size));
        ensure(order.checksum == sum, || {
            format!("order {order:?}: the value has {sum}")
        })?;
        object.grant_lease(now, ttl);
        object.maybe_queued = false;
        self.hit("disk-order");
        Ok(())
    }
}
