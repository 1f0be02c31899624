//! The history of one run and the judge of its reads.
//!
//! Every write gets a version unique in the run and is recorded when invoked and when it
//! completes. Every read is recorded with the version it saw. At the end each read is judged
//! against the writes of its key:
//!
//! - the bytes must be an intact value of this key (checked as the read completes);
//! - its write must have been invoked before the read completed, and must not have failed
//!   definitely (an error other than a lost RPC: its bytes were never committed);
//! - it must not be stale: if some write `u` of the key was acknowledged before the read
//!   began, and the seen write `v` was acknowledged before `u` began, then `v` had been
//!   overwritten (or removed and replaced) for good before the read started. The same holds
//!   for an acknowledged remove in place of `u`.
//!
//! A read that finds nothing ("not found", `exist` false) must be justified: if a write of the
//! key was acknowledged before the read began, something legal must have taken the object
//! away since that write began — a remove (of any outcome, by key or by pattern), another
//! write of the key (a preempted or abandoned write can take the object with it), or an event
//! of the master's: eviction (never of a hard-pinned value: those stay while a node holding
//! them lives), the loss of its last replica with a node, a discarded write that removed it.
//! A read refused because every replica it tried was damaged is justified only by a memory
//! fault on that key (a node drops a damaged disk copy as it stages it, so disk rot never
//! reaches a reader). Other errors are allowed (faults); whether they happen only when they
//! should is the liveness phase's and the master invariants' job.
//! Writes whose outcome the client could not know (a lost RPC, a crash mid-operation) may or
//! may not have committed, so reading them is allowed but they never make others stale.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use mooring_core::ErrorCode;
use tracing::debug;

use crate::value::{Judged, judge};

mod failover;
mod standing;

pub use failover::Expected;
pub use standing::Standing;

/// Simulated time since the run started.
pub type At = Duration;

/// How a write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still running (at the end of a run: its client crashed mid-operation).
    Pending,
    /// Acknowledged at this time.
    Acked(At),
    /// Failed for sure: its bytes were never committed.
    Failed(ErrorCode),
    /// Failed in a way that leaves the commit unknown (lost RPC).
    Unknown,
}

impl Outcome {
    /// Whether the write was refused before it changed anything: the master turned its start
    /// down (readers or holds in the way, no room, a copy in progress, bad arguments). Such a
    /// write explains nothing about its key.
    fn refused_at_start(&self) -> bool {
        matches!(
            self,
            Outcome::Failed(
                ErrorCode::OBJECT_REPLICA_BUSY
                    | ErrorCode::NO_AVAILABLE_HANDLE
                    | ErrorCode::OBJECT_HAS_REPLICATION_TASK
                    | ErrorCode::INVALID_PARAMS
            )
        )
    }
}

#[derive(Clone, Debug)]
struct Write {
    key: String,
    size: usize,
    invoked: At,
    outcome: Outcome,
    /// When its outcome became known (none while pending).
    ended: Option<At>,
    upsert: bool,
    hard_pinned: bool,
}

/// How long before the master hears of it a node's damaged disk copy may already be missed
/// by readers: a disk sync period, stretched by faults between node and master. Only damage
/// earns it (a node drops a copy it finds damaged at once, and the master hears of it at the
/// node's next sync, or with the node's segment if that goes first); a copy the node evicts
/// stays readable until the master has been told, so its absence must follow the master's
/// event.
pub const DISK_REPORT_SLACK: Duration = Duration::from_secs(10);

/// A read that failed: it found no value, or found every replica it tried damaged.
#[derive(Clone, Debug)]
struct Absence {
    key: String,
    invoked: At,
    completed: At,
    what: &'static str,
}

impl Absence {
    fn new(what: &'static str, key: &str, invoked: At, completed: At) -> Absence {
        Absence {
            key: key.to_string(),
            invoked,
            completed,
            what,
        }
    }
}

/// A remove of any outcome, of one key or of every key matching a pattern.
#[derive(Clone, Debug)]
struct RemoveAttempt {
    pattern: regex::Regex,
    invoked: At,
    /// `None` while running (at the end of a run: its client crashed).
    ended: Option<At>,
    /// The master refused it (the object was leased, held, being written or copied, or
    /// already gone): it removed nothing.
    refused: bool,
}

/// Why the master let an object go on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneWhy {
    /// Evicted from memory with no disk copy to read from.
    Evicted,
    /// A node dropped its disk copy (evicted from the disk, or found damaged). A damaged
    /// copy is dropped before the master hears of it at the node's next sync, so once a
    /// fault has damaged disk bytes, readers may find the copy missing up to
    /// [`DISK_REPORT_SLACK`] before the event.
    DiskDropped,
    /// Its last replica went with a node's segment.
    Lost,
    /// A discarded write took it.
    Discarded,
    /// A fault damaged every copy of its value (memory and disk, all on one node): no reader
    /// can have it any more, though the master hears of it only as readers and the node
    /// find the copies damaged, or not at all if the key is written again first.
    Destroyed,
}

#[derive(Clone, Debug)]
struct Gone {
    key: String,
    at: At,
    why: GoneWhy,
}

#[derive(Clone, Debug)]
struct Read {
    key: String,
    invoked: At,
    completed: At,
    version: u64,
    what: &'static str,
}

#[derive(Clone, Debug)]
struct Remove {
    key: String,
    invoked: At,
    acked: At,
}

/// Operation counts by kind and outcome, for the run report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// (operation, outcome) -> count; outcome is "ok" or an error code name.
    pub counts: BTreeMap<(&'static str, String), u64>,
}

impl Tally {
    /// Counts one operation.
    pub fn count(&mut self, op: &'static str, outcome: &str) {
        *self.counts.entry((op, outcome.to_string())).or_default() += 1;
    }

    /// How many operations of `op` ended with `outcome`.
    pub fn get(&self, op: &'static str, outcome: &str) -> u64 {
        self.counts
            .get(&(op, outcome.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Total operations counted.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Successful operations.
    pub fn ok(&self) -> u64 {
        self.counts
            .iter()
            .filter(|((_, o), _)| o == "ok")
            .map(|(_, n)| n)
            .sum()
    }
}

/// Everything that happened in a run, and what was wrong with it.
#[derive(Default)]
pub struct History {
    writes: BTreeMap<u64, Write>,
    /// Each key's writes, by version.
    writes_by_key: BTreeMap<String, Vec<u64>>,
    reads: Vec<Read>,
    removes: Vec<Remove>,
    absences: Vec<Absence>,
    remove_attempts: Vec<RemoveAttempt>,
    /// The remove attempts of one key each, by key, and those by a wider pattern.
    removes_by_key: BTreeMap<String, Vec<usize>>,
    pattern_removes: Vec<usize>,
    gone: Vec<Gone>,
    /// Each key's entries in `gone`.
    gone_by_key: BTreeMap<String, Vec<usize>>,
    violations: Vec<String>,
    /// Keys whose bytes a memory fault damaged in some replica.
    rotted: std::collections::BTreeSet<String>,
    /// Keys whose disk copy a fault may have damaged, and when first: only their absences
    /// may precede the master's event by [`DISK_REPORT_SLACK`].
    disk_rot: BTreeMap<String, At>,
    /// Reads refused because every replica they tried was damaged (`INVALID_REPLICA`).
    damaged: Vec<Absence>,
    /// Outcomes of every operation.
    pub tally: Tally,
}

impl History {
    /// Records the start of a `size`-byte write of `key`; returns its version.
    pub fn write_invoked(
        &mut self,
        key: &str,
        size: usize,
        at: At,
        upsert: bool,
        hard_pinned: bool,
    ) -> u64 {
        let version = self.writes.len() as u64 + 1;
        debug!(key, version, size, upsert, hard_pinned, "write invoked");
        self.writes.insert(
            version,
            Write {
                key: key.to_string(),
                size,
                invoked: at,
                outcome: Outcome::Pending,
                ended: None,
                upsert,
                hard_pinned,
            },
        );
        self.writes_by_key
            .entry(key.to_string())
            .or_default()
            .push(version);
        version
    }

    /// Records how write `version` ended.
    pub fn write_completed(&mut self, version: u64, at: At, result: Result<(), ErrorCode>) {
        debug!(version, ?result, "write completed");
        if let Some(w) = self.writes.get_mut(&version) {
            w.ended = Some(at);
            w.outcome = match result {
                Ok(()) => Outcome::Acked(at),
                Err(ErrorCode::RPC_FAIL) => Outcome::Unknown,
                Err(code) => Outcome::Failed(code),
            };
        }
    }

    /// The size of the most recent write of `key` (what a same-size upsert reuses).
    pub fn latest_size(&self, key: &str) -> Option<usize> {
        self.writes
            .values()
            .rev()
            .find(|w| w.key == key)
            .map(|w| w.size)
    }

    /// Records bytes a read of `key` returned (`what` names the operation).
    pub fn read_value(
        &mut self,
        what: &'static str,
        key: &str,
        invoked: At,
        completed: At,
        bytes: &[u8],
    ) {
        let judged = judge(key, bytes);
        debug!(what, key, len = bytes.len(), ?judged, "read");
        match judged {
            Judged::Intact(version) => self.reads.push(Read {
                key: key.to_string(),
                invoked,
                completed,
                version,
                what,
            }),
            Judged::Torn(why) => self.violation(format!(
                "{what} of {key:?} at {completed:?} returned damaged bytes: {why}"
            )),
            Judged::Foreign(hash) => self.violation(format!(
                "{what} of {key:?} at {completed:?} returned another key's value (key hash {hash:#x})"
            )),
        }
    }

    /// Records that a read of `key` (`what` names the operation) found no value.
    pub fn read_absent(&mut self, what: &'static str, key: &str, invoked: At, completed: At) {
        debug!(what, key, "found nothing");
        self.absences
            .push(Absence::new(what, key, invoked, completed));
    }

    /// Records the start of a remove of every key matching `pattern` (a key's own remove
    /// passes the key, escaped); returns a handle for [`History::remove_ended`].
    pub fn remove_invoked(&mut self, pattern: &str, at: At) -> usize {
        let handle = self.remove_attempts.len();
        let exact = pattern
            .strip_prefix('^')
            .and_then(|p| p.strip_suffix('$'))
            .filter(|p| regex::escape(p) == *p);
        match exact {
            Some(key) => self
                .removes_by_key
                .entry(key.to_string())
                .or_default()
                .push(handle),
            None => self.pattern_removes.push(handle),
        }
        let pattern = regex::Regex::new(pattern).expect("the workload's patterns are valid");
        self.remove_attempts.push(RemoveAttempt {
            pattern,
            invoked: at,
            ended: None,
            refused: false,
        });
        handle
    }

    /// Records when the remove `handle` ended, whatever its outcome.
    pub fn remove_ended(&mut self, handle: usize, at: At) {
        self.remove_attempts[handle].ended = Some(at);
    }

    /// The remove `handle` names was refused: it removed nothing, so it explains no absence.
    pub fn remove_refused(&mut self, handle: usize) {
        self.remove_attempts[handle].refused = true;
    }

    /// Every write of `key` recorded so far, whatever its outcome: its version and size.
    pub fn writes_of(&self, key: &str) -> Vec<(u64, usize)> {
        self.writes
            .iter()
            .filter(|(_, w)| w.key == key)
            .map(|(v, w)| (*v, w.size))
            .collect()
    }

    /// Records that the master let `key`'s object go on its own at `at`.
    pub fn gone(&mut self, key: &str, at: At, why: GoneWhy) {
        debug!(key, ?at, ?why, "object gone");
        self.gone_by_key
            .entry(key.to_string())
            .or_default()
            .push(self.gone.len());
        self.gone.push(Gone {
            key: key.to_string(),
            at,
            why,
        });
    }

    /// Records a remove of `key` acknowledged at `acked`.
    pub fn remove_acked(&mut self, key: &str, invoked: At, acked: At) {
        debug!(key, "remove acknowledged");
        self.removes.push(Remove {
            key: key.to_string(),
            invoked,
            acked,
        });
    }

    /// Records a safety violation found outside the history (an invariant, a stuck operation).
    pub fn violation(&mut self, what: String) {
        self.violations.push(what);
    }

    /// A memory fault damaged a replica of `key`.
    pub fn note_rot(&mut self, key: &str) {
        self.rotted.insert(key.to_string());
    }

    /// A fault may have damaged `key`'s disk copy at `at` (the node finds out only when it
    /// reads it). The supervisor names every key whose copy the damaged bytes may belong to,
    /// and no other: the absence of any other key must follow the master's event.
    pub fn note_disk_rot(&mut self, key: &str, at: At) {
        self.disk_rot.entry(key.to_string()).or_insert(at);
    }

    /// Records a read of `key` refused because the replicas it tried were damaged. Only a
    /// fault that damaged this key's bytes in memory explains that (a slip that lets a block
    /// be overwritten under its value would otherwise pass as an error). Disk rot does not:
    /// a node checks a disk copy as it stages it and drops it if damaged, so rotted disk
    /// bytes never reach a reader.
    pub fn read_damaged(&mut self, what: &'static str, key: &str, invoked: At, completed: At) {
        debug!(what, key, "replicas damaged");
        self.damaged
            .push(Absence::new(what, key, invoked, completed));
    }

    /// Whether a memory fault damaged a replica of `key`: reading it may fail (every copy
    /// damaged), but must never return the damaged bytes.
    pub fn was_rotted(&self, key: &str) -> bool {
        self.rotted.contains(key)
    }

    /// Whether anything has been found wrong so far.
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    /// Judges every read; returns every violation found in the run.
    pub fn judge(&mut self) -> Vec<String> {
        let mut by_key: BTreeMap<&str, Vec<(u64, &Write)>> = BTreeMap::new();
        for (&v, w) in &self.writes {
            by_key.entry(&w.key).or_default().push((v, w));
        }
        let mut removes: BTreeMap<&str, Vec<&Remove>> = BTreeMap::new();
        for r in &self.removes {
            removes.entry(&r.key).or_default().push(r);
        }
        let mut found = Vec::new();
        // A write is refused as another client's only when another write of its key took it
        // over: one that began before the refusal and had not ended before this write began
        // (a crashed client's write never ends).
        for (key, writes) in &by_key {
            for &(v, w) in writes {
                let (Outcome::Failed(ErrorCode::ILLEGAL_CLIENT), Some(refused)) =
                    (w.outcome, w.ended)
                else {
                    continue;
                };
                let overlapped = writes.iter().any(|&(u, other)| {
                    u != v && other.invoked < refused && other.ended.is_none_or(|e| e > w.invoked)
                });
                if !overlapped {
                    found.push(format!(
                        "write {v} of {key:?} (from {:?}) was refused as another client's \
                         ({}) at {refused:?}, but no other write of that key overlapped it",
                        w.invoked,
                        ErrorCode::ILLEGAL_CLIENT
                    ));
                }
            }
        }
        for read in &self.reads {
            let Some(seen) = self.writes.get(&read.version) else {
                found.push(format!(
                    "{} of {:?} returned version {} that was never written",
                    read.what, read.key, read.version
                ));
                continue;
            };
            let mut problem = String::new();
            if seen.key != read.key {
                let _ = write!(problem, "it is a write of {:?}", seen.key);
            } else if seen.invoked > read.completed {
                let _ = write!(problem, "that write began only at {:?}", seen.invoked);
            } else if let Outcome::Failed(code) = seen.outcome {
                let _ = write!(problem, "that write failed ({code}) and never committed");
            } else if let Outcome::Acked(seen_acked) = seen.outcome {
                let newer = by_key.get(read.key.as_str()).and_then(|writes| {
                    writes.iter().find(|(_, u)| {
                        matches!(u.outcome, Outcome::Acked(a) if a < read.invoked)
                            && seen_acked < u.invoked
                    })
                });
                let removed = removes.get(read.key.as_str()).and_then(|rs| {
                    rs.iter()
                        .find(|r| r.acked < read.invoked && seen_acked < r.invoked)
                });
                if let Some((v, u)) = newer {
                    let _ = write!(
                        problem,
                        "it is stale: version {v} ({}) was acknowledged at {:?}, before the read began",
                        if u.upsert { "upsert" } else { "put" },
                        match u.outcome {
                            Outcome::Acked(a) => a,
                            _ => unreachable!("filtered on Acked"),
                        }
                    );
                } else if let Some(r) = removed {
                    let _ = write!(
                        problem,
                        "it is stale: a remove acknowledged at {:?} (begun {:?}) came after it",
                        r.acked, r.invoked
                    );
                }
            }
            if !problem.is_empty() {
                found.push(format!(
                    "{} of {:?} during [{:?}, {:?}] returned version {}, but {problem}",
                    read.what, read.key, read.invoked, read.completed, read.version
                ));
            }
        }
        found.extend(self.absences.iter().filter_map(|a| self.unjustified(a)));
        found.extend(
            self.damaged
                .iter()
                .filter(|d| !self.was_rotted(&d.key))
                .map(|d| {
                    format!(
                        "{} of {:?} during [{:?}, {:?}] found every replica it tried damaged, but no fault had damaged bytes",
                        d.what, d.key, d.invoked, d.completed
                    )
                }),
        );
        let mut all = self.violations.clone();
        all.extend(found);
        all
    }

    /// Why the absence `a` is a violation, if it is: a write of its key was acknowledged
    /// before it began and nothing legal took the value away since that write began.
    fn unjustified(&self, a: &Absence) -> Option<String> {
        let writes: Vec<(u64, &Write)> = self
            .writes
            .iter()
            .filter(|(_, w)| w.key == a.key)
            .map(|(v, w)| (*v, w))
            .collect();
        let acked_at = |w: &Write| match w.outcome {
            Outcome::Acked(at) => Some(at),
            _ => None,
        };
        // The write acknowledged last before the read began.
        let (version, last) = writes
            .iter()
            .filter(|(_, w)| acked_at(w).is_some_and(|at| at < a.invoked))
            .max_by_key(|(_, w)| acked_at(w))?;
        let since = last.invoked;
        let overlaps =
            |from: At, to: Option<At>| from <= a.completed && to.is_none_or(|t| t >= since);
        // An upsert replacing the value leaves nothing readable until it ends (a put of an
        // existing key is refused and changes nothing).
        let other_write = writes.iter().any(|(v, w)| {
            v != version
                && w.upsert
                && !w.outcome.refused_at_start()
                && overlaps(
                    w.invoked,
                    match w.outcome {
                        Outcome::Acked(at) => Some(at),
                        // A failed or unknown write's effects (a discard) may come later.
                        _ => None,
                    },
                )
        });
        let removed = self
            .remove_attempts
            .iter()
            .any(|r| !r.refused && r.pattern.is_match(&a.key) && overlaps(r.invoked, r.ended));
        let taken = self.gone.iter().any(|g| {
            let reported_by = match g.why {
                // The master hears of a damaged copy at the node's next sync, or with its
                // segment if that goes first (a remount, the node's death).
                GoneWhy::DiskDropped | GoneWhy::Lost
                    if self.disk_rot.get(&a.key).is_some_and(|t| *t <= a.completed) =>
                {
                    a.completed + DISK_REPORT_SLACK
                }
                _ => a.completed,
            };
            g.key == a.key
                && g.at >= since
                && g.at <= reported_by
                && !(last.hard_pinned && g.why == GoneWhy::Evicted)
        });
        if other_write || removed || taken {
            debug!(
                what = a.what,
                key = a.key,
                other_write,
                removed,
                taken,
                "a read that found nothing is explained"
            );
            return None;
        }
        let evicted = self
            .gone
            .iter()
            .any(|g| g.key == a.key && g.at >= since && g.at <= a.completed);
        Some(format!(
            "{} of {:?} during [{:?}, {:?}] found nothing, but version {version} (acknowledged at {:?}{}) was {}",
            a.what,
            a.key,
            a.invoked,
            a.completed,
            acked_at(last).expect("acknowledged"),
            if last.hard_pinned {
                ", hard-pinned"
            } else {
                ""
            },
            if evicted {
                "hard-pinned and evicted anyway"
            } else {
                "neither removed, overwritten, evicted nor lost with a node"
            }
        ))
    }

    /// A digest of everything recorded, to compare two runs of one seed.
    pub fn fingerprint(&self) -> u64 {
        let mut text = String::new();
        for (v, w) in &self.writes {
            let _ = write!(text, "w{v}:{}:{:?}:{:?};", w.key, w.invoked, w.outcome);
        }
        for r in &self.reads {
            let _ = write!(
                text,
                "r{}:{}:{:?}:{:?};",
                r.key, r.version, r.invoked, r.completed
            );
        }
        for a in &self.absences {
            let _ = write!(text, "a{}:{:?}:{:?};", a.key, a.invoked, a.completed);
        }
        for g in &self.gone {
            let _ = write!(text, "g{}:{:?}:{:?};", g.key, g.at, g.why);
        }
        for ((op, outcome), n) in &self.tally.counts {
            let _ = write!(text, "{op}:{outcome}:{n};");
        }
        u64::from(crc32c::crc32c(text.as_bytes())) << 32 | text.len() as u64
    }

    /// Writes still pending at the end of a run (their clients crashed) become unknown.
    pub fn settle(&mut self) {
        for w in self.writes.values_mut() {
            if w.outcome == Outcome::Pending {
                w.outcome = Outcome::Unknown;
            }
        }
    }

    /// (writes, reads judged, reads that found nothing) so far.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.writes.len(), self.reads.len(), self.absences.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::encode;

    fn ms(n: u64) -> At {
        Duration::from_millis(n)
    }

    #[test]
    fn the_judge_accepts_concurrent_reads_and_rejects_stale_failed_and_damaged_ones() {
        let mut h = History::default();
        let v1 = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(v1, ms(10), Ok(()));
        let v2 = h.write_invoked("k", 64, ms(20), true, false);
        // Concurrent with v2: either value is fine.
        h.read_value("get", "k", ms(21), ms(25), &encode("k", v1, 64));
        h.read_value("get", "k", ms(22), ms(26), &encode("k", v2, 64));
        h.write_completed(v2, ms(30), Ok(()));
        assert!(h.judge().is_empty(), "{:?}", h.judge());

        // After v2 was acknowledged, v1 is stale.
        h.read_value("get", "k", ms(31), ms(35), &encode("k", v1, 64));
        assert_eq!(h.judge().len(), 1);

        // A definitely failed write must never be seen; an unknown one may.
        let mut h = History::default();
        let bad = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(bad, ms(5), Err(ErrorCode::TRANSFER_FAIL));
        let unknown = h.write_invoked("k", 64, ms(6), false, false);
        h.write_completed(unknown, ms(9), Err(ErrorCode::RPC_FAIL));
        h.read_value("get", "k", ms(10), ms(11), &encode("k", unknown, 64));
        assert!(h.judge().is_empty());
        h.read_value("get", "k", ms(10), ms(11), &encode("k", bad, 64));
        assert_eq!(h.judge().len(), 1);

        // A remove acknowledged before the read makes older values stale.
        let mut h = History::default();
        let v = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(v, ms(1), Ok(()));
        h.remove_acked("k", ms(2), ms(3));
        h.read_value("get", "k", ms(4), ms(5), &encode("k", v, 64));
        assert_eq!(h.judge().len(), 1);

        // Damaged and foreign bytes are violations at once.
        let mut h = History::default();
        let v = h.write_invoked("a", 64, ms(0), false, false);
        h.read_value("get", "b", ms(1), ms(2), &encode("a", v, 64));
        let mut torn = encode("a", v, 64);
        torn[40] ^= 1;
        h.read_value("get", "a", ms(1), ms(2), &torn);
        assert_eq!(h.judge().len(), 2);
        assert!(h.failed());
    }

    #[test]
    fn finding_nothing_needs_a_reason() {
        // Nothing acknowledged before the read began: nothing to find.
        let mut h = History::default();
        let v = h.write_invoked("k", 64, ms(0), false, false);
        h.read_absent("get", "k", ms(1), ms(2));
        h.write_completed(v, ms(3), Ok(()));
        assert!(h.judge().is_empty(), "{:?}", h.judge());

        // Acknowledged, then found missing with no reason: the value was lost.
        h.read_absent("exist", "k", ms(10), ms(11));
        assert_eq!(h.judge().len(), 1, "{:?}", h.judge());

        // Each legal reason excuses it: eviction, a remove of any outcome (by pattern too),
        // another write of the key.
        for reason in 0..4 {
            let mut h = History::default();
            let v = h.write_invoked("k1", 64, ms(0), false, false);
            h.write_completed(v, ms(3), Ok(()));
            match reason {
                0 => h.gone("k1", ms(5), GoneWhy::Evicted),
                1 => {
                    let r = h.remove_invoked("^k1$", ms(4));
                    h.remove_ended(r, ms(6));
                }
                2 => {
                    // Still running when the run ended (its client crashed).
                    h.remove_invoked("^k.$", ms(4));
                }
                _ => {
                    let u = h.write_invoked("k1", 64, ms(4), true, false);
                    h.write_completed(u, ms(6), Err(ErrorCode::TRANSFER_FAIL));
                }
            }
            h.read_absent("get", "k1", ms(10), ms(11));
            assert!(h.judge().is_empty(), "reason {reason}: {:?}", h.judge());
        }

        // Reasons that came before the write, or for another key, excuse nothing.
        let mut h = History::default();
        h.gone("k", ms(1), GoneWhy::Lost);
        let r = h.remove_invoked("^k2$", ms(4));
        h.remove_ended(r, ms(6));
        let v = h.write_invoked("k", 64, ms(2), false, false);
        h.write_completed(v, ms(3), Ok(()));
        h.read_absent("get_size", "k", ms(10), ms(11));
        assert_eq!(h.judge().len(), 1, "{:?}", h.judge());

        // A node's damaged disk copy may be missed before the master hears of it, not long
        // before; without damage on disk, not before at all.
        for rot in [false, true] {
            let mut h = History::default();
            if rot {
                h.note_disk_rot("k", ms(1));
            }
            let v = h.write_invoked("k", 64, ms(0), false, false);
            h.write_completed(v, ms(3), Ok(()));
            h.read_absent("get", "k", ms(10), ms(11));
            h.gone("k", ms(11) + DISK_REPORT_SLACK, GoneWhy::DiskDropped);
            assert_eq!(h.judge().len(), usize::from(!rot), "{:?}", h.judge());
            let mut h = History::default();
            let v = h.write_invoked("k", 64, ms(0), false, false);
            h.write_completed(v, ms(3), Ok(()));
            h.read_absent("get", "k", ms(4), ms(5));
            h.gone("k", ms(5), GoneWhy::DiskDropped);
            assert!(h.judge().is_empty(), "{:?}", h.judge());
            h.read_absent("get", "k", ms(6), ms(7));
            h.gone("k", ms(8) + DISK_REPORT_SLACK, GoneWhy::DiskDropped);
            assert!(
                h.judge().is_empty(),
                "an earlier event explains it: {:?}",
                h.judge()
            );
        }
        let mut h = History::default();
        h.note_disk_rot("k", ms(0));
        let v = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(v, ms(3), Ok(()));
        h.read_absent("get", "k", ms(4), ms(5));
        h.gone("k", ms(6) + DISK_REPORT_SLACK, GoneWhy::DiskDropped);
        assert_eq!(h.judge().len(), 1, "{:?}", h.judge());

        // Damage to one key's copy excuses no other key's early absence.
        let mut h = History::default();
        h.note_disk_rot("other", ms(0));
        let v = h.write_invoked("k", 64, ms(0), false, false);
        h.write_completed(v, ms(3), Ok(()));
        h.read_absent("get", "k", ms(4), ms(5));
        h.gone("k", ms(6), GoneWhy::DiskDropped);
        assert_eq!(h.judge().len(), 1, "{:?}", h.judge());

        // A hard-pinned value may go with its node, never by eviction.
        let mut h = History::default();
        let v = h.write_invoked("k", 64, ms(0), false, true);
        h.write_completed(v, ms(3), Ok(()));
        h.gone("k", ms(5), GoneWhy::Evicted);
        h.read_absent("get", "k", ms(10), ms(11));
        let found = h.judge();
        assert!(
            found.len() == 1 && found[0].contains("hard-pinned and evicted"),
            "{found:?}"
        );
        h.gone("k", ms(6), GoneWhy::Lost);
        assert!(h.judge().is_empty(), "{:?}", h.judge());
    }
}
