//! The same-host transport's exchange on a node's Unix socket: a client presents a ticket; the node answers with
//! the segment's address and length and the offer's proof and, attached as `SCM_RIGHTS`, its
//! memfd, or with a refusal saying why.
//!
//! ```text
//! request: "MSHM" | version | ticket (16)                                  21 bytes
//! reply:   "MSHM" | version | status | message length (u16) | base (u64) | length (u64)
//!          | proof (16) | message (status 1: why the ticket was refused)
//! ```
//!
//! The proof came with the ticket in the node's offer, over the authenticated data
//! connection, and is sent back only with the memory: a process that took the socket's name
//! after the node went learns the ticket from the client but cannot prove it is the node.
//!
//! Integers are little-endian. Decoding is pure and total (fuzzed): any bytes give a value or
//! an error, never a panic.

const MAGIC: [u8; 4] = *b"MSHM";
const VERSION: u8 = 2;
/// Length of a request.
pub const REQUEST_LEN: usize = 21;
/// Length of a reply before its message.
pub const REPLY_HEADER_LEN: usize = 40;
/// Longest refusal message.
pub const MAX_MESSAGE: usize = 512;

/// The node's answer to a ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The memfd is attached: the segment starts at the node's address `base` and is `len`
    /// bytes long.
    Granted {
        /// The node's address of the segment's first byte (replica descriptors use it).
        base: u64,
        /// The segment's length.
        len: u64,
        /// The proof in the offer whose ticket this answers.
        proof: [u8; 16],
    },
    /// No memory for this ticket, and why.
    Refused(String),
}

/// A request carrying `ticket`.
pub fn encode_request(ticket: &[u8; 16]) -> [u8; REQUEST_LEN] {
    let mut bytes = [0u8; REQUEST_LEN];
    bytes[..4].copy_from_slice(&MAGIC);
    bytes[4] = VERSION;
    bytes[5..].copy_from_slice(ticket);
    bytes
}

/// The ticket in a request.
pub fn decode_request(bytes: &[u8]) -> Result<[u8; 16], String> {
    if bytes.len() != REQUEST_LEN {
        return Err(format!(
            "a request is {REQUEST_LEN} bytes, got {}",
            bytes.len()
        ));
    }
    check_preamble(bytes)?;
    Ok(bytes[5..].try_into().expect("16 bytes"))
}

/// A reply's bytes (a refusal's message is cut to [`MAX_MESSAGE`] bytes).
pub fn encode_reply(reply: &Reply) -> Vec<u8> {
    let (status, message, base, len, proof) = match reply {
        Reply::Granted { base, len, proof } => (0u8, "", *base, *len, *proof),
        Reply::Refused(why) => (1u8, cut(why), 0, 0, [0; 16]),
    };
    let mut bytes = Vec::with_capacity(REPLY_HEADER_LEN + message.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.push(VERSION);
    bytes.push(status);
    bytes.extend_from_slice(&(message.len() as u16).to_le_bytes());
    bytes.extend_from_slice(&base.to_le_bytes());
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&proof);
    bytes.extend_from_slice(message.as_bytes());
    bytes
}

/// How long the reply whose header is `header` is in all.
pub fn reply_len(header: &[u8; REPLY_HEADER_LEN]) -> Result<usize, String> {
    check_preamble(header)?;
    let message = u16::from_le_bytes([header[6], header[7]]) as usize;
    if message > MAX_MESSAGE {
        return Err(format!(
            "a reply message of {message} bytes (at most {MAX_MESSAGE})"
        ));
    }
    Ok(REPLY_HEADER_LEN + message)
}

/// The reply in `bytes` (exactly one whole reply).
pub fn decode_reply(bytes: &[u8]) -> Result<Reply, String> {
    let header: &[u8; REPLY_HEADER_LEN] = bytes
        .get(..REPLY_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| {
            format!(
                "a reply of {} bytes is shorter than its header",
                bytes.len()
            )
        })?;
    if reply_len(header)? != bytes.len() {
        return Err("a reply's length does not match its header".into());
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    match header[5] {
        0 => Ok(Reply::Granted {
            base: word(8),
            len: word(16),
            proof: bytes[24..40].try_into().expect("16 bytes"),
        }),
        1 => Ok(Reply::Refused(
            String::from_utf8_lossy(&bytes[REPLY_HEADER_LEN..]).into_owned(),
        )),
        other => Err(format!("unknown reply status {other}")),
    }
}

fn check_preamble(bytes: &[u8]) -> Result<(), String> {
    if bytes[..4] != MAGIC {
        return Err("not a Mooring shared-memory message".into());
    }
    if bytes[4] != VERSION {
        return Err(format!(
            "shared-memory handoff version {}, this build speaks {VERSION}",
            bytes[4]
        ));
    }
    Ok(())
}

fn cut(message: &str) -> &str {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_roundtrip_and_garbage_is_refused() {
        let ticket = [7u8; 16];
        assert_eq!(decode_request(&encode_request(&ticket)), Ok(ticket));
        assert!(decode_request(&encode_request(&ticket)[..20]).is_err());
        let mut wrong = encode_request(&ticket);
        wrong[4] = 9;
        assert!(decode_request(&wrong).unwrap_err().contains("version 9"));
        wrong[0] = b'X';
        assert!(decode_request(&wrong).is_err());

        for reply in [
            Reply::Granted {
                base: 0x7f00_0000_0000,
                len: 1 << 30,
                proof: [9; 16],
            },
            Reply::Refused("ticket unknown or expired".into()),
        ] {
            assert_eq!(decode_reply(&encode_reply(&reply)), Ok(reply));
        }
        let long = Reply::Refused("é".repeat(400));
        match decode_reply(&encode_reply(&long)).unwrap() {
            Reply::Refused(m) => assert_eq!(m.len(), MAX_MESSAGE),
            other => panic!("{other:?}"),
        }
        let mut bytes = encode_reply(&Reply::Refused("x".into()));
        bytes[5] = 3;
        assert!(decode_reply(&bytes).unwrap_err().contains("status 3"));
        bytes[6] = 0xff;
        bytes[7] = 0xff;
        assert!(decode_reply(&bytes).is_err());
        assert!(decode_reply(&[]).is_err());
    }
}
