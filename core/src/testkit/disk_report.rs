//! The model's half of a disk sync: what the master must do with a node's report, in its
//! order (deletions confirmed, disk evictions, copies written, failed offloads, recovered
//! copies), predicted exactly: the disk copies it records, the objects disk eviction
//! removes (and their events), the tombstones, and which recovered copies it adopts.

use super::Harness;
use super::disk::Files;
use super::model::MObject;
use crate::events::Event;
use crate::ids::{ClientId, SegmentId, WriteId};
use crate::offload::DiskReport;

impl Harness {
    /// What the master does with a report, in its order: deletions confirmed, evictions,
    /// copies written, failures, recoveries. Returns the events it must report.
    pub(super) fn model_disk_report(
        &mut self,
        name: &str,
        (seg, owner): (SegmentId, ClientId),
        report: &DiskReport,
        files: &Files,
    ) -> Result<Vec<Event>, String> {
        let mut events = Vec::new();
        if let Some(tombs) = self.model.tombstones.get_mut(name) {
            for deleted in &report.deleted {
                tombs.remove(deleted);
            }
            if tombs.is_empty() {
                self.model.tombstones.remove(name);
            }
        }
        for (key, write) in &report.evicted {
            let Some(object) = self.current(key, *write) else {
                continue;
            };
            if object.disk != Some(seg) {
                continue;
            }
            object.disk = None;
            object.offload_failed = true;
            object.maybe_queued = false;
            let gone = object.replicas.is_empty() && object.writing.is_none();
            let last_access = object.last_access;
            self.hit("disk-evict");
            if gone {
                // A disk-only object whose only copy goes: it is gone.
                self.hit("disk-evict-object");
                self.model_remove(key);
                events.push(Event::Evicted {
                    key: key.as_str().into(),
                    soft_pinned: false,
                    bytes: 0,
                    contiguous: false,
                    kept_on_disk: false,
                    last_access,
                });
            }
        }
        for (key, write) in &report.offloaded {
            match self.current(key, *write).map(|o| o.disk) {
                Some(None) => {
                    let object = self.current(key, *write).expect("current");
                    object.disk = Some(seg);
                    object.offload_failed = false;
                    object.maybe_queued = false;
                    self.hit("disk-offloaded");
                }
                Some(Some(disk)) if disk == seg => {}
                _ => {
                    // Stale (a new value or none since), or already on another disk.
                    self.hit("disk-offload-stale");
                    self.model.tombstone(name, key, *write);
                }
            }
        }
        for (key, write) in &report.failed {
            if let Some(object) = self.current(key, *write) {
                object.offload_failed = true;
                object.maybe_queued = false;
            }
        }
        let first_sync = self.model.known_disks.insert(name.to_string());
        // The harness's disk holds exact copies, so their checksums always match.
        for (key, write, size, _) in &report.recovered {
            let copy = (key.as_str(), *write, *size);
            self.model_recovered(name, (seg, owner), copy, first_sync, files)?;
        }
        Ok(events)
    }

    /// A copy found on disk after a mount: adopted if it is the key's current value with no
    /// disk copy, or the ghost of an object that went with this disk (or, on the first sync
    /// with the disk, any copy of a key with no value); tombstoned otherwise, unless it
    /// already is.
    fn model_recovered(
        &mut self,
        name: &str,
        (seg, owner): (SegmentId, ClientId),
        (key, write, size): (&str, WriteId, u64),
        first_sync: bool,
        files: &Files,
    ) -> Result<(), String> {
        self.hit("disk-recovered");
        let entry = (key.to_string(), write);
        if self
            .model
            .tombstones
            .get(name)
            .is_some_and(|t| t.contains(&entry))
        {
            return Ok(());
        }
        let Some(object) = self.model.objects.get_mut(key) else {
            let ghost = self.model.ghosts.get(key).cloned();
            let adopt = match &ghost {
                Some((n, w, _, _)) => {
                    (n.as_str(), *w) == (name, write) || (first_sync && write > *w)
                }
                None => first_sync,
            };
            if !adopt {
                self.hit("disk-recovered-refused");
                self.model.tombstone(name, key, write);
                return Ok(());
            }
            match &ghost {
                Some((n, w, _, _)) if (n.as_str(), *w) == (name, write) => {
                    self.model.ghosts.remove(key);
                }
                Some(_) => self.model.bury_ghost(key),
                None => {}
            }
            let (version, _) = files.get(&(key.to_string(), write.0)).ok_or_else(|| {
                format!("{name:?} recovered {key:?} {write}, which it never wrote")
            })?;
            // Holds taken on the object that went away do not hold the adopted one.
            for hold in self.model.holds.values_mut() {
                if hold.key == key && hold.write_id == write {
                    hold.write_id = WriteId(u64::MAX);
                }
            }
            let mut object = MObject::new(size, owner, write);
            object.version = Some(*version);
            object.disk = Some(seg);
            self.model.objects.insert(key.to_string(), object);
            self.hit("disk-recovered-adopted");
            return Ok(());
        };
        if object.write_id == write && object.size == size && object.disk.is_none() {
            object.disk = Some(seg);
            object.offload_failed = false;
            object.maybe_queued = false;
            self.hit("disk-recovered-adopted");
        } else if !(object.write_id == write && object.disk == Some(seg)) {
            self.hit("disk-recovered-refused");
            self.model.tombstone(name, key, write);
        }
        Ok(())
    }

    /// The model object of `key` if it currently holds `write`.
    fn current(&mut self, key: &str, write: WriteId) -> Option<&mut MObject> {
        self.model
            .objects
            .get_mut(key)
            .filter(|o| o.write_id == write)
    }
}
