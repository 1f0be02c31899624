//! A TCP stream that speaks frames: buffered header and payload reads, direct bulk transfers.
//!
//! Small things (headers, payloads, the first bytes of bulk data) come through one read buffer
//! so a short response costs one `read` syscall; bulk bytes beyond what is already buffered go
//! straight from the socket into their destination, and are written straight from their source,
//! with no intermediate copy. Every message is flushed (the simulation's streams buffer until
//! flushed).

use std::io;

use mooring_core::wire::{FrameError, FrameHeader, HEADER_LEN, WireMessage, parse_header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Read buffer size; also the most bulk data coalesced into a frame's write.
const BUFFER: usize = 64 * 1024;

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

/// A framed connection.
pub struct Framed {
    stream: TcpStream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Framed {
    /// Wraps a connected stream (and turns Nagle off: requests are latency-bound).
    pub fn new(stream: TcpStream) -> Framed {
        let _ = stream.set_nodelay(true);
        Framed {
            stream,
            buf: vec![0; BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Connects to `addr`.
    pub async fn connect(addr: &str) -> io::Result<Framed> {
        Ok(Framed::new(TcpStream::connect(addr).await?))
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
            let n = self.stream.read(&mut self.buf[self.end..]).await?;
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
        if !self.fill(HEADER_LEN, true).await? {
            return Err(ReadError::Closed);
        }
        let header: [u8; HEADER_LEN] = self.buf[self.start..self.start + HEADER_LEN]
            .try_into()
            .expect("header length");
        self.start += HEADER_LEN;
        let header: FrameHeader = parse_header(&header).map_err(ReadError::Frame)?;
        let len = header.len as usize;
        let message = if len <= BUFFER {
            self.fill(len, false).await?;
            let payload = &self.buf[self.start..self.start + len];
            let message = M::from_frame(&header, payload).map_err(ReadError::Frame)?;
            self.start += len;
            message
        } else {
            let mut payload = vec![0u8; len];
            self.read_exact(&mut payload).await?;
            M::from_frame(&header, &payload).map_err(ReadError::Frame)?
        };
        Ok((header.request_id, message))
    }

    /// Reads exactly `dest.len()` bulk bytes: what is buffered first, the rest straight from
    /// the socket into `dest`.
    pub async fn read_exact(&mut self, dest: &mut [u8]) -> Result<(), ReadError> {
        let from_buffer = self.buffered().min(dest.len());
        dest[..from_buffer].copy_from_slice(&self.buf[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        if from_buffer < dest.len() {
            self.stream.read_exact(&mut dest[from_buffer..]).await?;
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
        let mut frame = message.to_frame(request_id);
        let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
        if bulk_len <= BUFFER {
            // Small transfers: one write for everything.
            for b in bulk {
                frame.extend_from_slice(b);
            }
            self.stream.write_all(&frame).await?;
        } else {
            self.stream.write_all(&frame).await?;
            for b in bulk {
                self.stream.write_all(b).await?;
            }
        }
        self.stream.flush().await
    }
}
