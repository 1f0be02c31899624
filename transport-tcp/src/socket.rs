//! A connected TCP socket that joins the runtime's reactor only while a task waits on it.
//!
//! Tokio registers a socket with epoll for its whole life, edge-triggered, so every segment that
//! arrives wakes the thread parked in `epoll_wait`, even while the connection's own task is
//! busy-polling the socket and takes the bytes itself (see [`crate::Framed`]). On a
//! single-threaded runtime the poller is that thread, so nothing is woken; on a multi-threaded
//! one (the Python extension's, a node's, an application's) an idle worker is woken for nothing
//! at every answer, and on a small host it takes a core from the master or the node for a
//! moment. Measured on the 2-core VM: 4 KiB gets over shared memory went from 10–13 µs to
//! 26–31 µs with every process on two workers, and `perf record -e sched:sched_wakeup` showed
//! the wake-ups coming from `recv` through `ep_poll_callback`.
//!
//! So a [`Socket`] moves bytes with non-blocking system calls of its own and, on a
//! multi-threaded runtime, is registered with the reactor only when a call has to park, and
//! only for the direction it waits on; the next busy-polling read takes it out again (one
//! `epoll_ctl` each way, paid only by calls that parked, which cost tens of µs anyway).
//! Readiness is never lost: a registration reports a socket that is ready already, and while
//! registered the reactor records every edge. The simulator's streams have no descriptors: there
//! a [`Socket`] is the simulated stream, always parked.

use std::io::{self, IoSlice};
use std::time::Duration;

#[cfg(not(madsim))]
pub(crate) use real::{Socket, retrying};
#[cfg(madsim)]
pub(crate) use simulated::Socket;

#[cfg(not(madsim))]
mod real {
    use super::*;
    use std::os::fd::{AsRawFd, RawFd};
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    /// A connected socket; see the module docs.
    pub(crate) struct Socket {
        /// The socket's place in the reactor, and for what, while it has one. Declared before
        /// the stream so that it leaves the reactor before the descriptor closes.
        registered: Option<(AsyncFd<Descriptor>, Interest)>,
        /// The stream (`None` if taking it from tokio's own registration failed: every call
        /// then fails).
        stream: Option<std::net::TcpStream>,
        fd: RawFd,
        /// Whether busy-polling reads take the socket out of the reactor, and parks register
        /// only the direction they wait for: on a multi-threaded runtime. On a
        /// single-threaded one the thread that polls the reactor is the one busy-polling, so
        /// an arrival wakes nobody, and staying in saves two `epoll_ctl` calls per park (bulk
        /// reads park several times a transfer).
        leaves_reactor: bool,
        /// Whether the last busy-polling call had to park. A connection whose answers come
        /// after the spin (a server whose client pauses) parks every time; taking it out of
        /// the reactor before each spin would cost two `epoll_ctl` calls a call and save
        /// nothing, so it stays in until a call is answered while spinning.
        parked_last: bool,
    }

    /// A descriptor the socket owns, as the reactor sees it.
    struct Descriptor(RawFd);

    impl AsRawFd for Descriptor {
        fn as_raw_fd(&self) -> RawFd {
            self.0
        }
    }

    impl Socket {
        /// Wraps a connected stream (out of the reactor until a call parks).
        pub(crate) fn new(stream: tokio::net::TcpStream) -> Socket {
            let fd = stream.as_raw_fd();
            let leaves_reactor = tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
            let stream = stream
                .into_std()
                .inspect_err(|e| tracing::warn!("cannot take a socket from the runtime: {e}"))
                .ok();
            Socket {
                registered: None,
                // A lost stream's descriptor is closed, and its number may be reused.
                fd: if stream.is_some() { fd } else { -1 },
                stream,
                leaves_reactor,
                parked_last: false,
            }
        }

        /// The descriptor, for tests that read its socket options.
        #[cfg(test)]
        pub(crate) fn fd(&self) -> RawFd {
            self.fd
        }

        /// Runs `op` (one non-blocking system call on the descriptor) until it stops saying
        /// "would block": first busy-polling for up to `spin`, then parked in the reactor.
        /// `op` must only report `WouldBlock` when the socket is not ready for `interest`.
        pub(crate) async fn io<R>(
            &mut self,
            interest: Interest,
            spin: Duration,
            mut op: impl FnMut(RawFd) -> io::Result<R>,
        ) -> io::Result<R> {
            if self.stream.is_none() {
                return Err(lost());
            }
            // Tokio's own streams take a unit of the task's budget per operation, so a long
            // transfer that never waits still lets the worker's other tasks run. Taken before
            // the call: a yield after it, if cancelled, would lose the bytes it moved.
            tokio::task::coop::consume_budget().await;
            let fd = self.fd;
            if !spin.is_zero() {
                // Out of the reactor while polling, unless calls keep parking for this very
                // direction (a registration for writing, left by a write that parked, would
                // be woken by every acknowledgement that frees room).
                let keeps = self.parked_last
                    && matches!(&self.registered, Some((_, has)) if *has == interest);
                if self.leaves_reactor && !keeps {
                    self.registered = None;
                }
                let started = std::time::Instant::now();
                loop {
                    match op(fd) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        done => {
                            self.parked_last = false;
                            return done;
                        }
                    }
                    if started.elapsed() >= spin {
                        break;
                    }
                    // Let this runtime's other tasks (other connections) and, if the host is
                    // oversubscribed, other processes' threads run between polls.
                    std::thread::yield_now();
                    tokio::task::yield_now().await;
                }
                self.parked_last = true;
            } else {
                // Once before parking: a registration's readiness is stale while polled.
                match op(fd) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    done => return done,
                }
            }
            self.registration(interest)?
                .async_io(interest, |_| op(fd))
                .await
        }

        /// The socket's registration, made for `interest` if it has none that covers it. On a
        /// multi-threaded runtime a read parks registered for reading alone: a socket
        /// registered for writing too is reported writable at once, which wakes the idle
        /// worker for nothing at every park.
        fn registration(&mut self, interest: Interest) -> io::Result<&AsyncFd<Descriptor>> {
            let wanted = if self.leaves_reactor {
                interest
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            let covered = matches!(&self.registered, Some((_, has)) if *has == wanted);
            if !covered {
                self.registered = None;
                // SAFETY: the descriptor is the stream's, which stays open and the same for
                // as long as the registration lives: both are this socket's, the stream is
                // never taken out, and the registration is dropped first.
                let registration =
                    unsafe { AsyncFd::register_with_interest(Descriptor(self.fd), wanted) }?;
                self.registered = Some((registration, wanted));
            }
            Ok(&self.registered.as_ref().expect("registered above").0)
        }

        /// Reads at least one byte (0: the peer closed), spinning up to `spin` before parking.
        pub(crate) async fn read_some(
            &mut self,
            buf: &mut [u8],
            spin: Duration,
        ) -> io::Result<usize> {
            self.io(Interest::READABLE, spin, |fd| {
                // SAFETY: `buf` is a valid writable slice; `fd` is this socket's, open while it
                // lives.
                retrying(|| unsafe {
                    libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                })
            })
            .await
        }

        /// Writes all of `bytes`.
        pub(crate) async fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
            while !bytes.is_empty() {
                let n = self
                    .io(Interest::WRITABLE, Duration::ZERO, |fd| {
                        // SAFETY: `bytes` is a valid readable slice; `fd` is this socket's.
                        retrying(|| unsafe {
                            libc::send(
                                fd,
                                bytes.as_ptr().cast(),
                                bytes.len(),
                                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                            )
                        })
                    })
                    .await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                bytes = &bytes[n..];
            }
            Ok(())
        }

        /// One gathered write of (a prefix of) `slices`; how many bytes it took.
        pub(crate) async fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
            self.io(Interest::WRITABLE, Duration::ZERO, |fd| {
                // SAFETY: an all-zero msghdr is valid (no address, no control data).
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                // IoSlice is ABI-compatible with iovec on Unix; sendmsg only reads them.
                msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = slices.len() as _;
                // SAFETY: `msg` points at live iovecs describing readable slices; `fd` is
                // this socket's.
                retrying(|| unsafe {
                    libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                })
            })
            .await
        }

        /// Nothing to flush: writes go straight to the kernel.
        pub(crate) async fn flush(&mut self) -> io::Result<()> {
            match self.stream {
                Some(_) => Ok(()),
                None => Err(lost()),
            }
        }

        /// Whether the peer has closed or reset the connection, or sent bytes: looks without
        /// waiting or consuming anything.
        pub(crate) fn peer_sent_or_closed(&self) -> bool {
            let mut byte = 0u8;
            // SAFETY: one writable byte; `fd` is this socket's, open while it lives (a lost
            // socket's is -1, which fails and so counts as closed).
            let n = unsafe {
                libc::recv(
                    self.fd,
                    (&raw mut byte).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
        }
    }

    /// A system call's byte count, or its error; made again if a signal interrupted it (never
    /// reported as "would block", which would drop a readiness the reactor will not repeat).
    pub(crate) fn retrying(mut call: impl FnMut() -> isize) -> io::Result<usize> {
        loop {
            let n = call();
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn lost() -> io::Error {
        io::Error::other("the socket could not be taken from the runtime's own registration")
    }
}

#[cfg(madsim)]
mod simulated {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The simulator's stream (always parked: it has no descriptor to poll).
    pub(crate) struct Socket {
        stream: tokio::net::TcpStream,
    }

    impl Socket {
        pub(crate) fn new(stream: tokio::net::TcpStream) -> Socket {
            Socket { stream }
        }

        pub(crate) async fn read_some(
            &mut self,
            buf: &mut [u8],
            _spin: Duration,
        ) -> io::Result<usize> {
            self.stream.read(buf).await
        }

        pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
            self.stream.write_all(bytes).await
        }

        pub(crate) async fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
            self.stream.write_vectored(slices).await
        }

        /// The simulated stream buffers until flushed.
        pub(crate) async fn flush(&mut self) -> io::Result<()> {
            self.stream.flush().await
        }

        /// The simulated stream cannot be looked at without reading: a dead peer shows when
        /// the next call fails.
        pub(crate) fn peer_sent_or_closed(&self) -> bool {
            false
        }
    }
}

#[cfg(all(test, target_os = "linux", not(madsim)))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Instant;

    /// A socket on `runtime` connected to a plain blocking stream for the test to drive.
    fn pair(runtime: &tokio::runtime::Runtime) -> (Socket, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let socket =
            runtime.block_on(async { Socket::new(tokio::net::TcpStream::from_std(ours).unwrap()) });
        (socket, peer)
    }

    /// A runtime with one worker, its threads named `name`: tests run side by side in one
    /// process, so a test that counts its worker's switches gives it a name no other test uses.
    fn multi_thread(name: &str) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Voluntary context switches of this process's threads named `name` so far.
    fn switches_of(name: &str) -> u64 {
        let mut total = 0;
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            total += status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .map(|v| v.trim().parse::<u64>().unwrap())
                .unwrap();
        }
        total
    }

    /// Reads that park and reads that spin, alternating, on a multi-threaded runtime: the
    /// socket goes in and out of the reactor and no byte or wake-up is lost on the way.
    #[test]
    fn reads_that_park_and_reads_that_spin_take_every_byte() {
        let runtime = multi_thread("socket-test-io");
        let (mut socket, mut peer) = pair(&runtime);
        let sender = std::thread::spawn(move || {
            for i in 0..200u32 {
                // Some answers come at once, some after the reader has given up spinning.
                if i % 3 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                peer.write_all(&i.to_le_bytes()).unwrap();
            }
            peer
        });
        let mut got = Vec::new();
        runtime.block_on(async {
            let mut buf = [0u8; 64];
            while got.len() < 800 {
                let spin = if got.len() % 8 == 0 {
                    Duration::ZERO
                } else {
                    Duration::from_micros(50)
                };
                let n =
                    tokio::time::timeout(Duration::from_secs(10), socket.read_some(&mut buf, spin))
                        .await
                        .expect("a read parked for good: a wake-up was lost")
                        .unwrap();
                assert!(n > 0, "the peer closed early");
                got.extend_from_slice(&buf[..n]);
            }
        });
        let expected: Vec<u8> = (0..200u32).flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(got, expected);
        drop(sender.join().unwrap());
        runtime.block_on(async {
            let mut buf = [0u8; 8];
            assert_eq!(
                socket
                    .read_some(&mut buf, Duration::from_micros(50))
                    .await
                    .unwrap(),
                0
            );
        });
    }

    /// A write larger than the socket's buffers, to a peer that starts reading late, parks in
    /// the reactor until there is room, and arrives whole.
    #[test]
    fn a_write_that_fills_the_socket_waits_for_room() {
        let runtime = multi_thread("socket-test-io");
        let (mut socket, mut peer) = pair(&runtime);
        let data: Vec<u8> = (0..16 << 20)
            .map(|i: u32| (i * 7 + i / 4099) as u8)
            .collect();
        let expected = data.clone();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut got = vec![0u8; expected.len()];
            peer.read_exact(&mut got).unwrap();
            assert!(got == expected, "the bytes changed on the way");
        });
        runtime.block_on(async {
            socket.write_all(&data[..1000]).await.unwrap();
            let slices = [IoSlice::new(&data[1000..5000])];
            let n = socket.write_vectored(&slices).await.unwrap();
            assert!(n > 0);
            // Reads in between take the socket out of the reactor; the write brings it back.
            let mut nothing = [0u8; 1];
            let _ = tokio::time::timeout(
                Duration::from_millis(1),
                socket.read_some(&mut nothing, Duration::from_micros(100)),
            )
            .await;
            socket.write_all(&data[1000 + n..]).await.unwrap();
        });
        reader.join().unwrap();
    }

    /// The name of the one worker whose switches are counted; the other tests' workers come and
    /// go while it counts (with a shared name, one leaving made the count negative).
    const IDLE_WORKER: &str = "socket-idle-wkr";

    /// The point of the type: while a call busy-polls for its answer, answers arriving do not
    /// wake the runtime's idle worker (with tokio's always-registered streams, each did).
    #[test]
    fn answers_taken_by_busy_polling_wake_no_idle_worker() {
        let runtime = multi_thread(IDLE_WORKER);
        // Let the worker start and park.
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
        let (mut socket, mut peer) = pair(&runtime);
        let answers = 300;
        let echo = std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            for _ in 0..answers {
                peer.read_exact(&mut byte).unwrap();
                peer.write_all(&byte).unwrap();
            }
        });
        let before = switches_of(IDLE_WORKER);
        let started = Instant::now();
        runtime.block_on(async {
            let mut byte = [0u8; 1];
            for _ in 0..answers {
                socket.write_all(b"x").await.unwrap();
                let n = socket
                    .read_some(&mut byte, Duration::from_millis(20))
                    .await
                    .unwrap();
                assert_eq!(n, 1);
            }
        });
        let woken = switches_of(IDLE_WORKER) - before;
        echo.join().unwrap();
        // A few for the first registration and the reactor's housekeeping; one per answer
        // before this type.
        assert!(
            woken < answers / 4,
            "the idle worker was woken {woken} times for {answers} answers in {:?}",
            started.elapsed()
        );
    }
}
