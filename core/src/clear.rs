//! Mooncake's per-client maintenance calls: which hosts a client's segments are on, and
//! clearing a client's own objects (whole, or their replicas on one segment).

use std::collections::BTreeSet;

use crate::error::Result;
use crate::ids::ClientId;
use crate::master::Master;
use crate::time::Millis;

impl Master {
    /// The hosts (the endpoint without its port) of the segments each of `clients` has
    /// mounted, without repeats; a client with no segment mounted is left out.
    pub fn client_hosts(&self, clients: &[ClientId]) -> Vec<(ClientId, Vec<String>)> {
        clients
            .iter()
            .filter_map(|&client| {
                let hosts: BTreeSet<String> = self
                    .segments
                    .iter()
                    .filter(|(_, s)| s.owner == client)
                    .map(|(_, s)| host_of(&s.endpoint).to_string())
                    .collect();
                (!hosts.is_empty()).then(|| (client, hosts.into_iter().collect()))
            })
            .collect()
    }

    /// Clears `client`'s objects among `keys`: each whole, or with `segment`, only its
    /// replica there (an object whose only replica that was goes whole). An object is
    /// cleared only if `client` wrote it and it could be removed now (no lease, hold, task or
    /// write in progress, and with `segment`, a complete replica there); others are skipped.
    /// Returns the keys cleared. Blocks are reused once readers that may hold them are done.
    pub fn batch_replica_clear(
        &mut self,
        keys: &[String],
        client: ClientId,
        segment: Option<&str>,
        now: Millis,
    ) -> Result<Vec<String>> {
        let now = self.advance(now);
        let on = match segment {
            Some(name) => Some(self.segments.slot_by_name(name).ok_or_else(|| {
                crate::error::Error::new(
                    crate::error::ErrorCode::SEGMENT_NOT_FOUND,
                    format!("no segment named {name:?} is mounted"),
                )
            })?),
            None => None,
        };
        let mut cleared = Vec::new();
        for key in keys {
            let Some(slot) = self.objects.find(key) else {
                continue;
            };
            if !self.objects.written_by(slot, client) || self.removable(slot, now).is_err() {
                continue;
            }
            let object = self.objects.at(slot);
            let Some(on) = on else {
                self.remove_now(slot);
                cleared.push(key.clone());
                continue;
            };
            let here = object
                .replicas
                .iter()
                .filter(|r| r.segment == on && r.is_complete())
                .count();
            if here == 0 {
                continue;
            }
            if here == object.replicas.len() && !object.has_disk_replica() {
                self.remove_now(slot);
            } else {
                let done = object.readers_done_at(self.config.lease_grace);
                let object = self.objects.at_mut(slot);
                let dropped: Vec<_> = object
                    .replicas
                    .iter()
                    .filter(|r| r.segment == on)
                    .copied()
                    .collect();
                object.replicas.retain(|r| r.segment != on);
                let gone = !object.is_readable();
                let size = object.size();
                self.release_read_blocks(&dropped, size, done);
                if gone {
                    self.value_removed(slot);
                }
            }
            cleared.push(key.clone());
        }
        Ok(cleared)
    }
}

/// The host part of an endpoint (`host:port`, `[v6]:port`, or a bare host).
fn host_of(endpoint: &str) -> &str {
    match endpoint.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => {
            host.trim_start_matches('[').trim_end_matches(']')
        }
        _ => endpoint,
    }
}
