//! What the master tells a client about the cluster when it says hello: the settings the
//! client must follow.

use mooring_core::Millis;

/// The master's settings that clients need to follow the protocol.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ClusterInfo {
    /// How long a read lease lasts; readers finish within it or retry.
    pub lease_ttl: Millis,
    /// After this long an unfinished write may be preempted.
    pub put_start_discard_timeout: Millis,
    /// Writers stop writing a grant this long after starting it (their self-fence).
    pub put_start_release_timeout: Millis,
    /// Clients heartbeat well within this.
    pub client_ttl: Millis,
    /// Longest key accepted.
    pub max_key_len: u32,
}
