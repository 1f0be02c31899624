//! The workload: random operations over a small shared key space, each recorded in the
//! history so every value read can be judged.

use std::sync::Arc;
use std::time::Duration;

use mooring::Client;
use mooring_core::rng::Rng;
use mooring_core::{Error, ErrorCode, ReplicateConfig, Result, TaskAction, TaskReport, TaskState};

use crate::value::{HEADER, encode};
use crate::world::World;

/// Longest any single operation may take once it has started, faults included (a batch get
/// whose lease ran out retries key by key; an upsert waits out busy readers). Past this the
/// operation is stuck: a liveness violation.
pub const OPERATION_BOUND: Duration = Duration::from_secs(60);

/// One step in this many also starts a copy or move task and follows it to its end.
const TASK_ONE_IN: usize = 25;

/// How long gets aim at a value damaged in every copy: past the slowest disk sync (2 s), so
/// reads meet its node before and after the master hears the disk copy went.
const AIM_AT_DAMAGE: Duration = Duration::from_secs(3);

/// Operation kinds and their weights.
const MIX: &[(Op, u32)] = &[
    (Op::Put, 14),
    (Op::UpsertSameSize, 9),
    (Op::UpsertNewSize, 7),
    (Op::BatchPut, 4),
    (Op::BatchUpsert, 3),
    (Op::Get, 18),
    (Op::GetInto, 8),
    (Op::GetHeld, 4),
    (Op::BatchGet, 6),
    (Op::BatchGetInto, 3),
    (Op::Exist, 5),
    (Op::BatchExist, 3),
    (Op::GetSize, 3),
    (Op::Remove, 7),
    (Op::RemoveByRegex, 1),
    (Op::Query, 1),
];

#[derive(Clone, Copy, Debug)]
enum Op {
    Put,
    UpsertSameSize,
    UpsertNewSize,
    BatchPut,
    BatchUpsert,
    Get,
    GetInto,
    GetHeld,
    BatchGet,
    BatchGetInto,
    Exist,
    BatchExist,
    GetSize,
    Remove,
    RemoveByRegex,
    Query,
}

/// A key listed in [`World::reading`] while this lives.
struct Reading {
    world: Arc<World>,
    key: String,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut reading = self.world.reading.lock().expect("reading lock");
        if let Some(at) = reading.iter().position(|k| *k == self.key) {
            reading.swap_remove(at);
        }
    }
}

/// One client's stream of operations.
pub struct Workload {
    world: Arc<World>,
    client: Client,
    rng: Rng,
    /// Its own stream for copy and move tasks, so adding them changed no other choice.
    tasks_rng: Rng,
}

/// The outcome name the tally uses.
fn outcome<T>(result: &Result<T>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => e.code.to_string(),
    }
}

impl Workload {
    /// Stream `stream` of client `j`'s workload in its `incarnation`-th process.
    pub fn new(
        world: Arc<World>,
        client: Client,
        j: usize,
        incarnation: usize,
        stream: usize,
    ) -> Workload {
        let seed = world.plan.seed
            ^ ((j as u64 + 1) << 40)
            ^ ((incarnation as u64 + 1) << 52)
            ^ ((stream as u64) << 32);
        Workload {
            world,
            client,
            rng: Rng::seeded(seed),
            tasks_rng: Rng::seeded(seed ^ 0x7a5c_0000_0000_0001),
        }
    }

    fn key(&mut self) -> String {
        let keys = &self.world.keys;
        // A few hot keys see most of the contention.
        let i = if self.rng.below(3) == 0 {
            self.rng.below(keys.len().min(6))
        } else {
            self.rng.below(keys.len())
        };
        keys[i].clone()
    }

    /// A key to remove or overwrite: half the time one a get is reading, if any.
    fn contended_key(&mut self) -> String {
        let reading = self.world.reading.lock().expect("reading lock").clone();
        if !reading.is_empty() && self.rng.below(2) == 0 {
            return reading[self.rng.below(reading.len())].clone();
        }
        self.key()
    }

    /// A key to read, listed as being read until the guard goes (with the read, or with a
    /// client killed mid-read).
    fn key_to_read(&mut self) -> Reading {
        let key = self.damaged_key().unwrap_or_else(|| self.key());
        self.world
            .reading
            .lock()
            .expect("reading lock")
            .push(key.clone());
        Reading {
            world: self.world.clone(),
            key,
        }
    }

    /// Half the time, a key whose every copy was damaged in the last [`AIM_AT_DAMAGE`]:
    /// its readers must be told it is damaged, never that nothing has it, while its node
    /// drops the damaged disk copy and before the master hears of that. (Runs without such
    /// damage draw nothing here.)
    fn damaged_key(&mut self) -> Option<String> {
        let now = self.world.now();
        let recent: Vec<String> = self
            .world
            .damaged_everywhere
            .lock()
            .expect("damaged lock")
            .iter()
            .filter(|(_, at)| now.saturating_sub(*at) < AIM_AT_DAMAGE)
            .map(|(key, _)| key.clone())
            .collect();
        if recent.is_empty() || self.rng.below(2) == 0 {
            return None;
        }
        Some(recent[self.rng.below(recent.len())].clone())
    }

    /// Two to `2 + spread - 1` distinct keys.
    fn some_keys(&mut self, spread: usize) -> Vec<String> {
        let n = 2 + self.rng.below(spread);
        self.distinct_keys(n)
    }

    fn distinct_keys(&mut self, n: usize) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        while keys.len() < n {
            let k = self.key();
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    /// A value size: mostly small KV blocks, sometimes up to 96 KiB; in runs with a block
    /// size, three values in four are one block.
    fn size(&mut self) -> usize {
        if let Some(block) = self.world.plan.block_size
            && self.rng.below(4) != 0
        {
            return block;
        }
        let bits = 6 + self.rng.below(11); // 64 B .. 64 KiB scale
        let size = (1usize << bits) + self.rng.below(1 << bits);
        size.clamp(HEADER, 96 << 10)
    }

    fn config(&mut self) -> ReplicateConfig {
        let replicas = 1 + self.rng.below(3) as u32;
        let mut config = ReplicateConfig::replicas(replicas);
        match self.rng.below(20) {
            0 => config = config.hard_pinned(),
            1..=3 => config = config.soft_pinned(None),
            4 => config = config.soft_unpinned(),
            _ => {}
        }
        if self.rng.below(5) == 0
            && let Some(name) = self.client.segment_name()
        {
            config = config.preferring(name);
        }
        config
    }

    fn pick(&mut self) -> Op {
        let total: u32 = MIX.iter().map(|(_, w)| w).sum();
        let mut roll = self.rng.below(total as usize) as u32;
        for &(op, weight) in MIX {
            if roll < weight {
                return op;
            }
            roll -= weight;
        }
        unreachable!("the roll is below the total weight")
    }

    /// Performs one random operation, recording it; a pause first, as real clients think.
    pub async fn step(&mut self) {
        let think = Duration::from_micros(self.rng.below(4000) as u64);
        tokio::time::sleep(think).await;
        let op = self.pick();
        let started = self.world.now();
        let run = self.run(op);
        if tokio::time::timeout(OPERATION_BOUND, run).await.is_err() {
            self.world.history().violation(format!(
                "{op:?} begun at {started:?} was still running after {OPERATION_BOUND:?}"
            ));
        }
        // Not over RDMA yet: there, a background copy made seed 101 run differently when run
        // a second time in the same process (fresh processes replay it identically), so some
        // state of the process leaks into RDMA runs through the copy's transfers; until that
        // is found, RDMA runs keep the determinism check meaningful without them.
        let tasks_here = self.world.plan.transport != crate::plan::Transport::Rdma;
        if self.tasks_rng.below(TASK_ONE_IN) == 0 && tasks_here {
            // Following a task waits out its end, which may take its timeout.
            let _ = tokio::time::timeout(OPERATION_BOUND, self.copy_or_move()).await;
        }
    }

    /// Starts a copy or move of a random key to a random segment (the client carries it out
    /// in the background while this follows it with QueryTask): a task the master
    /// acknowledged is always known to it, and once ended its report never changes.
    async fn copy_or_move(&mut self) {
        let keys = &self.world.keys;
        let key = keys[self.tasks_rng.below(keys.len())].clone();
        let Ok(segments) = self.client.segments().await else {
            return;
        };
        if segments.len() < 2 {
            return;
        }
        let mut pick = || segments[self.tasks_rng.below(segments.len())].name.clone();
        let (target, source) = (pick(), pick());
        let (name, action, started) = if self.tasks_rng.below(3) == 0 && source != target {
            self.aim_at_target(&key, &target);
            let started = self.client.start_move(&key, &source, &target).await;
            ("move_task", TaskAction::Move, started)
        } else {
            let started = self.client.start_copy(&key, &[&target]).await;
            ("copy_task", TaskAction::Copy, started)
        };
        let task = match started {
            Ok(task) => task,
            Err(e) => {
                self.world.task_orders().remove(&madsim::plugin::node());
                return self.tally(name, &Err::<(), _>(e));
            }
        };
        let mut ended: Option<TaskReport> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let report = match self.client.query_task(task).await {
                Ok(report) => report,
                Err(e) if e.code == ErrorCode::OBJECT_NO_REPLICATION_TASK => {
                    return self.world.history().violation(format!(
                        "the master forgot {task} ({name} of {key:?}) it acknowledged: {e}"
                    ));
                }
                // Faults: ask again.
                Err(_) => continue,
            };
            if report.key != key || report.action != action {
                return self.world.history().violation(format!(
                    "{task} ({name} of {key:?}) was reported as another task: {report:?}"
                ));
            }
            match (&ended, report.state) {
                (None, TaskState::Running) => {}
                (None, _) => ended = Some(report),
                (Some(first), _)
                    if *first
                        != TaskReport {
                            now: first.now,
                            ..report.clone()
                        } =>
                {
                    return self.world.history().violation(format!(
                        "{task} ({name} of {key:?}) changed after it ended: first {first:?}, \
                         then {report:?}"
                    ));
                }
                (Some(first), _) => {
                    let outcome = match first.state {
                        TaskState::Succeeded => "succeeded",
                        _ => "failed",
                    };
                    self.world.history().tally.count(name, outcome);
                    self.world.task_orders().remove(&madsim::plugin::node());
                    return;
                }
            }
        }
    }

    /// In half the moves of a run with faults (chosen by the key and target, so the task
    /// stream's draws stay as they were), asks the supervisor to take the target away just
    /// before the move ends: the move must then fail and keep its source.
    fn aim_at_target(&self, key: &str, target: &str) {
        let chosen =
            mooring_core::peer::ring::stable_hash(format!("{key}>{target}").as_bytes()) & 1 == 0;
        let healed = self.world.healed.load(std::sync::atomic::Ordering::Relaxed);
        if self.world.plan.faults.is_empty() || healed || !chosen {
            return;
        }
        let Some(node) = target.strip_prefix("node").and_then(|i| i.parse().ok()) else {
            return;
        };
        self.world.task_orders().insert(
            madsim::plugin::node(),
            crate::world::TaskOrder {
                node,
                triggered: false,
            },
        );
    }

    fn tally<T>(&self, op: &'static str, result: &Result<T>) {
        if let Err(e) = result
            && e.code == ErrorCode::INTERNAL_ERROR
        {
            self.world
                .history()
                .violation(format!("{op} failed without a clear error: {e}"));
        }
        self.world.history().tally.count(op, &outcome(result));
    }

    /// Records a read of `key` that failed with `e` as finding nothing or as finding every
    /// replica damaged, when that is what `e` says (other errors are the faults' doing).
    fn record_failed_read(&self, what: &'static str, key: &str, invoked: Duration, e: &Error) {
        let now = self.world.now();
        if e.code == ErrorCode::OBJECT_NOT_FOUND {
            self.world.history().read_absent(what, key, invoked, now);
        } else if e.code == ErrorCode::INVALID_REPLICA {
            self.world.history().read_damaged(what, key, invoked, now);
        }
    }

    async fn run(&mut self, op: Op) {
        match op {
            Op::Put => self.write(false, None).await,
            Op::UpsertSameSize => {
                let key = self.contended_key();
                let size = self.world.history().latest_size(&key);
                self.write_key(key, true, size).await
            }
            Op::UpsertNewSize => self.write(true, None).await,
            Op::BatchPut => self.batch_write(false).await,
            Op::BatchUpsert => self.batch_write(true).await,
            Op::Get => self.get_whole(false).await,
            Op::GetHeld => self.get_whole(true).await,
            Op::GetInto => {
                let reading = self.key_to_read();
                let key = reading.key.clone();
                let mut buf = vec![0u8; self.size()];
                let invoked = self.world.now();
                let result = self.client.get_into(&key, &mut buf).await;
                let now = self.world.now();
                drop(reading);
                match &result {
                    Ok(n) => {
                        self.world
                            .history()
                            .read_value("get_into", &key, invoked, now, &buf[..*n])
                    }
                    Err(e) => self.record_failed_read("get_into", &key, invoked, e),
                }
                self.tally("get_into", &result);
            }
            Op::BatchGet => {
                let keys = self.some_keys(5);
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let invoked = self.world.now();
                let results = self.client.batch_get(&refs).await;
                let now = self.world.now();
                for (key, result) in keys.iter().zip(&results) {
                    match result {
                        Ok(bytes) => {
                            self.world
                                .history()
                                .read_value("batch_get", key, invoked, now, bytes)
                        }
                        Err(e) => self.record_failed_read("batch_get", key, invoked, e),
                    }
                    self.tally("batch_get", result);
                }
            }
            Op::BatchGetInto => {
                let keys = self.some_keys(4);
                let mut buffers: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; 96 << 10]).collect();
                let mut items: Vec<(&str, &mut [u8])> = keys
                    .iter()
                    .map(String::as_str)
                    .zip(buffers.iter_mut().map(|b| &mut b[..]))
                    .collect();
                let invoked = self.world.now();
                let results = self.client.batch_get_into(&mut items).await;
                let now = self.world.now();
                drop(items);
                for ((key, buf), result) in keys.iter().zip(&buffers).zip(&results) {
                    match result {
                        Ok(n) => self.world.history().read_value(
                            "batch_get_into",
                            key,
                            invoked,
                            now,
                            &buf[..*n],
                        ),
                        Err(e) => self.record_failed_read("batch_get_into", key, invoked, e),
                    }
                    self.tally("batch_get_into", result);
                }
            }
            Op::Exist => {
                let key = self.key();
                // With disks, half the checks promote a disk-only value (docs/prefetch.md).
                let invoked = self.world.now();
                let (what, result) = if self.world.plan.disk.is_some() && self.rng.below(2) == 0 {
                    ("exist_prefetch", self.client.exist_prefetch(&key).await)
                } else {
                    ("exist", self.client.exist(&key).await)
                };
                if let Ok(false) = result {
                    let now = self.world.now();
                    self.world.history().read_absent(what, &key, invoked, now);
                }
                self.tally(what, &result);
            }
            Op::BatchExist => {
                let keys = self.some_keys(8);
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let invoked = self.world.now();
                let result = self.client.batch_exist(&refs).await;
                let now = self.world.now();
                if let Ok(each) = &result {
                    for (key, exists) in keys.iter().zip(each) {
                        if let Ok(false) = exists {
                            self.world
                                .history()
                                .read_absent("batch_exist", key, invoked, now);
                        }
                    }
                }
                self.tally("batch_exist", &result);
            }
            Op::GetSize => {
                let key = self.key();
                let invoked = self.world.now();
                let result = self.client.get_size(&key).await;
                if let Err(e) = &result {
                    self.record_failed_read("get_size", &key, invoked, e);
                }
                self.tally("get_size", &result);
            }
            Op::Remove => {
                let key = self.contended_key();
                let invoked = self.world.now();
                let attempt = self
                    .world
                    .history()
                    .remove_invoked(&format!("^{}$", regex::escape(&key)), invoked);
                let result = self.client.remove(&key).await;
                let now = self.world.now();
                self.world.history().remove_ended(attempt, now);
                if result.as_ref().is_err_and(|e| {
                    matches!(
                        e.code,
                        ErrorCode::OBJECT_HAS_LEASE
                            | ErrorCode::OBJECT_REPLICA_BUSY
                            | ErrorCode::REPLICA_IS_NOT_READY
                            | ErrorCode::OBJECT_HAS_REPLICATION_TASK
                            | ErrorCode::OBJECT_NOT_FOUND
                    )
                }) {
                    self.world.history().remove_refused(attempt);
                }
                if result.is_ok() {
                    self.world.history().remove_acked(&key, invoked, now);
                }
                self.tally("remove", &result);
            }
            Op::RemoveByRegex => {
                let digit = self.rng.below(5);
                let pattern = format!("^k00{digit}$");
                let invoked = self.world.now();
                let attempt = self.world.history().remove_invoked(&pattern, invoked);
                let result = self.client.remove_by_regex(&pattern).await;
                let now = self.world.now();
                self.world.history().remove_ended(attempt, now);
                self.tally("remove_by_regex", &result);
            }
            Op::Query => {
                let result = self.client.query_by_regex("^k01").await;
                self.tally("query_by_regex", &result);
            }
        }
    }

    /// Reads one key's whole value, by a get or (if `held`) a held get, and judges it.
    async fn get_whole(&mut self, held: bool) {
        let what = if held { "get_held" } else { "get" };
        let reading = self.key_to_read();
        let key = reading.key.clone();
        let invoked = self.world.now();
        let result = if held {
            self.client.get_held(&key).await
        } else {
            self.client.get(&key).await
        };
        let now = self.world.now();
        drop(reading);
        match &result {
            Ok(bytes) => self
                .world
                .history()
                .read_value(what, &key, invoked, now, bytes),
            Err(e) => self.record_failed_read(what, &key, invoked, e),
        }
        self.tally(what, &result);
    }

    async fn write(&mut self, upsert: bool, size: Option<usize>) {
        let key = self.key();
        self.write_key(key, upsert, size).await
    }

    async fn write_key(&mut self, key: String, upsert: bool, size: Option<usize>) {
        let size = size.unwrap_or_else(|| self.size());
        let config = self.config();
        let invoked = self.world.now();
        let version =
            self.world
                .history()
                .write_invoked(&key, size, invoked, upsert, config.with_hard_pin);
        let value = encode(&key, version, size);
        let result = if upsert {
            self.client.upsert(&key, &value, &config).await
        } else {
            self.client.put(&key, &value, &config).await
        };
        let now = self.world.now();
        self.world.history().write_completed(
            version,
            now,
            result.as_ref().map(|_| ()).map_err(|e| e.code),
        );
        self.tally(if upsert { "upsert" } else { "put" }, &result);
    }

    async fn batch_write(&mut self, upsert: bool) {
        let keys = self.some_keys(5);
        let config = self.config();
        let invoked = self.world.now();
        let values: Vec<(String, Vec<u8>, u64)> = keys
            .into_iter()
            .map(|key| {
                let size = self.size();
                let version = self.world.history().write_invoked(
                    &key,
                    size,
                    invoked,
                    upsert,
                    config.with_hard_pin,
                );
                let value = encode(&key, version, size);
                (key, value, version)
            })
            .collect();
        let items: Vec<(&str, &[u8])> = values
            .iter()
            .map(|(k, v, _)| (k.as_str(), v.as_slice()))
            .collect();
        let results = if upsert {
            self.client.batch_upsert(&items, &config).await
        } else {
            self.client.batch_put(&items, &config).await
        };
        let now = self.world.now();
        for ((_, _, version), result) in values.iter().zip(&results) {
            self.world.history().write_completed(
                *version,
                now,
                result.as_ref().map(|_| ()).map_err(|e: &Error| e.code),
            );
            self.tally(if upsert { "batch_upsert" } else { "batch_put" }, result);
        }
    }
}
