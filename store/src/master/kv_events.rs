//! The KV-event feed: the master's key changes (see `mooring_core::key_events`), numbered,
//! kept, and served as pages of JSON at `/kv_events` on the metrics address, for routers that
//! send each request to the engine whose prefix is already stored.
//!
//! A subscriber polls: it asks for the events after the last number it saw and gets a page
//! with the number to ask after next. Pages carry the feed's `epoch` (a new one each time a
//! master starts or takes over) and `missed` (events it asked for were dropped): on either, the
//! subscriber lists the keys again and follows from the page's `next`.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use mooring_core::Millis;
use mooring_core::key_events::{KeyChanges, KeyEventKind, KeyEventLog};
use mooring_core::tenant::{DEFAULT_TENANT, local_key, tenant_of};
use serde_json::json;

use crate::ops::http::{Request, Response};

/// Events a page looks at unless the subscriber asks for fewer.
pub const DEFAULT_PAGE: usize = 1_000;
/// The most events a page looks at.
pub const MAX_PAGE: usize = 10_000;

/// The latest key changes, for subscribers.
pub struct KvEventFeed {
    log: Mutex<KeyEventLog>,
    epoch: u64,
}

impl KvEventFeed {
    /// A feed keeping the latest `kept` events, under a new epoch.
    pub fn new(kept: usize) -> KvEventFeed {
        KvEventFeed {
            log: Mutex::new(KeyEventLog::new(kept)),
            epoch: wall_clock().0,
        }
    }

    /// Numbers and keeps `changes`, stamped with the wall clock.
    pub fn record(&self, changes: KeyChanges) {
        if changes.changes.is_empty() && changes.dropped == 0 {
            return;
        }
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(changes, wall_clock());
    }

    /// The answer to `GET /kv_events?after=N&tenant=T&prefix=P&limit=M`. Without `after`, the
    /// page is empty and its `next` is the latest number: where a subscriber that has just
    /// listed the keys starts following.
    pub fn page(&self, request: &Request<'_>) -> Response {
        let after = match request.param("after").map(|a| a.parse::<u64>()) {
            None => None,
            Some(Ok(after)) => Some(after),
            Some(Err(_)) => {
                return Response::error(400, "after= takes the number of the last event seen");
            }
        };
        let limit = match request.param("limit").map(|l| l.parse::<usize>()) {
            None => DEFAULT_PAGE,
            Some(Ok(limit)) if (1..=MAX_PAGE).contains(&limit) => limit,
            Some(_) => {
                return Response::error(400, &format!("limit= takes 1 to {MAX_PAGE} events"));
            }
        };
        let tenant = request
            .param("tenant")
            .unwrap_or_else(|| DEFAULT_TENANT.to_string());
        let prefix = request.param("prefix").unwrap_or_default();
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let Some(after) = after else {
            let body = json!({
                "epoch": self.epoch,
                "next": log.latest(),
                "missed": false,
                "events": [],
            });
            return Response::ok("application/json", body.to_string());
        };
        let page = log.read(after, limit, |key| {
            tenant_of(key) == tenant && local_key(key).starts_with(&*prefix)
        });
        drop(log);
        let events: Vec<_> = page
            .events
            .iter()
            .map(|event| {
                let change = &event.change;
                let kind = match change.kind {
                    KeyEventKind::Stored => "BlockStored",
                    KeyEventKind::Removed => "BlockRemoved",
                };
                json!({
                    "seq": event.seq,
                    "ts": event.at.0 as f64 / 1000.0,
                    "type": kind,
                    "tenant": tenant,
                    "block_hashes": [local_key(&change.key)],
                    "size": change.size,
                    "write": change.write.0,
                    "medium": "mooring",
                })
            })
            .collect();
        let body = json!({
            "epoch": self.epoch,
            "next": page.next,
            "missed": page.missed,
            "events": events,
        });
        Response::ok("application/json", body.to_string())
    }
}

/// Milliseconds since the Unix epoch (0 on a clock set before it).
fn wall_clock() -> Millis {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooring_core::WriteId;
    use mooring_core::key_events::KeyChange;

    fn stored(key: &str) -> KeyChange {
        KeyChange {
            kind: KeyEventKind::Stored,
            key: key.into(),
            write: WriteId(1),
            size: 3,
        }
    }

    fn page(feed: &KvEventFeed, query: &str) -> (u16, serde_json::Value) {
        let response = feed.page(&Request {
            path: "/kv_events",
            query,
        });
        let body = String::from_utf8(response.body).unwrap();
        let value = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
        (response.status, value)
    }

    #[test]
    fn pages_filter_by_tenant_and_prefix_and_name_keys_as_their_tenant_gave_them() {
        let feed = KvEventFeed::new(100);
        feed.record(KeyChanges {
            changes: vec![
                stored("kv/1"),
                stored("team-a\u{1f}kv/2"),
                stored("other"),
                stored("kv/3"),
            ]
            .into(),
            dropped: 0,
        });
        let (status, all) = page(&feed, "after=0&prefix=kv%2F");
        assert_eq!(status, 200);
        let keys: Vec<_> = all["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["block_hashes"][0].as_str().unwrap().to_string())
            .collect();
        assert_eq!(keys, ["kv/1", "kv/3"]);
        assert_eq!(all["next"], 4);
        let (_, team) = page(&feed, "after=0&tenant=team-a");
        assert_eq!(team["events"][0]["block_hashes"][0], "kv/2");
        assert_eq!(team["events"][0]["tenant"], "team-a");
        assert_eq!(team["events"].as_array().unwrap().len(), 1);
        // No `after`: where to start following, nothing else.
        let (_, now) = page(&feed, "");
        assert_eq!(
            (now["next"].clone(), now["events"].clone()),
            (4.into(), serde_json::json!([]))
        );
        assert_eq!(now["epoch"], all["epoch"]);
    }

    #[test]
    fn bad_parameters_say_what_they_take() {
        let feed = KvEventFeed::new(10);
        let (status, why) = page(&feed, "after=-1");
        assert_eq!(status, 400);
        assert!(why.as_str().unwrap().contains("after="));
        for limit in ["0", "10001", "x"] {
            let (status, why) = page(&feed, &format!("after=0&limit={limit}"));
            assert_eq!(status, 400, "limit={limit}");
            assert!(why.as_str().unwrap().contains("limit="));
        }
    }
}
