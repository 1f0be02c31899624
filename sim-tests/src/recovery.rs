//! The recovery oracle: each time a storage node's disk tier recovers, what its backend
//! reported is checked against the disk's own bytes, read here without the backend's code.
//! Reads recheck every record, so a backend whose recovery keeps a damaged record, loses an
//! intact one or leaves a torn write behind would otherwise go unseen.
//!
//! The disk is scanned as the scan starts (after the crash, before the backend touches it)
//! and again once it has recovered; nothing else writes to a node's disk in between, and a
//! bit flipped meanwhile (the disk's flip count) voids the checks that depend on it. Every
//! backend must report only values whose intact record was on the disk (key, version, length
//! and checksum) and is still there; each must also do what its layout promises
//! (docs/ssd-tier.md, `Backend::recover`):
//!
//! - file per key: every intact record file is reported, and no unfinished write (`tmp/`) or
//!   damaged record file is left;
//! - offset file: each key's highest intact version is reported, and no damaged record is
//!   left for a later scan to find (its header zeroed);
//! - bucket: no unfinished meta and no data file without a meta is left.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use mooring::node::disk_tier::{DiskBackend, RecoveryStage, RecoveryWatch};
use mooring_core::Checksum;
use mooring_disk::{DATA_FILE, FilePerKey, Recovered, record};
use mooring_transport_sim::disk::SimDisk;

use crate::world::World;

/// Alignment of records in the bucket and offset-file layouts (at least 4 KiB whatever the
/// disk's; mooring_disk's `layout_alignment`).
const LAYOUT_ALIGNMENT: u64 = 4096;

/// An intact record on the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Intact {
    key: String,
    version: u64,
    len: u64,
    checksum: Checksum,
    file: String,
    at: u64,
}

/// What a disk held: its files, its intact records, and where a record's magic or a
/// record file's start does not decode.
#[derive(Default)]
struct Scan {
    files: Vec<String>,
    intact: Vec<Intact>,
    damaged: Vec<(String, u64)>,
}

impl Scan {
    fn of(disk: &SimDisk) -> Scan {
        let mut scan = Scan::default();
        for (name, _) in disk.files() {
            let Some(bytes) = disk.contents(&name) else {
                continue;
            };
            let mut starts: Vec<usize> = bytes
                .windows(record::MAGIC.len())
                .enumerate()
                .filter(|(_, w)| *w == record::MAGIC)
                .map(|(at, _)| at)
                .collect();
            // A record file starts with its record, whatever its first bytes say now.
            if name.ends_with(".rec") && starts.first() != Some(&0) {
                starts.insert(0, 0);
            }
            for at in starts {
                match record::decode(&bytes[at..]) {
                    Ok(r) => scan.intact.push(Intact {
                        key: r.key.to_string(),
                        version: r.version,
                        len: r.value.len() as u64,
                        checksum: r.checksum,
                        file: name.clone(),
                        at: at as u64,
                    }),
                    Err(_) => scan.damaged.push((name.clone(), at as u64)),
                }
            }
            scan.files.push(name);
        }
        scan
    }

    fn holds(&self, key: &str, version: u64, len: u64, checksum: Checksum) -> bool {
        self.intact.iter().any(|r| {
            (r.key.as_str(), r.version, r.len, r.checksum) == (key, version, len, checksum)
        })
    }
}

/// The watch for node `node`'s disk tier: reports what it finds as violations in the
/// world's history (held weakly: the node's tier holds the watch).
pub fn watch(world: Weak<World>, node: usize) -> RecoveryWatch {
    let before: Mutex<Option<(Scan, u64)>> = Mutex::new(None);
    RecoveryWatch(Arc::new(move |stage| {
        let Some(world) = world.upgrade() else {
            return;
        };
        let Some(plan) = world.plan.disk.as_ref() else {
            return;
        };
        let disk = &world.disks[node];
        let mut before = before.lock().unwrap_or_else(|e| e.into_inner());
        match stage {
            RecoveryStage::Scanning => *before = Some((Scan::of(disk), disk.stats().flips)),
            RecoveryStage::Recovered(found) => {
                let Some((scan, flips)) = before.take() else {
                    return;
                };
                let after = (disk.stats().flips == flips).then(|| Scan::of(disk));
                let problems = check(plan.backend, &scan, after.as_ref(), found);
                let mut history = world.history();
                for problem in problems {
                    history.violation(format!(
                        "node{node}'s {:?} disk recovery: {problem}",
                        plan.backend
                    ));
                }
            }
        }
    }))
}

/// What is wrong with `found`, recovered from a disk that held `before` and, unless a bit
/// flipped meanwhile, holds `after` now.
fn check(
    backend: DiskBackend,
    before: &Scan,
    after: Option<&Scan>,
    found: &Recovered,
) -> Vec<String> {
    let mut problems = Vec::new();
    for h in &found.objects {
        if !before.holds(&h.key, h.version, h.len, h.checksum) {
            problems.push(format!(
                "reported write {} of {:?} ({} bytes, checksum {:?}), which no intact record on the disk held",
                h.version, h.key, h.len, h.checksum
            ));
        }
    }
    let Some(after) = after else {
        return problems;
    };
    for h in &found.objects {
        if before.holds(&h.key, h.version, h.len, h.checksum)
            && !after.holds(&h.key, h.version, h.len, h.checksum)
        {
            problems.push(format!(
                "reported write {} of {:?} but left no intact record of it",
                h.version, h.key
            ));
        }
    }
    let reported = |key: &str, version: u64| {
        found
            .objects
            .iter()
            .any(|h| (h.key.as_str(), h.version) == (key, version))
    };
    match backend {
        DiskBackend::FilePerKey => {
            for r in &before.intact {
                let own_file = r.at == 0 && FilePerKey::file_name(&r.key) == r.file;
                if own_file && !reported(&r.key, r.version) {
                    problems.push(format!(
                        "did not report write {} of {:?}, intact in {}",
                        r.version, r.key, r.file
                    ));
                }
            }
            for name in after.files.iter().filter(|n| n.starts_with("tmp/")) {
                problems.push(format!("left the unfinished write {name}"));
            }
            for (name, _) in after
                .damaged
                .iter()
                .filter(|(n, at)| *at == 0 && n.ends_with(".rec"))
            {
                problems.push(format!("left the damaged record file {name}"));
            }
        }
        DiskBackend::OffsetFile => {
            let in_layout =
                |file: &str, at: u64| file == DATA_FILE && at.is_multiple_of(LAYOUT_ALIGNMENT);
            let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
            for r in before.intact.iter().filter(|r| in_layout(&r.file, r.at)) {
                let v = newest.entry(&r.key).or_insert(r.version);
                *v = (*v).max(r.version);
            }
            for (key, version) in newest {
                if !reported(key, version) {
                    problems.push(format!(
                        "did not report write {version} of {key:?}, its newest intact record"
                    ));
                }
            }
            for (_, at) in after.damaged.iter().filter(|(n, at)| in_layout(n, *at)) {
                problems.push(format!("left a damaged record at {DATA_FILE}@{at}"));
            }
        }
        DiskBackend::Bucket => {
            for name in &after.files {
                if name.ends_with(".meta.tmp") {
                    problems.push(format!("left the unfinished meta {name}"));
                }
                if let Some(stem) = name.strip_suffix(".bucket")
                    && !after.files.contains(&format!("{stem}.meta"))
                {
                    problems.push(format!("left {name}, which has no meta"));
                }
            }
        }
    }
    problems
}
