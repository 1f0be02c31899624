//! A master taking over a group, seen at the moment it does: the state it recovered (before it
//! serves anyone), judged against every change the clients saw acknowledged before then.

use std::collections::BTreeMap;
use std::time::Duration;

use mooring_core::{Checksum, Master};

use crate::history::{Expected, History};
use crate::value::encode;

/// A key's object as a master holds it: its size and checksum if it is readable.
type Held = Option<(u64, Checksum)>;

/// A master's state at the moment it took over.
#[derive(Clone, Debug)]
pub struct Takeover {
    /// The group master that took over.
    pub master: usize,
    /// When (simulated time since the run started).
    pub at: Duration,
    /// The master that led before it.
    pub after: usize,
    /// Each key the workload uses, as the new leader holds it.
    pub state: BTreeMap<String, Held>,
}

impl Takeover {
    /// Master `master`'s state `m` as it takes over from `after` at `at`.
    pub fn of(master: usize, after: usize, at: Duration, keys: &[String], m: &Master) -> Takeover {
        let state = keys
            .iter()
            .map(|key| {
                let held = m
                    .audit_memory_replicas(key)
                    .and_then(|(_, checksum)| Some((m.get_size(key).ok()?, checksum)));
                (key.clone(), held)
            })
            .collect();
        Takeover {
            master,
            at,
            after,
            state,
        }
    }

    /// Judges the state against `history`: how many keys the history had something to say
    /// about, and every acknowledged change the new leader lacks.
    pub fn judge(&self, history: &History) -> (usize, Vec<String>) {
        let mut judged = 0;
        let mut found = Vec::new();
        for (key, held) in &self.state {
            let Some(expected) = history.expected_at(key, self.at) else {
                continue;
            };
            judged += 1;
            let lacks = match &expected {
                Expected::Value { version, size, .. } => {
                    let want = Checksum::of(&encode(key, *version, *size));
                    *held != Some((*size as u64, want))
                }
                Expected::Absent { .. } => held.is_some(),
            };
            if lacks {
                found.push(format!(
                    "master {} took over from master {} at {:?} without an acknowledged change \
                     of {key:?}: {} — it holds {}",
                    self.master,
                    self.after,
                    self.at,
                    match expected {
                        Expected::Value {
                            version,
                            size,
                            acked,
                        } => format!("version {version} ({size} bytes) acknowledged at {acked:?}"),
                        Expected::Absent { acked } => format!("a remove acknowledged at {acked:?}"),
                    },
                    describe(history, key, held)
                ));
            }
        }
        (judged, found)
    }
}

/// Which write a held object is, as far as its size and checksum tell.
fn describe(history: &History, key: &str, held: &Held) -> String {
    let Some((size, checksum)) = held else {
        return "nothing readable".into();
    };
    history
        .writes_of(key)
        .into_iter()
        .find(|&(v, s)| s as u64 == *size && Checksum::of(&encode(key, v, s)) == *checksum)
        .map_or_else(
            || format!("{size} bytes of no write of the key"),
            |(v, _)| format!("version {v}"),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_missing_an_acknowledged_put_or_holding_a_removed_key_is_caught() {
        let mut h = History::default();
        let v = h.write_invoked("a", 64, Duration::from_millis(1), false, false);
        h.write_completed(v, Duration::from_millis(2), Ok(()));
        h.remove_acked("b", Duration::from_millis(3), Duration::from_millis(4));
        let put = Some((64, Checksum::of(&encode("a", v, 64))));
        let mut takeover = Takeover {
            master: 1,
            after: 0,
            at: Duration::from_millis(10),
            state: BTreeMap::from([("a".to_string(), put), ("b".to_string(), None)]),
        };
        assert_eq!(takeover.judge(&h), (2, Vec::new()));
        takeover.state.insert("a".into(), None);
        takeover.state.insert("b".into(), put);
        let (judged, found) = takeover.judge(&h);
        assert_eq!(judged, 2);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("version 1 (64 bytes)"), "{found:?}");
        assert!(
            found[1].contains("a remove acknowledged at 4ms"),
            "{found:?}"
        );
    }
}
