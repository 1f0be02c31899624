//! The [`Disk`] trait over io_uring.
//!
//! Data transfers and `fdatasync` go through one ring owned by a dedicated I/O thread. The
//! thread keeps a read of an eventfd in the ring and waits in `io_uring_enter` for any
//! completion; a caller queues its request on a channel and then writes the eventfd, so the
//! thread wakes for it at once, even while transfers are in flight. Each time it wakes, the
//! thread moves up to the queue depth of pending requests into the submission queue and
//! submits them in one `io_uring_enter`, so concurrent transfers are batched up to the queue
//! depth. A read larger than [`READ_CHUNK`] is split into chunks, one request each, submitted
//! together so the device works on them in parallel.
//!
//! Namespace operations (create, remove, rename, list, len) run on tokio's blocking pool
//! through the POSIX adapter, which also learns the direct-I/O alignment; files are opened on
//! the blocking pool too (names validated as the POSIX adapter does) and cached by name.
//!
//! Soundness: memory or a descriptor the kernel uses for a request must stay valid until that
//! request's completion is reaped, even if the caller drops its future mid-transfer.
//!
//! - Writes, syncs and reads outside the registered buffer use only what the request owns, held
//!   in the I/O thread's slot until its completion is reaped: an `Arc<File>` and, for a
//!   transfer, an [`AlignedBuf`]. Writes copy into one and such reads copy out of one, like the
//!   POSIX adapter.
//! - Reads into the buffer registered by [`UringDisk::open_with_buffer`] (the staging buffer)
//!   go straight into the caller's memory with `READ_FIXED`; nothing of that memory is owned
//!   here. `read_at` keeps its borrow until every chunk has completed, but a future dropped
//!   mid-read releases it early, and a broken ring fails reads the kernel may still run: both
//!   are left to that function's safety contract.
//! - The eventfd read's 8-byte buffer is leaked: the read is still pending when the ring goes.
//! - Dropping the disk waits for the I/O thread, which exits once no transfer is in flight.
//!   If the ring fails, which entries the kernel took is unknown: the requests in flight fail,
//!   and their buffers and files, and the ring itself, are leaked rather than freed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use io_uring::{IoUring, Probe, opcode, squeue, types};
use mooring_proto::disk::Disk;
use mooring_proto::transport::BoxFuture;
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::AlignedBuf;

/// Reads larger than this (or than the alignment, if larger) are split into chunks, one
/// request each, submitted together.
const READ_CHUNK: usize = 256 << 10;
use crate::aligned::check_aligned;
use crate::paths::resolve;
use crate::posix::{IoMode, PosixDisk};

/// Submission queue depth: the most transfers in flight at once.
const DEPTH: usize = 64;

/// The largest transfer one SQE asks for (the length field is 32 bits); larger transfers
/// continue with further SQEs (in practice only writes: reads are already split at
/// [`READ_CHUNK`]). A power of two, so it keeps any direct-I/O alignment.
const MAX_CHUNK: usize = 1 << 30;

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
        // SAFETY: no buffer is registered.
        unsafe { UringDisk::open_with_buffer(root, mode, None) }
    }

    /// [`UringDisk::open`], registering `buffer` (address, length) with the ring as fixed
    /// buffer 0 (after `MADV_NOHUGEPAGE` on the range, so pinning its pages works whatever the
    /// system's transparent huge page policy): a read whose destination lies wholly inside it
    /// goes straight into it with `READ_FIXED` (chunked like any read), with no bounce buffer
    /// or copy; other reads bounce as usual. If registration fails, every read bounces
    /// (logged; see [`UringDisk::has_registered_buffer`]).
    ///
    /// # Safety
    ///
    /// The buffer must stay mapped and writable until this disk is dropped: the ring pins its
    /// pages, and reads write into it from the kernel, outside Rust's borrows. `read_at` keeps
    /// its destination borrowed until every chunk has completed, but the kernel may still
    /// write a read's destination after that borrow ends:
    ///
    /// - a read whose future is dropped before it completes may still land afterwards, up to
    ///   the drop of this disk (which waits for every transfer in flight);
    /// - if the ring fails, a read in flight returns an error while the kernel may still run
    ///   it, and the ring is leaked, so it may land at any later time, even after this disk
    ///   is dropped.
    ///
    /// The caller must not hand such a part of the buffer to anyone else while a read may
    /// still land there.
    pub unsafe fn open_with_buffer(
        root: impl Into<PathBuf>,
        mode: IoMode,
        buffer: Option<(std::ptr::NonNull<u8>, usize)>,
    ) -> io::Result<UringDisk> {
        let ring = new_ring()?;
        let fixed = buffer.and_then(|(ptr, len)| {
            // SAFETY: the caller vouches that the range is a live, writable mapping that
            // stays so until this disk is dropped. madvise only changes the mapping's huge
            // page advice (its result is ignored: advice, not a requirement); the registration
            // pins the pages. Neither changes the contents.
            let registered = unsafe {
                libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_NOHUGEPAGE);
                let iovec = libc::iovec {
                    iov_base: ptr.as_ptr().cast(),
                    iov_len: len,
                };
                ring.submitter().register_buffers(&[iovec])
            };
            match registered {
                Ok(()) => Some((ptr.as_ptr() as usize, len)),
                Err(e) => {
                    warn!("io_uring could not register the staging buffer, reads will bounce: {e}");
                    None
                }
            }
        });
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
            .spawn(move || run(ring, received, alignment, thread_wake))?;
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

    /// Whether a buffer is registered (reads into it skip the bounce buffer).
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
            options.read(true).write(true);
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

    /// Hands `op` on `file` to the I/O thread and waits for its result.
    async fn submit<T>(
        &self,
        file: Arc<File>,
        op: impl FnOnce(oneshot::Sender<io::Result<T>>) -> Op,
    ) -> io::Result<T> {
        let (reply, result) = oneshot::channel();
        let request = Request {
            file,
            op: op(reply),
        };
        self.requests
            .as_ref()
            .expect("the request channel lives until drop")
            .send(request)
            .map_err(|_| thread_gone())?;
        self.wake();
        result.await.map_err(|_| thread_gone())?
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

/// A transfer or sync for the I/O thread. The file stays open until it completes.
struct Request {
    file: Arc<File>,
    op: Op,
}

/// What to do, with the buffer (owned, except for `ReadFixed`) and progress so far.
enum Op {
    Read {
        buf: AlignedBuf,
        len: usize,
        offset: u64,
        done: usize,
        reply: oneshot::Sender<io::Result<(AlignedBuf, usize)>>,
    },
    Write {
        buf: AlignedBuf,
        len: usize,
        offset: u64,
        done: usize,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Sync {
        reply: oneshot::Sender<io::Result<()>>,
    },
    /// A read straight into the registered buffer (fixed buffer 0), at address `addr`: memory
    /// of the caller's, not of this request (see [`UringDisk::open_with_buffer`]).
    ReadFixed {
        addr: usize,
        len: usize,
        offset: u64,
        done: usize,
        reply: oneshot::Sender<io::Result<usize>>,
    },
}

impl Request {
    /// The SQE for the rest of this request, tagged with its slot.
    fn entry(&mut self, slot: usize) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        let entry = match &mut self.op {
            Op::Read {
                buf,
                len,
                offset,
                done,
                ..
            } => {
                let n = (*len - *done).min(MAX_CHUNK);
                opcode::Read::new(fd, buf[*done..].as_mut_ptr(), n as u32)
                    .offset(*offset + *done as u64)
                    .build()
            }
            Op::Write {
                buf,
                len,
                offset,
                done,
                ..
            } => {
                let n = (*len - *done).min(MAX_CHUNK);
                opcode::Write::new(fd, buf[*done..].as_ptr(), n as u32)
                    .offset(*offset + *done as u64)
                    .build()
            }
            Op::Sync { .. } => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::ReadFixed {
                addr,
                len,
                offset,
                done,
                ..
            } => {
                let n = (*len - *done).min(MAX_CHUNK);
                opcode::ReadFixed::new(fd, (*addr + *done) as *mut u8, n as u32, 0)
                    .offset(*offset + *done as u64)
                    .build()
            }
        };
        entry.user_data(slot as u64)
    }

    /// Accounts for a completion with result `res`; `Some(self)` if more is to be submitted.
    fn complete(mut self, res: i32, alignment: usize) -> Option<Request> {
        if res == -libc::EINTR || res == -libc::EAGAIN {
            return Some(self);
        }
        let failed = || io::Error::from_raw_os_error(-res);
        match &mut self.op {
            Op::Read { len, done, .. } | Op::ReadFixed { len, done, .. } => {
                if res > 0 {
                    *done += res as usize;
                    // Direct reads keep whole aligned blocks: a short one ends the file.
                    if *done < *len && done.is_multiple_of(alignment) {
                        return Some(self);
                    }
                }
            }
            Op::Write { len, done, .. } => {
                if res > 0 {
                    *done += res as usize;
                    if *done < *len {
                        return Some(self);
                    }
                }
            }
            Op::Sync { .. } => {}
        }
        match self.op {
            Op::Read { reply, .. } if res < 0 => drop(reply.send(Err(failed()))),
            Op::Read {
                buf, done, reply, ..
            } => drop(reply.send(Ok((buf, done)))),
            Op::Write { reply, .. } if res < 0 => drop(reply.send(Err(failed()))),
            Op::Write { reply, .. } if res == 0 => drop(reply.send(Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the write made no progress",
            )))),
            Op::Write { reply, .. } => drop(reply.send(Ok(()))),
            Op::Sync { reply } if res < 0 => drop(reply.send(Err(failed()))),
            Op::Sync { reply } => drop(reply.send(Ok(()))),
            Op::ReadFixed { reply, .. } if res < 0 => drop(reply.send(Err(failed()))),
            Op::ReadFixed { done, reply, .. } => drop(reply.send(Ok(done))),
        }
        None
    }

    /// Replies `error` and returns the resources the kernel may still use, to be leaked. A
    /// `ReadFixed` has none here: its destination is the caller's registered buffer, which the
    /// kernel may still write after this reply (see [`UringDisk::open_with_buffer`]).
    fn fail(self, error: impl Fn() -> io::Error) -> (Arc<File>, Option<AlignedBuf>) {
        let buf = match self.op {
            Op::Read { buf, reply, .. } => {
                let _ = reply.send(Err(error()));
                Some(buf)
            }
            Op::Write { buf, reply, .. } => {
                let _ = reply.send(Err(error()));
                Some(buf)
            }
            Op::Sync { reply } => {
                let _ = reply.send(Err(error()));
                None
            }
            Op::ReadFixed { reply, .. } => {
                let _ = reply.send(Err(error()));
                None
            }
        };
        (self.file, buf)
    }
}

/// Queues `entry`, submitting first if the submission queue is full.
fn push(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<()> {
    loop {
        // SAFETY: what every entry points at stays valid until its completion is reaped. A
        // transfer or sync points at its request's file and, for a transfer, at the request's
        // owned buffer, both kept in the request's slot until then; a `ReadFixed` points into
        // the registered buffer instead, which `open_with_buffer`'s contract keeps valid. The
        // wake read points at a leaked buffer and at the eventfd, which stays open until the
        // thread has exited (and the kernel holds its own reference once it is submitted).
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        match ring.submit() {
            Ok(_) => {}
            Err(e) if transient(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Errors of `io_uring_enter` after which submitting again is right.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// The I/O thread: submits requests in batches of up to [`DEPTH`] and completes them until
/// the channel closes and nothing is in flight.
fn run(mut ring: IoUring, requests: Receiver<Request>, alignment: usize, wake: Arc<OwnedFd>) {
    let mut slots: Vec<Option<Request>> = (0..DEPTH).map(|_| None).collect();
    let mut free: Vec<usize> = (0..DEPTH).rev().collect();
    let mut completed: Vec<(u64, i32)> = Vec::with_capacity(2 * DEPTH);
    let mut open = true;
    // The wake read's buffer: leaked, as the kernel may still hold the read when the ring
    // goes away.
    let wake_buf: &'static mut [u8; 8] = Box::leak(Box::new([0u8; 8]));
    let wake_entry = opcode::Read::new(types::Fd(wake.as_raw_fd()), wake_buf.as_mut_ptr(), 8)
        .build()
        .user_data(WAKE);
    let fatal = 'run: loop {
        if let Err(e) = push(&mut ring, &wake_entry) {
            break 'run e;
        }
        loop {
            // Take what is pending, up to the queue depth.
            while open && let Some(&slot) = free.last() {
                match requests.try_recv() {
                    Ok(mut request) => {
                        free.pop();
                        let entry = request.entry(slot);
                        slots[slot] = Some(request);
                        if let Err(e) = push(&mut ring, &entry) {
                            break 'run e;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if !open && free.len() == DEPTH {
                return; // closed, and no transfer in flight (only the wake read, see above)
            }
            // Until a transfer completes or a new request wakes us.
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if transient(&e) => {}
                Err(e) => break 'run e,
            }
            completed.extend(ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
            let mut rearm = false;
            for (tag, res) in completed.drain(..) {
                if tag == WAKE {
                    rearm = true;
                    continue;
                }
                let slot = tag as usize;
                let request = slots[slot]
                    .take()
                    .expect("a completion for an occupied slot");
                match request.complete(res, alignment) {
                    Some(mut more) => {
                        let entry = more.entry(slot);
                        slots[slot] = Some(more);
                        if let Err(e) = push(&mut ring, &entry) {
                            break 'run e;
                        }
                    }
                    None => free.push(slot),
                }
            }
            if rearm {
                continue 'run;
            }
        }
    };
    // The ring is broken: which entries the kernel took is unknown, so every request in
    // flight fails and leaks its buffer and file rather than free what the kernel may use.
    // A `ReadFixed`'s destination is the caller's: such a read may still land after its
    // error is returned, which `open_with_buffer`'s contract covers.
    error!(error = %fatal, "io_uring failed; failing all requests");
    let failure = || io::Error::other(format!("io_uring failed: {fatal}"));
    for request in slots.into_iter().flatten() {
        std::mem::forget(request.fail(failure));
    }
    std::mem::forget(ring);
    for request in requests {
        drop(request.fail(failure));
    }
}

/// The bytes a chunked read got: its chunks' up to the first short one (the end of the file).
fn sum_reads(chunks: Vec<io::Result<(usize, usize)>>) -> io::Result<usize> {
    let mut total = 0;
    for chunk in chunks {
        let (done, len) = chunk?;
        total += done;
        if done < len {
            break;
        }
    }
    Ok(total)
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
        data: &'a [u8],
    ) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let alignment = self.alignment();
            check_aligned(alignment, offset, data.as_ptr(), data.len())?;
            let file = self.file(name).await?;
            if data.is_empty() {
                return Ok(());
            }
            // The ring needs owned data; direct I/O needs it aligned too.
            let buf = AlignedBuf::copy_of(data, alignment);
            let len = data.len();
            self.submit(file, |reply| Op::Write {
                buf,
                len,
                offset,
                done: 0,
                reply,
            })
            .await
        })
    }

    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: &'a mut [u8],
    ) -> BoxFuture<'a, io::Result<usize>> {
        Box::pin(async move {
            let alignment = self.alignment();
            check_aligned(alignment, offset, buf.as_ptr(), buf.len())?;
            let file = self.file(name).await?;
            let len = buf.len();
            if len == 0 {
                return Ok(0);
            }
            // A large read goes out as several chunks in one submission: the device works
            // on them in parallel (queue depth > 1 for a single value).
            let chunk = READ_CHUNK.max(alignment);
            let start = buf.as_ptr() as usize;
            if let Some((base, size)) = self.fixed
                && start >= base
                && start + len <= base + size
            {
                let reads = (0..len.div_ceil(chunk)).map(|i| {
                    let file = file.clone();
                    let part = chunk.min(len - i * chunk);
                    let at = offset + (i * chunk) as u64;
                    async move {
                        let done = self
                            .submit(file, |reply| Op::ReadFixed {
                                addr: start + i * chunk,
                                len: part,
                                offset: at,
                                done: 0,
                                reply,
                            })
                            .await?;
                        Ok::<_, io::Error>((done, part))
                    }
                });
                // The kernel writes `buf` meanwhile. `join_all` (not `try_join_all`) waits for
                // every chunk, even after one fails, so this future holds the borrow until the
                // kernel is done with it; if the future is dropped first, or the ring fails,
                // `open_with_buffer`'s contract covers the reads still running.
                return sum_reads(futures_util::future::join_all(reads).await);
            }
            let reads = buf.chunks_mut(chunk).enumerate().map(|(i, part)| {
                let file = file.clone();
                let len = part.len();
                let owned = AlignedBuf::new(len, alignment);
                let at = offset + (i * chunk) as u64;
                async move {
                    let (owned, done) = self
                        .submit(file, |reply| Op::Read {
                            buf: owned,
                            len,
                            offset: at,
                            done: 0,
                            reply,
                        })
                        .await?;
                    part[..done].copy_from_slice(&owned[..done]);
                    Ok::<_, io::Error>((done, len))
                }
            });
            sum_reads(futures_util::future::join_all(reads).await)
        })
    }

    fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        Box::pin(async move {
            let file = self.file(name).await?;
            self.submit(file, |reply| Op::Sync { reply }).await
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
