//! `MooringConnector`: the Mooring client as an L2 store of LMCache's server (MP mode).
//!
//! LMCache loads a third-party "native connector" through `--l2-adapter '{"type":
//! "native_plugin", ...}'` and wraps it in its own adapter, which calls:
//!
//! | call | what it does here |
//! | --- | --- |
//! | `event_fd()` | the eventfd this connector signals when operations complete |
//! | `submit_batch_set(keys, views)` | stores each view's bytes under its key (one batch put) |
//! | `submit_batch_get(keys, views)` | reads each key into its view (one batch read) |
//! | `submit_batch_exists(keys)` | which keys are stored; with `lock_on_lookup`, each one found is held |
//! | `submit_batch_delete(keys)` | removes the keys (a held key is refused) |
//! | `drain_completions()` | `[(future id, ok, error, per-key bools)]` of the operations finished since the last drain |
//! | `close()` | waits for operations in flight, releases holds and leaves the cluster |
//!
//! Beyond that contract, for `MooringL2Adapter`: `unlock(keys)`, `held()` and
//! `list_keys(pattern)` (LMCache's key listing).
//!
//! Each `submit_*` returns a future id at once; the work runs on the shared runtime without
//! the GIL. The views are LMCache's memory objects: their bytes go to the nodes and come
//! back into them without a copy in between (the views stay pinned until their operation's
//! completion is drained). A key loads only if exactly the view's length arrives; a read that
//! fails part way (a node killed mid-load) answers `False` for that key, never a success with
//! wrong bytes.
//!
//! Locks: LMCache's lookup-and-lock protects an object from eviction until it is loaded. A
//! plain lookup (`batch_exist`) gets the master's read lease, which lasts `lease_ttl`. With
//! `lock_on_lookup`, a lookup takes a hold on each key found instead (the object is not
//! evicted, removed or replaced while held, and the master drops the holds of a client that
//! dies); [`MooringConnector::unlock`] releases one hold per key. LMCache's `native_plugin`
//! wrapper never passes its unlocks on, so holds are used through the `plugin` adapter
//! (`mooring.integrations.lmcache.MooringL2Adapter`), which does.

use std::collections::HashMap;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use mooring::Client;
use mooring_core::{Error, ErrorCode, HoldId, ReplicateConfig, Result};
use pyo3::prelude::*;

use crate::client::NativeClient;
use crate::errors::{invalid, log_failure, raise};
use crate::values::{BufferView, Region, disjoint};
use crate::{block_on, runtime, sizes};

/// One finished operation as LMCache's wrapper reads it: (future id, whether every key
/// succeeded, the first failure's message, one bool per key).
type Completion = (u64, bool, String, Option<Vec<bool>>);

/// How long `close` waits for operations in flight before it leaves anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// How many times an unlock's release is sent before it is left to the master (which drops
/// the holds of a client that leaves or dies).
const RELEASE_ATTEMPTS: u32 = 5;

/// A Linux eventfd: written once per finished operation, read (reset) by each drain.
struct EventFd(File);

impl EventFd {
    fn new() -> Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a negative result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!(
                    "cannot create the completion eventfd: {} (raise the process's open-file limit)",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(EventFd(unsafe { File::from_raw_fd(fd) }))
    }

    /// Adds one to the counter, waking whoever polls the descriptor.
    fn signal(&self) {
        if let Err(e) = (&self.0).write_all(&1u64.to_ne_bytes()) {
            tracing::error!("cannot signal the LMCache completion eventfd: {e}");
        }
    }

    /// Resets the counter (nothing to reset is fine: the descriptor is non-blocking).
    fn reset(&self) {
        let mut count = [0u8; 8];
        match (&self.0).read(&mut count) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => tracing::error!("cannot read the LMCache completion eventfd: {e}"),
        }
    }
}

/// What the operations share with the tasks that run them.
struct Shared {
    client: Client,
    config: ReplicateConfig,
    events: EventFd,
    done: Mutex<Vec<Completion>>,
    /// Held keys: one hold id per lookup that found the key and was not yet unlocked.
    holds: Mutex<HashMap<String, Vec<HoldId>>>,
    /// Whether lookups hold what they find.
    lock_on_lookup: bool,
    in_flight: AtomicUsize,
}

impl Shared {
    /// Records a finished operation and wakes LMCache.
    fn finish(&self, completion: Completion) {
        self.done
            .lock()
            .expect("completions lock is never poisoned")
            .push(completion);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.events.signal();
    }

    /// Holds `key` (one more hold if held already); whether it was there to hold.
    async fn hold(&self, key: &str) -> Result<bool> {
        match self.client.acquire_hold(key).await {
            Ok((hold, _)) => {
                self.holds
                    .lock()
                    .expect("holds lock is never poisoned")
                    .entry(key.to_string())
                    .or_default()
                    .push(hold);
                Ok(true)
            }
            Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Releases `hold`, retrying a lost request; a hold the master no longer has is released.
    async fn release(&self, key: &str, hold: HoldId) {
        for attempt in 1..=RELEASE_ATTEMPTS {
            match self.client.release_hold(hold).await {
                Ok(()) => return,
                Err(e) if e.code == ErrorCode::INVALID_PARAMS => {
                    tracing::debug!(key, "hold already gone at unlock: {e}");
                    return;
                }
                Err(e) if attempt == RELEASE_ATTEMPTS => {
                    tracing::warn!(
                        key,
                        "could not release the hold on {key:?} after {RELEASE_ATTEMPTS} tries ({e}); the master drops it when this client leaves or is taken for dead"
                    );
                }
                Err(e) => {
                    tracing::debug!(key, attempt, "release failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
            }
        }
    }

    /// Takes every hold this connector has, for release.
    fn take_all_holds(&self) -> Vec<(String, HoldId)> {
        let mut holds = self.holds.lock().expect("holds lock is never poisoned");
        holds
            .drain()
            .flat_map(|(key, ids)| ids.into_iter().map(move |id| (key.clone(), id)))
            .collect()
    }
}

/// The ports the in-process node's data server may take (with `segment_size` > 0): Mooncake's
/// `MC_STORE_CLIENT_MIN_PORT`..`MC_STORE_CLIENT_MAX_PORT`, as `mooring.store` reads them.
fn data_server_ports() -> (u16, u16) {
    let port = |name: &str, default: u16| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
            .filter(|&p| p > 0)
            .unwrap_or(default)
    };
    let (low, high) = (
        port("MC_STORE_CLIENT_MIN_PORT", 12300),
        port("MC_STORE_CLIENT_MAX_PORT", 14300),
    );
    if low <= high {
        (low, high)
    } else {
        (12300, 14300)
    }
}

/// The completion of an operation whose keys each succeeded or failed.
fn per_key(id: u64, outcomes: &[Result<bool>], call: &str) -> Completion {
    let mut first = None;
    let bools = outcomes
        .iter()
        .map(|outcome| match outcome {
            Ok(found) => *found,
            Err(e) => {
                log_failure(call, e);
                first.get_or_insert_with(|| e.to_string());
                false
            }
        })
        .collect::<Vec<bool>>();
    let ok = first.is_none() && bools.iter().all(|b| *b);
    (id, ok, first.unwrap_or_default(), Some(bools))
}

/// The Mooring client as LMCache's L2 `native_plugin` connector; see the module docs.
#[pyclass(module = "mooring._native", frozen)]
pub struct MooringConnector {
    shared: Arc<Shared>,
    /// The views of operations in flight or not yet drained, by future id.
    pinned: Mutex<HashMap<u64, Vec<BufferView>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

#[pymethods]
impl MooringConnector {
    /// Connects to the master at `master` (`host:port`, a group's `A,B,C` or
    /// `etcd://host:port/cluster`). `segment_size` > 0 also contributes that much memory from
    /// an in-process node on `local_hostname` (LMCache's server host then stores into itself
    /// first). `replica_num` copies are kept of each value; `lock_on_lookup` makes lookups take
    /// holds (see the module docs).
    #[new]
    #[pyo3(signature = (master, local_hostname = "127.0.0.1".to_string(), segment_size = None, token_file = None, tenant = None, protocol = "tcp".to_string(), rdma_devices = String::new(), replica_num = 1, lock_on_lookup = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        master: String,
        local_hostname: String,
        segment_size: Option<&Bound<'_, PyAny>>,
        token_file: Option<String>,
        tenant: Option<String>,
        protocol: String,
        rdma_devices: String,
        replica_num: u32,
        lock_on_lookup: bool,
    ) -> PyResult<MooringConnector> {
        let segment_size = segment_size.map(sizes::from_py).transpose()?.unwrap_or(0);
        if replica_num == 0 {
            return Err(crate::errors::to_py(&invalid(
                "replica_num is 0: keep at least one copy of each value",
            )));
        }
        if protocol != "tcp" && protocol != "rdma" {
            return Err(crate::errors::to_py(&invalid(format!(
                "protocol {protocol:?}: give \"tcp\" or \"rdma\""
            ))));
        }
        let rdma = (protocol == "rdma")
            .then(|| mooring::transports::device_names(Some(rdma_devices.as_str())));
        let shared = raise(block_on(py, async {
            let (client, _) = NativeClient::connect_async(
                master.clone(),
                local_hostname,
                segment_size,
                token_file.clone(),
                data_server_ports(),
                rdma,
                tenant,
                None,
            )
            .await?;
            let events = match EventFd::new() {
                Ok(events) => events,
                Err(e) => {
                    // Leave the cluster rather than linger in it with a client nobody uses.
                    let _ = client.close().await;
                    return Err(e);
                }
            };
            Ok::<_, Error>(Shared {
                client,
                config: ReplicateConfig {
                    replica_num,
                    ..ReplicateConfig::default()
                },
                events,
                done: Mutex::default(),
                holds: Mutex::default(),
                lock_on_lookup,
                in_flight: AtomicUsize::new(0),
            })
        }))?;
        Ok(MooringConnector {
            shared: Arc::new(shared),
            pinned: Mutex::default(),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        })
    }

    /// The eventfd signalled when operations complete (LMCache polls it, then drains).
    fn event_fd(&self) -> i32 {
        self.shared.events.0.as_raw_fd()
    }

    /// Stores each of `views` under its key; returns the future id.
    fn submit_batch_set(&self, keys: Vec<String>, views: Vec<Bound<'_, PyAny>>) -> PyResult<u64> {
        let (pinned, regions) = self.pin(&keys, &views, false)?;
        let id = self.start(pinned)?;
        let shared = self.shared.clone();
        runtime().spawn(async move {
            let items: Vec<(&str, &[u8])> = keys
                .iter()
                .map(String::as_str)
                .zip(regions.iter().map(Region::bytes))
                .collect();
            let results = shared.client.batch_put(&items, &shared.config).await;
            let outcomes: Vec<Result<bool>> = results
                .into_iter()
                .map(|r| match r {
                    // A value stored already (by this server or another) is as good as stored.
                    Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => Ok(true),
                    other => other.map(|()| true),
                })
                .collect();
            shared.finish(per_key(id, &outcomes, "lmcache batch_set"));
        });
        Ok(id)
    }

    /// Reads each key into its view; returns the future id. A key succeeds only if its value
    /// is exactly the view's length and arrived whole.
    fn submit_batch_get(&self, keys: Vec<String>, views: Vec<Bound<'_, PyAny>>) -> PyResult<u64> {
        let (pinned, regions) = self.pin(&keys, &views, true)?;
        raise(disjoint(&regions))?;
        let id = self.start(pinned)?;
        let shared = self.shared.clone();
        runtime().spawn(async move {
            let mut items: Vec<(&str, &mut [u8])> = keys
                .iter()
                .zip(&regions)
                // SAFETY: `disjoint` found no two regions overlapping; the slices are dropped
                // before the completion is recorded, and the views they lie in stay pinned
                // until that completion is drained.
                .map(|(key, region)| (key.as_str(), unsafe { region.bytes_mut() }))
                .collect();
            let lengths: Vec<usize> = items.iter().map(|(_, buf)| buf.len()).collect();
            let results = shared.client.batch_get_into(&mut items).await;
            drop(items);
            let outcomes: Vec<Result<bool>> = results
                .into_iter()
                .zip(lengths)
                .zip(&keys)
                .map(|((r, want), key)| match r {
                    Ok(n) if n == want => Ok(true),
                    Ok(n) => Err(Error::new(
                        ErrorCode::INVALID_PARAMS,
                        format!(
                            "{key:?} is {n} bytes, LMCache's buffer {want}: the key was stored by a server with another chunk size or dtype"
                        ),
                    )),
                    Err(e) if e.code == ErrorCode::BUFFER_OVERFLOW => Err(Error::new(
                        ErrorCode::BUFFER_OVERFLOW,
                        format!(
                            "{key:?} is larger than LMCache's buffer of {want} bytes: the key was stored by a server with another chunk size or dtype"
                        ),
                    )),
                    Err(e) if e.code == ErrorCode::OBJECT_NOT_FOUND => Ok(false),
                    Err(e) => Err(e),
                })
                .collect();
            shared.finish(per_key(id, &outcomes, "lmcache batch_get"));
        });
        Ok(id)
    }

    /// Which of `keys` are stored; returns the future id. With `lock_on_lookup`, each key found
    /// is held until [`MooringConnector::unlock`].
    fn submit_batch_exists(&self, keys: Vec<String>) -> PyResult<u64> {
        let id = self.start(Vec::new())?;
        let shared = self.shared.clone();
        runtime().spawn(async move {
            let outcomes: Vec<Result<bool>> = if shared.lock_on_lookup {
                join_all(keys.iter().map(|key| shared.hold(key))).await
            } else {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                match shared.client.batch_exist(&refs).await {
                    Ok(found) => found,
                    Err(e) => vec![Err(e); keys.len()],
                }
            };
            // A lookup's misses are answers, and a key that could not be looked up is a miss:
            // `ok` stays true so LMCache reads the bools (it reads none of a failed lookup).
            let (_, _, error, bools) = per_key(id, &outcomes, "lmcache batch_exists");
            shared.finish((id, true, error, bools));
        });
        Ok(id)
    }

    /// Removes `keys`; returns the future id. A key being read (under a lease or a hold, as a
    /// locked key is) is not removed: its bool is `False`.
    fn submit_batch_delete(&self, keys: Vec<String>) -> PyResult<u64> {
        let id = self.start(Vec::new())?;
        let shared = self.shared.clone();
        runtime().spawn(async move {
            let client = &shared.client;
            let outcomes = join_all(keys.iter().map(|key| async move {
                match client.remove(key).await {
                    Ok(()) => Ok(true),
                    // Gone already, or being read (a lease, a hold: a lock): not deleted, and
                    // no trouble; Mooring evicts it later if it needs the room.
                    Err(e)
                        if matches!(
                            e.code,
                            ErrorCode::OBJECT_NOT_FOUND
                                | ErrorCode::OBJECT_HAS_LEASE
                                | ErrorCode::OBJECT_REPLICA_BUSY
                        ) =>
                    {
                        tracing::debug!(key, "not deleted: {e}");
                        Ok(false)
                    }
                    Err(e) => Err(e),
                }
            }))
            .await;
            shared.finish(per_key(id, &outcomes, "lmcache batch_delete"));
        });
        Ok(id)
    }

    /// Releases one hold on each of `keys` (keys not held are skipped), in the background.
    fn unlock(&self, keys: Vec<String>) {
        let mut released = Vec::new();
        {
            let mut holds = self
                .shared
                .holds
                .lock()
                .expect("holds lock is never poisoned");
            for key in keys {
                if let Some(ids) = holds.get_mut(&key) {
                    if let Some(hold) = ids.pop() {
                        released.push((key.clone(), hold));
                    }
                    if ids.is_empty() {
                        holds.remove(&key);
                    }
                }
            }
        }
        if released.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        runtime().spawn(async move {
            join_all(
                released
                    .iter()
                    .map(|(key, hold)| shared.release(key, *hold)),
            )
            .await;
        });
    }

    /// The stored keys matching the regular expression `pattern`, sorted, with their sizes.
    /// Grants no lease (a listing keeps nothing from eviction).
    fn list_keys(&self, py: Python<'_>, pattern: &str) -> PyResult<Vec<(String, u64)>> {
        let listed = raise(block_on(py, self.shared.client.query(pattern)))?;
        Ok(listed.into_iter().map(|l| (l.key, l.size)).collect())
    }

    /// How many holds this connector has (locked keys, counted once per lock).
    fn held(&self) -> usize {
        let holds = self
            .shared
            .holds
            .lock()
            .expect("holds lock is never poisoned");
        holds.values().map(Vec::len).sum()
    }

    /// The operations finished since the last drain; resets the eventfd and unpins their views.
    fn drain_completions(&self) -> Vec<Completion> {
        self.shared.events.reset();
        let done = std::mem::take(
            &mut *self
                .shared
                .done
                .lock()
                .expect("completions lock is never poisoned"),
        );
        let mut pinned = self.pinned.lock().expect("pinned lock is never poisoned");
        for (id, ..) in &done {
            pinned.remove(id);
        }
        done
    }

    /// Waits (up to 30 s) for operations in flight, releases every hold and leaves the
    /// cluster. Later submissions are refused.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let shared = self.shared.clone();
        let left = block_on(py, async move {
            let deadline = Instant::now() + CLOSE_WAIT;
            while shared.in_flight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let left = shared.in_flight.load(Ordering::Acquire);
            let holds = shared.take_all_holds();
            join_all(holds.iter().map(|(key, hold)| shared.release(key, *hold))).await;
            shared.client.close().await.map(|()| left)
        });
        let left = raise(left)?;
        if left > 0 {
            // Their views stay pinned (leaked with this connector) rather than freed under
            // transfers that may still write into them.
            tracing::warn!(
                left,
                "closed the LMCache connector with operations still in flight after 30 s"
            );
            std::mem::forget(std::mem::take(
                &mut *self.pinned.lock().expect("pinned lock is never poisoned"),
            ));
        } else {
            self.pinned
                .lock()
                .expect("pinned lock is never poisoned")
                .clear();
        }
        Ok(())
    }
}

impl MooringConnector {
    /// Pins `views` (one per key; writable ones for a get) and the memory they cover.
    fn pin(
        &self,
        keys: &[String],
        views: &[Bound<'_, PyAny>],
        writable: bool,
    ) -> PyResult<(Vec<BufferView>, Vec<Region>)> {
        if keys.len() != views.len() {
            return Err(crate::errors::to_py(&invalid(format!(
                "{} keys and {} buffers: give one buffer per key",
                keys.len(),
                views.len()
            ))));
        }
        let pinned = views
            .iter()
            .map(|v| match writable {
                true => BufferView::writable(v),
                false => BufferView::new(v),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let regions = pinned.iter().map(Region::viewed).collect();
        Ok((pinned, regions))
    }

    /// A fresh future id for an operation about to start, whose views stay pinned under it.
    fn start(&self, pinned: Vec<BufferView>) -> PyResult<u64> {
        if self.closed.load(Ordering::Acquire) {
            return Err(crate::errors::to_py(&Error::new(
                ErrorCode::INVALID_PARAMS,
                "the Mooring connector is closed: LMCache submitted an operation after close()",
            )));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if !pinned.is_empty() {
            self.pinned
                .lock()
                .expect("pinned lock is never poisoned")
                .insert(id, pinned);
        }
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(id)
    }
}
