//! What happened inside the master that its caller did not ask about directly: evictions,
//! discarded writes, lost objects, expired clients. The driver drains these after each call to
//! log and count them; tests use them to judge every decision the master made on its own.

use std::collections::VecDeque;

use crate::ids::{ClientId, SegmentId, WriteId};

/// Why an in-progress put or upsert was abandoned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscardCause {
    /// No End or Revoke within `put_start_discard_timeout`.
    Timeout,
    /// A newer put or upsert of the same key took over.
    Preempted,
    /// The writing client stopped heartbeating.
    WriterDead,
    /// The writing client said goodbye with the write unfinished.
    WriterLeft,
    /// The writer gave up on a transfer that may still be landing (`put_abort`).
    Aborted,
    /// Every replica being written went away with its segment, while the value lives on
    /// in a disk copy (a prefetch into a segment that left).
    ReplicasLost,
    /// The writer revoked a prefetch that failed (its bytes were damaged) after the node had
    /// dropped the disk copy it read: no copy of the value is left.
    PrefetchRevoked,
}

/// Something the master did on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An object was evicted to free memory.
    Evicted {
        /// Its key.
        key: Box<str>,
        /// Whether it was soft-pinned (taken only after every unpinned candidate).
        soft_pinned: bool,
        /// Bytes freed (replica blocks).
        bytes: u64,
        /// Evicted to open a contiguous range for a large value (the least recently used
        /// such range), rather than in global least-recently-used order.
        contiguous: bool,
        /// The object lives on, readable from its node's disk copy (only its memory went).
        /// Also set by a node evicting a disk copy (then `bytes` is 0 and this is false).
        kept_on_disk: bool,
        /// Its last access (write or read): its place in least-recently-used order.
        last_access: crate::time::Millis,
    },
    /// `exist(prefetch)` found an object only on disk but no memory to promote it into. The
    /// object still exists; reads go to disk.
    PrefetchFailed {
        /// The key.
        key: Box<str>,
        /// Why the allocation failed.
        error: crate::error::Error,
    },
    /// An in-progress write was abandoned; its blocks wait out the release delay.
    WriteDiscarded {
        /// The key.
        key: Box<str>,
        /// The abandoned write.
        write: WriteId,
        /// Why.
        cause: DiscardCause,
        /// Whether the object went away with it (no complete replica left).
        object_removed: bool,
    },
    /// An object lost its last replica because its segment went away.
    ObjectLost {
        /// The key.
        key: Box<str>,
        /// The segment that went away.
        segment: SegmentId,
    },
    /// An object being written (a prefetch from a node's disk) lost its only readable copy,
    /// with its segment or to the node's disk eviction: it cannot be read unless the write
    /// completes, and goes if it fails.
    ReadableCopyLost {
        /// The key.
        key: Box<str>,
        /// The segment that went away, or whose disk dropped the copy.
        segment: SegmentId,
    },
    /// A segment was unmounted, by request or because its owner expired.
    SegmentUnmounted {
        /// The segment.
        segment: SegmentId,
        /// Its name.
        name: Box<str>,
        /// Replicas that were on it.
        replicas_dropped: u64,
        /// Objects that had no other replica and went with it (each also reported as
        /// [`Event::ObjectLost`], before this event).
        objects_lost: u64,
    },
    /// A client stopped heartbeating and was forgotten.
    ClientExpired {
        /// The client.
        client: ClientId,
    },
    /// A client said goodbye: what it held went as for an expired client.
    ClientLeft {
        /// The client.
        client: ClientId,
    },
}

/// A bounded queue of events: if the driver stops draining, the oldest are dropped and counted
/// rather than growing without bound.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventQueue {
    events: VecDeque<Event>,
    dropped: u64,
}

/// Events kept before the oldest are dropped.
const EVENT_QUEUE_LIMIT: usize = 1 << 16;

impl EventQueue {
    pub(crate) fn push(&mut self, event: Event) {
        if self.events.len() == EVENT_QUEUE_LIMIT {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Event> + '_ {
        self.events.drain(..)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}
