//! How a standby master follows the leader: the state files it copies and the chunks they
//! arrive in, and how a master that does not lead refuses requests.

/// One of a master's state files (see the store's journal): the snapshot or the journal of a
/// generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub enum StateFile {
    /// `snapshot-G.snap`: the master's state when generation G began.
    Snapshot(u64),
    /// `journal-G.log`: the inputs applied since.
    Journal(u64),
}

/// Bytes of a leader's state file, for a standby to write at `offset` of `file`. When `file`
/// or `offset` differ from what the standby asked for, it starts over there: a new snapshot
/// at offset 0 replaces everything it holds; the next journal at offset 0 follows a
/// completed one.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct FollowChunk {
    /// The file the bytes belong to.
    pub file: StateFile,
    /// Where they go in it.
    pub offset: u64,
    /// The bytes (at most [`FOLLOW_CHUNK`]).
    pub bytes: Vec<u8>,
    /// Whether the file ends with them (a snapshot, or a journal the leader has moved past).
    pub complete: bool,
}

/// How every refusal from a master that does not lead begins (a standby, or a leader whose
/// lease lapsed): a caller given several masters tries the next one.
pub const STANDBY_REFUSAL: &str = "this master is a standby";

/// Most bytes of state file one [`FollowChunk`] carries.
pub const FOLLOW_CHUNK: usize = 1 << 20;
