//! Trace ids: one id per client operation, carried from the client through the master to the
//! nodes, so one slow operation can be followed across the three processes' logs.
//!
//! A client operation (a get, a put, a batch) runs inside [`traced`]; every frame it sends, to
//! the master or to a node, carries the operation's id as its request id, and the servers open
//! a span with that id around the request (`trace=…` in their DEBUG lines). A request sent
//! outside any operation gets an id of its own. The id only names: replies echo it, and no
//! decision depends on it.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
#[cfg(not(madsim))]
use std::sync::OnceLock;
#[cfg(not(madsim))]
use std::sync::atomic::{AtomicU64, Ordering};

tokio::task_local! {
    static CURRENT: TraceId;
}

/// One operation's id: a random per-process prefix in the top 24 bits (so two processes'
/// ids differ) and a per-process counter below.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceId(pub u64);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl TraceId {
    /// A fresh id, unique within this process.
    pub fn new() -> TraceId {
        // The simulation runs each seed on a fresh thread of one process: per-thread state
        // starts each run alike, so a seed run among others is the seed run alone (a prefix
        // drawn on a seed's first id would be drawn only by the first seed of a batch).
        #[cfg(madsim)]
        {
            thread_local! {
                static PREFIX: u64 = RandomState::new().hash_one(std::process::id()) << 40;
                static NEXT: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
            }
            let n = NEXT.with(|next| next.replace(next.get() + 1));
            TraceId(PREFIX.with(|prefix| *prefix) | (n & ((1 << 40) - 1)))
        }
        #[cfg(not(madsim))]
        {
            static PREFIX: OnceLock<u64> = OnceLock::new();
            static NEXT: AtomicU64 = AtomicU64::new(1);
            let prefix =
                *PREFIX.get_or_init(|| RandomState::new().hash_one(std::process::id()) << 40);
            TraceId(prefix | (NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << 40) - 1)))
        }
    }

    /// The id of the operation this task is running, or a fresh one outside any.
    pub fn current() -> TraceId {
        CURRENT
            .try_with(|id| *id)
            .unwrap_or_else(|_| TraceId::new())
    }
}

impl Default for TraceId {
    fn default() -> TraceId {
        TraceId::new()
    }
}

/// Runs `operation` with `id` as its trace id: the frames it sends carry `id`.
pub async fn traced<F: Future>(id: TraceId, operation: F) -> F::Output {
    CURRENT.scope(id, operation).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_share_the_process_prefix() {
        let (a, b) = (TraceId::new(), TraceId::new());
        assert_ne!(a, b);
        assert_eq!(a.0 >> 40, b.0 >> 40);
        assert_eq!(a.to_string().len(), 16);
    }

    #[test]
    fn an_operation_sees_its_own_id_and_outsiders_get_fresh_ones() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let id = TraceId::new();
        let (inside, again) = runtime.block_on(traced(id, async {
            (TraceId::current(), TraceId::current())
        }));
        assert_eq!((inside, again), (id, id));
        assert_ne!(TraceId::current(), id);
    }
}
