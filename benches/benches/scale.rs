//! The master at scale: its memory per object and its operation rates with tens of millions
//! of resident objects of 64-byte keys, and how long a master of ten million objects takes to
//! restart from its state directory (from its snapshot alone, and in the worst case: a
//! journal grown just short of the size at which the next snapshot begins). Targets from the issue that asked for them: at most 150
//! bytes per object; PutStart+PutEnd pairs >= 1 M/s and GetReplicaList >= 2 M/s with 100 M
//! resident; a restart of 10 M objects within 10 s.
//!
//! Run: `cargo bench -p mooring-benches --bench scale`. `MOORING_BENCH_OBJECTS` lists the
//! resident sets to measure (default `10000000`, 0 to skip; 100 M objects need about 17 GB
//! of memory);
//! `MOORING_BENCH_RESTART_OBJECTS` sets the restarted master's objects (default 10 M, 0 to
//! skip). The state directory lives under `target/restart-bench` (`MOORING_BENCH_DIR` to
//! measure another device), and is removed at the end unless `MOORING_BENCH_KEEP` is set (it
//! then holds the worst case's snapshot and journal beside the snapshot its restart wrote).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use mooring::master::MasterService;
use mooring::master::journal::{SNAPSHOT_AFTER, snapshot_due_at};
use mooring_benches::service::{Pairs, mounted, put_pairs};
use mooring_benches::{
    bench_dir, bench_runtime, filled_master_with, key64, master_ops, resident_bytes,
};
use mooring_core::MasterConfig;
use mooring_proto::state_dir::StateDir;

/// Each object's size: small, so a hundred million fit the segments' address space.
const OBJECT_SIZE: u64 = 4096;
/// 64 segments of 16 TiB, metadata only.
const SEGMENTS: u64 = 64;
const CAPACITY: u64 = SEGMENTS << 44;

fn counts(var: &str, default: usize) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![default])
}

fn label(n: usize) -> String {
    format!("{}M", n / 1_000_000)
}

/// Fills a master with `n` objects, reports its memory per object, and measures its rates.
fn resident(c: &mut Criterion) {
    for n in counts("MOORING_BENCH_OBJECTS", 10_000_000) {
        if n == 0 {
            continue;
        }
        let before = resident_bytes();
        let started = Instant::now();
        let (mut master, now) = filled_master_with(
            MasterConfig::default(),
            SEGMENTS,
            CAPACITY,
            n,
            OBJECT_SIZE,
            key64,
        );
        let fill = started.elapsed();
        let grown = resident_bytes().saturating_sub(before);
        eprintln!(
            "{} resident objects of 64-byte keys: {:.1} GB resident, {:.0} bytes per object \
             (filled at {:.2} M puts/s)",
            label(n),
            grown as f64 / 1e9,
            grown as f64 / n as f64,
            n as f64 / fill.as_secs_f64() / 1e6,
        );
        master_ops(c, &label(n), &mut master, now, n, key64);
    }
}

/// Restarts of a master whose state directory holds `n` objects put through its requests
/// (so the directory is a snapshot and the journal written since, as a master at work
/// leaves it).
fn restart(c: &mut Criterion) {
    if let Ok(how) = std::env::var(FRESH) {
        fresh(&how);
        std::process::exit(0);
    }
    for n in counts("MOORING_BENCH_RESTART_OBJECTS", 10_000_000) {
        if n == 0 {
            continue;
        }
        let dir = bench_dir("restart-bench");
        let _ = std::fs::remove_dir_all(&dir);
        let config = MasterConfig::default();
        {
            let runtime = bench_runtime();
            let service = MasterService::persistent(&dir, config.clone(), SNAPSHOT_AFTER)
                .expect("a master with a journal");
            mounted(&service, CAPACITY);
            let pairs = Pairs {
                next: Arc::new(AtomicU64::new(0)),
                object_size: OBJECT_SIZE,
                key: |i| key64(i as usize),
                in_flight: 256,
                upsert: false,
            };
            eprintln!(
                "restart: putting {} objects through a journaled master",
                label(n)
            );
            let took = put_pairs(&runtime, &service, &pairs, n as u64);
            eprintln!(
                "restart: {} pairs in {:.1} s ({:.0} k pairs/s, each acknowledged once synced)",
                label(n),
                took.as_secs_f64(),
                n as f64 / took.as_secs_f64() / 1e3
            );
        }
        let mut files: Vec<(String, u64)> = std::fs::read_dir(&dir)
            .expect("the state directory")
            .filter_map(|e| {
                let e = e.ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().ok()?.len(),
                ))
            })
            .collect();
        files.sort();
        for (name, len) in &files {
            eprintln!("restart: {name} {:.1} MB", *len as f64 / 1e6);
        }
        breakdown(&files, &dir, &config);
        // The first restart replays the journal written since the last snapshot; the ones
        // criterion times next find little journal after the snapshot the one before wrote.
        let started = Instant::now();
        let service = MasterService::persistent(&dir, config.clone(), SNAPSHOT_AFTER)
            .expect("the master restarts");
        let serving = started.elapsed();
        drop(service);
        eprintln!(
            "restart: the first restart serves after {:.2} s; its snapshot is written (in the \
             background) after {:.2} s",
            serving.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        let mut group = c.benchmark_group("restart");
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(60));
        group.bench_function(format!("{} objects", label(n)), |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let service = MasterService::persistent(&dir, config.clone(), SNAPSHOT_AFTER)
                        .expect("the master restarts");
                    elapsed += started.elapsed();
                    assert_eq!(service.stats().objects, n as u64, "every object came back");
                }
                elapsed
            })
        });
        group.finish();
        worst_restart(&dir, &config, n);
        if std::env::var_os("MOORING_BENCH_KEEP").is_some() {
            eprintln!("restart: the state directory is kept: {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// The longest restart the journal allows: upserts of the resident objects (their number
/// stays `n`) until the journal written since the snapshot is just short of the size at which
/// the next snapshot begins, then a restart, timed to serving.
fn worst_restart(dir: &std::path::Path, config: &MasterConfig, n: usize) {
    let newest = |suffix: &str| {
        std::fs::read_dir(dir)
            .expect("the state directory")
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().to_string_lossy().into_owned();
                // Numbered files only (not `journal-spare.log`).
                let stem = name.strip_suffix(suffix)?;
                stem.ends_with(|c: char| c.is_ascii_digit()).then_some(())?;
                Some((name, e.metadata().ok()?.len()))
            })
            .max()
            .expect("a file")
    };
    let (_, snapshot_len) = newest(".snap");
    let due = snapshot_due_at(SNAPSHOT_AFTER, snapshot_len);
    let target = due - due / 50;
    // A restart is a new process: its memory is all first touches (slow on a VM whose host
    // backs guest memory lazily), unlike the criterion restarts above.
    for _ in 0..2 {
        for how in ["read", "map"] {
            in_new_process(how, dir);
        }
    }
    let runtime = bench_runtime();
    let service = MasterService::persistent(dir, config.clone(), SNAPSHOT_AFTER)
        .expect("the master restarts");
    let (journal, _) = newest(".log");
    let written = || service.journal_counts().expect("a journal").bytes;
    let pairs = Pairs {
        next: Arc::new(AtomicU64::new(0)),
        object_size: OBJECT_SIZE,
        key: |i| key64(i as usize),
        in_flight: 256,
        upsert: true,
    };
    eprintln!(
        "restart: upserting until the journal holds {:.0} MB (the next snapshot begins at {:.0} \
         MB, the size of the last, {:.0} MB)",
        target as f64 / 1e6,
        due as f64 / 1e6,
        snapshot_len as f64 / 1e6
    );
    let took = Instant::now();
    let chunk = 20_000;
    while written() < target {
        let left = (target - written()) as f64 / 1e6;
        if pairs.next.load(std::sync::atomic::Ordering::Relaxed) + chunk > n as u64 {
            pairs.next.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        put_pairs(&runtime, &service, &pairs, chunk);
        if left > 100.0 && written() as f64 / 1e6 % 200.0 < 3.0 {
            eprintln!("restart: journal {:.0} MB", written() as f64 / 1e6);
        }
    }
    let upserts = pairs.next.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "restart: {:.0} MB of journal in {:.1} s ({upserts} upserts in the last pass)",
        written() as f64 / 1e6,
        took.elapsed().as_secs_f64()
    );
    drop(service);
    drop(runtime);
    let (after, _) = newest(".log");
    if after != journal {
        eprintln!(
            "restart: a snapshot began after all ({journal} then {after}): not the worst case"
        );
    }
    in_new_process("recover", dir);
    let started = Instant::now();
    let service = MasterService::persistent(dir, config.clone(), SNAPSHOT_AFTER)
        .expect("the master restarts");
    let serving = started.elapsed();
    assert_eq!(service.stats().objects, n as u64, "every object came back");
    drop(service);
    eprintln!(
        "restart: the worst case (the snapshot, then {:.0} MB of journal) serves after {:.2} s",
        target as f64 / 1e6,
        serving.as_secs_f64()
    );
}

/// Where a restart's time goes, measured once: reading the newest snapshot, restoring it
/// (which checks every invariant of the restored state), and that check alone.
fn breakdown(files: &[(String, u64)], dir: &std::path::Path, config: &MasterConfig) {
    let Some((newest, _)) = files.iter().rev().find(|(name, _)| name.ends_with(".snap")) else {
        return;
    };
    let started = Instant::now();
    let state_dir = mooring_disk::PosixStateDir::new(dir);
    let snapshot = state_dir.read_whole(newest).expect("the snapshot");
    let read = started.elapsed();
    let started = Instant::now();
    let master = mooring::master::journal::restore_snapshot(config.clone(), snapshot.bytes())
        .expect("it restores");
    let restored = started.elapsed();
    let started = Instant::now();
    mooring_core::invariants::check(&master).expect("it holds");
    let checked = started.elapsed();
    eprintln!(
        "restart: mapping {newest} {:.2} s; restoring it {:.2} s, of which checking its \
         invariants {:.2} s",
        read.as_secs_f64(),
        restored.as_secs_f64(),
        checked.as_secs_f64()
    );
    drop((master, snapshot));
    // Recovery as a restart runs it: the snapshot, then the journal written since.
    let started = Instant::now();
    let recovered =
        mooring::master::journal::recover(&state_dir, config.clone()).expect("it recovers");
    eprintln!(
        "restart: recovering (the snapshot, then {} journal records) {:.2} s",
        recovered.replayed,
        started.elapsed().as_secs_f64()
    );
}

/// Set in a child process the restart bench starts: `HOW:DIR`, what [`fresh`] does.
const FRESH: &str = "MOORING_BENCH_FRESH_RESTART";

/// Runs [`fresh`] in a new process of this bench, and waits for it.
fn in_new_process(how: &str, dir: &std::path::Path) {
    let status = std::process::Command::new(std::env::current_exe().expect("this bench"))
        .args(["--bench", "restart"])
        .env(FRESH, format!("{how}:{}", dir.display()))
        .env("MOORING_BENCH_OBJECTS", "0")
        .status()
        .expect("a new process");
    assert!(status.success(), "the new process failed: {status}");
}

/// In a new process: `read:DIR` reads the newest snapshot in DIR into memory and restores it,
/// `map:DIR` maps it and restores it (as recovery does), `recover:DIR` recovers DIR as a
/// restart does (the snapshot, then the journal since; nothing is written), `decode:DIR`
/// reads and decodes DIR's journals and applies nothing.
fn fresh(how: &str) {
    let (how, dir) = how.split_once(':').expect("HOW:DIR");
    let state_dir = mooring_disk::PosixStateDir::new(dir);
    let started = Instant::now();
    if how == "decode" {
        decode_only(&state_dir, started);
        return;
    }
    if how == "recover" {
        let recovered = mooring::master::journal::recover(&state_dir, MasterConfig::default())
            .expect("it recovers");
        eprintln!(
            "restart: in a new process, recovering (the snapshot, then {} journal records) {:.2} s",
            recovered.replayed,
            started.elapsed().as_secs_f64()
        );
        return;
    }
    let newest = (state_dir.list().expect("the state directory").into_iter())
        .filter(|name| name.starts_with("snapshot-") && name.ends_with(".snap"))
        .max()
        .expect("a snapshot");
    let snapshot = match how {
        "read" => mooring_proto::state_dir::read_into_memory(&state_dir, &newest),
        _ => state_dir.read_whole(&newest),
    }
    .expect("the snapshot");
    let read = started.elapsed();
    let master =
        mooring::master::journal::restore_snapshot(MasterConfig::default(), snapshot.bytes())
            .expect("it restores");
    eprintln!(
        "restart: in a new process, {} {newest} {:.2} s, then restoring it {:.2} s ({} objects)",
        if how == "read" { "reading" } else { "mapping" },
        read.as_secs_f64(),
        (started.elapsed() - read).as_secs_f64(),
        master.stats().objects
    );
}

/// Reads and decodes every journal in `dir` as recovery does, applying nothing: what a
/// replay costs before the master does any work.
fn decode_only(dir: &mooring_disk::PosixStateDir, started: Instant) {
    use mooring_proto::state_dir::{OpenMode, StateDir};
    let mut records = 0u64;
    let journals = (dir.list().expect("the state directory").into_iter())
        .filter(|name| name.starts_with("journal-0") && name.ends_with(".log"));
    for name in journals {
        let generation: u64 = name["journal-".len()..name.len() - ".log".len()]
            .parse()
            .expect("a journal's generation");
        let file = dir.open(&name, OpenMode::Read).expect("the journal");
        let len = file.len().expect("its length");
        mooring_proto::journal::replay(
            generation,
            len,
            mooring_proto::journal::REPLAY_PIECE,
            |buf, at| file.read_at(buf, at),
            |_, input| {
                records += 1;
                std::hint::black_box(input);
                Ok::<(), std::io::Error>(())
            },
        )
        .expect("it decodes");
    }
    eprintln!(
        "restart: in a new process, decoding {records} journal records alone {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

criterion_group!(benches, resident, restart);
criterion_main!(benches);
