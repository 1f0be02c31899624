//! # mooring-proto
//!
//! The seams between Mooring's pure core and the adapters that do I/O, and the wire they
//! speak. Nothing here decides policy (that is `mooring-core`) and nothing here moves bytes
//! over a real network or disk (that is the transports and `mooring-disk`): this crate names
//! the messages, how they are framed and checked, and the traits every transport and disk
//! implements, so that production and the simulation plug into one shape.
//!
//! | module | concept |
//! | --- | --- |
//! | [`auth`] | the cluster token and the handshake that opens every connection |
//! | [`wire`] | messages and the checksummed frame codec |
//! | [`dispatch`] | a request to the master, applied to the core; the reply it gives |
//! | [`transport`] | the control-plane and data-plane traits, segment memory, the export table |
//! | [`helper`] | the process's helper thread, which takes part in large copies and summing |
//! | [`summing`] | checksums summed on a helper thread while a transfer moves the next bytes |
//! | [`striped`] | large copies in memory split between the caller and the helper |
//! | [`serve`] | a node's answer to each data request, shared by every transport's data server |
//! | [`journal`] | the master's inputs as checksummed records, and their replay |
//! | [`refusals`] | refusals logged at WARN, at most ten a second, and counted |
//! | [`trace`] | the id one client operation carries through master and nodes |
//! | [`disk`] | the file I/O trait the SSD tier's disks implement |
//! | [`state_dir`] | the files a master keeps (journals, snapshots), as a trait the simulation can break |
//! | [`fuzz`] | fuzz entry points for every decoder of network bytes |
//! | [`buggify`] | the simulation's timing faults and hold points, in every crate that moves bytes; no-ops outside it |

pub mod auth;
pub mod buggify;
pub mod disk;
pub mod dispatch;
pub mod fuzz;
pub mod handoff;
pub mod helper;
pub mod journal;
pub mod peer_dispatch;
pub mod refusals;
pub mod serve;
pub mod state_dir;
pub mod striped;
pub mod summing;
/// Lock and atomic types, swapped for loom's under `--cfg mooring_loom` so loom can model
/// the structures that share state across threads (the export table, a copy's pieces).
mod sync;
pub mod trace;
pub mod transport;
pub mod wire;

/// `len` bytes that differ with `seed` and along their length, for tests of copies and sums.
#[cfg(test)]
pub(crate) fn test_bytes(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) as u8)
        .collect()
}
