//! Which rare paths a run exercised, and the floors a seed set must reach.
//!
//! A run's coverage comes from three places: the master's own events (evictions of each
//! kind, discarded writes by cause, objects lost with a node), the services' simulation-only
//! counters ([`mooring::coverage`]: reads from disk, fallbacks, disk eviction, damaged disk
//! copies, recovery), and the history (reads that found nothing, upserts that landed). Over a
//! seed set, each floored path must be reached in at least its share of the seeds; `run`
//! prints the table and fails when a path falls short, so a change that quietly stops the
//! simulation from reaching a path is caught like a bug.

use std::collections::BTreeMap;

use mooring_core::{DiscardCause, Event, UpsertCounts};

use mooring::node::disk_tier::DiskBackend;

use crate::history::History;
use crate::plan::Transport;

/// Paths and the share of seeds (in a set of [`FLOOR_MIN_SEEDS`] or more) that must reach
/// each: about two thirds of what the CI's 200 seeds reached when they were set (the table
/// `scripts/sim.sh ci` prints; a quarter of the seeds have no disks). They catch a path
/// that stops being reached. The rarest (a writer dying mid-write before its write times
/// out, damaged disk copies) are reached in only 2-5% of seeds.
pub const FLOORS: &[(&str, f64)] = &[
    // 86-91% of seeds in sweeps of 2,100 seeds on 2026-12-04 (every transport): 90% failed
    // runs that reached it as often as ever.
    (EVICTED, 0.80),
    (EVICTED_TO_DISK, 0.50),
    (DISK_COPY_DROPPED, 0.12),
    // Window eviction no longer takes objects waiting for their disk copy, which in seeds
    // with disks (three quarters) were most of its victims: reached in 27% of CI's 200
    // seeds and 21% of 400 since (66% before, values lost among them).
    (CONTIGUOUS, 0.15),
    (SOFT_PINNED_EVICTED, 0.75),
    (PREEMPTED, 0.90),
    (TIMED_OUT, 0.20),
    (WRITER_DIED, 0.02),
    (ABORTED, 0.60),
    (LOST, 0.90),
    (ABSENCE_JUDGED, 0.95),
    (UPSERT_LANDED, 0.95),
    (UPSERT_CREATED, 0.90),
    (UPSERT_IN_PLACE, 0.90),
    (UPSERT_COPIED, 0.90),
    (UPSERT_RESIZED, 0.90),
    ("read from a disk copy", 0.50),
    ("read fell back to another replica", 0.60),
    ("read outlived its lease", 0.20),
    ("node evicted from its disk", 0.25),
    ("disk copy found damaged", 0.01),
    // 58% of CI's 200 seeds since disk seeds kill nodes partway through disk writes (6%
    // before).
    ("recovery dropped records", 0.40),
    // Reached in 2-3% of seeds as timings shift (5 of CI's 200 now, at least 6 before the
    // data-plane messages grew): a floor of 2% still fails the day it stops happening.
    ("staging buffer ran full", 0.02),
    ("held read outlasted its lease", 0.20),
    // 7% of 1,000 mixed seeds, 4% of 200 RDMA seeds (2026-12-04).
    ("damaged prefetch refused", 0.03),
    // Measured over 800 seeds: 98% and 57%.
    ("replica lost with a node repaired", 0.90),
    ("repair copy failed and was queued again", 0.30),
    // A third of the seeds kill the master.
    ("master recovered from its journal", 0.25),
    // A lone master's deaths tear its journal's tail (a third of its kills) or flip a bit in
    // a synced record (a third), and 30% of seeds with faults fill its disk for a while:
    // reached in 12%, 7% and 14% of CI's 200 seeds.
    ("journal tail torn by a crash, dropped", 0.03),
    ("damaged journal refused at start", 0.04),
    ("state directory full, changes refused", 0.09),
    // A fifth of the seeds with faults fail the master's syncs for a while: 11% of CI's 200.
    ("journal sync failed, master stopped changes", 0.07),
    // Half the TCP seeds that kill the master run a group instead (a sixth of TCP seeds);
    // 19% of 400 TCP seeds took over. Counted over TCP and transport-sim seeds
    // ([`reachable`]), 30% of the latter running groups: 23% of CI's 200 seeds took over.
    (STANDBY_TOOK_OVER, 0.08),
    // A writer cut off from the master (or whose answers broke off for a TTL) refuses to
    // write: 20% of CI's 200 seeds on 2026-11-27.
    ("write fenced before its transfers", 0.08),
    // Copy and move tasks started beside the workload (not in RDMA runs) and followed with
    // QueryTask: 100% and 62% of CI's 200 seeds.
    (TASK_SUCCEEDED, 0.90),
    // Half the TCP seeds with faults add the stranger, and with it the insider (counted over
    // TCP seeds, [`reachable`]).
    (INSIDER_REFUSED, 0.15),
    (TASK_FAILED, 0.40),
    // Half the moves of seeds with faults lose their target between its write and the
    // task's end (the supervisor remounts its node), so a move must keep its source.
    (TASK_TARGET_TAKEN, 0.20),
    // The master's audit checked blocks reused after each kind of promise, and the history's
    // standing checked a hard pin through a later write: 85%, 96% and 99% of CI's 200 seeds on
    // 2026-11-27. A block reused early because its writer was declared dead has no floor since
    // 2026-11-28: a writer is declared dead a client TTL after it was last heard, when its
    // writes' fence has long closed and their blocks are free already (0 of 200 seeds).
    (REUSED_AFTER_WRITER_DELAY, 0.55),
    (REUSED_AFTER_READERS, 0.65),
    (PIN_KEPT_THROUGH_WRITE, 0.65),
    // Half the seeds with faults remount nodes under traffic: 44% and 50% of the sim and TCP
    // seeds among 100 default seeds. Each share is of the seeds over that transport.
    (REMOUNTED[0].1, 0.25),
    (REMOUNTED[1].1, 0.25),
    (REMOUNTED[2].1, 0.25),
    (REMOUNTED[3].1, 0.25),
    // Half the seeds with faults hold up to three writes partway: a same-host writer's
    // process paused mid-copy past its release (36% of 200 shm seeds on 2026-11-29), a
    // node's receipt of a write held across a remount (34% of 200 TCP seeds).
    (SHM_WRITE_HELD, 0.20),
    (NODE_WRITE_HELD_REMOUNTED, 0.20),
    // 30% of the transport-sim seeds run a group whose leader is killed: 28 of CI's 100
    // sim seeds lost a leader to a kill, and 46 of its 200 seeds judged a takeover against
    // the acknowledged changes (2026-11-27).
    (LEADER_KILLED_SIM, 0.18),
    (FAILOVER_VERIFIED, 0.15),
    // Each disk backend's recovery, counted over the seeds that run that backend
    // ([`reachable`]): nodes killed partway through a disk write, most after a bit flip in
    // a record (the plan's disk crashes). Of CI's 200 seeds, recovery dropped records in 83%
    // of the bucket seeds, 88% of the file-per-key ones and 61% of the offset-file ones, and
    // found records in 96% of each.
    (RECOVERY_DROPPED_BUCKET, 0.55),
    (RECOVERY_DROPPED_FILE_PER_KEY, 0.55),
    (RECOVERY_DROPPED_OFFSET_FILE, 0.40),
    (RECOVERY_CHECKED_BUCKET, 0.65),
    (RECOVERY_CHECKED_FILE_PER_KEY, 0.65),
    (RECOVERY_CHECKED_OFFSET_FILE, 0.65),
];

/// Recovery by each backend (see `mooring::coverage`).
const RECOVERY_DROPPED_BUCKET: &str = "recovery dropped records (bucket)";
const RECOVERY_DROPPED_FILE_PER_KEY: &str = "recovery dropped records (file per key)";
const RECOVERY_DROPPED_OFFSET_FILE: &str = "recovery dropped records (offset file)";
const RECOVERY_CHECKED_BUCKET: &str = "recovery checked records (bucket)";
const RECOVERY_CHECKED_FILE_PER_KEY: &str = "recovery checked records (file per key)";
const RECOVERY_CHECKED_OFFSET_FILE: &str = "recovery checked records (offset file)";

/// The disk backend whose seeds alone can reach `path`, if one.
fn backend_of(path: &str) -> Option<DiskBackend> {
    match path {
        RECOVERY_DROPPED_BUCKET | RECOVERY_CHECKED_BUCKET => Some(DiskBackend::Bucket),
        RECOVERY_DROPPED_FILE_PER_KEY | RECOVERY_CHECKED_FILE_PER_KEY => {
            Some(DiskBackend::FilePerKey)
        }
        RECOVERY_DROPPED_OFFSET_FILE | RECOVERY_CHECKED_OFFSET_FILE => {
            Some(DiskBackend::OffsetFile)
        }
        _ => None,
    }
}

/// A block an abandoned write held, reused once its release delay ran out (the master's
/// audit checks each reuse against the delay it works out for itself).
pub const REUSED_AFTER_WRITER_DELAY: &str = "block reused after its abandoned writer's delay";
/// A block an abandoned write held, reused early because its writer was declared dead.
pub const REUSED_AFTER_WRITER_DEATH: &str = "block reused early: its writer declared dead";
/// A block of a leased value, reused once its readers' lease and grace were over.
pub const REUSED_AFTER_READERS: &str = "block reused after its readers' lease and grace";
/// A hard pin checked on an object whose latest write did not ask for one.
pub const PIN_KEPT_THROUGH_WRITE: &str = "hard pin kept through a later write";

/// A node remounted its segment under traffic, per transport (each data path must refuse
/// transfers for the old mount).
const REMOUNTED: [(Transport, &str); 4] = [
    (Transport::Tcp, "segment remounted under traffic (tcp)"),
    (Transport::Sim, "segment remounted under traffic (sim)"),
    (Transport::Rdma, "segment remounted under traffic (rdma)"),
    (Transport::Shm, "segment remounted under traffic (shm)"),
];

/// The coverage path of a remount under traffic over `transport`.
pub fn remounted(transport: Transport) -> &'static str {
    REMOUNTED
        .iter()
        .find(|(t, _)| *t == transport)
        .map(|(_, path)| *path)
        .expect("every transport is listed")
}

/// Floors are checked only over at least this many seeds (fewer say little about shares).
pub const FLOOR_MIN_SEEDS: usize = 100;

/// Whether seeds over `transport` can reach `path` at all. A floor is a share of the seeds in
/// a set that can, and a set with none of them is not held to it.
fn reachable(path: &str, transport: Transport, backend: Option<DiskBackend>) -> bool {
    if let Some(only) = backend_of(path) {
        return backend == Some(only);
    }
    match path {
        // Groups of masters run over TCP and transport-sim.
        STANDBY_TOOK_OVER | FAILOVER_VERIFIED => {
            matches!(transport, Transport::Tcp | Transport::Sim)
        }
        LEADER_KILLED_SIM => transport == Transport::Sim,
        // The insider knocks in TCP seeds with a stranger.
        INSIDER_REFUSED => transport == Transport::Tcp,
        // Hold points in the same-host client's copy and the TCP data server's receipt.
        SHM_WRITE_HELD => transport == Transport::Shm,
        NODE_WRITE_HELD_REMOUNTED => transport == Transport::Tcp,
        // RDMA runs start no copy or move tasks (see the workload).
        TASK_SUCCEEDED | TASK_FAILED | TASK_TARGET_TAKEN => transport != Transport::Rdma,
        _ => REMOUNTED
            .iter()
            .find(|(_, p)| *p == path)
            .is_none_or(|(t, _)| *t == transport),
    }
}

const STANDBY_TOOK_OVER: &str = "standby took over from its copy";
const SHM_WRITE_HELD: &str = "same-host write held mid-copy past its release";
const NODE_WRITE_HELD_REMOUNTED: &str = "write held at its node across a remount";
const INSIDER_REFUSED: &str = "insider refused at the master";

/// A sim-transport seed's group lost its leader to a kill (see `run::faults`).
pub const LEADER_KILLED_SIM: &str = "standby group lost its leader to a kill (sim transport)";
/// A master that took over was judged against the changes acknowledged before, with at
/// least one key the history had something to say about (see [`crate::takeover`]).
pub const FAILOVER_VERIFIED: &str = "failover verified against acknowledged changes";

const EVICTED: &str = "evicted from memory";
const EVICTED_TO_DISK: &str = "evicted to its disk copy";
const DISK_COPY_DROPPED: &str = "disk copy dropped";
const CONTIGUOUS: &str = "evicted for a contiguous range";
const SOFT_PINNED_EVICTED: &str = "soft-pinned evicted";
const PREEMPTED: &str = "write preempted";
const TIMED_OUT: &str = "write timed out";
const WRITER_DIED: &str = "writer died mid-write";
const ABORTED: &str = "write aborted";
const LOST: &str = "object lost with its node";
const ABSENCE_JUDGED: &str = "read that found nothing judged";
const UPSERT_LANDED: &str = "upsert landed";
const UPSERT_CREATED: &str = "upsert case A (new key)";
const UPSERT_IN_PLACE: &str = "upsert case B (in place)";
const UPSERT_COPIED: &str = "upsert case B (copied beside readers)";
const UPSERT_RESIZED: &str = "upsert case C (new size)";
const TASK_SUCCEEDED: &str = "copy or move task followed to success";
const TASK_FAILED: &str = "copy or move task followed to failure";
/// A move's target was taken away between its write and the task's end (see
/// `run::faults`).
pub const TASK_TARGET_TAKEN: &str = "move's target taken away before its end";

/// The master's upserts by case (docs/upsert.md), as paths.
pub fn of_upserts(upserts: &UpsertCounts) -> [(&'static str, u64); 4] {
    [
        (UPSERT_CREATED, upserts.created),
        (UPSERT_IN_PLACE, upserts.in_place),
        (UPSERT_COPIED, upserts.copied),
        (UPSERT_RESIZED, upserts.resized),
    ]
}

/// The path a master event stands for.
pub fn of_event(event: &Event) -> &'static str {
    match event {
        Event::Evicted {
            contiguous: true, ..
        } => CONTIGUOUS,
        Event::Evicted {
            soft_pinned: true, ..
        } => SOFT_PINNED_EVICTED,
        Event::Evicted {
            kept_on_disk: true, ..
        } => EVICTED_TO_DISK,
        Event::Evicted { bytes: 0, .. } => DISK_COPY_DROPPED,
        Event::Evicted { .. } => EVICTED,
        Event::PrefetchFailed { .. } => "prefetch without room",
        Event::WriteDiscarded { cause, .. } => match cause {
            DiscardCause::Preempted => PREEMPTED,
            DiscardCause::Timeout => TIMED_OUT,
            DiscardCause::WriterDead => WRITER_DIED,
            DiscardCause::WriterLeft => "writer left mid-write",
            DiscardCause::Aborted => ABORTED,
            DiscardCause::ReplicasLost => "prefetch into a leaving segment",
            DiscardCause::PrefetchRevoked => "damaged prefetch of a dropped disk copy revoked",
        },
        Event::ObjectLost { .. } => LOST,
        Event::ReadableCopyLost { .. } => "prefetch lost its disk copy",
        Event::SegmentUnmounted { .. } => "segment unmounted",
        Event::ClientExpired { .. } => "client expired",
        Event::ClientLeft { .. } => "client left",
    }
}

/// A run's coverage: the master's events by kind, the services' counters, the history's.
pub fn of_run(
    mut events: BTreeMap<&'static str, u64>,
    history: &History,
) -> BTreeMap<&'static str, u64> {
    for (path, n) in mooring::coverage::take() {
        *events.entry(path).or_default() += n;
    }
    let (_, _, absences) = history.sizes();
    let upserts = history.tally.get("upsert", "ok") + history.tally.get("batch_upsert", "ok");
    let tasks =
        |outcome| history.tally.get("copy_task", outcome) + history.tally.get("move_task", outcome);
    for (path, n) in [
        (ABSENCE_JUDGED, absences as u64),
        (UPSERT_LANDED, upserts),
        (TASK_SUCCEEDED, tasks("succeeded")),
        (TASK_FAILED, tasks("failed")),
    ] {
        if n > 0 {
            events.insert(path, n);
        }
    }
    events
}

/// Coverage summed over a seed set.
#[derive(Default)]
pub struct Totals {
    /// The transport and disk backend of each seed.
    seeds: Vec<(Transport, Option<DiskBackend>)>,
    /// Path -> (seeds that reached it, times in all).
    paths: BTreeMap<&'static str, (usize, u64)>,
}

impl Totals {
    /// Adds the coverage of one run over `transport`.
    pub fn add(&mut self, coverage: &BTreeMap<&'static str, u64>, transport: Transport) {
        self.add_with_disk(coverage, transport, None);
    }

    /// Adds the coverage of one run over `transport` whose nodes' disks use `backend`.
    pub fn add_with_disk(
        &mut self,
        coverage: &BTreeMap<&'static str, u64>,
        transport: Transport,
        backend: Option<DiskBackend>,
    ) {
        self.seeds.push((transport, backend));
        for (&path, &n) in coverage {
            let entry = self.paths.entry(path).or_default();
            entry.0 += usize::from(n > 0);
            entry.1 += n;
        }
    }

    /// The table: every path reached or floored, with its seeds, count and floor.
    pub fn table(&self) -> String {
        let mut out = format!(
            "coverage over {} seeds (seeds reaching each path, times in all, floor):\n",
            self.seeds.len()
        );
        let mut names: Vec<&str> = self.paths.keys().copied().collect();
        names.extend(
            FLOORS
                .iter()
                .map(|(p, _)| *p)
                .filter(|p| !self.paths.contains_key(p)),
        );
        for name in names {
            let (seeds, times) = self.paths.get(name).copied().unwrap_or_default();
            let floor = FLOORS
                .iter()
                .find(|(p, _)| *p == name)
                .map_or(String::new(), |(_, f)| format!("  floor {:.0}%", f * 100.0));
            // A share of the seeds that can reach the path (see [`reachable`]).
            let able = self
                .seeds
                .iter()
                .filter(|&&(t, b)| reachable(name, t, b))
                .count();
            let of_able = match able == self.seeds.len() {
                true => String::new(),
                false => format!(" of {able} able"),
            };
            out.push_str(&format!(
                "  {name:<36} {seeds:>5} ({:>3.0}%) {times:>8}{floor}{of_able}\n",
                100.0 * seeds as f64 / able.max(1) as f64
            ));
        }
        out
    }

    /// The floored paths reached by fewer seeds than their floor (only over
    /// [`FLOOR_MIN_SEEDS`] or more seeds).
    pub fn short_of_floors(&self) -> Vec<String> {
        if self.seeds.len() < FLOOR_MIN_SEEDS {
            return Vec::new();
        }
        FLOORS
            .iter()
            .filter_map(|&(path, floor)| {
                let seeds = self.paths.get(path).map_or(0, |p| p.0);
                let out_of = self
                    .seeds
                    .iter()
                    .filter(|&&(t, b)| reachable(path, t, b))
                    .count();
                if out_of == 0 {
                    return None;
                }
                let which = match out_of == self.seeds.len() {
                    true => "",
                    false => " able",
                };
                let share = seeds as f64 / out_of as f64;
                (share < floor).then(|| {
                    format!(
                        "{path:?} was reached in {seeds} of {out_of}{which} seeds ({:.0}%), under its floor of {:.0}%",
                        share * 100.0,
                        floor * 100.0
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_reached_too_rarely_falls_short_of_its_floor() {
        let mut totals = Totals::default();
        for i in 0..FLOOR_MIN_SEEDS {
            let mut run = BTreeMap::new();
            for &(path, floor) in FLOORS {
                // Every path at its floor exactly, except "write preempted", one seed short.
                let reached = (i as f64)
                    < floor * FLOOR_MIN_SEEDS as f64 - f64::from(u8::from(path == PREEMPTED));
                if reached {
                    run.insert(path, 1);
                }
            }
            totals.add(&run, Transport::Tcp);
        }
        let short = totals.short_of_floors();
        assert_eq!(short.len(), 1, "{short:?}");
        assert!(short[0].contains("write preempted"), "{short:?}");
        assert!(totals.table().contains("write preempted"));
    }

    #[test]
    fn paths_some_transports_cannot_reach_are_floored_over_the_seeds_that_can() {
        let everything_but_standby = || -> BTreeMap<&'static str, u64> {
            FLOORS
                .iter()
                .filter(|(path, _)| *path != STANDBY_TOOK_OVER)
                .map(|&(path, _)| (path, 1))
                .collect()
        };
        let mut without_tcp = Totals::default();
        for _ in 0..FLOOR_MIN_SEEDS {
            without_tcp.add(&everything_but_standby(), Transport::Shm);
        }
        assert_eq!(without_tcp.short_of_floors(), Vec::<String>::new());
        let mut rdma = Totals::default();
        for _ in 0..FLOOR_MIN_SEEDS {
            let mut run = everything_but_standby();
            run.remove(TASK_SUCCEEDED);
            run.remove(TASK_FAILED);
            rdma.add(&run, Transport::Rdma);
        }
        assert_eq!(rdma.short_of_floors(), Vec::<String>::new());
        // A mixed set: the TCP half must reach it in its floor's share of the TCP seeds.
        let mut mixed = Totals::default();
        for i in 0..FLOOR_MIN_SEEDS {
            let mut run = everything_but_standby();
            let tcp = i % 2 == 0;
            if tcp && i < 6 {
                run.insert(STANDBY_TOOK_OVER, 1);
            }
            mixed.add(&run, if tcp { Transport::Tcp } else { Transport::Shm });
        }
        let short = mixed.short_of_floors();
        assert_eq!(short.len(), 1, "3 of 50 TCP seeds is 6%: {short:?}");
        assert!(short[0].contains("3 of 50 able seeds"), "{short:?}");
    }

    #[test]
    fn recovery_floors_count_the_seeds_of_their_backend_alone() {
        let backends = [
            None,
            Some(DiskBackend::Bucket),
            Some(DiskBackend::FilePerKey),
            Some(DiskBackend::OffsetFile),
        ];
        let mut totals = Totals::default();
        for i in 0..FLOOR_MIN_SEEDS {
            let backend = backends[i % 4];
            // The 25 seeds of each backend: bucket reaches its paths in 20 (80%), file per
            // key in 10 (40%, under its floors), offset file in all.
            let nth = i / 4;
            let mut run: BTreeMap<&'static str, u64> = FLOORS
                .iter()
                .filter(|(path, _)| backend_of(path).is_none())
                .map(|&(path, _)| (path, 1))
                .collect();
            let reached = match backend {
                Some(DiskBackend::Bucket) => nth < 20,
                Some(DiskBackend::FilePerKey) => nth < 10,
                _ => true,
            };
            for &(path, _) in FLOORS {
                if reached && backend.is_some() && backend_of(path) == backend {
                    run.insert(path, 1);
                }
            }
            totals.add_with_disk(&run, Transport::Sim, backend);
        }
        let short = totals.short_of_floors();
        assert_eq!(short.len(), 2, "{short:?}");
        for line in &short {
            assert!(line.contains("(file per key)"), "{short:?}");
            assert!(line.contains("10 of 25 able seeds"), "{short:?}");
        }
        assert!(totals.table().contains("of 25 able"));
    }
}
