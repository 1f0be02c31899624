//! A simulated disk: files in memory, with the faults real disks have.
//!
//! Each file keeps what readers see (the page cache) and what would survive a crash (the
//! durable image), plus the writes made since the last sync. [`SimDisk::crash`] rebuilds every
//! file from its durable image and replays each unsynced write whole, torn (a prefix, cut at a
//! sector boundary) or not at all, as a power loss can. Reads and writes can fail with EIO and
//! take simulated time. Every random choice comes from the seed, so a simulation that uses the
//! disk replays exactly.

use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use mooring_core::rng::Rng;
use mooring_proto::disk::{Disk, IoBuf, IoResult};
use mooring_proto::transport::BoxFuture;

/// Granularity of torn writes: a crash keeps whole sectors of a write in progress.
pub const SECTOR: usize = 512;

/// The faults a [`SimDisk`] injects. All probabilities are per operation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiskFaults {
    /// Simulated time each operation takes.
    pub latency: Range<Duration>,
    /// Chance a read fails with EIO.
    pub read_error: f64,
    /// Chance a write fails with EIO (nothing is written).
    pub write_error: f64,
    /// Chance a sync fails with EIO; the unsynced writes are then lost (as after a failed
    /// `fsync` on Linux, whose dirty pages may be dropped).
    pub sync_error: f64,
    /// On crash, the chance an unsynced write is torn (a prefix of sectors survives).
    pub torn_on_crash: f64,
    /// On crash, the chance an unsynced write is lost entirely.
    pub lost_on_crash: f64,
    /// Bytes the disk holds at most (all files together): a write that would grow past it
    /// fails with `StorageFull` and writes nothing. None: no limit.
    pub capacity: Option<u64>,
}

/// What happened to the disk so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Injected read, write and sync errors.
    pub errors: u64,
    /// Unsynced writes torn by crashes.
    pub torn: u64,
    /// Unsynced writes lost by crashes or failed syncs.
    pub lost: u64,
    /// Crashes.
    pub crashes: u64,
    /// Writes refused for want of space (see [`DiskFaults::capacity`]).
    pub full: u64,
    /// Bits flipped by [`SimDisk::flip_bit`] (a checker can tell its disk changed under it).
    pub flips: u64,
}

#[derive(Clone, Debug, Default)]
struct SimFile {
    /// Names the file whatever it is renamed to.
    id: u64,
    visible: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<(u64, Vec<u8>)>,
}

fn apply(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let end = start + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

pub(crate) struct State {
    files: BTreeMap<String, SimFile>,
    /// The id the next new file gets.
    next_id: u64,
    faults: DiskFaults,
    rng: Rng,
    stats: DiskStats,
    /// A crash point: changes left before the disk stops (see [`SimDisk::stop_before`]).
    stop_in: Option<u32>,
    /// Whether the disk has stopped at its crash point.
    stopped: bool,
}

impl State {
    fn roll(&mut self, probability: f64) -> bool {
        probability > 0.0 && (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= probability
    }

    /// Rolls for the fault whose probability `which` picks.
    fn fault(&mut self, which: impl Fn(&DiskFaults) -> f64) -> bool {
        let probability = which(&self.faults);
        self.roll(probability)
    }

    fn latency(&mut self) -> Duration {
        let Range { start, end } = self.faults.latency;
        if end <= start {
            return start;
        }
        let span = (end - start).as_nanos() as u64;
        start + Duration::from_nanos(self.rng.next_u64() % span)
    }

    fn file(&mut self, name: &str) -> io::Result<&mut SimFile> {
        self.files
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {name:?}")))
    }

    /// A new, empty file named `name` (replacing any).
    pub(crate) fn create(&mut self, name: &str) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.files.insert(
            name.to_string(),
            SimFile {
                id,
                ..SimFile::default()
            },
        );
        id
    }

    /// The name file `id` has now.
    pub(crate) fn name_of(&self, id: u64) -> io::Result<String> {
        self.files
            .iter()
            .find(|(_, f)| f.id == id)
            .map(|(name, _)| name.clone())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file #{id}")))
    }

    /// Writes `data` at `offset` of `name`, unsynced, unless an injected fault or the
    /// capacity refuses it.
    pub(crate) fn write(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.fault(|f| f.write_error) {
            self.stats.errors += 1;
            return Err(eio("write"));
        }
        if let Some(capacity) = self.faults.capacity {
            let len = self.file(name)?.visible.len() as u64;
            let growth = (offset + data.len() as u64).saturating_sub(len);
            let used: u64 = self.files.values().map(|f| f.visible.len() as u64).sum();
            if growth > 0 && used + growth > capacity {
                self.stats.full += 1;
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "simulated ENOSPC: no space left on the disk",
                ));
            }
        }
        let file = self.file(name)?;
        apply(&mut file.visible, offset, data);
        file.unsynced.push((offset, data.to_vec()));
        Ok(())
    }

    /// Makes `name`'s writes durable, unless an injected fault fails the sync (which loses
    /// them, as a failed `fsync` on Linux may).
    pub(crate) fn sync(&mut self, name: &str) -> io::Result<()> {
        let failed = self.fault(|f| f.sync_error);
        let file = self.file(name)?;
        if failed {
            let lost = file.unsynced.len() as u64;
            file.unsynced.clear();
            file.visible = file.durable.clone();
            self.stats.errors += 1;
            self.stats.lost += lost;
            return Err(eio("sync"));
        }
        file.unsynced.clear();
        file.durable = file.visible.clone();
        Ok(())
    }

    /// Fills `buf` from `offset` of `name` as far as the file goes; how many bytes it read.
    pub(crate) fn read(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if self.fault(|f| f.read_error) {
            self.stats.errors += 1;
            return Err(eio("read"));
        }
        let file = self.file(name)?;
        let start = (offset as usize).min(file.visible.len());
        let n = buf.len().min(file.visible.len() - start);
        buf[..n].copy_from_slice(&file.visible[start..start + n]);
        Ok(n)
    }

    /// Renames `from` to `to`, replacing any file named `to`.
    pub(crate) fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let file = self
            .files
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {from:?}")))?;
        self.files.insert(to.to_string(), file);
        Ok(())
    }

    /// The length of `name`.
    pub(crate) fn len(&mut self, name: &str) -> io::Result<u64> {
        Ok(self.file(name)?.visible.len() as u64)
    }

    /// The id of the file named `name`, if there is one.
    pub(crate) fn id_of(&self, name: &str) -> Option<u64> {
        self.files.get(name).map(|f| f.id)
    }

    /// Removes `name`.
    pub(crate) fn remove(&mut self, name: &str) -> io::Result<()> {
        match self.files.remove(name) {
            Some(_) => Ok(()),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no file {name:?}"),
            )),
        }
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO on {what}"))
}

/// An in-memory disk with injectable faults.
pub struct SimDisk {
    state: Mutex<State>,
    alignment: usize,
}

impl SimDisk {
    /// An empty disk whose random choices follow `seed`, with no faults, and no alignment
    /// requirement.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk::with_alignment(seed, 1)
    }

    /// An empty disk that, like a direct-I/O device, refuses unaligned reads and writes.
    pub fn with_alignment(seed: u64, alignment: usize) -> SimDisk {
        SimDisk {
            state: Mutex::new(State {
                files: BTreeMap::new(),
                next_id: 0,
                faults: DiskFaults::default(),
                rng: Rng::seeded(seed),
                stats: DiskStats::default(),
                stop_in: None,
                stopped: false,
            }),
            alignment: alignment.max(1),
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave a file half-updated: every update is one assignment.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the faults to inject from now on.
    pub fn set_faults(&self, faults: DiskFaults) {
        self.lock().faults = faults;
    }

    /// What the disk has done so far.
    pub fn stats(&self) -> DiskStats {
        self.lock().stats.clone()
    }

    /// Power loss: every file goes back to its durable image plus, per unsynced write in
    /// order, all of it, a sector-aligned prefix of it, or none of it.
    pub fn crash(&self) {
        let mut state = self.lock();
        state.stats.crashes += 1;
        // The machine is gone: nothing waits at a crash point any more.
        state.stop_in = None;
        state.stopped = false;
        let names: Vec<String> = state.files.keys().cloned().collect();
        for name in names {
            let file = state.files.get_mut(&name).expect("listed");
            let unsynced = std::mem::take(&mut file.unsynced);
            let mut image = file.durable.clone();
            for (offset, data) in unsynced {
                let (torn, lost) = (state.faults.torn_on_crash, state.faults.lost_on_crash);
                if state.roll(lost) {
                    state.stats.lost += 1;
                } else if state.roll(torn) {
                    state.stats.torn += 1;
                    let sectors = data.len().div_ceil(SECTOR);
                    let keep = (state.rng.below(sectors.max(1)) * SECTOR).min(data.len());
                    apply(&mut image, offset, &data[..keep]);
                } else {
                    apply(&mut image, offset, &data);
                }
            }
            let file = state.files.get_mut(&name).expect("listed");
            file.durable = image.clone();
            file.visible = image;
        }
    }

    /// Arms a crash point: the `changes`-th change from now (a create, write, sync, rename
    /// or removal; at least the first) and every operation after it wait, undone, until
    /// [`SimDisk::crash`] or [`SimDisk::disarm`]. A test kills its process once
    /// [`SimDisk::stopped`] says so: a crash caught mid-write, with that write's earlier steps
    /// done and unsynced.
    pub fn stop_before(&self, changes: u32) {
        let mut state = self.lock();
        state.stop_in = Some(changes.max(1));
        state.stopped = false;
    }

    /// Whether the disk waits at its crash point.
    pub fn stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Lifts a crash point, armed or reached: waiting operations go on.
    pub fn disarm(&self) {
        let mut state = self.lock();
        state.stop_in = None;
        state.stopped = false;
    }

    /// Waits while the disk is stopped at its crash point; a change (`changes`) counts down
    /// towards it first.
    async fn crash_point(&self, changes: bool) {
        loop {
            {
                let mut state = self.lock();
                if changes && !state.stopped {
                    match state.stop_in {
                        Some(1) => {
                            state.stop_in = None;
                            state.stopped = true;
                        }
                        Some(n) => state.stop_in = Some(n - 1),
                        None => {}
                    }
                }
                if !state.stopped {
                    return;
                }
            }
            // Polled: a stopped disk waits only until its process is killed.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Flips one bit of `name` at byte `offset`, durably (a test's bit rot).
    pub fn flip_bit(&self, name: &str, offset: u64, bit: u8) -> io::Result<()> {
        let mut state = self.lock();
        state.stats.flips += 1;
        let file = state.file(name)?;
        for image in [&mut file.visible, &mut file.durable] {
            if let Some(byte) = image.get_mut(offset as usize) {
                *byte ^= 1 << (bit % 8);
            }
        }
        Ok(())
    }

    /// Where `needle` occurs in the files (as their contents now read): a test's way to
    /// find the records of one value.
    pub fn find(&self, needle: &[u8]) -> Vec<(String, u64)> {
        let state = self.lock();
        let mut found = Vec::new();
        if needle.is_empty() {
            return found;
        }
        for (name, file) in &state.files {
            for (at, window) in file.visible.windows(needle.len()).enumerate() {
                if window == needle {
                    found.push((name.clone(), at as u64));
                }
            }
        }
        found
    }

    /// `name`'s contents as they read now, if it exists (a test's way to see what a fault is
    /// about to hit).
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().files.get(name).map(|file| file.visible.clone())
    }

    /// How many leading bytes of `name` read now as they would after a crash: where its
    /// current contents and its durable image first differ.
    pub fn synced_prefix(&self, name: &str) -> Option<u64> {
        let state = self.lock();
        let file = state.files.get(name)?;
        let same = file
            .visible
            .iter()
            .zip(&file.durable)
            .take_while(|(a, b)| a == b)
            .count();
        Some(same as u64)
    }

    /// Deletes every file at once (a harness letting go of a finished run's disk).
    pub fn clear(&self) {
        self.lock().files.clear();
    }

    /// Every file and its length, sorted by name.
    pub fn files(&self) -> Vec<(String, u64)> {
        let state = self.lock();
        state
            .files
            .iter()
            .map(|(name, file)| (name.clone(), file.visible.len() as u64))
            .collect()
    }

    /// Cuts `name` to `len` bytes, durably (a test's truncated file).
    pub fn truncate(&self, name: &str, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        let file = state.file(name)?;
        file.visible.truncate(len as usize);
        file.durable.truncate(len as usize);
        file.unsynced.clear();
        Ok(())
    }

    fn check_aligned(&self, offset: u64, len: usize) -> io::Result<()> {
        let a = self.alignment;
        if !offset.is_multiple_of(a as u64) || !len.is_multiple_of(a) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unaligned I/O ({offset}+{len}) on a disk aligned to {a}"),
            ));
        }
        Ok(())
    }

    async fn write_bytes(&self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check_aligned(offset, data.len())?;
        self.crash_point(true).await;
        self.delay().await;
        self.lock().write(name, offset, data)
    }

    async fn read_bytes(&self, name: &str, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.check_aligned(offset, buf.len())?;
        self.crash_point(false).await;
        self.delay().await;
        self.lock().read(name, offset, buf)
    }

    async fn delay(&self) {
        let latency = self.lock().latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }
}

impl Disk for SimDisk {
    fn alignment(&self) -> usize {
        self.alignment
    }

    fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            self.crash_point(true).await;
            self.delay().await;
            self.lock().create(name);
            Ok(())
        })
    }

    fn write_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, ()>> {
        // The future owns the buffer: nothing runs after it is dropped, so the transfer ends
        // with it.
        Box::pin(async move {
            let result = self.write_bytes(name, offset, &buf).await;
            (buf, result)
        })
    }

    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        mut buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, usize>> {
        Box::pin(async move {
            let result = self.read_bytes(name, offset, &mut buf).await;
            (buf, result)
        })
    }

    fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            self.crash_point(true).await;
            self.delay().await;
            self.lock().sync(name)
        })
    }

    fn len<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<u64>> {
        Box::pin(async move { Ok(self.lock().file(name)?.visible.len() as u64) })
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            self.crash_point(true).await;
            self.delay().await;
            self.lock().remove(name)
        })
    }

    fn rename<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            self.crash_point(true).await;
            self.delay().await;
            self.lock().rename(from, to)
        })
    }

    fn list(&self) -> BoxFuture<'_, io::Result<Vec<String>>> {
        Box::pin(async move { Ok(self.lock().files.keys().cloned().collect()) })
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;
    use mooring_proto::disk::{read_copy, write_copy};

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// A disk that loses every unsynced write at a crash, with an empty file `a`.
    async fn losing_disk() -> SimDisk {
        let disk = SimDisk::new(1);
        disk.set_faults(DiskFaults {
            lost_on_crash: 1.0,
            ..DiskFaults::default()
        });
        disk.create("a").await.unwrap();
        disk
    }

    async fn read_all(disk: &SimDisk, name: &str) -> Vec<u8> {
        let len = disk.len(name).await.unwrap() as usize;
        let mut buf = vec![0; len];
        assert_eq!(read_copy(disk, name, 0, &mut buf).await.unwrap(), len);
        buf
    }

    #[test]
    fn a_crash_point_stops_the_disk_before_its_change_until_the_crash() {
        block_on(async {
            let disk = losing_disk().await;
            // The write is the first change, the sync the second: it stops before the sync.
            disk.stop_before(2);
            write_copy(&disk, "a", 0, b"unsynced").await.unwrap();
            assert!(!disk.stopped());
            let sync = tokio::time::timeout(Duration::from_millis(50), disk.sync("a")).await;
            assert!(sync.is_err(), "the sync went through its crash point");
            assert!(disk.stopped());
            // Reads wait too: the machine is dying.
            let mut buf = [0u8; 8];
            let read = tokio::time::timeout(
                Duration::from_millis(50),
                read_copy(&disk, "a", 0, &mut buf),
            );
            assert!(read.await.is_err());
            disk.crash();
            assert!(!disk.stopped());
            assert_eq!(read_all(&disk, "a").await, b"");
            // Disarmed, changes go through.
            disk.stop_before(1);
            disk.disarm();
            disk.sync("a").await.unwrap();
        });
    }

    #[test]
    fn synced_writes_survive_a_crash_and_unsynced_ones_may_not() {
        block_on(async {
            let disk = losing_disk().await;
            write_copy(&disk, "a", 0, b"durable").await.unwrap();
            disk.sync("a").await.unwrap();
            write_copy(&disk, "a", 7, b" and not").await.unwrap();
            assert_eq!(read_all(&disk, "a").await, b"durable and not");
            disk.crash();
            assert_eq!(read_all(&disk, "a").await, b"durable");
            assert_eq!(disk.stats().lost, 1);
        });
    }

    #[test]
    fn torn_writes_keep_a_sector_aligned_prefix() {
        block_on(async {
            let mut prefixes = std::collections::BTreeSet::new();
            for seed in 0..64 {
                let disk = SimDisk::new(seed);
                disk.set_faults(DiskFaults {
                    torn_on_crash: 1.0,
                    ..DiskFaults::default()
                });
                disk.create("f").await.unwrap();
                write_copy(&disk, "f", 0, &[7u8; 4 * SECTOR]).await.unwrap();
                disk.crash();
                let kept = read_all(&disk, "f").await;
                assert_eq!(kept.len() % SECTOR, 0);
                assert!(kept.len() < 4 * SECTOR, "a torn write loses its tail");
                assert!(kept.iter().all(|&b| b == 7));
                prefixes.insert(kept.len());
            }
            assert!(prefixes.len() > 1, "tears fall at different sectors");
        });
    }

    #[test]
    fn injected_errors_fail_the_operation_and_count() {
        block_on(async {
            let disk = SimDisk::new(3);
            disk.create("f").await.unwrap();
            disk.set_faults(DiskFaults {
                write_error: 1.0,
                read_error: 1.0,
                ..DiskFaults::default()
            });
            assert!(write_copy(&disk, "f", 0, b"x").await.is_err());
            let mut buf = [0u8; 1];
            assert!(read_copy(&disk, "f", 0, &mut buf).await.is_err());
            disk.set_faults(DiskFaults::default());
            assert_eq!(
                disk.len("f").await.unwrap(),
                0,
                "a failed write writes nothing"
            );
            write_copy(&disk, "f", 0, b"y").await.unwrap();
            disk.set_faults(DiskFaults {
                sync_error: 1.0,
                ..DiskFaults::default()
            });
            assert!(disk.sync("f").await.is_err());
            assert_eq!(
                disk.len("f").await.unwrap(),
                0,
                "a failed sync drops dirty data"
            );
            assert_eq!(disk.stats().errors, 3);
        });
    }

    #[test]
    fn owned_buffers_round_trip_and_come_back() {
        block_on(async {
            let disk = SimDisk::with_alignment(5, 512);
            disk.create("f").await.unwrap();
            let data = IoBuf::copy_of(&[9u8; 1024], 512);
            let ptr = data.as_ptr();
            let (back, written) = disk.write_at("f", 512, data).await;
            written.unwrap();
            assert_eq!(back.as_ptr(), ptr, "the same buffer comes back");
            let (back, read) = disk.read_at("f", 0, IoBuf::new(2048, 512)).await;
            assert_eq!(read.unwrap(), 1536);
            assert!(back[..512].iter().all(|&b| b == 0));
            assert!(back[512..1536].iter().all(|&b| b == 9));
            let (back, refused) = disk.write_at("f", 100, back).await;
            assert_eq!(refused.unwrap_err().kind(), io::ErrorKind::InvalidInput);
            assert_eq!(back.len(), 2048, "a refused buffer comes back too");
        });
    }

    #[test]
    fn namespace_operations_and_alignment() {
        block_on(async {
            let disk = SimDisk::with_alignment(4, 512);
            disk.create("x/1").await.unwrap();
            assert!(write_copy(&disk, "x/1", 1, &[0; 512]).await.is_err());
            write_copy(&disk, "x/1", 0, &[1; 512]).await.unwrap();
            disk.rename("x/1", "y/2").await.unwrap();
            assert_eq!(disk.list().await.unwrap(), vec!["y/2".to_string()]);
            disk.flip_bit("y/2", 3, 0).unwrap();
            let mut buf = [0u8; 512];
            read_copy(&disk, "y/2", 0, &mut buf).await.unwrap();
            assert_eq!(buf[3], 0);
            disk.truncate("y/2", 0).unwrap();
            assert_eq!(disk.len("y/2").await.unwrap(), 0);
            disk.remove("y/2").await.unwrap();
            assert!(disk.remove("y/2").await.is_err());
        });
    }
}
