//! Peer mode's state machines: a cluster with no master.
//!
//! Every host runs a peer. It copies its writes into its own published pool ([`pool`]) and
//! publishes a small location record to the key's directory owners; it hosts the shard of the
//! directory the ring gives it ([`directory`]); and the ring ([`ring`]) tells every peer,
//! without asking anyone, which peers own a key's entry. A read asks an owner, then reads the
//! bytes straight from the data's peer. Eviction is local to the data's peer and updates the
//! entry; a value evicted to disk keeps its entry, marked non-resident, and a read promotes it.
//! On a ring change every peer re-publishes what it holds to the new owners.
//!
//! Like the master's, these are pure values: no I/O, time passed in, every rule (whose
//! locations a peer may publish, which write wins, what a removal keeps out) decided here.

pub mod directory;
pub mod disk;
mod entries;
pub mod membership;
pub mod pool;
pub mod ring;
pub mod state;
