//! Two pieces of pure work side by side: the one way the core uses more than one processor.
//!
//! Restoring a snapshot of millions of objects has independent halves (building the key
//! index, checking everything else), and a server has a second core idle while it restores.
//! The core starts no threads itself: like time and randomness, how work runs comes in as an
//! argument. A server passes threads; the simulation and the tests pass [`Sequential`], and
//! the result is the same either way, since neither half writes what the other reads.

/// Runs two closures and returns once both have run, side by side or one after the other.
pub trait Parallel: Sync {
    /// Runs `a` and `b`. Each hands its result out through what it captures.
    fn join(&self, a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send));
}

/// [`Parallel`] one after the other, on the caller's thread.
pub struct Sequential;

impl Parallel for Sequential {
    fn join(&self, a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
        a();
        b();
    }
}
