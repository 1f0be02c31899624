//! The [`Disk`] trait over io_uring.
//!
//! Data transfers and `fdatasync` go through one ring owned by a dedicated I/O thread. The
//! thread keeps a read of an eventfd in the ring and waits in `io_uring_enter` for any
//! completion; a caller queues its request on a channel and then writes the eventfd, so the
//! thread wakes for it at once, even while transfers are in flight. Each time it wakes, the
//! thread takes every pending request and moves their entries into the submission queue, up
//! to the queue depth in flight, submitting them in one `io_uring_enter`, so concurrent
//! transfers are batched. A read larger than [`CHUNK`] is split into chunks, one entry each,
//! submitted together so the device works on them in parallel; a write of several buffers
//! ([`Disk::write_all_at`], a bucket's records) is one vectored write.
//!
//! Namespace operations (create, remove, rename, list, len) run on tokio's blocking pool
//! through the POSIX adapter, which also learns the direct-I/O alignment; files are opened on
//! the blocking pool too (names validated as the POSIX adapter does) and cached by name.
//!
//! Soundness: memory or a descriptor the kernel uses for a request must stay valid until that
//! request's completion is reaped, even if the caller drops its future mid-transfer. Every
//! transfer owns what it points at: its [`IoBuf`]s (moved in by the caller, handed back with
//! the result) and an `Arc<File>`, held in the I/O thread's request table until the last of
//! its chunks completes. A caller that stops waiting only loses the reply; the thread still
//! drops the buffers after the kernel is done, which for a lent staging slot is what gives the
//! slot back. So no unsafe contract is asked of callers:
//!
//! - reads whose buffer lies in the memory registered by [`UringDisk::open_with_buffer`] (the
//!   staging buffer) use `READ_FIXED` straight into it; the thread keeps a clone of that
//!   [`SegmentMemory`], so the mapping outlives the ring's registration of it;
//! - other reads and all writes go straight to or from the buffer with `READ`/`WRITE` (no
//!   bounce buffer, no copy);
//! - the eventfd read's 8-byte buffer is leaked: the read is still pending when the ring goes.
//! - Dropping the disk waits for the I/O thread, which exits once no transfer is in flight.
//!   If the ring fails, which entries the kernel took is unknown: the requests with entries in
//!   flight fail, and their buffers and files, the ring itself and the registered memory are
//!   leaked rather than freed (a lent slot is then never given back). If the thread panics,
//!   the same is leaked by unwinding (the table and the ring are `ManuallyDrop`).

use std::collections::HashMap;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use io_uring::{IoUring, Probe, opcode, squeue, types};
use mooring_proto::disk::{Disk, IoBuf, IoResult};
use mooring_proto::transport::BoxFuture;
use mooring_proto::transport::SegmentMemory;
use tokio::sync::oneshot;
use tracing::{error, info, warn};

mod engine;

use engine::*;

/// Reads larger than this (or than the alignment, if larger) are split into chunks, one entry
/// each, submitted together, so the device works on them in parallel.
const CHUNK: usize = 256 << 10;

/// The most bytes one write entry carries (the kernel caps a transfer just under 2 GiB); a
/// power of two, so it keeps any direct-I/O alignment.
const MAX_WRITE: usize = 1 << 30;

/// The most segments of one vectored write.
const IOV_MAX: usize = 1024;
use crate::aligned::check_aligned;
use crate::paths::resolve;
use crate::posix::{IoMode, PosixDisk};

/// Submission queue depth: the most entries (chunks) in flight at once.
const DEPTH: usize = 64;

/// `user_data` of the eventfd read that wakes the I/O thread for new requests.
const WAKE: u64 = u64::MAX;

/// Open file descriptors kept per name at most; beyond that an arbitrary one is closed.
const MAX_OPEN: usize = 256;

/// A disk rooted at a directory, moving data through io_uring.
pub struct UringDisk {
    /// Namespace operations, name validation and the alignment.
    posix: PosixDisk,
    direct: bool,
    files: Arc<Mutex<Files>>,
    /// `Some` until dropped; dropping it lets the I/O thread finish and exit.
    requests: Option<Sender<Request>>,
    /// The registered buffer (address, length), if any: reads into it go straight there.
    fixed: Option<(usize, usize)>,
    /// Written after every request: the I/O thread keeps a read of it in the ring, so a
    /// request arriving while it waits for completions is submitted at once.
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

/// Cached open files, by name.
#[derive(Default)]
struct Files {
    /// Bumped by every namespace change, so an open racing with one is not cached.
    generation: u64,
    open: HashMap<String, Arc<File>>,
}

impl UringDisk {
    /// Opens (creating it if needed) the directory `root`. Fails with `Unsupported` if
    /// io_uring is unavailable (old kernel, seccomp, `kernel.io_uring_disabled`), so the
    /// caller can fall back to [`PosixDisk`], or, for `IoMode::Direct`, if the filesystem
    /// cannot do direct I/O.
    pub fn open(root: impl Into<PathBuf>, mode: IoMode) -> io::Result<UringDisk> {
        UringDisk::open_with_buffer(root, mode, None)
    }

    /// [`UringDisk::open`], registering `buffer` with the ring as fixed buffer 0 (after
    /// `MADV_NOHUGEPAGE` on the range, so pinning its pages works whatever the system's
    /// transparent huge page policy): a read into an [`IoBuf`] lying wholly inside it (a
    /// staging slot) goes there with `READ_FIXED` (chunked like any read). The disk keeps a
    /// clone of `buffer`, so the memory stays mapped while the ring may use it. If
    /// registration fails, such reads use plain `READ` (logged; see
    /// [`UringDisk::has_registered_buffer`]).
    pub fn open_with_buffer(
        root: impl Into<PathBuf>,
        mode: IoMode,
        buffer: Option<SegmentMemory>,
    ) -> io::Result<UringDisk> {
        let ring = new_ring()?;
        let registered = buffer.and_then(|memory| {
            let ptr = memory.range(memory.base(), memory.len() as u64)?;
            let len = memory.len();
            if len == 0 {
                return None;
            }
            // SAFETY: `memory` is a live mapping of `len` bytes at `ptr` for as long as a clone
            // of it lives, and the I/O thread keeps this one until the ring is gone (or leaks
            // both). madvise only changes the mapping's huge page advice (its result is
            // ignored: advice, not a requirement); the registration pins the pages. Neither
            // changes the contents.
            let registered = unsafe {
                libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_NOHUGEPAGE);
                let iovec = libc::iovec {
                    iov_base: ptr.as_ptr().cast(),
                    iov_len: len,
                };
                ring.submitter().register_buffers(&[iovec])
            };
            match registered {
                Ok(()) => Some(memory),
                Err(e) => {
                    warn!("io_uring could not register the staging buffer, reads will not use READ_FIXED: {e}");
                    None
                }
            }
        });
        let fixed = registered
            .as_ref()
            .map(|memory| (memory.base() as usize, memory.len()));
        let posix = PosixDisk::open(root, mode)?;
        let alignment = posix.alignment();
        let (requests, received) = mpsc::channel();
        // SAFETY: eventfd has no memory-safety preconditions; a non-negative result is a new
        // descriptor this function owns.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let thread_wake = wake.clone();
        let thread = std::thread::Builder::new()
            .name("mooring-uring".into())
            .spawn(move || run(ring, registered, received, alignment, thread_wake))?;
        info!(root = %posix.root().display(), depth = DEPTH, "io_uring disk opened");
        Ok(UringDisk {
            posix,
            direct: mode == IoMode::Direct,
            files: Arc::default(),
            requests: Some(requests),
            fixed,
            wake,
            thread: Some(thread),
        })
    }

    /// Wakes the I/O thread.
    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to the eventfd this disk owns. The
        // result is ignored: the eventfd is blocking, but a write blocks only if the counter
        // would pass `u64::MAX - 1`, which adding 1 per request cannot reach (the thread's
        // wake read resets it to zero).
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Whether a buffer is registered (reads into it use `READ_FIXED`).
    pub fn has_registered_buffer(&self) -> bool {
        self.fixed.is_some()
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        self.posix.root()
    }

    fn lock_files(&self) -> MutexGuard<'_, Files> {
        lock(&self.files)
    }

    /// The open file `name`, from the cache or opened on the blocking pool.
    async fn file(&self, name: &str) -> io::Result<Arc<File>> {
        let generation = {
            let files = self.lock_files();
            if let Some(file) = files.open.get(name) {
                return Ok(file.clone());
            }
            files.generation
        };
        let path = resolve(self.posix.root(), name)?;
        let direct = self.direct;
        let file = tokio::task::spawn_blocking(move || {
            let mut options = OpenOptions::new();
            options.read(true).write(true).mode(0o600);
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options.open(path)
        })
        .await
        .map_err(io::Error::other)??;
        let file = Arc::new(file);
        let mut files = self.lock_files();
        // A namespace change since the lookup may have made this file stale for the name.
        if files.generation == generation {
            if files.open.len() >= MAX_OPEN
                && let Some(evict) = files.open.keys().next().cloned()
            {
                files.open.remove(&evict);
            }
            files.open.insert(name.to_string(), file.clone());
        }
        Ok(file)
    }

    /// Runs a namespace change of the POSIX adapter, then forgets cached files of `names`.
    /// Once polled it runs as its own task, so the cache is invalidated even if the caller
    /// stops waiting.
    fn namespace<'a, F, Fut>(&'a self, names: Vec<String>, op: F) -> BoxFuture<'a, io::Result<()>>
    where
        F: FnOnce(PosixDisk, Vec<String>) -> Fut,
        Fut: Future<Output = io::Result<()>> + Send + 'static,
    {
        let change = op(self.posix.clone(), names.clone());
        let files = self.files.clone();
        Box::pin(async move {
            let task = tokio::spawn(async move {
                let result = change.await;
                let mut files = lock(&files);
                files.generation += 1;
                for name in &names {
                    files.open.remove(name);
                }
                result
            });
            task.await.map_err(io::Error::other)?
        })
    }

    /// Hands `request` to the I/O thread with `reply`; gives the request back if the thread
    /// has stopped.
    fn send(&self, mut request: Request, reply: Reply) -> Result<(), Request> {
        request.reply = Some(reply);
        self.requests
            .as_ref()
            .expect("the request channel lives until drop")
            .send(request)
            .map_err(|back| back.0)?;
        self.wake();
        Ok(())
    }

    /// A read into `buf` at `offset`, split into chunks of at most [`CHUNK`] bytes (or the
    /// alignment, if larger), one entry each, so the device works on them in parallel.
    fn read_chunks(&self, buf: &IoBuf, offset: u64) -> Vec<Chunk> {
        let size = CHUNK.max(self.alignment());
        (0..buf.len())
            .step_by(size)
            .map(|start| {
                let len = size.min(buf.len() - start);
                Chunk::of(vec![Seg { buf: 0, start, len }], offset + start as u64)
            })
            .collect()
    }

    /// A write of `bufs` back to back from `offset`, as few vectored writes as possible (up to
    /// [`IOV_MAX`] segments and [`MAX_WRITE`] bytes each): one direct write per bucket, as an
    /// extending `O_DIRECT` write is done under the inode's lock, so many small ones would be
    /// serialised.
    fn write_chunks(&self, bufs: &[IoBuf], offset: u64) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        let mut segs = Vec::new();
        let (mut start_at, mut at, mut bytes) = (offset, offset, 0usize);
        for (i, buf) in bufs.iter().enumerate() {
            let mut start = 0;
            while start < buf.len() {
                let len = (MAX_WRITE - bytes).min(buf.len() - start);
                segs.push(Seg { buf: i, start, len });
                start += len;
                bytes += len;
                at += len as u64;
                if bytes == MAX_WRITE || segs.len() == IOV_MAX {
                    chunks.push(Chunk::of(std::mem::take(&mut segs), start_at));
                    (start_at, bytes) = (at, 0);
                }
            }
        }
        if !segs.is_empty() {
            chunks.push(Chunk::of(segs, start_at));
        }
        chunks
    }

    /// Writes `bufs` back to back from `offset`: every chunk of every buffer in flight at
    /// once (up to the queue depth).
    async fn write_bufs(
        &self,
        name: &str,
        offset: u64,
        bufs: Vec<IoBuf>,
    ) -> IoResult<Vec<IoBuf>, ()> {
        let alignment = self.alignment();
        let mut at = offset;
        for buf in &bufs {
            if let Err(e) = check_aligned(alignment, at, buf.as_ptr(), buf.len()) {
                return (bufs, Err(e));
            }
            at += buf.len() as u64;
        }
        let file = match self.file(name).await {
            Ok(file) => file,
            Err(e) => return (bufs, Err(e)),
        };
        let chunks = self.write_chunks(&bufs, offset);
        if chunks.is_empty() {
            return (bufs, Ok(()));
        }
        let (reply, result) = oneshot::channel();
        let request = Request::new(file, Kind::Write, bufs, chunks);
        if let Err(back) = self.send(request, Reply::Write(reply)) {
            return (back.bufs, Err(thread_gone()));
        }
        result
            .await
            .unwrap_or_else(|_| (Vec::new(), Err(thread_gone())))
    }
}

impl Drop for UringDisk {
    /// Closes the request channel and waits for the I/O thread to finish what is in flight.
    fn drop(&mut self) {
        drop(self.requests.take());
        self.wake();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            error!("the io_uring thread panicked");
        }
    }
}

fn lock(files: &Mutex<Files>) -> MutexGuard<'_, Files> {
    files
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn thread_gone() -> io::Error {
    io::Error::other("the io_uring thread has stopped")
}

/// A ring of [`DEPTH`] entries that supports every opcode used here, or `Unsupported`.
/// `READ_FIXED` is not probed: it predates `READ` (Linux 5.1 against 5.6).
fn new_ring() -> io::Result<IoUring> {
    let unsupported = |what: String| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("io_uring is unavailable ({what}); use PosixDisk"),
        )
    };
    let ring = IoUring::new(DEPTH as u32).map_err(|e| unsupported(e.to_string()))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| unsupported(format!("probing opcodes: {e}")))?;
    for (code, name) in [
        (opcode::Read::CODE, "read"),
        (opcode::Write::CODE, "write"),
        (opcode::Fsync::CODE, "fsync"),
    ] {
        if !probe.is_supported(code) {
            return Err(unsupported(format!("no {name} opcode")));
        }
    }
    Ok(ring)
}

impl Disk for UringDisk {
    fn alignment(&self) -> usize {
        self.posix.alignment()
    }

    fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        self.namespace(vec![name.to_string()], |posix, names| async move {
            posix.create(&names[0]).await
        })
    }

    fn write_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, ()>> {
        Box::pin(async move {
            let (mut bufs, result) = self.write_bufs(name, offset, vec![buf]).await;
            (bufs.pop().unwrap_or_default(), result)
        })
    }

    fn write_all_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        bufs: Vec<IoBuf>,
    ) -> BoxFuture<'a, IoResult<Vec<IoBuf>, ()>> {
        Box::pin(self.write_bufs(name, offset, bufs))
    }

    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, usize>> {
        Box::pin(async move {
            if let Err(e) = check_aligned(self.alignment(), offset, buf.as_ptr(), buf.len()) {
                return (buf, Err(e));
            }
            let file = match self.file(name).await {
                Ok(file) => file,
                Err(e) => return (buf, Err(e)),
            };
            if buf.is_empty() {
                return (buf, Ok(0));
            }
            // A buffer inside the registered memory (a staging slot) is read with READ_FIXED.
            let (start, len) = (buf.as_ptr() as usize, buf.len());
            let fixed = self
                .fixed
                .is_some_and(|(base, size)| start >= base && start + len <= base + size);
            // A large read goes out as several chunks in one submission: the device works on
            // them in parallel (queue depth > 1 for a single value).
            let chunks = self.read_chunks(&buf, offset);
            let bufs = vec![buf];
            let (reply, result) = oneshot::channel();
            let request = Request::new(file, Kind::Read { fixed }, bufs, chunks);
            if let Err(back) = self.send(request, Reply::Read(reply)) {
                let buf = back.bufs.into_iter().next().unwrap_or_default();
                return (buf, Err(thread_gone()));
            }
            // If this future is dropped now, the I/O thread still owns the buffer and drops it
            // only after the kernel has finished with it.
            result
                .await
                .unwrap_or_else(|_| (IoBuf::default(), Err(thread_gone())))
        })
    }

    fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let file = self.file(name).await?;
            let (reply, result) = oneshot::channel();
            let request = Request::new(file, Kind::Sync, Vec::new(), vec![Chunk::sync()]);
            if self.send(request, Reply::Sync(reply)).is_err() {
                return Err(thread_gone());
            }
            result.await.map_err(|_| thread_gone())?
        })
    }

    fn len<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<u64>> {
        self.posix.len(name)
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        self.namespace(vec![name.to_string()], |posix, names| async move {
            posix.remove(&names[0]).await
        })
    }

    fn rename<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, io::Result<()>> {
        self.namespace(
            vec![from.to_string(), to.to_string()],
            |posix, names| async move { posix.rename(&names[0], &names[1]).await },
        )
    }

    fn list(&self) -> BoxFuture<'_, io::Result<Vec<String>>> {
        self.posix.list()
    }
}
