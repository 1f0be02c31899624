//! The faults a plan holds: what each does to the cluster, how long it lasts, and how it
//! reads in a report.

use std::fmt;
use std::time::Duration;

use super::Member;

/// One fault.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Kill a storage node (its memory is lost) and start a fresh one after `down_for`.
    KillNode {
        /// Which node.
        node: usize,
        /// How long it stays down.
        down_for: Duration,
    },
    /// Kill a client, if `mid_write` at its next step between PutStart and PutEnd, and start
    /// it again (as a new client) after `down_for`.
    CrashClient {
        /// Which client.
        client: usize,
        /// Crash between the start and the end of a write.
        mid_write: bool,
        /// How long it stays down.
        down_for: Duration,
    },
    /// Cut the link from `from` to `to` (and back, if `both_ways`).
    Partition {
        /// Sending side.
        from: Member,
        /// Receiving side.
        to: Member,
        /// Cut the reverse direction too.
        both_ways: bool,
        /// How long the cut lasts.
        lasts: Duration,
    },
    /// Cut `member` off from everyone, both ways.
    Isolate {
        /// Who.
        member: Member,
        /// How long.
        lasts: Duration,
    },
    /// Message faults everywhere (on TCP: loss and delay only, which stall streams).
    Noise {
        /// Drop chance per message.
        loss: f64,
        /// Duplication chance per message.
        duplicate: f64,
        /// Bit-flip chance per message.
        corrupt: f64,
        /// Extra delay per message, up to this.
        max_delay: Duration,
        /// How long.
        lasts: Duration,
    },
    /// Freeze a storage node's process (as a long GC pause or a stopped VM would).
    PauseNode {
        /// Which node.
        node: usize,
        /// How long.
        lasts: Duration,
    },
    /// A storage node's disk fails reads, writes and syncs (EIO) at `rate` each.
    DiskErrors {
        /// Which node.
        node: usize,
        /// Chance each operation fails.
        rate: f64,
        /// How long.
        lasts: Duration,
    },
    /// Flip one bit of a file on a storage node's disk (bit rot), chosen by `pick`.
    RotDisk {
        /// Which node.
        node: usize,
        /// Picks the file and the bit.
        pick: u64,
    },
    /// Kill a storage node the moment its disk is partway through a write: at the `change`-th
    /// change it makes to its disk from now (a create, write, sync, rename or removal), its
    /// earlier steps done and unsynced, so the crash tears or loses them. It restarts on the
    /// same disk after `down_for`; if `failing` says so, its disk fails that share of
    /// operations for that long from the restart (recovery meets I/O errors).
    KillNodeMidDiskWrite {
        /// Which node.
        node: usize,
        /// Which change, counted from the fault's time, the crash comes before.
        change: u32,
        /// How long it stays down.
        down_for: Duration,
        /// The share of disk operations that fail from the restart, and for how long.
        failing: Option<(f64, Duration)>,
    },
    /// Flip one bit inside a record (header, key or value) on a storage node's disk, chosen
    /// by `pick`: damage its next recovery must find.
    RotRecord {
        /// Which node.
        node: usize,
        /// Picks the record and the bit.
        pick: u64,
    },
    /// Flip one bit of a value held in a storage node's memory (a bad DIMM, a stray write),
    /// chosen by `pick`: readers must detect it by its checksum and never return it.
    RotMemory {
        /// Which node.
        node: usize,
        /// Picks the value and the bit.
        pick: u64,
    },
    /// Damage every copy of one value a storage node holds (a failing machine): a bit of its
    /// memory replica, the value's only one, and a bit of each of its records on the node's
    /// disk, chosen by `pick`. The value is lost: readers must say it is damaged, never
    /// that nothing has the key.
    RotEveryCopy {
        /// Which node.
        node: usize,
        /// Picks the value and the bits.
        pick: u64,
    },
    /// Datagrams from `from` to `to` arrive `by` late (a switch buffer, a retransmission
    /// backlog), intact; datagram-transport runs only (TCP's cut already delivers late).
    Lag {
        /// Sending side.
        from: Member,
        /// Receiving side.
        to: Member,
        /// How late each datagram arrives.
        by: Duration,
        /// How long the link lags.
        lasts: Duration,
    },
    /// A storage node remounts its segment under a fresh key while the workload runs (as
    /// when the master forgot it): the master drops the old mount's objects and hands its
    /// ranges out again, so a write or read granted for the old mount, still on its way,
    /// must be refused on every transport rather than land in or read the new values.
    Remount {
        /// Which node.
        node: usize,
    },
    /// A process without the cluster token knocks on every port (wrong-token handshakes,
    /// garbage, frames announced and never finished, silent connections); TCP runs only.
    Stranger {
        /// How long it keeps at it.
        lasts: Duration,
    },
    /// Kill the master (it keeps its state on disk in these runs) and start it again after
    /// `down_for`: it must come back knowing everything it acknowledged.
    KillMaster {
        /// How long it stays down.
        down_for: Duration,
        /// What happens to its state directory as it dies.
        journal: JournalFault,
    },
    /// The master's state directory fills up for `lasts`: changes must be refused, reads
    /// served, and everything held written once there is room (runs whose master keeps its
    /// state on the simulated disk).
    MasterDiskFull {
        /// How long the disk stays full.
        lasts: Duration,
    },
    /// Every sync of the master's state directory fails for `lasts` (EIO, the unsynced
    /// bytes dropped as Linux may drop them): the master must stop acknowledging changes
    /// for good (fail-stop); when the disk works again it is restarted on what it kept.
    MasterSyncFails {
        /// How long syncs fail.
        lasts: Duration,
    },
    /// A group's leader loses touch with its standby (both ways) if `standby`, and with etcd
    /// if `etcd`, for `lasts`; clients and nodes still reach it. Cut from etcd, it must stop
    /// granting before a standby can be elected; cut from its standby, it may go on
    /// acknowledging without it only once the standby is recorded out of sync.
    SplitLeader {
        /// Whether the standby is cut off.
        standby: bool,
        /// Whether etcd is cut off.
        etcd: bool,
        /// How long the split lasts.
        lasts: Duration,
    },
}

/// What a master's death does to its state directory (runs whose master keeps its state on
/// the simulated disk; a group's masters keep theirs on real directories and are only
/// killed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalFault {
    /// The process dies; the disk keeps everything written (the page cache survives).
    Kill,
    /// The machine loses power while a batch of records is half written: unsynced writes are
    /// torn or lost. Nothing acknowledged may go.
    PowerLoss,
    /// The process dies, then a bit flips in a synced record of the newest journal (chosen
    /// by `pick`): the restarted master must refuse to start, naming the damage; the
    /// harness then restores the byte, as an operator restores the file, and it starts.
    FlipSynced {
        /// Picks the byte and the bit.
        pick: u64,
    },
}

impl Fault {
    /// How long the fault holds before it heals on its own.
    pub fn lasts(&self) -> Duration {
        match self {
            Fault::KillNode { down_for, .. }
            | Fault::KillNodeMidDiskWrite { down_for, .. }
            | Fault::CrashClient { down_for, .. }
            | Fault::KillMaster { down_for, .. } => *down_for,
            Fault::Partition { lasts, .. }
            | Fault::Isolate { lasts, .. }
            | Fault::Noise { lasts, .. }
            | Fault::PauseNode { lasts, .. }
            | Fault::DiskErrors { lasts, .. }
            | Fault::Stranger { lasts }
            | Fault::MasterDiskFull { lasts }
            | Fault::MasterSyncFails { lasts }
            | Fault::SplitLeader { lasts, .. }
            | Fault::Lag { lasts, .. } => *lasts,
            Fault::RotDisk { .. }
            | Fault::RotRecord { .. }
            | Fault::RotMemory { .. }
            | Fault::RotEveryCopy { .. }
            | Fault::Remount { .. } => Duration::ZERO,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillNode { node, down_for } => {
                write!(f, "kill node{node}, restart after {down_for:?}")
            }
            Fault::KillNodeMidDiskWrite {
                node,
                change,
                down_for,
                failing,
            } => {
                write!(
                    f,
                    "kill node{node} before its disk's change {change} from now, restart after {down_for:?}"
                )?;
                match failing {
                    Some((rate, lasts)) => write!(
                        f,
                        " on a disk failing {rate:.2} of operations for {lasts:?}"
                    ),
                    None => Ok(()),
                }
            }
            Fault::RotRecord { node, pick } => {
                write!(f, "flip a bit of a record on node{node}'s disk ({pick:#x})")
            }
            Fault::KillMaster {
                down_for,
                journal: JournalFault::Kill,
            } => {
                write!(f, "kill the master, restart it after {down_for:?}")
            }
            Fault::KillMaster {
                down_for,
                journal: JournalFault::PowerLoss,
            } => write!(
                f,
                "power loss at the master mid-write (unsynced journal bytes torn or lost), \
                 restart it after {down_for:?}"
            ),
            Fault::KillMaster {
                down_for,
                journal: JournalFault::FlipSynced { pick },
            } => write!(
                f,
                "kill the master and flip a bit in a synced journal record (pick {pick:#x}), \
                 restart it after {down_for:?}"
            ),
            Fault::MasterDiskFull { lasts } => {
                write!(f, "fill the master's state directory for {lasts:?}")
            }
            Fault::SplitLeader {
                standby,
                etcd,
                lasts,
            } => write!(
                f,
                "cut the leading master off from {} for {lasts:?}",
                match (standby, etcd) {
                    (true, true) => "its standby and etcd",
                    (true, false) => "its standby",
                    _ => "etcd",
                }
            ),
            Fault::MasterSyncFails { lasts } => {
                write!(
                    f,
                    "fail every sync of the master's state directory for {lasts:?}"
                )
            }
            Fault::CrashClient {
                client,
                mid_write,
                down_for,
            } => write!(
                f,
                "crash client{client}{}, restart after {down_for:?}",
                if *mid_write {
                    " between PutStart and PutEnd"
                } else {
                    ""
                }
            ),
            Fault::Partition {
                from,
                to,
                both_ways,
                lasts,
            } => write!(
                f,
                "cut {from} {} {to} for {lasts:?}",
                if *both_ways { "<->" } else { "->" }
            ),
            Fault::Isolate { member, lasts } => write!(f, "isolate {member} for {lasts:?}"),
            Fault::Noise {
                loss,
                duplicate,
                corrupt,
                max_delay,
                lasts,
            } => write!(
                f,
                "noise for {lasts:?}: loss {loss:.3}, duplicate {duplicate:.3}, corrupt {corrupt:.3}, delay up to {max_delay:?}"
            ),
            Fault::PauseNode { node, lasts } => write!(f, "pause node{node} for {lasts:?}"),
            Fault::Lag {
                from,
                to,
                by,
                lasts,
            } => write!(f, "lag {from} -> {to} by {by:?} for {lasts:?}"),
            Fault::DiskErrors { node, rate, lasts } => {
                write!(
                    f,
                    "node{node}'s disk fails {rate:.2} of operations for {lasts:?}"
                )
            }
            Fault::RotDisk { node, pick } => {
                write!(f, "flip a bit on node{node}'s disk ({pick:#x})")
            }
            Fault::RotMemory { node, pick } => {
                write!(
                    f,
                    "flip a bit of a value in node{node}'s memory ({pick:#x})"
                )
            }
            Fault::RotEveryCopy { node, pick } => {
                write!(
                    f,
                    "flip a bit of every copy of a value on node{node}, memory and disk ({pick:#x})"
                )
            }
            Fault::Remount { node } => {
                write!(f, "node{node} remounts its segment under a fresh key")
            }
            Fault::Stranger { lasts } => {
                write!(
                    f,
                    "a stranger without the token knocks on every port for {lasts:?}"
                )
            }
        }
    }
}
