//! The master's journal: the core's inputs, each with its `now`, as checksummed records.
//!
//! The core is deterministic: the same inputs at the same times give the same state, the
//! same grants and the same evictions. A master that appends every request it serves and
//! every timer tick, in the order it applied them, can therefore be rebuilt by replaying the
//! records onto the snapshot they follow. This module is the record format and the replay;
//! files, group commit and snapshots are the store's (`mooring::journal`).
//!
//! A record is `length u32 | crc32c u32 | now u64 | payload`, little-endian, where the crc
//! covers `now` and the payload. The payload starts with a tag padded with zeros to a
//! multiple of 16 bytes: a request's name (one length byte, then the name), or a zero byte
//! for a configuration or a tick. After the tag comes the rkyv archive of the request alone
//! (archived as the enum of every request, each record would be as large as the largest
//! request: twice the bytes to write, sync and snapshot after) or of the [`Input`]. Decoding
//! stops at the first record that is cut short or fails its checksum: a crash leaves at most
//! one torn record at the tail, and everything before it is intact. Zeros after the last
//! record (a writer may write them ahead) are the end, not damage.

use mooring_core::{Master, MasterConfig, Millis};
use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::dispatch;
use crate::wire::MasterRequest;

/// Bytes before a record's payload: length, checksum, time.
pub const RECORD_HEADER: usize = 4 + 4 + 8;
/// The largest payload a record may carry (a request's largest frame, with room to spare).
pub const MAX_RECORD: usize = 64 << 20;

/// One input to the core.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Input {
    /// The configuration the inputs that follow were applied under (the first record of
    /// every journal file).
    Config(MasterConfig),
    /// A request, applied with [`dispatch::handle`].
    Request(MasterRequest),
    /// The timer's [`Master::tick`].
    Tick,
}

/// Payload tags are padded to a multiple of this, so the archive after them stays aligned.
const TAG_ALIGN: usize = 16;

/// A payload: `tag` (a request's name, or empty for any other input) padded, then `archive`.
fn tagged(tag: &str, archive: &[u8]) -> Vec<u8> {
    let head = (1 + tag.len()).next_multiple_of(TAG_ALIGN);
    let mut out = Vec::with_capacity(head + archive.len());
    out.push(u8::try_from(tag.len()).expect("request names are short"));
    out.extend_from_slice(tag.as_bytes());
    out.resize(head, 0);
    out.extend_from_slice(archive);
    out
}

/// An input's payload bytes (what [`record`] frames).
pub fn payload(input: &Input) -> Vec<u8> {
    match input {
        Input::Request(request) => {
            let (name, archive) = request.archive_alone();
            tagged(name, &archive)
        }
        other => tagged(
            "",
            &rkyv::to_bytes::<rancor::Error>(other).expect("in-memory serialization"),
        ),
    }
}

/// A request's [`payload`], and the request back (serialized in place, not cloned).
pub fn request_payload(request: MasterRequest) -> (Vec<u8>, MasterRequest) {
    let input = Input::Request(request);
    let bytes = payload(&input);
    match input {
        Input::Request(request) => (bytes, request),
        Input::Config(_) | Input::Tick => unreachable!("built as a request above"),
    }
}

/// The payload of a timer tick.
pub fn tick_payload() -> Vec<u8> {
    payload(&Input::Tick)
}

/// The input a [`payload`] holds; why not, if it holds none.
fn from_payload(payload: &[u8]) -> Result<Input, String> {
    let Some((&len, rest)) = payload.split_first() else {
        return Err("an empty payload".into());
    };
    let head = (1 + usize::from(len)).next_multiple_of(TAG_ALIGN);
    let (Some(name), Some(body)) = (rest.get(..usize::from(len)), payload.get(head..)) else {
        return Err(format!("a payload's {len}-byte tag is cut short"));
    };
    let mut aligned = AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    if name.is_empty() {
        rkyv::from_bytes::<Input, rancor::Error>(&aligned).map_err(|e| e.to_string())
    } else {
        MasterRequest::from_archived_alone(name, &aligned).map(Input::Request)
    }
}

/// Appends to `out` the record of an input whose [`payload`] is `payload`, applied at `now`.
pub fn record(now: Millis, payload: &[u8], out: &mut Vec<u8>) {
    let now = now.as_millis().to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&now), payload);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&now);
    out.extend_from_slice(payload);
}

/// What a journal's bytes hold.
#[derive(Debug, Default)]
pub struct Decoded {
    /// The intact records, in order.
    pub entries: Vec<(Millis, Input)>,
    /// How many leading bytes they take: the rest is a torn or damaged tail.
    pub intact: usize,
    /// Why decoding stopped before the end, if it did.
    pub stopped: Option<String>,
    /// It stopped at a record whose checksum holds but whose input does not decode: not a
    /// torn write but a journal from another version of Mooring, which must not be cut.
    pub foreign: bool,
}

/// Decodes the records in `bytes`, stopping at the first one that is incomplete or damaged.
pub fn decode(bytes: &[u8]) -> Decoded {
    let mut decoded = Decoded::default();
    let mut at = 0;
    while at < bytes.len() {
        // Zeros written ahead of the records: the end (no record starts with a zero length).
        if bytes[at..].iter().all(|&b| b == 0) {
            break;
        }
        match decode_one(&bytes[at..]) {
            Ok((now, input, len)) => {
                decoded.entries.push((now, input));
                at += len;
            }
            Err((why, foreign)) => {
                decoded.stopped = Some(format!("at byte {at}: {why}"));
                decoded.foreign = foreign;
                break;
            }
        }
    }
    decoded.intact = at;
    decoded
}

/// One record at the start of `bytes`: its time, its input and its length; or why not, and
/// whether the record is intact but unreadable to this build.
fn decode_one(bytes: &[u8]) -> Result<(Millis, Input, usize), (String, bool)> {
    decode_checked(bytes)
        .map_err(|why| (why, false))
        .and_then(|(now, body, len)| {
            let input = from_payload(body)
                .map_err(|e| (format!("an intact record does not decode: {e}"), true))?;
            Ok((now, input, len))
        })
}

/// The time and payload of the record at the start of `bytes`, with the record's length, once
/// its length and checksum hold.
fn decode_checked(bytes: &[u8]) -> Result<(Millis, &[u8], usize), String> {
    if bytes.len() < RECORD_HEADER {
        return Err(format!("a {}-byte record header is cut short", bytes.len()));
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if len > MAX_RECORD {
        return Err(format!(
            "a record claims {len} bytes (at most {MAX_RECORD})"
        ));
    }
    let Some(body) = bytes.get(8..RECORD_HEADER + len) else {
        return Err(format!("a {len}-byte record is cut short"));
    };
    if crc32c::crc32c(body) != crc {
        return Err("a record fails its checksum".into());
    }
    let now = Millis(u64::from_le_bytes(body[0..8].try_into().expect("8 bytes")));
    Ok((now, &body[8..], RECORD_HEADER + len))
}

/// Applies one journaled input to `master`, as the master that journaled it did.
/// (A [`Input::Config`] is the loader's business: it is not an input to the core.)
pub fn apply(master: &mut Master, now: Millis, input: Input) {
    match input {
        Input::Config(_) => {}
        Input::Request(request) => {
            // The answer went to its client when the request was first served.
            let _ = dispatch::handle(master, request, now);
        }
        Input::Tick => master.tick(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{GetSize, Remove};

    fn journal(inputs: &[(u64, Input)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (now, input) in inputs {
            record(Millis(*now), &payload(input), &mut out);
        }
        out
    }

    #[test]
    fn a_request_is_journaled_alone_and_a_record_of_the_old_form_is_foreign() {
        use mooring_core::{Checksum, ClientId, WriteId};
        let end: MasterRequest = crate::wire::PutEnd {
            client: ClientId(1),
            key: "k1234567".into(),
            write: WriteId(5),
            checksum: Checksum::of(b""),
        }
        .into();
        let alone = payload(&Input::Request(end.clone()));
        let as_enum = rkyv::to_bytes::<rancor::Error>(&Input::Request(end.clone())).unwrap();
        assert!(
            alone.len() * 2 <= as_enum.len(),
            "{} bytes alone, {} as the enum",
            alone.len(),
            as_enum.len()
        );
        let mut bytes = Vec::new();
        record(Millis(3), &alone, &mut bytes);
        assert_eq!(
            decode(&bytes).entries,
            vec![(Millis(3), Input::Request(end))]
        );

        // A record written in the old form (the enum's archive): intact but not readable, so
        // recovery refuses it rather than taking it for a torn tail.
        let mut old = Vec::new();
        record(Millis(3), &as_enum, &mut old);
        let decoded = decode(&old);
        assert!(decoded.entries.is_empty() && decoded.foreign, "{decoded:?}");
    }

    #[test]
    fn records_round_trip_in_order() {
        let inputs = vec![
            (0, Input::Config(MasterConfig::default())),
            (5, Input::Request(Remove { key: "k".into() }.into())),
            (7, Input::Tick),
        ];
        let bytes = journal(&inputs);
        let decoded = decode(&bytes);
        assert_eq!(decoded.stopped, None);
        assert_eq!(decoded.intact, bytes.len());
        let expected: Vec<(Millis, Input)> =
            inputs.into_iter().map(|(t, i)| (Millis(t), i)).collect();
        assert_eq!(decoded.entries, expected);
    }

    #[test]
    fn a_torn_or_damaged_tail_stops_decoding_after_the_intact_records() {
        let bytes = journal(&[
            (1, Input::Tick),
            (2, Input::Request(GetSize { key: "k".into() }.into())),
        ]);
        let first = decode(&bytes).entries.len();
        assert_eq!(first, 2);
        let one = journal(&[(1, Input::Tick)]).len();
        for cut in one..bytes.len() {
            let decoded = decode(&bytes[..cut]);
            assert_eq!(decoded.entries.len(), 1, "cut at {cut}");
            assert_eq!(decoded.intact, one);
            assert!(decoded.stopped.is_some() || cut == one);
        }
        let mut damaged = bytes.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        let decoded = decode(&damaged);
        assert_eq!(decoded.entries.len(), 1);
        assert!(!decoded.foreign, "a damaged record is a torn tail");
        assert!(decoded.stopped.unwrap().contains("checksum"));
        // Zeros written ahead of the records end the journal cleanly.
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0; 4096]);
        let decoded = decode(&padded);
        assert_eq!((decoded.entries.len(), decoded.stopped), (2, None));
        assert_eq!(decoded.intact, bytes.len());
        // A length beyond any record is refused, not allocated.
        let mut huge = journal(&[(1, Input::Tick)]);
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).stopped.unwrap().contains("claims"));
    }

    #[test]
    fn an_intact_record_this_build_cannot_read_is_flagged_foreign() {
        let mut bytes = journal(&[(1, Input::Tick)]);
        // A record whose checksum holds over bytes that are no input of this build (as from
        // another version of the format).
        let garbage = [0xA5u8; 24];
        record(Millis(2), &garbage, &mut bytes);
        let decoded = decode(&bytes);
        assert_eq!(decoded.entries.len(), 1);
        assert!(decoded.foreign);
        assert!(decoded.stopped.unwrap().contains("does not decode"));
    }
}
