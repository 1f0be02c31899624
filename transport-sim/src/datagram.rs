//! Datagrams: one wire frame (header, checksummed payload) followed by the bulk bytes and a
//! crc32c of the bulk, so corruption anywhere is caught (TCP and RDMA have link checksums
//! that cover bulk data; the frame checksum covers only the payload).

use mooring_proto::wire::{FrameError, FrameHeader, HEADER_LEN, WireMessage, parse_header};

/// Tag of requests (to a server's endpoint).
pub(crate) const TAG_REQUEST: u64 = 1;
/// Tag of replies (to a caller's endpoint).
pub(crate) const TAG_REPLY: u64 = 2;

/// Largest bulk one datagram carries; larger transfers are split.
pub(crate) const MAX_BULK: usize = 1 << 20;

/// Encodes `message` with request id `id` and the concatenation of `bulk`.
pub(crate) fn encode<M: WireMessage>(id: u64, message: &M, bulk: &[&[u8]]) -> Vec<u8> {
    let frame = message.to_frame(id);
    let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
    let mut out = Vec::with_capacity(frame.len() + bulk_len + 4);
    out.extend_from_slice(&frame);
    let mut crc = 0;
    for b in bulk {
        out.extend_from_slice(b);
        crc = crc32c::crc32c_append(crc, b);
    }
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks a datagram's header, frame checksum and bulk checksum; returns its request id and
/// where its payload ends.
pub(crate) fn check(datagram: &[u8]) -> Result<(FrameHeader, usize), FrameError> {
    let short = || FrameError::Decode(format!("datagram of {} bytes is truncated", datagram.len()));
    let header: &[u8; HEADER_LEN] = datagram
        .get(..HEADER_LEN)
        .ok_or_else(short)?
        .try_into()
        .map_err(|_| short())?;
    let header = parse_header(header)?;
    let payload_end = HEADER_LEN + header.len as usize;
    if datagram.len() < payload_end + 4 {
        return Err(short());
    }
    let actual = crc32c::crc32c_append(header.prefix_crc, &datagram[HEADER_LEN..payload_end]);
    if actual != header.crc {
        return Err(FrameError::Checksum {
            expected: header.crc,
            actual,
        });
    }
    let (bulk, crc) = datagram[payload_end..].split_at(datagram.len() - payload_end - 4);
    let expected = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(bulk);
    if expected != actual {
        return Err(FrameError::Checksum { expected, actual });
    }
    Ok((header, payload_end))
}

/// Decodes a datagram into its request id, message and bulk bytes, checking both checksums.
pub(crate) fn decode<M: WireMessage>(datagram: &[u8]) -> Result<(u64, M, &[u8]), FrameError> {
    let (header, payload_end) = check(datagram)?;
    let message = M::from_frame(&header, &datagram[HEADER_LEN..payload_end])?;
    let bulk = &datagram[payload_end..datagram.len() - 4];
    Ok((header.request_id, message, bulk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_proto::wire::{DataRequest, Range};

    #[test]
    fn round_trip_and_every_flipped_bit_is_caught() {
        let request = DataRequest::Write {
            key: 9,
            ranges: vec![Range { addr: 64, len: 6 }],
            sent_at_us: 1,
            valid_for_us: 2,
        };
        let datagram = encode(77, &request, &[b"abc", b"def"]);
        let (id, decoded, bulk) = decode::<DataRequest>(&datagram).unwrap();
        assert_eq!((id, &decoded, bulk), (77, &request, &b"abcdef"[..]));
        assert_eq!(check(&datagram).unwrap().0.request_id, 77);
        for at in 0..datagram.len() {
            let mut bad = datagram.clone();
            bad[at] ^= 0x10;
            assert!(
                decode::<DataRequest>(&bad).is_err(),
                "flip at byte {at} went unnoticed"
            );
        }
        assert!(decode::<DataRequest>(&datagram[..datagram.len() - 1]).is_err());
    }
}
