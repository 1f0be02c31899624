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
//! multi-threaded runtime, is registered with the reactor only when a call has to park; the
//! next busy-polling read takes it out again (one `epoll_ctl` each way, paid only by calls
//! that parked, which cost tens of µs anyway).
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

    /// A connected socket; see the module docs.
    pub(crate) struct Socket {
        state: State,
        fd: RawFd,
        /// Whether busy-polling reads take the socket out of the reactor: on a multi-threaded
        /// runtime only. On a single-threaded one the thread that polls the reactor is the
        /// one busy-polling, so an arrival wakes nobody, and staying in saves the two
        /// `epoll_ctl` calls per park (bulk reads park several times a transfer).
        leaves_reactor: bool,
    }

    enum State {
        /// Out of the reactor: only this socket's own calls see its readiness.
        Polled(std::net::TcpStream),
        /// In the reactor, for a call that parked (or one that will).
        Parked(tokio::net::TcpStream),
        /// Lost while moving between the two (the move failed); every call fails.
        Lost,
    }

    impl Socket {
        /// Wraps a connected stream (in the reactor until its first busy-polling read, if that
        /// leaves it).
        pub(crate) fn new(stream: tokio::net::TcpStream) -> Socket {
            let fd = stream.as_raw_fd();
            let leaves_reactor = tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
            Socket {
                state: State::Parked(stream),
                fd,
                leaves_reactor,
            }
        }

        /// The descriptor, for socket options and peeks (valid while the socket lives).
        pub(crate) fn fd(&self) -> RawFd {
            self.fd
        }

        /// Runs `op` (one non-blocking system call on the descriptor) until it stops saying
        /// "would block": first busy-polling for up to `spin` out of the reactor, then parked
        /// in it. `op` must only report `WouldBlock` when the socket is not ready for
        /// `interest`.
        pub(crate) async fn io<R>(
            &mut self,
            interest: Interest,
            spin: Duration,
            mut op: impl FnMut(RawFd) -> io::Result<R>,
        ) -> io::Result<R> {
            let fd = self.fd;
            if !spin.is_zero() {
                if self.leaves_reactor {
                    self.leave_reactor()?;
                }
                let started = std::time::Instant::now();
                loop {
                    match op(fd) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        done => return done,
                    }
                    if started.elapsed() >= spin {
                        break;
                    }
                    // Let this runtime's other tasks (other connections) and, if the host is
                    // oversubscribed, other processes' threads run between polls.
                    std::thread::yield_now();
                    tokio::task::yield_now().await;
                }
            } else {
                // Once without the reactor: its readiness cache is stale while polled.
                match op(fd) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    done => return done,
                }
            }
            self.join_reactor()?.async_io(interest, || op(fd)).await
        }

        fn leave_reactor(&mut self) -> io::Result<()> {
            if matches!(self.state, State::Parked(_)) {
                let State::Parked(stream) = std::mem::replace(&mut self.state, State::Lost) else {
                    unreachable!("matched above")
                };
                self.state = State::Polled(stream.into_std()?);
            }
            self.usable()
        }

        fn join_reactor(&mut self) -> io::Result<&tokio::net::TcpStream> {
            if matches!(self.state, State::Polled(_)) {
                let State::Polled(stream) = std::mem::replace(&mut self.state, State::Lost) else {
                    unreachable!("matched above")
                };
                self.state = State::Parked(tokio::net::TcpStream::from_std(stream)?);
            }
            match &self.state {
                State::Parked(stream) => Ok(stream),
                _ => Err(lost()),
            }
        }

        fn usable(&self) -> io::Result<()> {
            match self.state {
                State::Lost => Err(lost()),
                _ => Ok(()),
            }
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
            self.usable()
        }
    }

    impl AsRawFd for Socket {
        fn as_raw_fd(&self) -> RawFd {
            self.fd
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
        io::Error::other("the socket was lost moving in or out of the runtime's reactor")
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

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("socket-test-io")
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
        let runtime = multi_thread();
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
        let runtime = multi_thread();
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

    /// The point of the type: while a call busy-polls for its answer, answers arriving do not
    /// wake the runtime's idle worker (with tokio's always-registered streams, each did).
    #[test]
    fn answers_taken_by_busy_polling_wake_no_idle_worker() {
        let runtime = multi_thread();
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
        let before = switches_of("socket-test-io");
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
        let woken = switches_of("socket-test-io") - before;
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
