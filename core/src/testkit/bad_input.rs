//! Malformed requests: each must be refused with the right code and change nothing.

use super::{Harness, client_id, ensure};
use crate::config::ReplicateConfig;
use crate::error::ErrorCode;
use crate::ids::TaskId;
use crate::master::Master;
use crate::segments::SegmentSpec;
use crate::time::Millis;

impl Harness {
    pub(super) fn bad_input(&mut self, kind: u8) -> Result<(), String> {
        let c = client_id(0);
        let now = self.now;
        let long_key = "x".repeat(self.config.max_key_len + 1);
        let cfg = ReplicateConfig::single();
        let m = &mut self.master;
        let outcome: (ErrorCode, String) = match kind % 12 {
            0 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.get_replica_list("", now)),
            ),
            1 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.put_start(c, &long_key, 10, &cfg, now)),
            ),
            2 => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.put_start(c, "k0", 0, &cfg, now)),
            ),
            3 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.upsert_start(c, "k0", 10, &ReplicateConfig::replicas(0), now)
                ),
            ),
            4 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.put_start(c, "k0", 10, &ReplicateConfig::replicas(99), now)
                ),
            ),
            5 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.put_start(
                        c,
                        "k0",
                        10,
                        &cfg.clone().soft_pinned(Some(Millis::ZERO)),
                        now
                    )
                ),
            ),
            6 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.query_by_regex(crate::tenant::DEFAULT_TENANT, "(unclosed", now)
                ),
            ),
            7 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.remove_by_regex(crate::tenant::DEFAULT_TENANT, "[z-a]", now)
                ),
            ),
            8 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    m.mount_segment(
                        c,
                        &SegmentSpec {
                            name: "tiny".into(),
                            base: 0,
                            size: 100,
                            endpoint: String::new(),
                            key: 7,
                            rdma_key: None,
                        },
                        now
                    )
                ),
            ),
            9 => (
                ErrorCode::OBJECT_NO_REPLICATION_TASK,
                format!("{:?}", m.task_end(c, TaskId(u64::MAX), now)),
            ),
            10 => (
                ErrorCode::INVALID_PARAMS,
                format!(
                    "{:?}",
                    Master::restore(self.config.clone(), b"MOORSNAP garbage", now).map(|_| ())
                ),
            ),
            _ => (
                ErrorCode::INVALID_PARAMS,
                format!("{:?}", m.exist(&long_key, now)),
            ),
        };
        // Calls that name a client count as a sign of life.
        if kind % 12 == 8 {
            self.model.announce(c, now);
        } else if !matches!(kind % 12, 0 | 6 | 7 | 10 | 11) {
            self.model.touch(c, now);
        }
        self.no_events("bad input")?;
        ensure(outcome.1.contains(&format!("{:?}", outcome.0)), || {
            format!(
                "bad input {kind}: expected {}, got {}",
                outcome.0, outcome.1
            )
        })
    }
}
