//! The `Verbs` seam: the few ibverbs calls the transport makes, on one opened device with one
//! protection domain. Two implementations: [`crate::model::ModelVerbs`], a software HCA, and
//! (feature `ibverbs`) `crate::sys::SysVerbs` on rdma-sys.
//!
//! Resources are named by plain numbers (keys, queue pair numbers) so the seam stays
//! object-safe and the model can check every use the way an HCA does.

use smallvec::SmallVec;

/// Queue pair states, as an RC queue pair moves through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created or reset: posts are refused.
    Reset,
    /// Bound to the port and given its access rights.
    Init,
    /// Ready to receive: knows its remote peer.
    ReadyToReceive,
    /// Ready to send: posts run.
    ReadyToSend,
    /// Failed: every posted request completes as flushed and nothing more executes.
    Error,
}

/// What a peer needs to connect a queue pair to ours (exchanged out of band).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// The port's local identifier (InfiniBand).
    pub lid: u16,
    /// The port's global identifier (RoCE, or routed InfiniBand).
    pub gid: [u8; 16],
    /// First packet sequence number this side sends.
    pub psn: u32,
}

/// Access a memory registration grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Remote peers may READ it.
    pub remote_read: bool,
    /// Remote peers may WRITE it.
    pub remote_write: bool,
}

impl Access {
    /// Local use only (a client's buffers).
    pub const LOCAL: Access = Access {
        remote_read: false,
        remote_write: false,
    };
    /// Remote reads and writes (a node's segment).
    pub const REMOTE: Access = Access {
        remote_read: true,
        remote_write: true,
    };
}

/// A memory registration: the key local work requests name it by, and the key remote peers
/// use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryKeys {
    /// Local key, for scatter-gather entries.
    pub lkey: u32,
    /// Remote key, for peers' one-sided requests.
    pub rkey: u32,
}

/// One piece of local memory a work request reads from or writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Local virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the registration that covers it.
    pub lkey: u32,
}

/// One-sided operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// Remote memory into the local scatter list.
    Read,
    /// The local gather list into remote memory.
    Write,
}

/// A send work request: one READ or WRITE between a scatter-gather list and one remote range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Caller's id, echoed by its completion.
    pub wr_id: u64,
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Local memory, in order.
    pub sges: SmallVec<[Sge; 4]>,
    /// Remote address of the first byte.
    pub remote_addr: u64,
    /// Remote key of the registration that covers the remote range.
    pub rkey: u32,
    /// Whether a successful completion produces an entry (failures and flushes always do).
    pub signaled: bool,
}

impl WorkRequest {
    /// Bytes it moves.
    pub fn len(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }

    /// Whether it moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a work request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A local scatter-gather entry lies outside its registration (or names none).
    LocalProtection,
    /// The peer refused: bad rkey, out of bounds, or access not granted.
    RemoteAccess,
    /// The peer did not answer within the retry budget (dead, or partitioned).
    RetryExceeded,
    /// Never executed: the queue pair was in the error state.
    Flushed,
    /// Any other failure, with the device's status number.
    Other(u32),
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
}

/// What the device can do, as the transport needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// The device's name (`mlx5_0`, or the model's).
    pub name: String,
    /// Largest message one work request may move.
    pub max_msg_size: u64,
    /// Most scatter-gather entries per work request.
    pub max_sge: u32,
    /// Most outstanding work requests per send queue.
    pub max_qp_wr: u32,
}

/// Why a verbs call failed (a call, not a completion).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsError {
    /// What failed, for the log and the error a caller sees.
    pub message: String,
}

impl VerbsError {
    /// An error saying `message`.
    pub fn new(message: impl Into<String>) -> VerbsError {
        VerbsError {
            message: message.into(),
        }
    }
}

impl std::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The verbs the transport needs, on one device and protection domain. Every queue pair has
/// its own completion queue, so one owner polls it and draining one queue pair never steals
/// another's completions.
pub trait Verbs: Send + Sync + 'static {
    /// The device's limits.
    fn caps(&self) -> &DeviceCaps;

    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The bytes must stay allocated until [`Verbs::deregister`], and while registered for
    /// remote access they may change under any reference to them, as DMA does.
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<MemoryKeys, VerbsError>;

    /// Ends the registration whose local key is `lkey`.
    fn deregister(&self, lkey: u32);

    /// Creates an RC queue pair (and its completion queue) with room for `depth` outstanding
    /// sends, in [`QpState::Reset`].
    fn create_qp(&self, depth: u32) -> Result<u32, VerbsError>;

    /// This side's endpoint of queue pair `qpn`, to send to the peer.
    fn endpoint(&self, qpn: u32) -> Result<QpEndpoint, VerbsError>;

    /// Moves `qpn` to `state`. [`QpState::ReadyToReceive`] needs the peer's endpoint; every
    /// other transition ignores `remote`. Moving to [`QpState::Error`] flushes what is
    /// outstanding; [`QpState::Reset`] discards it (drain first).
    fn modify_qp(
        &self,
        qpn: u32,
        state: QpState,
        remote: Option<&QpEndpoint>,
    ) -> Result<(), VerbsError>;

    /// The state `qpn` is in now (a device may have moved it to [`QpState::Error`]).
    fn qp_state(&self, qpn: u32) -> Result<QpState, VerbsError>;

    /// Posts `requests` in order to `qpn`'s send queue.
    ///
    /// # Safety
    /// Every local range named must stay registered, allocated and otherwise untouched (for
    /// a READ's destination) until its request's completion is polled or the queue pair is
    /// drained after [`QpState::Error`].
    unsafe fn post_send(&self, qpn: u32, requests: &[WorkRequest]) -> Result<(), VerbsError>;

    /// Moves up to `max` completions of `qpn` into `out`; returns how many.
    fn poll_cq(&self, qpn: u32, max: usize, out: &mut Vec<Completion>) -> usize;

    /// Destroys `qpn` and its completion queue.
    fn destroy_qp(&self, qpn: u32);
}
