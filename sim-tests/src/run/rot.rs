//! Bit rot: flipping bits of values in a node's memory or on its disk, and telling the
//! history when a value has lost its last intact copy (then, or later as its other copies go).

use mooring_core::Checksum;
use mooring_transport_sim::disk::SimDisk;

use super::{Supervisor, TICK};
use crate::history::GoneWhy;

/// A value's record on a node's disk that a bit flip hit.
pub(super) struct DamagedRecord {
    /// The node whose disk holds it, the file, and where in it the value starts.
    node: usize,
    file: String,
    start: u64,
    key: String,
    /// The write whose value it holds, and that value's length.
    version: u64,
    size: usize,
    /// The value's checksum, as the master knows it while it is the key's current value.
    checksum: Checksum,
}

impl DamagedRecord {
    /// Whether `disk` holds another record of the same value whose value is intact (the
    /// node wrote it twice): the master's disk copy may be that one.
    fn intact_twin_on(&self, disk: &SimDisk) -> bool {
        let mut header = crate::value::key_hash(&self.key).to_le_bytes().to_vec();
        header.extend_from_slice(&self.version.to_le_bytes());
        let found = disk.find(&header);
        let mut others = found
            .iter()
            .filter(|(name, start)| (name, *start) != (&self.file, self.start));
        others.any(|(name, start)| {
            disk.contents(name).is_some_and(|bytes| {
                let start = *start as usize;
                bytes.get(start..start + self.size).is_some_and(|value| {
                    crate::value::judge(&self.key, value)
                        == crate::value::Judged::Intact(self.version)
                })
            })
        })
    }
}

impl Supervisor {
    /// Flips one bit of a file on node `node`'s disk, chosen by `pick`. If the bit is in the
    /// bytes of a value whose disk copy there is its only copy (the master lists no complete
    /// memory replica), the value is destroyed: the history may find it gone from now on. If
    /// the value has other copies, it is destroyed once they are gone (seed 10003: its memory
    /// replicas evicted or lost with a node), which [`Supervisor::watch_rotted`] looks out
    /// for.
    pub(super) fn rot_disk(&mut self, node: usize, pick: u64) {
        let disk = &self.world.disks[node];
        let files = disk.files();
        let nonempty: Vec<&(String, u64)> = files.iter().filter(|(_, len)| *len > 0).collect();
        if nonempty.is_empty() {
            return;
        }
        let (name, len) = nonempty[(pick % nonempty.len() as u64) as usize];
        let at = (pick >> 16) % len;
        self.flip_disk_bit(node, name, at, (pick >> 8) as u8);
    }

    /// Flips one bit inside a record on node `node`'s disk (its header, key or value), the
    /// record and the bit chosen by `pick`; as [`Supervisor::rot_disk`] otherwise. Records
    /// are few among a disk's bytes (an offset file is mostly free space), so a flip aimed
    /// anywhere seldom gives recovery a damaged record to find.
    pub(super) fn rot_record(&mut self, node: usize, pick: u64) {
        let disk = &self.world.disks[node];
        let starts = disk.find(&mooring_disk::record::MAGIC);
        if starts.is_empty() {
            return;
        }
        let (name, start) = &starts[(pick % starts.len() as u64) as usize];
        let Some(contents) = disk.contents(name) else {
            return;
        };
        let from = *start as usize;
        // A header too damaged to say its length: its own bytes.
        let len = mooring_disk::record::announced_len(&contents[from..])
            .map_or(mooring_disk::record::HEADER_LEN as u64, |len| len)
            .min((contents.len() - from) as u64);
        let at = start + (pick >> 16) % len.max(1);
        self.flip_disk_bit(node, name, at, (pick >> 8) as u8);
    }

    /// Flips bit `bit` of byte `at` of file `name` on node `node`'s disk, and tells the
    /// history if that destroyed a value (now, or once its other copies go).
    fn flip_disk_bit(&mut self, node: usize, name: &str, at: u64, bit: u8) {
        let disk = &self.world.disks[node];
        // Looked up first: the search reads the value's header, which the flip may hit.
        let hit = self.current_value_at(node, name, at);
        tracing::info!(%name, at, "flipping a bit");
        // The file exists: it was just listed.
        let _ = disk.flip_bit(name, at, bit);
        self.note_disk_rot_on(node, hit.as_ref().map(|(record, _)| record.key.as_str()));
        match hit {
            Some((record, true)) if !record.intact_twin_on(disk) => {
                tracing::info!(key = %record.key, "the only copy of the value is damaged");
                let now = self.world.now();
                self.world
                    .history()
                    .gone(&record.key, now, GoneWhy::Destroyed);
            }
            Some((record, _)) => self.rotted.push(record),
            None => {}
        }
    }

    /// Tells the history which keys' disk copies a flip on node `node`'s disk may have
    /// damaged: the key whose record it hit, and every key whose copy the master lists on
    /// that node (a flip elsewhere in a file, or in a record's length, can cost a backend
    /// more records than the one it hit: a bucket's meta, the records after a torn length).
    fn note_disk_rot_on(&self, node: usize, hit: Option<&str>) {
        let here = self.world.node(node).and_then(|n| n.segment());
        let listed_here: Vec<&String> = match (self.world.master(), here) {
            (Some(master), Some(here)) => self
                .world
                .keys
                .iter()
                .filter(|key| master.inspect(|m| m.audit_disk_copy(key)) == Some(here))
                .collect(),
            // No master or no segment to ask about (a restart under way): any key's.
            _ => self.world.keys.iter().collect(),
        };
        let now = self.world.now();
        let mut history = self.world.history();
        for key in hit
            .into_iter()
            .chain(listed_here.into_iter().map(String::as_str))
        {
            history.note_disk_rot(key, now);
        }
    }

    /// Records as destroyed each value whose damaged disk record is now its only copy (the
    /// master lists no complete memory replica, and the disk copy on the damaged node); stops
    /// watching a record that is no longer its key's current value.
    pub(super) fn watch_rotted(&mut self) {
        let Some(master) = self.world.master() else {
            return;
        };
        let world = &self.world;
        // The state may have changed at any moment since the last tick.
        let since = world.now().saturating_sub(TICK);
        self.rotted.retain(|record| {
            let here = world.node(record.node).and_then(|n| n.segment());
            let key = &record.key;
            let (memory, disk) =
                master.inspect(|m| (m.audit_memory_replicas(key), m.audit_disk_copy(key)));
            match memory {
                Some((memory, current)) if current == record.checksum => {
                    let only_copy = memory.is_empty()
                        && disk.is_some()
                        && disk == here
                        && !record.intact_twin_on(&world.disks[record.node]);
                    if only_copy {
                        tracing::info!(%key, "a damaged disk record is the value's only copy now");
                        world.history().gone(key, since, GoneWhy::Destroyed);
                    }
                    !only_copy
                }
                // Written again, removed, or gone: the record is not the value's any more.
                _ => false,
            }
        });
    }

    /// The key whose current value's disk record (header, key or value) has a byte at offset
    /// `at` of file `name` on node `node`'s disk (seed 13707: a flip in a record's header):
    /// the key, the value's checksum, and whether that disk copy is the value's only
    /// one (the master lists it and no memory replica). A copy the node wrote and has not
    /// reported yet is found too (seed 10437): [`Supervisor::watch_rotted`] waits for the
    /// master to list it.
    fn current_value_at(&self, node: usize, name: &str, at: u64) -> Option<(DamagedRecord, bool)> {
        let master = self.world.master()?;
        let here = self.world.node(node)?.segment()?;
        let contents = self.world.disks[node].contents(name)?;
        let header = mooring_disk::record::HEADER_LEN;
        let (key, version, size, start) =
            crate::value::value_at(&contents, at as usize, &self.world.keys, header)?;
        // Only a write the history made (a stray header-like run of bytes is not a value).
        if !self
            .world
            .history()
            .writes_of(key)
            .contains(&(version, size))
        {
            return None;
        }
        let checksum = mooring_core::Checksum::of(&crate::value::encode(key, version, size));
        let (memory, current) = master.inspect(|m| m.audit_memory_replicas(key))?;
        if current != checksum {
            return None;
        }
        let listed_here = master.inspect(|m| m.audit_disk_copy(key)) == Some(here);
        let record = DamagedRecord {
            node,
            file: name.to_string(),
            start: start as u64,
            key: key.to_string(),
            version,
            size,
            checksum,
        };
        Some((record, listed_here && memory.is_empty()))
    }

    /// Flips one bit of a value held in node `node`'s memory: the first key from the one
    /// `pick` names with a complete memory replica there (reading its replica list grants a
    /// lease, as any reader's would).
    pub(super) fn rot_memory(&self, node: usize, pick: u64) {
        self.rot_value(node, pick, |_, _| true);
    }

    /// Flips one bit of every copy of a value on node `node`: the first key from the one
    /// `pick` names whose only complete memory replica is there and whose records are on
    /// the node's disk, in memory and in each record (the value's key hash, which heads it).
    /// If the records include the damaged value's own, and the master knows no disk copy of
    /// it elsewhere, the value is destroyed: the history may find it gone from now on.
    pub(super) fn rot_every_copy(&self, node: usize, pick: u64) {
        let disk = &self.world.disks[node];
        let records = |key: &str| disk.find(&crate::value::key_hash(key).to_le_bytes());
        let only_here = |key: &str, elsewhere: usize| elsewhere == 0 && !records(key).is_empty();
        let Some((key, version)) = self.rot_value(node, pick, only_here) else {
            return;
        };
        let mut own_record = crate::value::key_hash(&key).to_le_bytes().to_vec();
        own_record.extend_from_slice(&version.to_le_bytes());
        let own_record_here = !disk.find(&own_record).is_empty();
        for (name, at) in records(&key) {
            tracing::info!(%key, %name, at, "flipping a bit of a record on disk");
            // The file exists: it was just searched.
            let _ = disk.flip_bit(&name, at, (pick >> 24) as u8);
        }
        // The flips are in the key's own records: no other key's copy is touched.
        let now = self.world.now();
        self.world
            .damaged_everywhere
            .lock()
            .expect("damaged lock")
            .push((key.clone(), now));
        self.world.history().note_disk_rot(&key, now);
        let here = self.world.node(node).and_then(|n| n.segment());
        let no_disk_copy_elsewhere = self.world.master().is_some_and(|master| {
            master
                .inspect(|m| m.audit_disk_copy(&key))
                .is_none_or(|segment| Some(segment) == here)
        });
        if own_record_here && no_disk_copy_elsewhere {
            tracing::info!(%key, version, "every copy of the value is damaged");
            let at = self.world.now();
            self.world.history().gone(&key, at, GoneWhy::Destroyed);
        }
    }

    /// Flips one bit of a value held in node `node`'s memory: the first key from the one
    /// `pick` names with a complete memory replica there that `also(key, replicas
    /// elsewhere)` accepts. Returns the key and the version its damaged value had.
    fn rot_value(
        &self,
        node: usize,
        pick: u64,
        also: impl Fn(&str, usize) -> bool,
    ) -> Option<(String, u64)> {
        let master = self.world.master()?;
        let target = self.world.node(node)?;
        let segment = target.segment()?;
        let keys = &self.world.keys;
        let start = (pick % keys.len() as u64) as usize;
        let (key, replica) = keys
            .iter()
            .cycle()
            .skip(start)
            .take(keys.len())
            .find_map(|key| {
                // Behind the master's back, changing nothing: a lease granted here would be
                // an input its journal never saw.
                let (replicas, _) = master.inspect(|m| m.audit_memory_replicas(key))?;
                let elsewhere = replicas.iter().filter(|r| r.segment != segment).count();
                let replica = replicas
                    .into_iter()
                    .find(|r| r.segment == segment && r.len > 0)?;
                also(key, elsewhere).then(|| (key.clone(), replica))
            })?;
        // Every value the workload writes is at least a header long and says its version.
        let mut header = [0u8; crate::value::HEADER];
        if replica.len < header.len() as u64 || !target.memory().copy_out(replica.addr, &mut header)
        {
            return None;
        }
        let version = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let at = replica.addr + (pick >> 16) % replica.len;
        let mut byte = [0u8];
        if !target.memory().copy_out(at, &mut byte) {
            return None;
        }
        byte[0] ^= 1 << ((pick >> 8) % 8);
        let _ = target.memory().copy_in(at, &byte);
        tracing::info!(%key, at, "flipping a bit in memory");
        self.world.history().note_rot(&key);
        Some((key, version))
    }
}
