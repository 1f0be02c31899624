//! Fixtures shared by the core's scenario tests. Every helper that changes the master runs
//! the invariant checker afterwards, so every test checks the invariants at every step.

#![allow(dead_code)]

use mooring_core::{
    Checksum, ClientId, ErrorCode, Master, MasterConfig, Millis, PutGrant, ReplicaList,
    ReplicateConfig, SegmentSpec, WriteId, invariants,
};

pub const A: ClientId = ClientId(0xA);
pub const B: ClientId = ClientId(0xB);
pub const NODE: ClientId = ClientId(0x90DE);
pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// The checksum the fixtures' writes of `key` report (these tests move no bytes; a value is
/// named by its key).
pub fn sum_of(key: &str) -> Checksum {
    Checksum::of(key.as_bytes())
}

/// A master plus a clock.
pub struct Fixture {
    pub m: Master,
    pub now: Millis,
}

impl Fixture {
    /// A master with `segments` segments of `size` bytes each, named seg0.., owned by NODE.
    /// One writer may fill the whole pool here: these tests fill small pools on purpose, and
    /// the share of unfinished puts has tests of its own.
    pub fn new(segments: usize, size: u64) -> Fixture {
        let config = MasterConfig {
            unfinished_put_share: 1.0,
            ..MasterConfig::default()
        };
        Fixture::with_config(config, segments, size)
    }

    pub fn with_config(config: MasterConfig, segments: usize, size: u64) -> Fixture {
        let mut f = Fixture {
            m: Master::new(config).unwrap(),
            now: Millis(1_000),
        };
        for i in 0..segments {
            f.mount(&format!("seg{i}"), size);
        }
        f
    }

    pub fn check(&self) {
        if let Err(v) = invariants::check(&self.m) {
            panic!("{v}");
        }
    }

    pub fn mount(&mut self, name: &str, size: u64) {
        let spec = SegmentSpec {
            name: name.into(),
            base: 0x1000_0000_0000 * (self.m.segments().len() as u64 + 1),
            size,
            endpoint: format!("{name}:7000"),
            key: 7,
            rdma_key: None,
        };
        self.m.mount_segment(NODE, &spec, self.now).unwrap();
        self.check();
    }

    pub fn advance(&mut self, by: Millis) {
        self.now = self.now + by;
    }

    /// Advances and ticks with every client (NODE, A, B) heartbeating: alive, if idle.
    pub fn tick_after(&mut self, by: Millis) {
        self.advance(by);
        for client in [NODE, A, B] {
            self.m.heartbeat(client, self.now);
        }
        self.m.tick(self.now);
        self.check();
    }

    /// Advances and ticks with only NODE heartbeating: A and B have gone silent.
    pub fn tick_silent(&mut self, by: Millis) {
        self.advance(by);
        self.m.heartbeat(NODE, self.now);
        self.m.tick(self.now);
        self.check();
    }

    pub fn start(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> mooring_core::Result<PutGrant> {
        let r = self.m.put_start(client, key, size, cfg, self.now);
        self.check();
        r
    }

    pub fn upsert(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> mooring_core::Result<PutGrant> {
        let r = self.m.upsert_start(client, key, size, cfg, self.now);
        self.check();
        r
    }

    pub fn end(&mut self, client: ClientId, key: &str, write: WriteId) -> mooring_core::Result<()> {
        let r = self.m.put_end(client, key, write, sum_of(key), self.now);
        self.check();
        r
    }

    /// A complete put.
    pub fn put(
        &mut self,
        client: ClientId,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> PutGrant {
        let g = self.start(client, key, size, cfg).unwrap();
        self.end(client, key, g.write_id).unwrap();
        g
    }

    pub fn get(&mut self, key: &str) -> mooring_core::Result<ReplicaList> {
        let r = self.m.get_replica_list(key, self.now);
        self.check();
        r
    }

    pub fn remove(&mut self, key: &str) -> mooring_core::Result<()> {
        let r = self.m.remove(key, self.now);
        self.check();
        r
    }

    pub fn used(&self) -> u64 {
        self.m.stats().used
    }
}

pub fn code<T: std::fmt::Debug>(r: mooring_core::Result<T>) -> ErrorCode {
    r.expect_err("expected an error").code
}

pub fn addrs(list: &[mooring_core::ReplicaDescriptor]) -> Vec<u64> {
    list.iter().map(|r| r.addr).collect()
}
