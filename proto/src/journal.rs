//! The master's journal: the core's inputs, each with its `now`, as checksummed records.
//!
//! The core is deterministic: the same inputs at the same times give the same state, the
//! same grants and the same evictions. A master that appends every request it serves and
//! every timer tick, in the order it applied them, can therefore be rebuilt by replaying the
//! records onto the snapshot they follow. This module is the file format and the replay;
//! files, group commit and snapshots are the store's (`mooring::master::journal`).
//!
//! A journal file starts with a [`FILE_HEADER`]-byte header: [`MAGIC`] (which names the
//! format) and the file's generation. Records follow: `length u32 | crc32c u32 | now u64 |
//! payload`, little-endian, where the crc covers the generation, `now` and the payload. The
//! payload starts with a tag padded with zeros to a multiple of 16 bytes: a request's name
//! (one length byte, then the name), or a zero byte for any other input. After the tag comes
//! the rkyv archive of the request alone (archived as the enum of every request, each record
//! would be as large as the largest request: twice the bytes to write, sync and snapshot
//! after) or of the [`Input`].
//!
//! Decoding stops at the first record that is cut short or fails its checksum: a crash
//! leaves at most one torn record at the tail, and everything before it is intact. What
//! follows the last record is not damage: zeros (a writer may write them ahead), or the
//! records of an older generation when the file is reused (their checksums, seeded with
//! another generation, fail). A journal that the next generation follows ends with
//! [`Input::End`], so in a complete journal a failing record is damage.
//!
//! **Damage is told from a torn tail by sync marks.** After each sync the writer appends a
//! [`Input::Synced`] mark naming the offset every byte before which is on disk. A crash can
//! only tear bytes written after the last sync, so no intact mark can name an offset past a
//! torn record; a mark that does proves the bad record was synced (and acknowledged), and
//! [`Decoded::damaged`] reports it, so recovery stops instead of silently dropping every
//! change after it. Marks have one fixed length, which lets [`decode`] look for them past a
//! bad record in one pass (a length field of their size, then the checksum). The writer
//! syncs at most [`MAX_SYNC_BYTES`] at a time, so a mark vouching for a record lies within
//! [`MARK_REACH`] of it: recovery reads past a bad record, or past the zeros after the last
//! record, only that far ([`needed`]).

use mooring_core::{Master, MasterConfig, Millis};
use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::dispatch;
use crate::wire::MasterRequest;

/// Bytes before a record's payload: length, checksum, time.
pub const RECORD_HEADER: usize = 4 + 4 + 8;
/// The first bytes of every journal file of this format (the last byte is its version).
/// Version 2: the master's configuration gained its quotas, and listings and removals their
/// tenant, so a version-1 record would replay as something else; it is refused instead.
/// Version 3: a tenant's quota gained its disk bytes.
pub const MAGIC: [u8; 8] = *b"MOORJNL\x03";
/// Bytes before a journal file's first record: [`MAGIC`] and the generation.
pub const FILE_HEADER: usize = MAGIC.len() + 8;

/// The header of generation `generation`'s journal file.
pub fn file_header(generation: u64) -> [u8; FILE_HEADER] {
    let mut header = [0u8; FILE_HEADER];
    header[..MAGIC.len()].copy_from_slice(&MAGIC);
    header[MAGIC.len()..].copy_from_slice(&generation.to_le_bytes());
    header
}
/// The largest payload a record may carry (a request's largest frame, with room to spare).
pub const MAX_RECORD: usize = 64 << 20;
/// The most record bytes a writer syncs at once (a single larger record is synced alone).
/// The sync mark that vouches for them follows at once, so a mark vouching for a bad record
/// lies within [`MARK_REACH`] of it.
pub const MAX_SYNC_BYTES: usize = 16 << 20;
/// How far past a bad record [`decode`] needs the file to tell damage from a torn tail.
pub const MARK_REACH: usize = MAX_SYNC_BYTES + RECORD_HEADER + MAX_RECORD + 256;

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
    /// The journal's last record: the next generation's journal holds what follows.
    End,
    /// A sync mark: every byte of this journal before the offset it names was on disk when
    /// the mark was written (see the module docs). Not an input to the core.
    Synced(u64),
    /// A restarted master resumed serving ([`Master::resume`]): the second record of the
    /// journal a restart begins, after its configuration.
    Resume,
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
        Input::Config(_) | Input::Tick | Input::End | Input::Synced(_) | Input::Resume => {
            unreachable!("built as a request above")
        }
    }
}

/// The payload of a timer tick.
pub fn tick_payload() -> Vec<u8> {
    payload(&Input::Tick)
}

/// The payload of the record that ends a journal.
pub fn end_payload() -> Vec<u8> {
    payload(&Input::End)
}

/// The payload of the record of a restarted master resuming.
pub fn resume_payload() -> Vec<u8> {
    payload(&Input::Resume)
}

/// The payload of a sync mark: every byte before `offset` is on disk.
pub fn synced_payload(offset: u64) -> Vec<u8> {
    payload(&Input::Synced(offset))
}

/// The length of every sync mark's record.
pub fn synced_record_len() -> usize {
    RECORD_HEADER + synced_payload(0).len()
}

/// The input a [`payload`] holds; why not, if it holds none. An archive that is not aligned
/// (a record's payload starts anywhere in a file) is copied into `scratch` to align it: one
/// buffer for a whole replay, not one allocation per record.
fn from_payload(payload: &[u8], scratch: &mut AlignedVec<16>) -> Result<Input, String> {
    let Some((&len, rest)) = payload.split_first() else {
        return Err("an empty payload".into());
    };
    let head = (1 + usize::from(len)).next_multiple_of(TAG_ALIGN);
    let (Some(name), Some(body)) = (rest.get(..usize::from(len)), payload.get(head..)) else {
        return Err(format!("a payload's {len}-byte tag is cut short"));
    };
    // Read in place where the archive happens to be aligned already.
    let archive: &[u8] = if body.as_ptr().align_offset(16) == 0 {
        body
    } else {
        scratch.clear();
        scratch.extend_from_slice(body);
        scratch
    };
    if name.is_empty() {
        rkyv::from_bytes::<Input, rancor::Error>(archive).map_err(|e| e.to_string())
    } else {
        MasterRequest::from_archived_alone(name, archive).map(Input::Request)
    }
}

/// A record's checksum: over its generation (so a reused file's older records fail), its
/// time and its payload.
fn checksum(generation: u64, now: &[u8; 8], payload: &[u8]) -> u32 {
    let seeded = crc32c::crc32c_append(crc32c::crc32c(&generation.to_le_bytes()), now);
    crc32c::crc32c_append(seeded, payload)
}

/// Appends to `out` the record, in generation `generation`'s journal, of an input whose
/// [`payload`] is `payload`, applied at `now`.
pub fn record(generation: u64, now: Millis, payload: &[u8], out: &mut Vec<u8>) {
    let now = now.as_millis().to_le_bytes();
    let crc = checksum(generation, &now, payload);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&now);
    out.extend_from_slice(payload);
}

/// What a journal's bytes hold.
#[derive(Debug, Default)]
pub struct Decoded {
    /// The intact records, in order (not the [`Input::End`] that may close them); empty
    /// from [`replay`], which hands them to its caller instead.
    pub entries: Vec<(Millis, Input)>,
    /// How many leading bytes the header and the records take: the rest is a torn or
    /// damaged tail, zeros, or an older generation's records.
    pub intact: usize,
    /// Why decoding stopped before [`Input::End`] or zeros, if it did.
    pub stopped: Option<String>,
    /// It stopped at bytes that are intact but not this format: a journal from another
    /// version of Mooring, which must not be cut.
    pub foreign: bool,
    /// The records end with [`Input::End`]: the next generation's journal follows.
    pub ended: bool,
    /// Decoding stopped at a bad record that was synced: a sync mark after it names a later
    /// offset. Everything after it was acknowledged, so the journal is damaged, not torn.
    pub damaged: Option<Damage>,
}

/// Where a journal was damaged before records its writer had synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The offset of the first bad record: [`Decoded::intact`].
    pub at: usize,
    /// The furthest offset a sync mark after it says was on disk.
    pub synced_to: u64,
}

/// The length of the first piece of `records` (whole records, as [`record`] appends them) a
/// writer syncs at once: as many records as fit in [`MAX_SYNC_BYTES`], at least one.
pub fn sync_piece(records: &[u8]) -> usize {
    let mut at = 0;
    while let Some(len) = records.get(at..at + 4) {
        let next =
            at + RECORD_HEADER + u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        if at > 0 && next > MAX_SYNC_BYTES {
            break;
        }
        at = next;
    }
    at.min(records.len())
}

/// Whether the first `bytes` of generation `generation`'s journal file, `file_len` bytes
/// long, are all [`decode`] needs: None if so, else how many bytes at least to read. It needs
/// the records up to an end record, or up to a bad record or zeros and [`MARK_REACH`] past
/// it (see the module docs), or the whole file. A journal file reused from an older generation holds
/// that generation's records after the new ones, as long as a whole generation's journal:
/// recovery reads what is needed, not gigabytes of them.
pub fn needed(generation: u64, bytes: &[u8], file_len: u64) -> Option<u64> {
    needed_from(generation, bytes, 0, file_len)
}

/// [`needed`] of the file's bytes from offset `base` on, where `base` is 0 or where a record
/// begins (every record before it intact): offsets, like `file_len`, are the file's.
fn needed_from(generation: u64, bytes: &[u8], base: usize, file_len: u64) -> Option<u64> {
    let have = (base + bytes.len()) as u64;
    if have >= file_len {
        return None;
    }
    let more = Some(have + 1);
    let reach = |bad: usize| {
        let to = file_len.min((bad + MARK_REACH) as u64);
        (have < to).then_some(to)
    };
    let mut at = base;
    if base == 0 {
        if bytes.iter().all(|&b| b == 0) {
            // Nothing written yet as far as read: what follows decides.
            return more;
        }
        let Some(header) = bytes.get(..FILE_HEADER) else {
            return more;
        };
        if header[..MAGIC.len()] != MAGIC {
            return None;
        }
        if header[MAGIC.len()..] != generation.to_le_bytes() {
            return reach(0);
        }
        at = FILE_HEADER;
    }
    let end = end_payload();
    loop {
        let rest = &bytes[at - base..];
        if rest.iter().all(|&b| b == 0) {
            // Zeros written ahead, or a file read only this far. Past the last record, a file
            // grown ahead may hold gigabytes of zeros: like a bad record, they need reading only
            // as far as a mark that could vouch for bytes there would be.
            return reach(at);
        }
        match decode_checked(generation, rest) {
            Ok((_, payload, _)) if payload == end.as_slice() => return None,
            Ok((_, _, len)) => at += len,
            Err(_) if cut_short(rest) => return more,
            Err(_) => return reach(at),
        }
    }
}

/// Whether `bytes` start with a record whose header is plausible and whose end lies past
/// them: a record that reading further may complete.
fn cut_short(bytes: &[u8]) -> bool {
    match bytes.get(..4) {
        None => true,
        Some(len) => {
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            len <= MAX_RECORD && RECORD_HEADER + len > bytes.len()
        }
    }
}

/// Decodes generation `generation`'s journal file `bytes`, stopping at the first record that
/// is incomplete or damaged, or at [`Input::End`].
pub fn decode(generation: u64, bytes: &[u8]) -> Decoded {
    let mut entries = Vec::new();
    let push = |now, input| {
        entries.push((now, input));
        Ok::<(), std::convert::Infallible>(())
    };
    let Ok(mut decoded) = decode_from(generation, bytes, 0, &mut AlignedVec::new(), push);
    decoded.entries = entries;
    decoded
}

/// [`decode`] of the file's bytes from offset `base` on, where `base` is 0 or where a record
/// begins (every record before it intact), handing each intact record to `each` as it is
/// decoded instead of collecting them; stops at the first error `each` returns. What is
/// reported, offsets included, is what decoding the whole file would report from there on,
/// as records decode alone.
fn decode_from<E>(
    generation: u64,
    bytes: &[u8],
    base: usize,
    scratch: &mut AlignedVec<16>,
    mut each: impl FnMut(Millis, Input) -> Result<(), E>,
) -> Result<Decoded, E> {
    let mut decoded = Decoded::default();
    let mut at = base;
    if base == 0 {
        if bytes.iter().all(|&b| b == 0) {
            // Created, and nothing written yet.
            return Ok(decoded);
        }
        let Some(header) = bytes.get(..FILE_HEADER) else {
            decoded.stopped = Some(format!("a {}-byte file header is cut short", bytes.len()));
            return Ok(decoded);
        };
        if header[..MAGIC.len()] != MAGIC {
            decoded.stopped = Some("the file does not start with this format's header".into());
            decoded.foreign = true;
            return Ok(decoded);
        }
        let named = u64::from_le_bytes(header[MAGIC.len()..].try_into().expect("8 bytes"));
        if named != generation {
            // A reused file whose new header never reached the disk (unless a mark says it
            // did).
            decoded.stopped = Some(format!(
                "the header names generation {named}: the file was being reused"
            ));
            decoded.damaged = synced_past(generation, bytes, 0, 0);
            return Ok(decoded);
        }
        at = FILE_HEADER;
    }
    while at < base + bytes.len() {
        let rest = &bytes[at - base..];
        // Zeros written ahead of the records: the end (no record starts with a zero length).
        if rest.iter().all(|&b| b == 0) {
            break;
        }
        match decode_one(generation, rest, scratch) {
            Ok((_, Input::End, len)) => {
                at += len;
                decoded.ended = true;
                break;
            }
            Ok((_, Input::Synced(_), len)) => at += len,
            Ok((now, input, len)) => {
                each(now, input)?;
                at += len;
            }
            Err((why, foreign)) => {
                decoded.stopped = Some(format!("at byte {at}: {why}"));
                decoded.foreign = foreign;
                if !foreign {
                    decoded.damaged = synced_past(generation, bytes, base, at);
                }
                break;
            }
        }
    }
    decoded.intact = at;
    Ok(decoded)
}

/// Bytes of journal a [`replay`] holds at a time when every record is intact.
pub const REPLAY_PIECE: usize = 16 << 20;

/// Replays generation `generation`'s journal file, `file_len` bytes long, read through
/// `read` (fill a buffer from a file offset): each intact record goes to `each` as it is
/// decoded (a replay stops at the first error `each` returns), and the result is what
/// [`decode`] of the whole file reports. What follows a bad record is only known once it is
/// reached, so `each` may have applied records of a journal the result then calls damaged: a
/// caller that refuses damage discards what it applied.
///
/// The file is read `piece` bytes at a time into one buffer while its records are intact,
/// so a replay of gigabytes holds a piece, not the file. From the first record that is not
/// intact and whole in its piece (a torn tail, zeros written ahead, damage, or a record
/// larger than a piece) the rest is read as far as [`needed`] says and decoded whole, since
/// telling damage from a torn tail needs the marks after it.
pub fn replay<E>(
    generation: u64,
    file_len: u64,
    piece: usize,
    mut read: impl FnMut(&mut [u8], u64) -> Result<(), E>,
    mut each: impl FnMut(Millis, Input) -> Result<(), E>,
) -> Result<Decoded, E> {
    let file_len = usize::try_from(file_len).unwrap_or(usize::MAX);
    let mut scratch = AlignedVec::<16>::new();
    let mut window = vec![0u8; piece.max(FILE_HEADER).min(file_len)];
    // The window holds the file's bytes [base, base + filled); records before `next` are
    // replayed.
    let (mut base, mut filled, mut next) = (0, 0, 0);
    loop {
        let want = window.len().min(file_len - base);
        read(&mut window[filled..want], (base + filled) as u64)?;
        filled = want;
        let mut start = 0;
        if base == 0 {
            let header = file_header(generation);
            if window.get(..FILE_HEADER) != Some(&header[..]) {
                break;
            }
            start = FILE_HEADER;
        }
        let clean = decode_clean(generation, &window[start..filled], &mut scratch, &mut each)?;
        next = base + start + clean.consumed;
        if clean.ended {
            return Ok(Decoded {
                intact: next,
                ended: true,
                ..Decoded::default()
            });
        }
        if !clean.cut_by_window || base + filled == file_len || next == base {
            break;
        }
        // The window ends inside a record: keep its start, read on after it.
        window.copy_within(next - base..filled, 0);
        filled -= next - base;
        base = next;
    }
    drop(window);
    let mut rest = Vec::new();
    let mut want = (file_len - next).min(piece.max(1));
    loop {
        let have = rest.len();
        rest.resize(want, 0);
        read(&mut rest[have..], (next + have) as u64)?;
        match needed_from(generation, &rest, next, file_len as u64) {
            None => break,
            Some(at_least) => {
                want = (at_least as usize - next)
                    .max(want * 2)
                    .min(file_len - next);
            }
        }
    }
    decode_from(generation, &rest, next, &mut scratch, each)
}

/// How far [`decode_clean`] got.
struct Clean {
    /// Bytes of whole, intact records decoded and handed on.
    consumed: usize,
    /// The last of them was the end record.
    ended: bool,
    /// It stopped at a record the window cuts short (more of the file may complete it).
    cut_by_window: bool,
}

/// Hands on the whole, intact and readable records at the start of `window` (part of a
/// generation `generation` journal, starting where a record does) up to an end record, and
/// stops before the first record that is anything else.
fn decode_clean<E>(
    generation: u64,
    window: &[u8],
    scratch: &mut AlignedVec<16>,
    mut each: impl FnMut(Millis, Input) -> Result<(), E>,
) -> Result<Clean, E> {
    let mut at = 0;
    loop {
        let rest = &window[at..];
        let stopped = |cut_by_window| Clean {
            consumed: at,
            ended: false,
            cut_by_window,
        };
        let Ok((now, body, len)) = decode_checked(generation, rest) else {
            return Ok(stopped(cut_short(rest)));
        };
        match from_payload(body, scratch) {
            Ok(Input::End) => {
                return Ok(Clean {
                    consumed: at + len,
                    ended: true,
                    cut_by_window: false,
                });
            }
            Ok(Input::Synced(_)) => {}
            Ok(input) => each(now, input)?,
            Err(_) => return Ok(stopped(false)),
        }
        at += len;
    }
}

/// The damage at `bad` if an intact sync mark of `generation` after it names an offset past
/// it (see the module docs); one pass over the rest of `bytes`, the file's bytes from offset
/// `base` on. A reused journal file holds a former generation's records after the last new
/// one, hundreds of megabytes of them, so the candidates (a sync mark's length field) are
/// found with a vectorized search.
fn synced_past(generation: u64, bytes: &[u8], base: usize, bad: usize) -> Option<Damage> {
    let len = synced_record_len();
    let field = ((len - RECORD_HEADER) as u32).to_le_bytes();
    let from = bad + 1;
    let rest = bytes.get(from - base..)?;
    let end = base + bytes.len();
    let mut scratch = AlignedVec::new();
    memchr::memmem::find_iter(rest, &field)
        .map(|i| from + i)
        .take_while(|&at| at + len <= end)
        .filter_map(
            |at| match decode_one(generation, &bytes[at - base..], &mut scratch) {
                Ok((_, Input::Synced(offset), _)) if offset > bad as u64 => Some(offset),
                _ => None,
            },
        )
        .max()
        .map(|synced_to| Damage { at: bad, synced_to })
}

/// One record at the start of `bytes`: its time, its input and its length; or why not, and
/// whether the record is intact but unreadable to this build.
fn decode_one(
    generation: u64,
    bytes: &[u8],
    scratch: &mut AlignedVec<16>,
) -> Result<(Millis, Input, usize), (String, bool)> {
    decode_checked(generation, bytes)
        .map_err(|why| (why, false))
        .and_then(|(now, body, len)| {
            let input = from_payload(body, scratch)
                .map_err(|e| (format!("an intact record does not decode: {e}"), true))?;
            Ok((now, input, len))
        })
}

/// The time and payload of the record at the start of `bytes`, with the record's length, once
/// its length and checksum hold.
fn decode_checked(generation: u64, bytes: &[u8]) -> Result<(Millis, &[u8], usize), String> {
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
    let now: [u8; 8] = body[0..8].try_into().expect("8 bytes");
    if checksum(generation, &now, &body[8..]) != crc {
        return Err("a record fails its checksum".into());
    }
    Ok((
        Millis(u64::from_le_bytes(now)),
        &body[8..],
        RECORD_HEADER + len,
    ))
}

/// Applies one journaled input to `master`, as the master that journaled it did.
/// (A [`Input::Config`] is the loader's business: it is not an input to the core.)
pub fn apply(master: &mut Master, now: Millis, input: Input) {
    match input {
        Input::Config(_) | Input::End | Input::Synced(_) => {}
        Input::Request(request) => {
            // The answer went to its client when the request was first served.
            let _ = dispatch::handle(master, request, now);
        }
        Input::Tick => master.tick(now),
        Input::Resume => master.resume(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{GetSize, Remove};

    const GENERATION: u64 = 9;

    fn journal(generation: u64, inputs: &[(u64, Input)]) -> Vec<u8> {
        let mut out = file_header(generation).to_vec();
        for (now, input) in inputs {
            record(generation, Millis(*now), &payload(input), &mut out);
        }
        out
    }

    #[test]
    fn a_payload_decodes_in_place_when_aligned_and_from_a_copy_when_not() {
        let input = Input::Request(
            GetSize {
                key: "k1234567".into(),
            }
            .into(),
        );
        let payload = payload(&input);
        let mut scratch = AlignedVec::new();
        for shift in [0, 1, 8] {
            let mut at = AlignedVec::<16>::new();
            at.extend_from_slice(&vec![0; shift]);
            at.extend_from_slice(&payload);
            let decoded = from_payload(&at[shift..], &mut scratch).expect("it decodes");
            assert_eq!(decoded, input, "payload shifted by {shift}");
        }
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
        let mut bytes = file_header(GENERATION).to_vec();
        record(GENERATION, Millis(3), &alone, &mut bytes);
        assert_eq!(
            decode(GENERATION, &bytes).entries,
            vec![(Millis(3), Input::Request(end))]
        );

        // A record written in the old form (the enum's archive): intact but not readable, so
        // recovery refuses it rather than taking it for a torn tail.
        let mut old = file_header(GENERATION).to_vec();
        record(GENERATION, Millis(3), &as_enum, &mut old);
        let decoded = decode(GENERATION, &old);
        assert!(decoded.entries.is_empty() && decoded.foreign, "{decoded:?}");
    }

    #[test]
    fn recovery_reads_a_reused_file_only_as_far_as_decoding_needs() {
        let ours = journal(
            GENERATION,
            &[
                (1, Input::Config(MasterConfig::default())),
                (2, Input::Resume),
                (3, Input::Tick),
            ],
        );
        // The older generation's records that a reused file holds past ours.
        let mut reused = ours.clone();
        for now in 0..100 {
            record(GENERATION - 1, Millis(now), &tick_payload(), &mut reused);
        }
        let huge = 8u64 << 30;
        // Every record of ours, and a mark's reach past the first bad one: no more.
        let reach = (ours.len() + MARK_REACH) as u64;
        assert_eq!(needed(GENERATION, &reused, huge), Some(reach));
        // A record cut short by what was read asks for more.
        assert_eq!(
            needed(GENERATION, &ours[..ours.len() - 3], huge),
            Some(ours.len() as u64 - 2)
        );
        // Zeros written ahead are read as far as a bad record's reach, not to the end of a
        // file grown gigabytes ahead.
        let mut zeros = ours.clone();
        zeros.resize(ours.len() + 4096, 0);
        assert_eq!(needed(GENERATION, &zeros, huge), Some(reach));
        zeros.resize(reach as usize, 0);
        assert_eq!(needed(GENERATION, &zeros, huge), None);
        // The whole file, or an end record, is all decoding needs.
        assert_eq!(needed(GENERATION, &reused, reused.len() as u64), None);
        let mut ended = ours.clone();
        record(GENERATION, Millis(4), &end_payload(), &mut ended);
        let closed = ended.len();
        ended.extend_from_slice(&reused[ours.len()..]);
        assert_eq!(needed(GENERATION, &ended[..closed], huge), None);
        // What was read decodes as the whole file does.
        let whole = decode(GENERATION, &reused);
        let read = decode(GENERATION, &reused[..reused.len() / 2]);
        assert_eq!(
            (read.entries, read.intact, read.damaged),
            (whole.entries, whole.intact, whole.damaged)
        );
    }

    /// Replays `file` a `piece` at a time: what it hands on, what it reports, and the most
    /// bytes one read asked for.
    fn replay_in_pieces(file: &[u8], piece: usize) -> (Vec<(Millis, Input)>, Decoded, usize) {
        let mut entries = Vec::new();
        let mut largest = 0;
        let read = |buf: &mut [u8], offset: u64| {
            largest = largest.max(buf.len());
            buf.copy_from_slice(&file[offset as usize..offset as usize + buf.len()]);
            Ok::<(), std::convert::Infallible>(())
        };
        let Ok(decoded) = replay(GENERATION, file.len() as u64, piece, read, |now, input| {
            entries.push((now, input));
            Ok(())
        });
        (entries, decoded, largest)
    }

    #[test]
    fn a_replay_holds_a_piece_of_the_journal_at_a_time_and_reports_what_the_whole_file_does() {
        let mut inputs = vec![(1, Input::Config(MasterConfig::default()))];
        inputs.extend((2..2_000).map(|now| (now, Input::Tick)));
        let ours = journal(GENERATION, &inputs);
        let piece = 1_000;
        // Closed by its end record, followed by a reused file's older records: replayed in
        // pieces, none of them read past the end record's piece.
        let mut ended = ours.clone();
        record(GENERATION, Millis(9_999), &end_payload(), &mut ended);
        let closed = ended.len();
        for now in 0..5_000 {
            record(GENERATION - 1, Millis(now), &tick_payload(), &mut ended);
        }
        let (entries, replayed, largest) = replay_in_pieces(&ended, piece);
        let whole = decode(GENERATION, &ended);
        assert_eq!(entries.len(), inputs.len());
        assert_eq!(entries, whole.entries);
        assert_eq!((replayed.intact, replayed.ended), (closed, true));
        assert!(largest <= piece, "read {largest} bytes at once");
        // Torn at every kind of place and followed by zeros: the same as the whole file.
        for cut in [ours.len(), ours.len() - 3, ours.len() / 2 + 5, 17, 9, 0] {
            let mut torn = ours[..cut].to_vec();
            torn.resize(cut + 3 * piece, 0);
            let (entries, replayed, _) = replay_in_pieces(&torn, piece);
            let whole = decode(GENERATION, &torn);
            assert_eq!(entries, whole.entries, "cut at {cut}");
            assert_eq!(
                (replayed.intact, replayed.stopped, replayed.ended),
                (whole.intact, whole.stopped, whole.ended),
                "cut at {cut}"
            );
        }
        // A record longer than a piece is read whole.
        let (entries, replayed, _) = replay_in_pieces(&ended, 40);
        assert_eq!((entries, replayed.intact), (whole.entries, closed));

        // An intact record this build cannot read, amid the pieces: foreign, not the end.
        let mut foreign = ours.clone();
        let old_form = rkyv::to_bytes::<rancor::Error>(&Input::Tick).unwrap();
        record(GENERATION, Millis(5_000), &old_form, &mut foreign);
        foreign.extend_from_slice(&ours[FILE_HEADER..]);
        // A bad record that a sync mark after it vouches for: damage, not a torn tail.
        let mut damaged = ours.clone();
        let bad = damaged.len() / 2;
        damaged[bad] ^= 0x55;
        record(
            GENERATION,
            Millis(5_001),
            &synced_payload(ours.len() as u64),
            &mut damaged,
        );
        // Synced records zeroed on the disk from a record's start, more than a piece of them:
        // damage too, not the zeros written ahead of the records.
        let mut zeroed = ours.clone();
        let boundary = journal(GENERATION, &inputs[..inputs.len() / 2]).len();
        zeroed[boundary..boundary + 3 * piece].fill(0);
        record(
            GENERATION,
            Millis(5_001),
            &synced_payload(ours.len() as u64),
            &mut zeroed,
        );
        // A reused file whose new header never reached the disk: the older generation's.
        let unheaded = journal(GENERATION - 1, &inputs);
        for (name, file) in [
            ("foreign", &foreign),
            ("damaged", &damaged),
            ("zeroed", &zeroed),
            ("unheaded", &unheaded),
        ] {
            let (entries, replayed, _) = replay_in_pieces(file, piece);
            let whole = decode(GENERATION, file);
            assert!(whole.stopped.is_some(), "{name}: {whole:?}");
            assert_eq!(entries, whole.entries, "{name}");
            assert_eq!(
                (
                    replayed.intact,
                    replayed.stopped,
                    replayed.foreign,
                    replayed.damaged
                ),
                (whole.intact, whole.stopped, whole.foreign, whole.damaged),
                "{name}"
            );
        }
    }

    #[test]
    fn a_large_batch_is_synced_in_pieces_of_whole_records() {
        let mut records = Vec::new();
        let big = vec![7u8; MAX_SYNC_BYTES / 3];
        for now in 0..7 {
            record(GENERATION, Millis(now), &big, &mut records);
        }
        let one = RECORD_HEADER + big.len();
        assert_eq!(
            sync_piece(&records),
            2 * one,
            "as many whole records as fit"
        );
        let mut huge = Vec::new();
        record(
            GENERATION,
            Millis(0),
            &vec![1u8; MAX_SYNC_BYTES + 1],
            &mut huge,
        );
        huge.extend_from_slice(&records[..one]);
        assert_eq!(sync_piece(&huge), huge.len() - one, "a larger record alone");
        assert_eq!(sync_piece(&records[..one]), one);
        assert_eq!(sync_piece(&[]), 0);
    }

    #[test]
    fn records_round_trip_in_order() {
        let inputs = vec![
            (0, Input::Config(MasterConfig::default())),
            (5, Input::Request(Remove { key: "k".into() }.into())),
            (7, Input::Tick),
        ];
        let bytes = journal(GENERATION, &inputs);
        let decoded = decode(GENERATION, &bytes);
        assert_eq!((decoded.stopped, decoded.ended), (None, false));
        assert_eq!(decoded.intact, bytes.len());
        let expected: Vec<(Millis, Input)> =
            inputs.into_iter().map(|(t, i)| (Millis(t), i)).collect();
        assert_eq!(decoded.entries, expected);
    }

    #[test]
    fn a_torn_or_damaged_tail_stops_decoding_after_the_intact_records() {
        let bytes = journal(
            GENERATION,
            &[
                (1, Input::Tick),
                (2, Input::Request(GetSize { key: "k".into() }.into())),
            ],
        );
        let first = decode(GENERATION, &bytes).entries.len();
        assert_eq!(first, 2);
        let one = journal(GENERATION, &[(1, Input::Tick)]).len();
        for cut in one..bytes.len() {
            let decoded = decode(GENERATION, &bytes[..cut]);
            assert_eq!(decoded.entries.len(), 1, "cut at {cut}");
            assert_eq!(decoded.intact, one);
            assert!(decoded.stopped.is_some() || cut == one);
        }
        let mut damaged = bytes.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        let decoded = decode(GENERATION, &damaged);
        assert_eq!(decoded.entries.len(), 1);
        assert!(!decoded.foreign, "a damaged record is a torn tail");
        assert!(decoded.stopped.unwrap().contains("checksum"));
        // Zeros written ahead of the records end the journal cleanly.
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0; 4096]);
        let decoded = decode(GENERATION, &padded);
        assert_eq!((decoded.entries.len(), decoded.stopped), (2, None));
        assert_eq!(decoded.intact, bytes.len());
        // A length beyond any record is refused, not allocated.
        let mut huge = journal(GENERATION, &[(1, Input::Tick)]);
        huge[FILE_HEADER..FILE_HEADER + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decode(GENERATION, &huge)
                .stopped
                .unwrap()
                .contains("claims")
        );
    }

    #[test]
    fn a_bad_record_before_a_sync_mark_is_damage_and_one_after_it_a_torn_tail() {
        let inputs = [
            (1, Input::Tick),
            (2, Input::Request(GetSize { key: "a".into() }.into())),
            (3, Input::Tick),
        ];
        let mut bytes = journal(GENERATION, &inputs);
        let first_end = FILE_HEADER + RECORD_HEADER + payload(&Input::Tick).len();
        // Synced, then marked; then a batch that a crash may tear.
        let synced = bytes.len() as u64;
        record(GENERATION, Millis(3), &synced_payload(synced), &mut bytes);
        assert_eq!(bytes.len() as u64, synced + synced_record_len() as u64);
        let marked = bytes.len();
        record(GENERATION, Millis(4), &tick_payload(), &mut bytes);
        let decoded = decode(GENERATION, &bytes);
        assert_eq!(decoded.entries.len(), 4, "marks are not entries");
        assert_eq!((decoded.stopped, decoded.damaged), (None, None));

        // A torn record after the mark: a tail, nothing acknowledged is lost.
        let mut torn = bytes.clone();
        torn[marked + 5] ^= 0x10;
        let decoded = decode(GENERATION, &torn);
        assert_eq!(decoded.entries.len(), 3);
        assert_eq!(decoded.damaged, None, "{:?}", decoded.stopped);

        // A flipped bit in any synced record, header or body: damage, at that record.
        for flip in [
            first_end,
            first_end + 3,
            first_end + RECORD_HEADER + 1,
            FILE_HEADER,
        ] {
            let mut damaged = bytes.clone();
            damaged[flip] ^= 0x04;
            let decoded = decode(GENERATION, &damaged);
            let damage = decoded.damaged.expect("damage before the mark is reported");
            assert!(
                damage.at <= flip,
                "flip at {flip}, reported at {}",
                damage.at
            );
            assert_eq!(damage.synced_to, synced);
        }
        // A flipped header generation: the header was synced too.
        let mut damaged = bytes.clone();
        damaged[MAGIC.len()] ^= 0x01;
        assert_eq!(decode(GENERATION, &damaged).damaged.unwrap().at, 0);
        // A mark of another generation (a reused file's older records) proves nothing.
        let mut older = journal(GENERATION, &[(1, Input::Tick)]);
        let end = older.len();
        older.extend_from_slice(&[0xEE; 7]);
        record(
            GENERATION - 1,
            Millis(1),
            &synced_payload(1 << 20),
            &mut older,
        );
        let decoded = decode(GENERATION, &older);
        assert_eq!((decoded.intact, decoded.damaged), (end, None));
    }

    #[test]
    fn a_reused_file_ends_where_its_new_records_end() {
        // Generation 3's file, reused for generation 9: its header and first records are
        // overwritten; its older records follow, intact under their own generation.
        let old = journal(
            3,
            &[
                (1, Input::Tick),
                (2, Input::Tick),
                (3, Input::Request(GetSize { key: "old".into() }.into())),
            ],
        );
        let new = journal(GENERATION, &[(8, Input::Tick)]);
        let mut reused = old.clone();
        reused[..new.len()].copy_from_slice(&new);
        let decoded = decode(GENERATION, &reused);
        assert_eq!(decoded.entries, vec![(Millis(8), Input::Tick)]);
        assert_eq!(decoded.intact, new.len());
        assert!(!decoded.foreign && !decoded.ended, "{decoded:?}");
        assert!(decoded.stopped.unwrap().contains("checksum"));

        // Closed with an end record, the same file is complete: the next journal may follow.
        let mut closed = new.clone();
        record(GENERATION, Millis(9), &end_payload(), &mut closed);
        let mut reused = old.clone();
        reused[..closed.len()].copy_from_slice(&closed);
        let decoded = decode(GENERATION, &reused);
        assert_eq!(decoded.entries, vec![(Millis(8), Input::Tick)]);
        assert_eq!((decoded.intact, decoded.ended), (closed.len(), true));
        assert_eq!(decoded.stopped, None);

        // A reused file whose new header never reached the disk holds nothing of its own.
        let decoded = decode(GENERATION, &old);
        assert!(decoded.entries.is_empty() && !decoded.foreign);
        assert!(decoded.stopped.unwrap().contains("generation 3"));
    }

    #[test]
    fn a_file_without_this_formats_header_is_foreign_and_an_empty_one_is_empty() {
        // The format before headers: records from the first byte.
        let mut headless = Vec::new();
        record(0, Millis(1), &payload(&Input::Tick), &mut headless);
        let decoded = decode(0, &headless);
        assert!(decoded.foreign && decoded.entries.is_empty(), "{decoded:?}");
        for empty in [&[][..], &[0u8; 64][..]] {
            let decoded = decode(GENERATION, empty);
            assert_eq!((decoded.entries.len(), decoded.stopped), (0, None));
        }
    }

    #[test]
    fn an_intact_record_this_build_cannot_read_is_flagged_foreign() {
        let mut bytes = journal(GENERATION, &[(1, Input::Tick)]);
        // A record whose checksum holds over bytes that are no input of this build (as from
        // another version of the format).
        let garbage = [0xA5u8; 24];
        record(GENERATION, Millis(2), &garbage, &mut bytes);
        let decoded = decode(GENERATION, &bytes);
        assert_eq!(decoded.entries.len(), 1);
        assert!(decoded.foreign);
        assert!(decoded.stopped.unwrap().contains("does not decode"));
    }
}
