//! Sending and receiving the handoff on a node's Unix socket: the reply carries the memfd as
//! `SCM_RIGHTS`. The message format is [`mooring_proto::handoff`]'s (fuzzed there).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

pub use mooring_proto::handoff::*;

/// Sends `reply` on `stream`, with `fd` attached.
pub fn send_reply(
    stream: &UnixStream,
    reply: &Reply,
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let bytes = encode_reply(reply);
    let Some(fd) = fd else {
        return (&*stream).write_all(&bytes);
    };
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = ControlBuffer::new();
    let msg = message(&mut iov, &mut control);
    // SAFETY: the control buffer has room for one header carrying one descriptor
    // (`ControlBuffer::space`), so the first header exists and its data holds an int.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(header)
            .cast::<libc::c_int>()
            .write_unaligned(fd.as_raw_fd());
    }
    // SAFETY: `msg` describes valid buffers (above).
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The descriptor went with the first bytes; the rest (rare for a short reply) follows.
    (&*stream).write_all(&bytes[sent as usize..])
}

/// How long the rest of a reply may take once its first bytes came.
const REPLY_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// Receives a reply on `stream` and the descriptor attached to it, if any.
pub fn recv_reply(stream: &UnixStream) -> Result<(Reply, Option<OwnedFd>), String> {
    let mut bytes = vec![0u8; REPLY_HEADER_LEN + MAX_MESSAGE];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut control = ControlBuffer::new();
    let mut msg = message(&mut iov, &mut control);
    // SAFETY: `msg` describes valid buffers; received descriptors are close-on-exec.
    let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(format!("receiving: {}", std::io::Error::last_os_error()));
    }
    let fd = received_fd(&msg);
    let mut have = got as usize;
    let mut need = REPLY_HEADER_LEN;
    // However the node paces the rest, the whole reply comes within the window: a caller
    // waits for it on a thread that has other work.
    let deadline = std::time::Instant::now() + REPLY_WINDOW;
    loop {
        while have < need {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the node's reply took longer than {REPLY_WINDOW:?}"
                ));
            }
            let _ = stream.set_read_timeout(Some(left));
            let n = (&*stream)
                .read(&mut bytes[have..need])
                .map_err(|e| format!("receiving: {e}"))?;
            if n == 0 {
                return Err("the node closed the socket mid-reply".into());
            }
            have += n;
        }
        if need == REPLY_HEADER_LEN {
            need = reply_len(bytes[..REPLY_HEADER_LEN].try_into().expect("header"))?;
            if have > need {
                return Err("the node sent more than one reply".into());
            }
            if have < need {
                continue;
            }
        }
        break;
    }
    let reply = decode_reply(&bytes[..need])?;
    Ok((reply, fd))
}

/// A message header over one buffer and room for one descriptor; both must outlive its use.
fn message(iov: &mut libc::iovec, control: &mut ControlBuffer) -> libc::msghdr {
    // SAFETY: msghdr is plain data (all zeroes is a valid empty header).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_controllen = control.space();
    msg.msg_control = control.bytes.as_mut_ptr().cast();
    msg
}

/// The descriptor a received message carries (any beyond the first are closed).
fn received_fd(msg: &libc::msghdr) -> Option<OwnedFd> {
    let mut first = None;
    // SAFETY: walking the control messages the kernel wrote into `msg`'s buffer with the
    // libc macros, reading each SCM_RIGHTS payload as the ints it holds.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                let payload = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..payload / size_of::<libc::c_int>() {
                    let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    if first.is_none() {
                        first = Some(fd);
                    }
                }
            }
            header = libc::CMSG_NXTHDR(msg, header);
        }
    }
    first
}

/// Room for one control message carrying one descriptor (the kernel closes any more a peer
/// sends, and flags the message cut short), aligned for `cmsghdr`.
struct ControlBuffer {
    bytes: [u64; 8],
}

impl ControlBuffer {
    fn new() -> ControlBuffer {
        ControlBuffer { bytes: [0; 8] }
    }

    fn space(&self) -> usize {
        // SAFETY: CMSG_SPACE is arithmetic.
        let one = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
        one.min(size_of::<[u64; 8]>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_crosses_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        use std::os::fd::AsFd;
        let granted = Reply::Granted {
            base: 4096,
            len: 8192,
            proof: [3; 16],
        };
        send_reply(&a, &granted, Some(file.as_fd())).unwrap();
        let (reply, fd) = recv_reply(&b).unwrap();
        assert_eq!(reply, granted);
        assert!(fd.is_some());
        send_reply(&a, &Reply::Refused("no".into()), None).unwrap();
        let (reply, fd) = recv_reply(&b).unwrap();
        assert_eq!(reply, Reply::Refused("no".into()));
        assert!(fd.is_none());
        // A reply split across writes is still read whole.
        let bytes = encode_reply(&Reply::Refused("split".into()));
        (&a).write_all(&bytes[..3]).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            (&a).write_all(&bytes[3..]).unwrap();
            a
        });
        assert_eq!(recv_reply(&b).unwrap().0, Reply::Refused("split".into()));
        drop(writer.join().unwrap());
        assert!(recv_reply(&b).unwrap_err().contains("closed"));
    }
}
