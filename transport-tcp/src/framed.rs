//! A TCP stream that speaks frames: buffered header and payload reads, direct bulk transfers.
//!
//! Small things (headers, payloads, the first bytes of bulk data) come through one read buffer
//! so a short response costs one `read` syscall; bulk bytes beyond what is already buffered go
//! straight from the socket into their destination, and are written straight from their source,
//! with no intermediate copy. Every message is flushed (the simulation's streams buffer until
//! flushed).
//!
//! Reads can busy-poll the socket for a short while before parking: a waiter woken through
//! epoll pays tens of microseconds on a virtualised host, more than a whole loopback round
//! trip, so a caller that expects an answer soon polls a non-blocking `recv` first, yielding to
//! the runtime's other tasks between polls, with the socket out of the runtime's reactor
//! meanwhile (see [`crate::socket`]). Real sockets only; the simulator's streams always park.

use std::io::{self, IoSlice};
use std::time::Duration;

use mooring_proto::wire::{FrameError, FrameHeader, HEADER_LEN, WireMessage, parse_header};
use tokio::net::TcpStream;

use crate::socket::Socket;

/// Read buffer size.
const BUFFER: usize = 64 * 1024;
/// Once a frame's header has arrived, the rest of the frame must arrive within this: a peer
/// that announces a frame and stalls holds its connection for no longer.
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);
/// Bulk data up to this size is copied after its frame and sent in one write; larger bulk
/// goes out in a gathered write straight from its slices.
const COALESCE: usize = 16 * 1024;
/// Bulk reads up to this size go through the read buffer: one receive then lands many small
/// values (a batch of 32 × 4 KiB took a system call per value after the first 64 KiB).
const SMALL_READ: usize = COALESCE;
/// Slices per `writev` (the kernel's IOV_MAX).
const MAX_IOVECS: usize = 1024;

/// Why reading from a peer stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    Closed,
    /// The socket failed (or closed mid-frame).
    Io(io::Error),
    /// The peer sent a bad frame.
    Frame(FrameError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Closed => f.write_str("connection closed"),
            ReadError::Io(e) => write!(f, "i/o error: {e}"),
            ReadError::Frame(e) => write!(f, "bad frame: {e}"),
        }
    }
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> ReadError {
        ReadError::Io(e)
    }
}

/// Servers' connections follow their clients' pace up to this many times the configured spin
/// (see [`Framed::follow_pace`]): 100 µs for the default 20 µs.
pub(crate) const PACE_CAP: u32 = 5;

/// A framed connection.
pub struct Framed {
    socket: Socket,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// How long the next read spins before parking.
    spin: Duration,
    /// The least and most `spin` may be: equal unless the connection follows its peer's pace
    /// (see [`Framed::follow_pace`]).
    spin_floor: Duration,
    spin_cap: Duration,
    /// When the last frame went out, while following the peer's pace.
    sent_at: Option<tokio::time::Instant>,
    /// The gap before the last one (see [`Framed::follow`]).
    previous_gap: Duration,
    /// Zero-copy sender for bulk data (created on first use; absent if pipes fail).
    #[cfg(all(target_os = "linux", not(madsim)))]
    splice: Option<crate::splice::SplicePipe>,
}

/// Bulk slices of this many bytes are sent with `vmsplice`/`splice` where available. Measured
/// on loopback: 1 MiB slices go from 3.6 to 6.2 GB/s, while 4 MiB slices go from 3.4 down to
/// 2.9 GB/s (the pipe holds 1 MiB, and refilling it against a full send buffer costs more than
/// the copy saves), so larger slices take the plain write.
#[cfg(all(target_os = "linux", not(madsim)))]
const SPLICE_SIZES: std::ops::RangeInclusive<usize> = 64 * 1024..=2 << 20;

/// How long sent bytes may stay unacknowledged before the kernel drops the connection, unless
/// a cluster asks for less (see [`bound_late_writes`]). This is how TCP keeps the write fence's
/// late-landing bound: bytes either arrive within this long of being sent or never do. The
/// bound is the protocol's (`mooring_core::client::fence`), not this transport's.
pub const USER_TIMEOUT: Duration =
    Duration::from_millis(mooring_core::client::fence::MAX_LATE_LANDING.as_millis());

/// The user timeout connections opened from now on get, in milliseconds.
static USER_TIMEOUT_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(USER_TIMEOUT.as_millis() as u64);

/// Makes connections opened from now on give up on unacknowledged bytes within `late_landing`
/// (the fence's bound for the cluster joined: `FenceRule::late_landing`), never more than
/// [`USER_TIMEOUT`] nor less than a millisecond. Only ever lowers it: a process in two
/// clusters keeps the tighter bound.
pub fn bound_late_writes(late_landing: Duration) {
    let ms = late_landing.as_millis().clamp(1, USER_TIMEOUT.as_millis()) as u64;
    USER_TIMEOUT_MS.fetch_min(ms, std::sync::atomic::Ordering::Relaxed);
}

/// The user timeout connections opened now get.
pub fn user_timeout() -> Duration {
    Duration::from_millis(USER_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed))
}

#[cfg(all(target_os = "linux", not(madsim)))]
fn set_user_timeout(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let ms = user_timeout().as_millis() as libc::c_uint;
    // SAFETY: a valid fd and a pointer to a live c_uint of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::warn!(
            "cannot set TCP_USER_TIMEOUT ({}); a partitioned peer may receive stale writes late",
            io::Error::last_os_error()
        );
    }
}

impl Framed {
    /// Whether the peer has closed (or reset) this idle connection, or sent bytes nobody
    /// asked for: a pooled connection to a peer that restarted must not carry a request.
    /// Looks without waiting or consuming anything.
    pub fn peer_gone(&self) -> bool {
        if self.buffered() > 0 {
            return true;
        }
        self.socket.peer_sent_or_closed()
    }

    /// Wraps a connected stream (and turns Nagle off: requests are latency-bound). Reads spin
    /// for up to `spin` before parking.
    pub fn new(stream: TcpStream, spin: Duration) -> Framed {
        let _ = stream.set_nodelay(true);
        #[cfg(all(target_os = "linux", not(madsim)))]
        set_user_timeout(&stream);
        Framed {
            socket: Socket::new(stream),
            buf: vec![0; BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            spin,
            spin_floor: spin,
            spin_cap: spin,
            sent_at: None,
            previous_gap: Duration::MAX,
            #[cfg(all(target_os = "linux", not(madsim)))]
            splice: None,
        }
    }

    /// Makes reads spin as long as the peer usually takes to send its next frame after this
    /// side's last, by up to `cap`: a server whose client makes calls back to back, with a
    /// little work between them, answers the next without a wake-up (which costs tens of
    /// microseconds on virtualised hosts), while a client that pauses longer than `cap` costs
    /// only the configured spin.
    pub fn follow_pace(mut self, cap: Duration) -> Framed {
        self.spin_cap = cap.max(self.spin_floor);
        self
    }

    /// Sets the next read's spin from `gap`, the time between this side's last frame and the
    /// peer's next: half as long again (its pace varies), within the floor and cap. After a
    /// pause longer than the cap it goes by the gap before, if that one was short: calls
    /// often alternate a long gap with a short one (a put copies its value between its two
    /// master calls, then the program makes its next put), and the short one is the next.
    /// Only after two long pauses in a row is the spin the floor.
    fn follow(&mut self, gap: Duration) {
        let basis = [gap, self.previous_gap]
            .into_iter()
            .find(|&g| g <= self.spin_cap);
        self.spin = basis.map_or(self.spin_floor, |g| {
            (g + g / 2).clamp(self.spin_floor, self.spin_cap)
        });
        self.previous_gap = gap;
    }

    /// Connects to `addr`.
    pub async fn connect(addr: &str, spin: Duration) -> io::Result<Framed> {
        Ok(Framed::new(TcpStream::connect(addr).await?, spin))
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Makes at least `need` (<= BUFFER) bytes available in the buffer. `Ok(false)` if the
    /// peer closed before any byte arrived and `eof_ok`.
    async fn fill(&mut self, need: usize, eof_ok: bool) -> Result<bool, ReadError> {
        debug_assert!(need <= BUFFER);
        if self.buffered() >= need {
            return Ok(true);
        }
        if self.start + need > BUFFER {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < need {
            let n = self
                .socket
                .read_some(&mut self.buf[self.end..], self.spin)
                .await?;
            if n == 0 {
                if eof_ok && self.buffered() == 0 {
                    return Ok(false);
                }
                return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.end += n;
        }
        Ok(true)
    }

    /// Reads the next frame and decodes it as `M`. Returns the request id and the message.
    pub async fn read_message<M: WireMessage>(&mut self) -> Result<(u64, M), ReadError> {
        self.read_message_at_most(usize::MAX).await
    }

    /// As [`Framed::read_message`], refusing a frame longer than `limit` before reading its
    /// payload: for messages that are always small, from peers not yet authenticated (whose
    /// frames could otherwise hold up to the largest frame's worth of memory each).
    pub async fn read_message_at_most<M: WireMessage>(
        &mut self,
        limit: usize,
    ) -> Result<(u64, M), ReadError> {
        if !self.fill(HEADER_LEN, true).await? {
            return Err(ReadError::Closed);
        }
        if let Some(sent_at) = self.sent_at.take() {
            self.follow(sent_at.elapsed());
        }
        let header: [u8; HEADER_LEN] = self.buf[self.start..self.start + HEADER_LEN]
            .try_into()
            .expect("header length");
        self.start += HEADER_LEN;
        let header: FrameHeader = parse_header(&header).map_err(ReadError::Frame)?;
        let len = header.len as usize;
        if len > limit {
            return Err(ReadError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a {len}-byte frame where at most {limit} bytes are expected"),
            )));
        }
        let rest = async {
            if len <= BUFFER {
                self.fill(len, false).await?;
                let payload = &self.buf[self.start..self.start + len];
                let message = M::from_frame(&header, payload).map_err(ReadError::Frame)?;
                self.start += len;
                Ok(message)
            } else {
                let payload = self.read_growing(len).await?;
                M::from_frame(&header, &payload).map_err(ReadError::Frame)
            }
        };
        match tokio::time::timeout(FRAME_DEADLINE, rest).await {
            Ok(message) => Ok((header.request_id, message?)),
            Err(_) => Err(ReadError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("a {len}-byte frame did not arrive within {FRAME_DEADLINE:?}"),
            ))),
        }
    }

    /// Reads a `len`-byte payload into a buffer that grows with the bytes that arrive, not
    /// with what the header announced: a peer announcing 16 MiB and stalling costs this
    /// process one buffer's worth, not 16 MiB.
    async fn read_growing(&mut self, len: usize) -> Result<Vec<u8>, ReadError> {
        let mut payload = Vec::new();
        while payload.len() < len {
            let filled = payload.len();
            let step = filled.max(BUFFER).min(len - filled);
            payload.resize(filled + step, 0);
            self.read_exact(&mut payload[filled..]).await?;
        }
        Ok(payload)
    }

    /// Reads exactly `dest.len()` bulk bytes: what is buffered first, the rest straight from
    /// the socket into `dest` (through the buffer for reads of at most [`SMALL_READ`]).
    pub async fn read_exact(&mut self, dest: &mut [u8]) -> Result<(), ReadError> {
        if dest.len() <= SMALL_READ && self.buffered() < dest.len() {
            self.fill(dest.len(), false).await?;
        }
        let from_buffer = self.buffered().min(dest.len());
        dest[..from_buffer].copy_from_slice(&self.buf[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        let mut filled = from_buffer;
        while filled < dest.len() {
            let n = self
                .socket
                .read_some(&mut dest[filled..], self.spin)
                .await?;
            if n == 0 {
                return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            filled += n;
        }
        Ok(())
    }

    /// Writes a frame carrying `message`, then the `bulk` slices, and flushes.
    pub async fn write_message<M: WireMessage>(
        &mut self,
        request_id: u64,
        message: &M,
        bulk: &[&[u8]],
    ) -> io::Result<()> {
        self.write_frame(request_id, message, bulk, true).await
    }

    /// [`Framed::write_message`], copying every bulk byte into the socket: none of the
    /// slices' pages is lent to it (see `unaligned` in [`mooring_proto::wire::DataRequest`]).
    pub async fn write_message_copied<M: WireMessage>(
        &mut self,
        request_id: u64,
        message: &M,
        bulk: &[&[u8]],
    ) -> io::Result<()> {
        self.write_frame(request_id, message, bulk, false).await
    }

    async fn write_frame<M: WireMessage>(
        &mut self,
        request_id: u64,
        message: &M,
        bulk: &[&[u8]],
        lend_pages: bool,
    ) -> io::Result<()> {
        let mut frame = message.to_frame(request_id);
        let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
        if bulk_len <= COALESCE {
            // Small transfers: one contiguous write for everything.
            for b in bulk {
                frame.extend_from_slice(b);
            }
            self.socket.write_all(&frame).await?;
        } else if lend_pages && self.splice_large(bulk) {
            // Large slices: zero-copy, one at a time; runs of small ones: gathered writes.
            self.socket.write_all(&frame).await?;
            let mut run: Vec<&[u8]> = Vec::new();
            for &b in bulk {
                if self.should_splice(b) {
                    self.write_all_vectored(&mut run).await?;
                    run.clear();
                    self.splice_out(b).await?;
                } else if !b.is_empty() {
                    run.push(b);
                }
            }
            self.write_all_vectored(&mut run).await?;
        } else {
            // Large ones: one gathered write of the frame and every slice, no copying here.
            let mut slices: Vec<&[u8]> = Vec::with_capacity(bulk.len() + 1);
            slices.push(&frame);
            slices.extend(bulk.iter().copied().filter(|b| !b.is_empty()));
            self.write_all_vectored(&mut slices).await?;
        }
        self.socket.flush().await?;
        if self.spin_cap > self.spin_floor {
            self.sent_at = Some(tokio::time::Instant::now());
        }
        Ok(())
    }

    /// Whether any slice is worth a zero-copy send (and the platform has one).
    fn splice_large(&mut self, bulk: &[&[u8]]) -> bool {
        bulk.iter().any(|b| self.should_splice(b))
    }

    #[cfg(all(target_os = "linux", not(madsim)))]
    fn should_splice(&mut self, slice: &[u8]) -> bool {
        if !SPLICE_SIZES.contains(&slice.len()) {
            return false;
        }
        if self.splice.is_none() {
            self.splice = crate::splice::SplicePipe::new().ok();
        }
        self.splice.is_some()
    }

    #[cfg(not(all(target_os = "linux", not(madsim))))]
    fn should_splice(&mut self, _slice: &[u8]) -> bool {
        false
    }

    #[cfg(all(target_os = "linux", not(madsim)))]
    async fn splice_out(&mut self, slice: &[u8]) -> io::Result<()> {
        let pipe = self.splice.as_mut().expect("checked by should_splice");
        pipe.send(&mut self.socket, slice).await
    }

    #[cfg(not(all(target_os = "linux", not(madsim))))]
    async fn splice_out(&mut self, slice: &[u8]) -> io::Result<()> {
        self.socket.write_all(slice).await
    }

    /// Writes every slice, in order, with as few `writev` calls as the kernel allows.
    async fn write_all_vectored(&mut self, slices: &mut [&[u8]]) -> io::Result<()> {
        let mut first = 0;
        while first < slices.len() {
            let batch: Vec<IoSlice<'_>> = slices[first..]
                .iter()
                .take(MAX_IOVECS)
                .map(|s| IoSlice::new(s))
                .collect();
            let mut written = self.socket.write_vectored(&batch).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while written > 0 {
                let head = slices[first].len();
                if written >= head {
                    written -= head;
                    first += 1;
                } else {
                    slices[first] = &slices[first][written..];
                    written = 0;
                }
            }
        }
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux", not(madsim)))]
mod tests {
    use super::*;

    use mooring_proto::auth::Handshake;

    fn kernel_user_timeout(conn: &Framed) -> u32 {
        let mut ms: libc::c_uint = 0;
        let mut len = std::mem::size_of::<libc::c_uint>() as libc::socklen_t;
        // SAFETY: a valid fd, and pointers to a live c_uint and its length.
        let rc = unsafe {
            libc::getsockopt(
                conn.socket.fd(),
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                (&mut ms as *mut libc::c_uint).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        ms
    }

    /// A short client TTL lowers the user timeout of connections opened after it (to a
    /// quarter of the TTL), a longer one never raises it again.
    #[tokio::test]
    async fn a_short_client_ttl_bounds_late_writes_on_new_connections() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connect = async || {
            let stream = TcpStream::connect(addr).await.unwrap();
            let _accepted = listener.accept().await.unwrap();
            Framed::new(stream, Duration::ZERO)
        };
        let before = connect().await;
        assert!(kernel_user_timeout(&before) <= USER_TIMEOUT.as_millis() as u32);

        bound_late_writes(Duration::from_millis(750));
        assert_eq!(user_timeout(), Duration::from_millis(750));
        let after = connect().await;
        assert_eq!(kernel_user_timeout(&after), 750);

        bound_late_writes(Duration::from_millis(2_500));
        assert_eq!(user_timeout(), Duration::from_millis(750), "never raised");
        let later = connect().await;
        assert_eq!(kernel_user_timeout(&later), 750);
    }

    #[tokio::test]
    async fn a_frame_longer_than_the_caller_expects_is_refused_before_its_payload() {
        use mooring_proto::wire::{DataRequest, WireMessage};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut sender = Framed::new(TcpStream::connect(addr).await.unwrap(), Duration::ZERO);
        let mut receiver = Framed::new(listener.accept().await.unwrap().0, Duration::ZERO);
        // A 200 KiB message whose payload never comes: only its header is sent.
        let big = DataRequest::Write {
            key: 1,
            ranges: vec![mooring_proto::wire::Range { addr: 0, len: 0 }; 200 << 10 >> 4],
            sent_at_us: 0,
            valid_for_us: 0,
        };
        let frame = big.to_frame(3);
        sender.socket.write_all(&frame[..HEADER_LEN]).await.unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            receiver.read_message_at_most::<DataRequest>(64 << 10),
        )
        .await
        .expect("refused at once, without waiting for the payload");
        let Err(err) = refused else {
            panic!("a frame over the limit was read")
        };
        assert!(err.to_string().contains("at most 65536"), "{err}");
    }

    /// A pooled connection is refused once its peer closed it or sent bytes nobody asked for;
    /// a quiet live one is kept.
    #[tokio::test]
    async fn an_idle_connection_whose_peer_closed_or_spoke_is_gone() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let quiet = Framed::new(TcpStream::connect(addr).await.unwrap(), Duration::ZERO);
        let (_quiet_peer, _) = listener.accept().await.unwrap();
        let spoke = Framed::new(TcpStream::connect(addr).await.unwrap(), Duration::ZERO);
        let (mut spoke_peer, _) = listener.accept().await.unwrap();
        let closed = Framed::new(TcpStream::connect(addr).await.unwrap(), Duration::ZERO);
        let (closed_peer, _) = listener.accept().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut spoke_peer, b"?")
            .await
            .unwrap();
        drop(closed_peer);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!quiet.peer_gone());
        assert!(spoke.peer_gone());
        assert!(closed.peer_gone());
    }

    /// A connection following its peer's pace spins half again as long as the last gap,
    /// within its floor and cap; after a pause past the cap, as long as the short gap before
    /// it says, and only its floor after two such pauses; one that does not follow keeps
    /// its spin.
    #[tokio::test]
    async fn the_spin_follows_the_peers_pace_within_bounds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = TcpStream::connect(addr).await.unwrap();
        let _accepted = listener.accept().await.unwrap();
        let us = Duration::from_micros;
        let mut conn = Framed::new(stream, us(20)).follow_pace(us(200));
        conn.follow(us(40));
        assert_eq!(conn.spin, us(60));
        conn.follow(us(5));
        assert_eq!(conn.spin, us(20), "never below the floor");
        conn.follow(us(180));
        assert_eq!(conn.spin, us(200), "never above the cap");
        conn.follow(us(900));
        assert_eq!(conn.spin, us(200), "after a pause, the short gap before it");
        conn.follow(us(900));
        assert_eq!(conn.spin, us(20), "two long pauses cost only the floor");
        // A put's pattern: its copy between two master calls, a short gap before the next.
        for _ in 0..3 {
            conn.follow(us(40));
            assert_eq!(conn.spin, us(60));
            conn.follow(us(500));
            assert_eq!(conn.spin, us(60), "ready for the next call after the copy");
        }
        // The first frame out starts a gap to measure; without following, none is.
        conn.write_message(1, &Handshake::Refused { reason: "x".into() }, &[])
            .await
            .unwrap();
        assert!(conn.sent_at.is_some());
        let stream = TcpStream::connect(addr).await.unwrap();
        let _accepted = listener.accept().await.unwrap();
        let mut fixed = Framed::new(stream, us(20));
        fixed
            .write_message(1, &Handshake::Refused { reason: "x".into() }, &[])
            .await
            .unwrap();
        assert!(fixed.sent_at.is_none());
    }
}
