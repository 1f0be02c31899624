//! The io_uring I/O thread: the request table, how requests become submission entries (reads
//! split into chunks, vectored writes, `READ_FIXED` into the registered buffer), and the loop
//! that submits, reaps completions and answers callers. Everything the kernel may still touch
//! stays in the table until its last completion (see the soundness notes in the parent module).

use super::*;

/// A transfer or sync for the I/O thread: what it owns until its last chunk completes.
pub(super) struct Request {
    pub(super) file: Arc<File>,
    pub(super) kind: Kind,
    /// The buffers, moved in by the caller and handed back with the reply.
    pub(super) bufs: Vec<IoBuf>,
    pub(super) chunks: Vec<Chunk>,
    /// The next chunk to submit.
    pub(super) next: usize,
    /// Entries of this request in the ring.
    pub(super) in_flight: usize,
    /// The first failure.
    pub(super) error: Option<io::Error>,
    /// `None` only until sent.
    pub(super) reply: Option<Reply>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Into the buffer; `fixed`: it lies in the registered buffer (fixed buffer 0).
    Read {
        fixed: bool,
    },
    Write,
    Sync,
}

/// One entry's worth of a request: `len` bytes at file `offset`, from or into `segs`.
pub(super) struct Chunk {
    pub(super) segs: Vec<Seg>,
    pub(super) len: usize,
    pub(super) offset: u64,
    pub(super) done: usize,
    /// The vector of a vectored write, rebuilt for each submission and kept until its
    /// completion (the kernel reads it).
    pub(super) iov: Iovecs,
}

/// `len` bytes at `start` of buffer `buf`.
#[derive(Clone, Copy)]
pub(super) struct Seg {
    pub(super) buf: usize,
    pub(super) start: usize,
    pub(super) len: usize,
}

/// A `writev` vector: pointers into the request's own buffers.
#[derive(Default)]
pub(super) struct Iovecs(pub(super) Vec<libc::iovec>);

// SAFETY: the pointers are into buffers of the request that holds this vector (which moves
// between threads with them) and are only used by the I/O thread.
unsafe impl Send for Iovecs {}

impl Chunk {
    /// The one "chunk" of a sync.
    pub(super) fn sync() -> Chunk {
        Chunk::of(Vec::new(), 0)
    }

    pub(super) fn of(segs: Vec<Seg>, offset: u64) -> Chunk {
        Chunk {
            len: segs.iter().map(|s| s.len).sum(),
            segs,
            offset,
            done: 0,
            iov: Iovecs::default(),
        }
    }
}

pub(super) enum Reply {
    Read(oneshot::Sender<IoResult<IoBuf, usize>>),
    Write(oneshot::Sender<IoResult<Vec<IoBuf>, ()>>),
    Sync(oneshot::Sender<io::Result<()>>),
}

/// `user_data` of chunk `chunk` of the request in table entry `id`.
pub(super) fn tag(id: usize, chunk: usize) -> u64 {
    ((id as u64) << 32) | chunk as u64
}

impl Request {
    pub(super) fn new(
        file: Arc<File>,
        kind: Kind,
        bufs: Vec<IoBuf>,
        chunks: Vec<Chunk>,
    ) -> Request {
        Request {
            file,
            kind,
            bufs,
            chunks,
            next: 0,
            in_flight: 0,
            error: None,
            reply: None,
        }
    }

    /// Whether chunks are left to submit.
    pub(super) fn has_more(&self) -> bool {
        self.next < self.chunks.len()
    }

    /// Whether every chunk has completed (or the rest will not be submitted after an error).
    pub(super) fn finished(&self) -> bool {
        !self.has_more() && self.in_flight == 0
    }

    /// The SQE for the rest of chunk `c`, tagged with table entry `id`.
    pub(super) fn entry(&mut self, id: usize, c: usize) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        let chunk = &mut self.chunks[c];
        let offset = chunk.offset + chunk.done as u64;
        let n = (chunk.len - chunk.done) as u32;
        // Raw pointers, no references: the kernel may be writing other chunks of the buffers
        // meanwhile. Each stays inside its buffer (`start + skip < start + len <= capacity`).
        let mut skip = chunk.done;
        let mut rest = Vec::with_capacity(chunk.segs.len());
        for seg in &chunk.segs {
            if skip >= seg.len {
                skip -= seg.len;
                continue;
            }
            let ptr = self.bufs[seg.buf]
                .as_mut_ptr()
                .wrapping_add(seg.start + skip);
            rest.push(libc::iovec {
                iov_base: ptr.cast(),
                iov_len: seg.len - skip,
            });
            skip = 0;
        }
        let entry = match (self.kind, rest.as_slice()) {
            (Kind::Sync, _) => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            (Kind::Read { fixed: true }, [one]) => {
                opcode::ReadFixed::new(fd, one.iov_base.cast(), n, 0)
                    .offset(offset)
                    .build()
            }
            (Kind::Read { .. }, [one]) => opcode::Read::new(fd, one.iov_base.cast(), n)
                .offset(offset)
                .build(),
            (Kind::Write, [one]) => opcode::Write::new(fd, one.iov_base.cast(), n)
                .offset(offset)
                .build(),
            (Kind::Write, _) => {
                chunk.iov = Iovecs(rest);
                opcode::Writev::new(fd, chunk.iov.0.as_ptr(), chunk.iov.0.len() as u32)
                    .offset(offset)
                    .build()
            }
            (Kind::Read { .. }, _) => unreachable!("a read chunk has one segment"),
        };
        entry.user_data(tag(id, c))
    }

    /// Accounts for chunk `c`'s completion with result `res`; `true` if the rest of the chunk
    /// is to be submitted again.
    pub(super) fn complete(&mut self, c: usize, res: i32, alignment: usize) -> bool {
        if res == -libc::EINTR || res == -libc::EAGAIN {
            return true;
        }
        let chunk = &mut self.chunks[c];
        if res < 0 {
            self.error
                .get_or_insert_with(|| io::Error::from_raw_os_error(-res));
            self.next = self.chunks.len(); // submit nothing more
            return false;
        }
        match self.kind {
            Kind::Read { .. } => {
                chunk.done += res as usize;
                // Direct reads keep whole aligned blocks: a short one ends the file, as does
                // an empty one.
                res > 0 && chunk.done < chunk.len && chunk.done.is_multiple_of(alignment)
            }
            Kind::Write if res == 0 => {
                self.error.get_or_insert_with(|| {
                    io::Error::new(io::ErrorKind::WriteZero, "the write made no progress")
                });
                self.next = self.chunks.len();
                false
            }
            Kind::Write => {
                chunk.done += res as usize;
                chunk.done < chunk.len
            }
            Kind::Sync => false,
        }
    }

    /// Sends the result, handing the buffers back.
    pub(super) fn reply(self) {
        let result = match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        };
        match self.reply.expect("a sent request has its reply") {
            Reply::Read(reply) => {
                // The bytes read: the chunks' up to the first short one (the end of the file).
                let mut total = 0;
                for chunk in &self.chunks {
                    total += chunk.done;
                    if chunk.done < chunk.len {
                        break;
                    }
                }
                let buf = self.bufs.into_iter().next().unwrap_or_default();
                let _ = reply.send((buf, result.map(|()| total)));
            }
            Reply::Write(reply) => drop(reply.send((self.bufs, result))),
            Reply::Sync(reply) => drop(reply.send(result)),
        }
    }

    /// Replies `error` without the buffers, which are returned to be leaked: the kernel may
    /// still use them.
    pub(super) fn fail_keeping(mut self, error: io::Error) -> (Arc<File>, Vec<IoBuf>) {
        let bufs = std::mem::take(&mut self.bufs);
        self.error = Some(error);
        let file = self.file.clone();
        self.reply();
        (file, bufs)
    }
}

/// Queues `entry`, submitting first if the submission queue is full.
pub(super) fn push(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<()> {
    loop {
        // SAFETY: what every entry points at stays valid until its completion is reaped. A
        // transfer or sync points at its request's file and, for a transfer, into the
        // request's own buffers (through the chunk's own iovec array, for a vectored write) (a `ReadFixed`'s lies in the registered memory, which the I/O
        // thread keeps mapped until the ring is gone), all held in the request table until the
        // request's last entry completes, leaked if the ring fails, and never handed to anyone
        // else meanwhile. The wake read points at a leaked buffer and at the eventfd, which
        // stays open until the thread has exited (and the kernel holds its own reference once
        // it is submitted).
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
pub(super) fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

/// The requests the I/O thread holds, by table entry.
#[derive(Default)]
pub(super) struct Table {
    pub(super) entries: Vec<Option<Request>>,
    pub(super) vacant: Vec<usize>,
    pub(super) live: usize,
}

impl Table {
    pub(super) fn insert(&mut self, request: Request) -> usize {
        self.live += 1;
        match self.vacant.pop() {
            Some(id) => {
                self.entries[id] = Some(request);
                id
            }
            None => {
                self.entries.push(Some(request));
                self.entries.len() - 1
            }
        }
    }

    pub(super) fn get(&mut self, id: usize) -> &mut Request {
        self.entries[id].as_mut().expect("a live table entry")
    }

    pub(super) fn remove(&mut self, id: usize) -> Request {
        self.live -= 1;
        self.vacant.push(id);
        self.entries[id].take().expect("a live table entry")
    }
}

/// The I/O thread: takes requests, keeps up to [`DEPTH`] of their chunks in flight, and
/// completes them until the channel closes and nothing is in flight.
pub(super) fn run(
    ring: IoUring,
    registered: Option<SegmentMemory>,
    requests: Receiver<Request>,
    alignment: usize,
    wake: Arc<OwnedFd>,
) {
    // Leaked if this thread unwinds: the kernel may still use what they point at.
    let mut ring = ManuallyDrop::new(ring);
    let mut table = ManuallyDrop::new(Table::default());
    let registered = ManuallyDrop::new(registered);
    // Requests with chunks left to submit, oldest first.
    let mut ready: VecDeque<usize> = VecDeque::new();
    let mut in_flight = 0usize;
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
            // Take everything pending.
            while open {
                match requests.try_recv() {
                    Ok(request) => ready.push_back(table.insert(request)),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            // Queue chunks, up to the queue depth in flight.
            while in_flight < DEPTH
                && let Some(&id) = ready.front()
            {
                // An entry may be stale: its request failed and finished, and the table entry
                // may even hold a newer request (listed again further back).
                let Some(request) = table.entries[id].as_mut().filter(|r| r.has_more()) else {
                    ready.pop_front();
                    continue;
                };
                let c = request.next;
                request.next += 1;
                request.in_flight += 1;
                in_flight += 1;
                let entry = request.entry(id, c);
                if !request.has_more() {
                    ready.pop_front();
                }
                if let Err(e) = push(&mut ring, &entry) {
                    break 'run e;
                }
            }
            if !open && table.live == 0 {
                // Closed, and no transfer in flight (only the wake read, see above): the
                // registration goes with the ring, before the registered memory.
                drop(ManuallyDrop::into_inner(ring));
                drop(ManuallyDrop::into_inner(registered));
                return;
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
                let (id, c) = ((tag >> 32) as usize, (tag & 0xffff_ffff) as usize);
                let request = table.get(id);
                if request.complete(c, res, alignment) {
                    let entry = request.entry(id, c);
                    if let Err(e) = push(&mut ring, &entry) {
                        break 'run e;
                    }
                    continue;
                }
                request.in_flight -= 1;
                in_flight -= 1;
                if request.finished() {
                    // The kernel is done with its buffers: hand them back (or, if the caller
                    // stopped waiting, drop them here, which gives lent memory back).
                    table.remove(id).reply();
                }
            }
            if rearm {
                continue 'run;
            }
        }
    };
    // The ring is broken: which entries the kernel took is unknown, so every request with an
    // entry in flight fails and leaks its buffers and file rather than free what the kernel may
    // use; so do the ring and the registered memory. Requests with nothing in flight get their
    // buffers back.
    error!(error = %fatal, "io_uring failed; failing all requests");
    let failure = || io::Error::other(format!("io_uring failed: {fatal}"));
    for id in 0..table.entries.len() {
        if table.entries[id].is_none() {
            continue;
        }
        let mut request = table.remove(id);
        if request.in_flight > 0 {
            std::mem::forget(request.fail_keeping(failure()));
        } else {
            request.error = Some(failure());
            request.reply();
        }
    }
    for mut request in requests {
        request.error = Some(failure());
        request.reply();
    }
}
