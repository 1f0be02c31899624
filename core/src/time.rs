//! Time as the core sees it: a monotonic millisecond count handed in by the driver.
//!
//! The core never reads a clock. Every call takes `now`; the same sequence of calls with the same
//! `now` values gives the same results, which is what lets a simulation replay a run exactly.

use std::fmt;
use std::ops::{Add, Sub};

/// A point on the driver's monotonic clock, or a span of time, in milliseconds.
///
/// The origin is arbitrary (the driver's process start, the simulation's epoch); only differences
/// matter. Arithmetic saturates so that "never" (`Millis::MAX`) stays never.
#[derive(
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug, PartialEq, Eq, PartialOrd, Ord))]
pub struct Millis(pub u64);

impl Millis {
    /// The origin, or a zero-length span.
    pub const ZERO: Millis = Millis(0);
    /// A time that never comes.
    pub const MAX: Millis = Millis(u64::MAX);

    /// A span of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Millis {
        Millis(secs.saturating_mul(1000))
    }

    /// A span of `mins` minutes.
    pub const fn from_mins(mins: u64) -> Millis {
        Millis(mins.saturating_mul(60_000))
    }

    /// The raw millisecond count.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub const fn since(self, earlier: Millis) -> Millis {
        Millis(self.0.saturating_sub(earlier.0))
    }
}

impl Add for Millis {
    type Output = Millis;
    fn add(self, rhs: Millis) -> Millis {
        Millis(self.0.saturating_add(rhs.0))
    }
}

impl Sub for Millis {
    type Output = Millis;
    fn sub(self, rhs: Millis) -> Millis {
        Millis(self.0.saturating_sub(rhs.0))
    }
}

impl fmt::Debug for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Millis::MAX {
            f.write_str("never")
        } else {
            write!(f, "{}ms", self.0)
        }
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
