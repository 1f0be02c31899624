//! Every backend (file-per-key, bucket, offset-file) on every disk (POSIX buffered and direct,
//! io_uring, simulated): round trips, versions, replace and remove, restart and recovery,
//! damaged data dropped and never served, crashes at random points never leaving a wrong
//! value nor losing an acknowledged one, and concurrent use.

#![cfg(not(madsim))]

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use mooring_core::rng::Rng;
use mooring_disk::backend::read_len;
use mooring_disk::{
    Backend, Bucket, DATA_FILE, FilePerKey, Held, IoMode, Item, OffsetFile, PosixDisk,
};
use mooring_proto::disk::{Disk, IoBuf, IoResult, write_copy};
use mooring_proto::transport::BoxFuture;
use mooring_transport_sim::disk::{DiskFaults, SimDisk};

/// A fresh directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("mooring-backends-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    FilePerKey,
    Bucket,
    OffsetFile,
}

const KINDS: [Kind; 3] = [Kind::FilePerKey, Kind::Bucket, Kind::OffsetFile];

/// The offset-file backend's capacity in these tests.
const CAPACITY: u64 = 4 << 20;

fn make(kind: Kind, disk: Arc<dyn Disk>) -> Box<dyn Backend> {
    match kind {
        Kind::FilePerKey => Box::new(FilePerKey::new(disk)),
        Kind::Bucket => Box::new(Bucket::new(disk)),
        Kind::OffsetFile => Box::new(OffsetFile::open(disk, CAPACITY).unwrap()),
    }
}

/// A backend on an empty disk, recovered (nothing found).
async fn fresh(kind: Kind, disk: Arc<dyn Disk>) -> Box<dyn Backend> {
    let backend = make(kind, disk);
    let found = backend.recover().await.unwrap();
    assert_eq!(found.objects, vec![], "{kind:?}");
    backend
}

/// Value bytes unique to `(key, version)`, of varied lengths (empty, below, at and above a
/// 4 KiB block).
fn value(key: &str, version: u64) -> Vec<u8> {
    let seed = crc32c::crc32c(key.as_bytes()) as u64 ^ version.wrapping_mul(0x9E37_79B9);
    let len = match seed % 7 {
        0 => 0,
        1 => 4096 - 32 - key.len(), // the record fills one block exactly
        _ => (seed % 13_000) as usize,
    };
    (0..len)
        .map(|i| (seed as usize).wrapping_add(i * 131 + i / 7) as u8)
        .collect()
}

async fn read_value(
    backend: &dyn Backend,
    key: &str,
    version: u64,
    len: u64,
) -> io::Result<Vec<u8>> {
    let a = backend.alignment();
    let buf = IoBuf::new(read_len(key, len, a), a);
    let (buf, read) = backend.read(key, version, buf).await;
    Ok(buf[read?].to_vec())
}

/// Puts `(key, version)` pairs as one group, with [`value`]s.
async fn put(backend: &dyn Backend, writes: &[(&str, u64)]) -> io::Result<Vec<Held>> {
    let values: Vec<Vec<u8>> = writes.iter().map(|&(k, v)| value(k, v)).collect();
    let items: Vec<Item<'_>> = writes
        .iter()
        .zip(&values)
        .map(|(&(key, version), value)| Item {
            key,
            version,
            value,
        })
        .collect();
    backend.put_items(&items).await
}

/// What the backend should hold: key → version.
type Model = BTreeMap<String, u64>;

/// Every value of `model` reads back byte-exact.
async fn check_reads(backend: &dyn Backend, model: &Model) {
    for (key, &version) in model {
        let want = value(key, version);
        let got = read_value(backend, key, version, want.len() as u64).await;
        assert_eq!(
            got.unwrap_or_else(|e| panic!("{}: {key} v{version}: {e}", backend.name())),
            want,
            "{}: {key} v{version}",
            backend.name()
        );
    }
}

fn assert_not_found(result: io::Result<Vec<u8>>, what: &str) {
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => panic!("{what}: expected NotFound, got {other:?}"),
    }
}

fn held_set(held: &[Held]) -> BTreeSet<(String, u64, u64)> {
    held.iter()
        .map(|h| (h.key.clone(), h.version, h.len))
        .collect()
}

fn model_set(model: &Model) -> BTreeSet<(String, u64, u64)> {
    model
        .iter()
        .map(|(k, &v)| (k.clone(), v, value(k, v).len() as u64))
        .collect()
}

/// Groups, reads, versions, replace across groups, removes; then a new instance recovers
/// exactly what is left.
async fn exercise(kind: Kind, disk: Arc<dyn Disk>) {
    let backend = fresh(kind, disk.clone()).await;
    let b = backend.as_ref();
    let mut model = Model::new();
    let keys: Vec<String> = (0..21).map(|i| format!("group/k{i}")).collect();
    let k = |i: usize| keys[i].as_str();

    let first: Vec<(&str, u64)> = (0..10).map(|i| (k(i), 1)).collect();
    let second: Vec<(&str, u64)> = (10..20).map(|i| (k(i), 1)).collect();
    let held1 = put(b, &first).await.unwrap();
    let held2 = put(b, &second).await.unwrap();
    for (held, writes) in [(&held1, &first), (&held2, &second)] {
        let want: Vec<(String, u64, u64)> = writes
            .iter()
            .map(|&(k, v)| (k.to_string(), v, value(k, v).len() as u64))
            .collect();
        let got: Vec<(String, u64, u64)> = held
            .iter()
            .map(|h| (h.key.clone(), h.version, h.len))
            .collect();
        assert_eq!(got, want, "{kind:?}: put returns its items in order");
        model.extend(writes.iter().map(|&(k, v)| (k.to_string(), v)));
    }
    let units1: BTreeSet<u64> = held1.iter().map(|h| h.unit).collect();
    let units2: BTreeSet<u64> = held2.iter().map(|h| h.unit).collect();
    assert!(
        units1.is_disjoint(&units2),
        "{kind:?}: {units1:?} {units2:?}"
    );
    if kind == Kind::Bucket {
        assert_eq!((units1.len(), units2.len()), (1, 1), "one bucket per put");
    } else {
        assert_eq!((units1.len(), units2.len()), (10, 10), "one unit per value");
    }
    check_reads(b, &model).await;
    let len0 = value(k(0), 1).len() as u64;
    assert_not_found(read_value(b, k(0), 2, len0).await, "wrong version");
    assert_not_found(read_value(b, "group/absent", 1, 10).await, "absent key");

    // Replace keys from both earlier groups, with a new key alongside.
    put(b, &[(k(3), 2), (k(12), 2), (k(20), 1)]).await.unwrap();
    model.extend([(k(3).into(), 2), (k(12).into(), 2), (k(20).into(), 1)]);
    let len3 = value(k(3), 1).len() as u64;
    assert_not_found(read_value(b, k(3), 1, len3).await, "replaced version");
    check_reads(b, &model).await;

    // Removes name a write: k12 holds write 2, so removing write 1 keeps it.
    let removes: Vec<(String, u64)> = vec![
        (k(5).into(), 1),
        (k(6).into(), 1),
        (k(12).into(), 1),
        ("group/absent".into(), 1),
    ];
    b.remove(&removes).await.unwrap();
    model.remove(k(5));
    model.remove(k(6));
    let len5 = value(k(5), 1).len() as u64;
    assert_not_found(read_value(b, k(5), 1, len5).await, "removed");
    check_reads(b, &model).await;
    drop(backend);

    let restarted = make(kind, disk);
    let found = restarted.recover().await.unwrap();
    assert_eq!(found.dropped, vec![], "{kind:?}");
    assert_eq!(held_set(&found.objects), model_set(&model), "{kind:?}");
    check_reads(restarted.as_ref(), &model).await;
    // And it keeps working after recovery.
    put(restarted.as_ref(), &[(k(0), 3)]).await.unwrap();
    model.insert(k(0).into(), 3);
    check_reads(restarted.as_ref(), &model).await;
}

async fn exercise_all(disk: impl Fn(&str) -> Arc<dyn Disk>) {
    for kind in KINDS {
        exercise(kind, disk(&format!("{kind:?}"))).await;
    }
}

#[tokio::test]
async fn posix_buffered_round_trip_and_restart() {
    let dir = TempDir::new("buffered");
    exercise_all(|tag| Arc::new(PosixDisk::open(dir.0.join(tag), IoMode::Buffered).unwrap())).await;
}

#[tokio::test]
async fn posix_direct_round_trip_and_restart() {
    let dir = TempDir::new("direct");
    if let Err(e) = PosixDisk::open(&dir.0, IoMode::Direct) {
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        eprintln!("skipping the direct-I/O backends test: {e}");
        return;
    }
    exercise_all(|tag| Arc::new(PosixDisk::open(dir.0.join(tag), IoMode::Direct).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_uring_round_trip_and_restart() {
    let dir = TempDir::new("uring");
    if let Err(e) = mooring_disk::UringDisk::open(&dir.0, IoMode::Direct) {
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        eprintln!("skipping the io_uring backends test: {e}");
        return;
    }
    exercise_all(|tag| {
        Arc::new(mooring_disk::UringDisk::open(dir.0.join(tag), IoMode::Direct).unwrap())
    })
    .await;
}

#[tokio::test]
async fn simulated_round_trip_and_restart() {
    exercise_all(|_| Arc::new(SimDisk::with_alignment(3, 512))).await;
    exercise_all(|_| Arc::new(SimDisk::new(4))).await;
}

/// Every file's name and bytes, through the Disk trait.
async fn files(disk: &dyn Disk) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for name in disk.list().await.unwrap() {
        let len = disk.len(&name).await.unwrap() as usize;
        let buf = IoBuf::new(len, disk.alignment());
        let (buf, read) = disk.read_at(&name, 0, buf).await;
        let n = read.unwrap();
        out.push((name, buf[..n.min(len)].to_vec()));
    }
    out
}

/// The file holding `needle` and where.
async fn find(disk: &dyn Disk, needle: &[u8]) -> (String, u64) {
    for (name, bytes) in files(disk).await {
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            return (name, at as u64);
        }
    }
    panic!("{:?} is on no file", String::from_utf8_lossy(needle));
}

/// Flips one bit at `at` of `name`, through the Disk trait (aligned, so direct I/O works).
async fn flip(disk: &dyn Disk, name: &str, at: u64) {
    let a = disk.alignment() as u64;
    let start = at / a * a;
    let block = IoBuf::new(a as usize, a as usize);
    let (mut block, read) = disk.read_at(name, start, block).await;
    let n = read.unwrap();
    assert!(n as u64 > at - start);
    block[(at - start) as usize] ^= 0x10;
    disk.write_at(name, start, block).await.1.unwrap();
    disk.sync(name).await.unwrap();
}

/// A bit flipped in one value and a file cut inside another: neither is ever served, and
/// recovery drops them (durably) while keeping every intact value.
async fn damage(kind: Kind, disk: Arc<dyn Disk>, truncate: &dyn Fn(&str, u64)) {
    let backend = fresh(kind, disk.clone()).await;
    let b = backend.as_ref();
    let items = |marks: &[(&'static str, &'static [u8])]| -> Vec<(String, Vec<u8>)> {
        marks
            .iter()
            .map(|&(key, mark)| {
                let mut v = mark.to_vec();
                v.extend(value(key, 1));
                v.extend(std::iter::repeat_n(7u8, 6000));
                (key.to_string(), v)
            })
            .collect()
    };
    let first = items(&[
        ("intact/0", b"intact-0"),
        ("flipped", b"FLIP-MARK"),
        ("intact/1", b"intact-1"),
    ]);
    let second = items(&[("intact/2", b"intact-2"), ("truncated", b"TRUNC-MARK")]);
    for group in [&first, &second] {
        let batch: Vec<Item<'_>> = group
            .iter()
            .map(|(key, value)| Item {
                key,
                version: 1,
                value,
            })
            .collect();
        b.put_items(&batch).await.unwrap();
    }
    let (name, at) = find(disk.as_ref(), b"FLIP-MARK").await;
    flip(disk.as_ref(), &name, at + 3).await;
    let (name, at) = find(disk.as_ref(), b"TRUNC-MARK").await;
    truncate(&name, at + 100);

    let all: BTreeMap<&str, &Vec<u8>> = first
        .iter()
        .chain(&second)
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    for (&key, &want) in &all {
        let got = read_value(b, key, 1, want.len() as u64).await;
        if key.starts_with("intact") {
            assert_eq!(&got.unwrap(), want, "{kind:?}: {key}");
        } else {
            let e = got.expect_err(key);
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{kind:?}: {key}: {e}");
        }
    }
    drop(backend);

    let restarted = make(kind, disk.clone());
    let found = restarted.recover().await.unwrap();
    let intact: BTreeSet<(String, u64, u64)> = all
        .iter()
        .filter(|(k, _)| k.starts_with("intact"))
        .map(|(k, v)| (k.to_string(), 1, v.len() as u64))
        .collect();
    assert_eq!(held_set(&found.objects), intact, "{kind:?}");
    assert!(found.dropped.len() >= 2, "{kind:?}: {:?}", found.dropped);
    for (&key, &want) in &all {
        let got = read_value(restarted.as_ref(), key, 1, want.len() as u64).await;
        if key.starts_with("intact") {
            assert_eq!(&got.unwrap(), want, "{kind:?}: {key}");
        } else {
            assert!(got.is_err(), "{kind:?}: {key} served after recovery");
        }
    }
    drop(restarted);
    // Dropping is durable: another recovery finds the same values and nothing to drop.
    let again = make(kind, disk).recover().await.unwrap();
    assert_eq!(again.dropped, vec![], "{kind:?}");
    assert_eq!(held_set(&again.objects), intact, "{kind:?}");
}

#[tokio::test]
async fn simulated_damage_is_dropped_not_served() {
    for kind in KINDS {
        let sim = Arc::new(SimDisk::with_alignment(5, 512));
        let cut = sim.clone();
        damage(kind, sim, &|name, len| cut.truncate(name, len).unwrap()).await;
    }
}

#[tokio::test]
async fn posix_damage_is_dropped_not_served() {
    let dir = TempDir::new("damage");
    for kind in KINDS {
        let root = dir.0.join(format!("{kind:?}"));
        let disk = Arc::new(PosixDisk::open(&root, IoMode::Buffered).unwrap());
        let cut = |name: &str, len: u64| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(root.join(name))
                .unwrap()
                .set_len(len)
                .unwrap()
        };
        damage(kind, disk, &cut).await;
    }
}

/// A simulated disk that loses power after a given number of operations: the crash happens
/// just before that operation or just after it (the operation done, its caller never told),
/// and every later operation fails, as if the process had died with it.
struct Crashy {
    sim: Arc<SimDisk>,
    /// Operations left before the crash; negative: never.
    budget: AtomicI64,
    /// Whether the fatal operation is carried out before the power goes.
    after: bool,
    dead: AtomicBool,
}

impl Crashy {
    /// A disk that will not crash until [`Crashy::arm`]ed.
    fn new(sim: Arc<SimDisk>, after: bool) -> Crashy {
        Crashy {
            sim,
            budget: AtomicI64::new(-1),
            after,
            dead: AtomicBool::new(false),
        }
    }

    /// Power goes at the `ops`-th operation from now.
    fn arm(&self, ops: i64) {
        self.budget.store(ops, Ordering::SeqCst);
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn crash(&self) {
        if !self.dead.swap(true, Ordering::SeqCst) {
            self.sim.crash();
        }
    }

    fn died() -> io::Error {
        io::Error::other("power lost")
    }

    /// Before an operation: `Ok(true)` if it is the fatal one, to be done before crashing.
    fn gate(&self) -> io::Result<bool> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::died());
        }
        if self.budget.fetch_sub(1, Ordering::SeqCst) != 1 {
            return Ok(false);
        }
        if self.after {
            return Ok(true);
        }
        self.crash();
        Err(Self::died())
    }

    fn finish<T>(&self, fatal: bool, result: io::Result<T>) -> io::Result<T> {
        if fatal {
            self.crash();
            return Err(Self::died());
        }
        result
    }
}

impl Disk for Crashy {
    fn alignment(&self) -> usize {
        self.sim.alignment()
    }

    fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let fatal = self.gate()?;
            let r = self.sim.create(name).await;
            self.finish(fatal, r)
        })
    }

    fn write_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, ()>> {
        Box::pin(async move {
            let fatal = match self.gate() {
                Ok(fatal) => fatal,
                Err(e) => return (buf, Err(e)),
            };
            let (buf, r) = self.sim.write_at(name, offset, buf).await;
            (buf, self.finish(fatal, r))
        })
    }

    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, usize>> {
        Box::pin(async move {
            let fatal = match self.gate() {
                Ok(fatal) => fatal,
                Err(e) => return (buf, Err(e)),
            };
            let (buf, r) = self.sim.read_at(name, offset, buf).await;
            (buf, self.finish(fatal, r))
        })
    }

    fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let fatal = self.gate()?;
            let r = self.sim.sync(name).await;
            self.finish(fatal, r)
        })
    }

    fn len<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<u64>> {
        Box::pin(async move {
            let fatal = self.gate()?;
            let r = self.sim.len(name).await;
            self.finish(fatal, r)
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let fatal = self.gate()?;
            let r = self.sim.remove(name).await;
            self.finish(fatal, r)
        })
    }

    fn rename<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let fatal = self.gate()?;
            let r = self.sim.rename(from, to).await;
            self.finish(fatal, r)
        })
    }

    fn list(&self) -> BoxFuture<'_, io::Result<Vec<String>>> {
        Box::pin(async move {
            let fatal = self.gate()?;
            let r = self.sim.list().await;
            self.finish(fatal, r)
        })
    }
}

/// Keys whose fate a crash left open, with the versions each may now hold (`None`: absent).
type Doubt = BTreeMap<String, BTreeSet<Option<u64>>>;

/// Checks a recovery against the model: keys not in doubt exactly as acknowledged, keys in
/// doubt in one of their possible states, and every recovered value byte-exact. Returns the
/// recovered state.
async fn check_recovered(
    kind: Kind,
    seed: u64,
    backend: &dyn Backend,
    objects: &[Held],
    model: &Model,
    doubt: &Doubt,
) -> Model {
    let mut got = Model::new();
    for held in objects {
        let want = value(&held.key, held.version);
        assert_eq!(
            held.len,
            want.len() as u64,
            "{kind:?} seed {seed}: {held:?}"
        );
        let read = read_value(backend, &held.key, held.version, held.len).await;
        assert_eq!(read.unwrap(), want, "{kind:?} seed {seed}: {held:?}");
        assert!(
            got.insert(held.key.clone(), held.version).is_none(),
            "{kind:?} seed {seed}: {} recovered twice",
            held.key
        );
    }
    let keys: BTreeSet<&String> = got.keys().chain(model.keys()).chain(doubt.keys()).collect();
    for key in keys {
        let now = got.get(key).copied();
        match doubt.get(key) {
            Some(possible) => assert!(
                possible.contains(&now),
                "{kind:?} seed {seed}: {key} recovered as {now:?}, expected one of {possible:?}"
            ),
            None => assert_eq!(
                now,
                model.get(key).copied(),
                "{kind:?} seed {seed}: {key} (acknowledged state)"
            ),
        }
    }
    got
}

/// Puts, replaces and removes on a simulated disk that tears and loses unsynced writes, with
/// power cut at random operations (often mid-put) over several lives. Returns how many
/// crashes interrupted an operation.
async fn crash_lives(kind: Kind, seed: u64) -> usize {
    let sim = Arc::new(SimDisk::with_alignment(seed, 512));
    sim.set_faults(DiskFaults {
        torn_on_crash: 0.5,
        lost_on_crash: 0.3,
        ..DiskFaults::default()
    });
    let mut rng = Rng::seeded(seed.wrapping_mul(31).wrapping_add(kind as u64));
    let pool: Vec<String> = (0..6).map(|i| format!("crash/{i}")).collect();
    let mut model = Model::new();
    let mut doubt = Doubt::new();
    let mut next_version = 1u64;
    let mut interrupted = 0;
    for _life in 0..5 {
        let disk = Arc::new(Crashy::new(sim.clone(), rng.below(2) == 1));
        let during_recovery = rng.below(4) == 0;
        if during_recovery {
            disk.arm(rng.below(12) as i64 + 1);
        }
        let backend = make(kind, disk.clone());
        let recovered = backend.recover().await;
        if disk.is_dead() {
            continue; // the crash came during recovery, which changes no value's fate
        }
        let found = recovered.unwrap();
        disk.arm(-1); // the checks' reads are not part of the schedule
        model = check_recovered(kind, seed, backend.as_ref(), &found.objects, &model, &doubt).await;
        doubt.clear();
        disk.arm(rng.below(90) as i64 + 1);
        for _op in 0..8 {
            if rng.below(3) > 0 {
                let n = rng.below(4) + 1;
                let mut keys: Vec<&String> = pool.iter().collect();
                let mut writes = Vec::new();
                for _ in 0..n {
                    let key = keys.swap_remove(rng.below(keys.len()));
                    writes.push((key.as_str(), next_version));
                    next_version += 1;
                }
                match put(backend.as_ref(), &writes).await {
                    Ok(_) => {
                        for (key, version) in writes {
                            model.insert(key.to_string(), version);
                        }
                    }
                    Err(_) => {
                        for (key, version) in writes {
                            let before = model.remove(key);
                            doubt.insert(key.to_string(), [before, Some(version)].into());
                        }
                        interrupted += 1;
                        break;
                    }
                }
            } else {
                let mut writes = Vec::new();
                for _ in 0..rng.below(3) + 1 {
                    let key = &pool[rng.below(pool.len())];
                    // Mostly the held write; sometimes another one, which must stay.
                    let held = model.get(key).copied().unwrap_or(0);
                    let version = if rng.below(4) == 0 { held + 1 } else { held };
                    writes.push((key.clone(), version));
                }
                match backend.remove(&writes).await {
                    Ok(()) => {
                        for (key, version) in &writes {
                            if model.get(key) == Some(version) {
                                model.remove(key);
                            }
                        }
                    }
                    Err(_) => {
                        for (key, version) in &writes {
                            if model.get(key) == Some(version) {
                                model.remove(key);
                                doubt.insert(key.clone(), [None, Some(*version)].into());
                            }
                        }
                        interrupted += 1;
                        break;
                    }
                }
            }
        }
        // Power goes now if it has not yet (a quiet moment: unsynced writes still at risk).
        disk.crash();
    }
    interrupted
}

/// Crashes never leave a value whose bytes differ from what was put for its write, never lose
/// an acknowledged value, and never bring back a removed one.
#[tokio::test]
async fn crashes_at_random_points_never_serve_wrong_bytes_nor_lose_acknowledged_values() {
    for kind in KINDS {
        let mut interrupted = 0;
        for seed in 0..40 {
            interrupted += crash_lives(kind, seed).await;
        }
        // The schedule must actually cut operations short, not only crash between them.
        assert!(
            interrupted > 40,
            "{kind:?}: only {interrupted} interrupted operations"
        );
    }
}

/// Readers racing with puts that replace keys and with removes: every read that succeeds
/// returns exactly the bytes of the write it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_never_return_wrong_bytes() {
    for kind in KINDS {
        let disk: Arc<dyn Disk> = Arc::new(SimDisk::with_alignment(9, 512));
        let backend: Arc<dyn Backend> = Arc::from(fresh(kind, disk).await);
        let latest = Arc::new(AtomicU64::new(0));
        let writer = {
            let (backend, latest) = (backend.clone(), latest.clone());
            tokio::spawn(async move {
                for version in 1..=60u64 {
                    let keys: Vec<String> = (0..4).map(|i| format!("race/{i}")).collect();
                    let writes: Vec<(&str, u64)> =
                        keys.iter().map(|k| (k.as_str(), version)).collect();
                    put(backend.as_ref(), &writes).await.unwrap();
                    latest.store(version, Ordering::SeqCst);
                    if version % 3 == 0 {
                        let removes = vec![(keys[0].clone(), version), (keys[1].clone(), version)];
                        backend.remove(&removes).await.unwrap();
                    }
                }
            })
        };
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (backend, latest) = (backend.clone(), latest.clone());
                tokio::spawn(async move {
                    let mut served = 0;
                    for i in 0..3000u64 {
                        let key = format!("race/{}", (i + r) % 4);
                        let version = latest.load(Ordering::SeqCst).saturating_sub(i % 2).max(1);
                        let want = value(&key, version);
                        match read_value(backend.as_ref(), &key, version, want.len() as u64).await {
                            Ok(got) => {
                                assert_eq!(got, want, "{kind:?}: {key} v{version}");
                                served += 1;
                            }
                            Err(e) => assert!(
                                matches!(
                                    e.kind(),
                                    io::ErrorKind::NotFound | io::ErrorKind::InvalidData
                                ),
                                "{kind:?}: {e}"
                            ),
                        }
                        if i % 50 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    served
                })
            })
            .collect();
        writer.await.unwrap();
        let mut served = 0;
        for reader in readers {
            served += reader.await.unwrap();
        }
        assert!(served > 0, "{kind:?}: no read was served");
    }
}

fn bucket_pair(id: u64) -> [String; 2] {
    [Bucket::data_name(id), Bucket::meta_name(id)]
}

/// Replacing keys spread over older buckets rewrites those buckets; a bucket whose keys are
/// all replaced or removed has both its files deleted; ids continue after a restart.
#[tokio::test]
async fn bucket_replace_across_buckets_and_delete_emptied_ones() {
    let sim = Arc::new(SimDisk::with_alignment(11, 512));
    let disk: Arc<dyn Disk> = sim.clone();
    let backend = fresh(Kind::Bucket, disk.clone()).await;
    let b = backend.as_ref();
    let mut model = Model::new();
    let mut units = Vec::new();
    for group in ["a", "b"] {
        let keys: Vec<String> = (0..4).map(|i| format!("{group}{i}")).collect();
        let writes: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
        units.push(put(b, &writes).await.unwrap()[0].unit);
        model.extend(keys.into_iter().map(|k| (k, 1)));
    }
    let (a, bb) = (units[0], units[1]);
    // Replace one key of each older bucket.
    let held = put(b, &[("a0", 2), ("b0", 2), ("c0", 1)]).await.unwrap();
    let c = held[0].unit;
    assert!(c > bb && bb > a, "ids increase: {a} {bb} {c}");
    model.extend([("a0".into(), 2), ("b0".into(), 2), ("c0".into(), 1)]);
    check_reads(b, &model).await;
    let mut want: Vec<String> = [a, bb, c].iter().flat_map(|&id| bucket_pair(id)).collect();
    want.sort();
    assert_eq!(disk.list().await.unwrap(), want);

    // Replace the rest of bucket a: it is deleted.
    let held = put(b, &[("a1", 2), ("a2", 2), ("a3", 2)]).await.unwrap();
    let d = held[0].unit;
    model.extend((1..4).map(|i| (format!("a{i}"), 2)));
    // Remove the rest of bucket b (one with a wrong version first: nothing changes).
    b.remove(&[("b1".into(), 2)]).await.unwrap();
    let mut want: Vec<String> = [bb, c, d].iter().flat_map(|&id| bucket_pair(id)).collect();
    want.sort();
    assert_eq!(disk.list().await.unwrap(), want, "bucket a is gone");
    let removes: Vec<(String, u64)> = (1..4).map(|i| (format!("b{i}"), 1)).collect();
    b.remove(&removes).await.unwrap();
    for (key, _) in &removes {
        model.remove(key);
    }
    let mut want: Vec<String> = [c, d].iter().flat_map(|&id| bucket_pair(id)).collect();
    want.sort();
    assert_eq!(disk.list().await.unwrap(), want);
    check_reads(b, &model).await;
    drop(backend);

    let restarted = make(Kind::Bucket, disk.clone());
    let found = restarted.recover().await.unwrap();
    assert_eq!(found.dropped, vec![]);
    assert_eq!(held_set(&found.objects), model_set(&model));
    let units: BTreeSet<u64> = found.objects.iter().map(|h| h.unit).collect();
    assert_eq!(units, [c, d].into());
    let next = put(restarted.as_ref(), &[("e0", 1)]).await.unwrap()[0].unit;
    assert!(next > d, "ids continue after a restart: {next} after {d}");
}

/// A damaged meta drops its whole bucket; a data file without a meta and a leftover
/// temporary meta are unfinished writes; a key in two buckets (a crash between a replace's
/// commit and the old entry's removal) keeps its higher version.
#[tokio::test]
async fn bucket_recovery_drops_unfinished_and_damaged_buckets() {
    let sim = Arc::new(SimDisk::with_alignment(12, 512));
    let disk: Arc<dyn Disk> = sim.clone();
    let backend = fresh(Kind::Bucket, disk.clone()).await;
    let b = backend.as_ref();
    let one = put(b, &[("x", 1), ("y", 1)]).await.unwrap()[0].unit;
    let two = put(b, &[("z", 1)]).await.unwrap()[0].unit;
    let old = files(disk.as_ref()).await;
    // Replacing y rewrites bucket one; put its old meta back, as a crash before the rewrite
    // would have left it.
    let three = put(b, &[("y", 2)]).await.unwrap()[0].unit;
    let (meta, bytes) = old
        .iter()
        .find(|(name, _)| *name == Bucket::meta_name(one))
        .unwrap();
    disk.create(meta).await.unwrap();
    disk.write_at(meta, 0, IoBuf::copy_of(bytes, 512))
        .await
        .1
        .unwrap();
    disk.sync(meta).await.unwrap();
    drop(backend);
    // Bucket two's meta is damaged; a stray data file and a temporary meta are left over.
    sim.flip_bit(&Bucket::meta_name(two), 20, 3).unwrap();
    let stray = Bucket::data_name(0x40);
    disk.create(&stray).await.unwrap();
    write_copy(disk.as_ref(), &stray, 0, &[1; 512])
        .await
        .unwrap();
    let tmp = format!("{}.tmp", Bucket::meta_name(0x41));
    disk.create(&tmp).await.unwrap();

    let restarted = make(Kind::Bucket, disk.clone());
    let found = restarted.recover().await.unwrap();
    let mut model = Model::new();
    model.insert("x".into(), 1);
    model.insert("y".into(), 2);
    assert_eq!(held_set(&found.objects), model_set(&model));
    check_reads(restarted.as_ref(), &model).await;
    let dropped: Vec<&str> = found
        .dropped
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    for name in [
        &Bucket::meta_name(two),
        &Bucket::data_name(two),
        &stray,
        &tmp,
    ] {
        assert!(
            dropped.contains(&name.as_str()),
            "{name} not in {dropped:?}"
        );
    }
    assert!(
        found
            .dropped
            .iter()
            .any(|(name, why)| name.starts_with("y in") && why.contains("superseded")),
        "{:?}",
        found.dropped
    );
    let mut want: Vec<String> = [one, three]
        .iter()
        .flat_map(|&id| bucket_pair(id))
        .collect();
    want.sort();
    assert_eq!(disk.list().await.unwrap(), want);
    let next = put(restarted.as_ref(), &[("w", 1)]).await.unwrap()[0].unit;
    assert!(next > 0x41, "ids skip past every file seen: {next}");
    // The resolution is durable.
    let again = make(Kind::Bucket, disk).recover().await.unwrap();
    assert_eq!(again.dropped, vec![]);
}

/// Space is reused after removes and replaces; a full file is a `StorageFull` error, with
/// nothing of the failed put stored; a restart rebuilds the same free space.
#[tokio::test]
async fn offset_file_reuses_space_and_reports_full() {
    let disk: Arc<dyn Disk> = Arc::new(SimDisk::with_alignment(13, 512));
    let store = OffsetFile::open(disk.clone(), 64 << 10).unwrap();
    store.recover().await.unwrap();
    assert_eq!((store.capacity(), store.free_bytes()), (64 << 10, 64 << 10));
    let block = vec![5u8; 4096 - 32 - 6]; // keys of 6 bytes: one 4 KiB block per record
    let keys: Vec<String> = (0..16).map(|i| format!("key/{i:02}")).collect();
    let items = |keys: &[String], version: u64| -> Vec<(String, u64)> {
        keys.iter().map(|k| (k.clone(), version)).collect()
    };
    let put_blocks = |writes: Vec<(String, u64)>| {
        let store = &store;
        let block = &block;
        async move {
            let batch: Vec<Item<'_>> = writes
                .iter()
                .map(|(key, version)| Item {
                    key,
                    version: *version,
                    value: block,
                })
                .collect();
            store.put_items(&batch).await
        }
    };
    for round in 1..=3u64 {
        for chunk in keys.chunks(4) {
            put_blocks(items(chunk, round)).await.unwrap();
        }
        assert_eq!(store.free_bytes(), 0, "round {round}");
        let full = put_blocks(vec![("extra".into(), 1)]).await.unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::StorageFull, "{full}");
        assert!(
            full.to_string().contains("65536"),
            "names the capacity: {full}"
        );
        store.remove(&items(&keys, round)).await.unwrap();
        assert_eq!(store.free_bytes(), 64 << 10, "round {round}");
    }
    // Half full, then a group of which only part fits: all or nothing.
    for chunk in keys[..8].chunks(4) {
        put_blocks(items(chunk, 4)).await.unwrap();
    }
    let too_many: Vec<(String, u64)> = (0..9).map(|i| (format!("more/{i}"), 1)).collect();
    let e = put_blocks(too_many).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    assert_eq!(store.free_bytes(), 32 << 10);
    let huge = vec![0u8; 128 << 10];
    let e = store
        .put_items(&[Item {
            key: "huge",
            version: 1,
            value: &huge,
        }])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    // Replacing keeps the space used constant.
    put_blocks(items(&keys[..4], 5)).await.unwrap();
    assert_eq!(store.free_bytes(), 32 << 10);
    drop(store);

    let restarted = OffsetFile::open(disk.clone(), 64 << 10).unwrap();
    let found = restarted.recover().await.unwrap();
    assert_eq!(found.dropped, vec![]);
    let versions: BTreeMap<String, u64> = found
        .objects
        .iter()
        .map(|h| (h.key.clone(), h.version))
        .collect();
    let want: BTreeMap<String, u64> = keys[..8]
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), if i < 4 { 5 } else { 4 }))
        .collect();
    assert_eq!(versions, want);
    assert_eq!(restarted.free_bytes(), 32 << 10);
    // A larger existing file is used whole, never shrunk.
    drop(restarted);
    let small = OffsetFile::open(disk.clone(), 16 << 10).unwrap();
    assert_eq!(small.recover().await.unwrap().objects.len(), 8);
    assert_eq!(small.capacity(), 64 << 10);
    assert_eq!(disk.len(DATA_FILE).await.unwrap(), 64 << 10);
}

#[test]
fn offset_file_refuses_a_capacity_below_one_block() {
    let disk: Arc<dyn Disk> = Arc::new(SimDisk::new(1));
    let e = OffsetFile::open(disk.clone(), 100).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(OffsetFile::open(disk, 4096).is_ok());
}

/// Puts before recovery are refused where they could clash with what is on disk; repeated
/// keys in one put are refused by the bucket and offset-file backends; an empty put is a
/// no-op.
#[tokio::test]
async fn puts_need_recovery_and_distinct_keys() {
    for kind in [Kind::Bucket, Kind::OffsetFile] {
        let backend = make(kind, Arc::new(SimDisk::new(2)));
        assert!(
            put(backend.as_ref(), &[("k", 1)]).await.is_err(),
            "{kind:?}"
        );
    }
    for kind in KINDS {
        let backend = fresh(kind, Arc::new(SimDisk::new(2))).await;
        assert!(put(backend.as_ref(), &[]).await.unwrap().is_empty());
        if kind != Kind::FilePerKey {
            let e = put(backend.as_ref(), &[("k", 1), ("k", 2)]).await;
            assert_eq!(
                e.unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{kind:?}"
            );
        }
    }
}
