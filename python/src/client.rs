//! `NativeClient`: one Mooring client, shared by every Python thread of a store.
//!
//! Each method releases the GIL for the whole network call. Single-key calls raise
//! `MooringError(code, message)`; batch calls answer one int per key (0 or a length on
//! success, a negative Mooncake code on failure), so one bad key never hides the others.

use std::path::Path;
use std::sync::Arc;

use mooring::transports::TransportChoice;
use mooring::{Client, ClientConfig};
use mooring_core::{
    Error, ErrorCode, Medium, Millis, ReplicaStatus, ReplicateConfig, Result, SoftPinAction,
    TaskAction, TaskId, TaskState,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::block_on;
use crate::errors::{invalid, log_failure, raise};
use crate::handle::BufferHandle;
use crate::registered::Registered;
use crate::staging::Staging;
use crate::values::{BufferView, Region, disjoint};

/// A replicate config as the Python layer passes it: (replica_num, soft-pin action (0
/// preserve, 1 enable, 2 disable), soft-pin TTL in ms, hard pin, preferred segments).
type ConfigArgs = (u32, u8, Option<u64>, bool, Vec<String>);

fn replicate_config(args: ConfigArgs) -> Result<ReplicateConfig> {
    let (replica_num, action, ttl, with_hard_pin, preferred_segments) = args;
    let soft_pin = match action {
        0 => SoftPinAction::Preserve,
        1 => SoftPinAction::Enable,
        2 => SoftPinAction::Disable,
        other => return Err(invalid(format!("unknown soft-pin action {other}"))),
    };
    Ok(ReplicateConfig {
        replica_num,
        soft_pin,
        soft_pin_ttl: ttl.map(Millis),
        with_hard_pin,
        preferred_segments,
    })
}

/// The code a batch reports for `result`: `ok` on success.
fn code_of<T>(result: &Result<T>, ok: impl FnOnce(&T) -> i64, call: &str) -> i64 {
    match result {
        Ok(value) => ok(value),
        Err(e) => {
            log_failure(call, e);
            i64::from(e.code.code())
        }
    }
}

/// A task report as the Python layer takes it; see `NativeClient::query_task`.
type TaskTuple = (String, &'static str, &'static str, u128, u64, u64, String);

/// Where a port search for the in-process node's data server starts and ends.
type PortRange = (u16, u16);

/// A connected client; see the module docs.
#[pyclass(module = "mooring._native", frozen)]
pub struct NativeClient {
    client: Client,
    hostname: String,
    staging: Staging,
    registered: Arc<Registered>,
}

impl NativeClient {
    /// Connects, contributing `segment_size` bytes from a data server on `host:port`, the
    /// port being the one in `hostname` or the first free one of `ports`.
    async fn connect_async(
        master: String,
        hostname: String,
        segment_size: u64,
        token_file: Option<String>,
        ports: PortRange,
        rdma: Option<Vec<String>>,
    ) -> Result<(Client, String)> {
        let token = mooring::token::resolve(token_file.as_deref().map(Path::new))?;
        // Mooncake's `protocol="rdma"`: data over RDMA (failing here without a device), and a
        // contributed segment served over RDMA too.
        let base = |config: ClientConfig| {
            let mut config = ClientConfig {
                token: token.clone(),
                ..config
            };
            if let Some(devices) = &rdma {
                config.transport = TransportChoice::Rdma;
                config.rdma_devices = devices.clone();
                if let Some(segment) = config.segment.as_mut() {
                    segment.rdma_devices = Some(devices.clone());
                }
            }
            config
        };
        if segment_size == 0 {
            let client = Client::connect(base(ClientConfig::new(master))).await?;
            return Ok((client, hostname));
        }
        let (host, explicit) = split_port(&hostname)?;
        let candidates: Vec<u16> = match explicit {
            Some(port) => vec![port],
            None => free_ports(host, ports),
        };
        let mut last = None;
        for port in candidates.into_iter().take(20) {
            let name = format!("{host}:{port}");
            let mut config =
                base(ClientConfig::new(master.clone()).contributing(segment_size, &name));
            if let Some(segment) = config.segment.as_mut() {
                segment.advertise = Some(name.clone());
                segment.node.name = Some(name.clone());
                // Engines on one host (prefill beside decode) map each other's segments.
                segment.node.shared = true;
            }
            match Client::connect(config).await {
                Ok(client) => return Ok((client, name)),
                // Another process took the port between the probe and the bind: next one.
                Err(e) if e.to_string().contains("cannot listen on") && explicit.is_none() => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            invalid(format!(
                "no free port for the data server on {host} in {}-{}: free one, or give local_hostname as host:port",
                ports.0, ports.1
            ))
        }))
    }

    fn region(&self, ptr: usize, size: usize) -> Result<Region> {
        Region::checked(&self.registered, ptr, size)
    }

    /// The regions of a batch's per-key part lists, or the reason a key's lists are wrong.
    fn part_regions(&self, ptrs: &[usize], sizes: &[usize]) -> Result<Vec<Region>> {
        if ptrs.len() != sizes.len() || ptrs.is_empty() {
            return Err(invalid(format!(
                "{} buffer addresses and {} sizes: give one size per address, at least one",
                ptrs.len(),
                sizes.len()
            )));
        }
        ptrs.iter()
            .zip(sizes)
            .map(|(&p, &s)| self.region(p, s))
            .collect()
    }
}

/// Splits `host[:port]`.
fn split_port(hostname: &str) -> Result<(&str, Option<u16>)> {
    if hostname.is_empty() {
        return Err(invalid(
            "local_hostname is empty: give this machine's address or name",
        ));
    }
    // An IPv6 address without brackets has colons but no port.
    match hostname.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            let port = port.parse().map_err(|_| {
                invalid(format!(
                    "{hostname:?}: the part after ':' is not a port number"
                ))
            })?;
            Ok((host, Some(port)))
        }
        _ => Ok((hostname, None)),
    }
}

/// Ports of `range` free on `host` right now, starting at a random one (so processes that
/// start together spread out).
fn free_ports(host: &str, range: PortRange) -> Vec<u16> {
    let (low, high) = (range.0.min(range.1), range.0.max(range.1));
    let span = u32::from(high - low) + 1;
    let start = (mooring::random_client_id().0 % u128::from(span)) as u32;
    (0..span)
        .map(|i| low + ((start + i) % span) as u16)
        .filter(|port| std::net::TcpListener::bind((host, *port)).is_ok())
        .take(20)
        .collect()
}

#[pymethods]
impl NativeClient {
    /// Connects to the master at `master` (see the module docs of `mooring.store`).
    #[staticmethod]
    #[pyo3(signature = (master, hostname, segment_size, local_buffer_size, token_file, ports, protocol = "tcp", rdma_devices = ""))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        master: String,
        hostname: String,
        segment_size: u64,
        local_buffer_size: u64,
        token_file: Option<String>,
        ports: PortRange,
        protocol: &str,
        rdma_devices: &str,
    ) -> PyResult<NativeClient> {
        let rdma =
            (protocol == "rdma").then(|| mooring::transports::device_names(Some(rdma_devices)));
        let (client, hostname) = raise(block_on(
            py,
            NativeClient::connect_async(master, hostname, segment_size, token_file, ports, rdma),
        ))?;
        Ok(NativeClient {
            client,
            hostname,
            staging: Staging::new(local_buffer_size),
            registered: Arc::new(Registered::default()),
        })
    }

    /// `host:port` of the in-process node, or the local hostname given.
    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    /// The name of the segment this client contributes, if any.
    fn segment_name(&self) -> Option<String> {
        self.client.segment_name().map(str::to_string)
    }

    /// Leaves the cluster (unmounting the in-process segment, if any).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.registered.clear();
        raise(block_on(py, self.client.close()))
    }

    /// Raises unless the master answers.
    fn health_check(&self, py: Python<'_>) -> PyResult<()> {
        raise(block_on(py, self.client.health_check()))
    }

    /// Starts copying `key` to the segments `targets` in the background; returns the task id.
    fn start_copy(&self, py: Python<'_>, key: &str, targets: Vec<String>) -> PyResult<u64> {
        let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
        let task = raise(block_on(py, self.client.start_copy(key, &targets)))?;
        Ok(task.0)
    }

    /// Starts moving `key`'s replica from segment `source` to `target` in the background;
    /// returns the task id.
    fn start_move(&self, py: Python<'_>, key: &str, source: &str, target: &str) -> PyResult<u64> {
        let task = raise(block_on(py, self.client.start_move(key, source, target)))?;
        Ok(task.0)
    }

    /// Where task `task` stands: (key, action name, state name, client id, age of its start in
    /// ms, age of its last change in ms, failure message).
    fn query_task(&self, py: Python<'_>, task: u64) -> PyResult<TaskTuple> {
        let report = raise(block_on(py, self.client.query_task(TaskId(task))))?;
        let age = |at: Millis| report.now.0.saturating_sub(at.0);
        Ok((
            report.key.clone(),
            match report.action {
                TaskAction::Copy | TaskAction::Repair => "REPLICA_COPY",
                TaskAction::Move => "REPLICA_MOVE",
            },
            match report.state {
                TaskState::Running => "PROCESSING",
                TaskState::Succeeded => "SUCCESS",
                TaskState::Failed => "FAILED",
            },
            report.client.0,
            age(report.started),
            age(report.updated),
            report.message.clone(),
        ))
    }

    /// Stores a bytes-like `value` (copying call: staged in the local buffer).
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: ConfigArgs,
        upsert: bool,
    ) -> PyResult<()> {
        let view = BufferView::new(value)?;
        let config = raise(replicate_config(config))?;
        let bytes = view.bytes();
        raise(block_on(py, async {
            let _staged = self.staging.reserve(bytes.len() as u64).await?;
            write(&self.client, key, bytes, &config, upsert).await
        }))
    }

    /// Stores the concatenation of bytes-like `parts` as one value (copying call).
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        config: ConfigArgs,
        upsert: bool,
    ) -> PyResult<()> {
        let views = parts
            .iter()
            .map(BufferView::new)
            .collect::<PyResult<Vec<_>>>()?;
        let config = raise(replicate_config(config))?;
        let slices: Vec<&[u8]> = views.iter().map(BufferView::bytes).collect();
        raise(block_on(py, async {
            let total: usize = slices.iter().map(|s| s.len()).sum();
            let _staged = self.staging.reserve(total as u64).await?;
            let value = slices.concat();
            write(&self.client, key, &value, &config, upsert).await
        }))
    }

    /// Stores many bytes-like values; one code per key.
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: ConfigArgs,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        let views = values
            .iter()
            .map(BufferView::new)
            .collect::<PyResult<Vec<_>>>()?;
        let config = raise(replicate_config(config))?;
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .map(String::as_str)
            .zip(views.iter().map(BufferView::bytes))
            .collect();
        let results = block_on(py, async {
            let total: usize = items.iter().map(|(_, v)| v.len()).sum();
            let _staged = match self.staging.reserve(total as u64).await {
                Ok(permit) => permit,
                Err(e) => return vec![Err(e); items.len()],
            };
            if upsert {
                self.client.batch_upsert(&items, &config).await
            } else {
                let results = self.client.batch_put(&items, &config).await;
                results.into_iter().map(put_outcome).collect()
            }
        });
        Ok(results
            .iter()
            .map(|r| code_of(r, |_| 0, "put_batch"))
            .collect())
    }

    /// The value of `key` as bytes (copying call).
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let value = raise(block_on(py, self.read_staged(key)))?;
        Ok(PyBytes::new(py, &value))
    }

    /// The values of `keys`: bytes, or a negative code, per key (copying call).
    fn get_batch(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Py<PyAny>>> {
        let results = self.batch_read_staged(py, &keys);
        results
            .into_iter()
            .map(|r| match r {
                Ok(v) => Ok(PyBytes::new(py, &v).into_any().unbind()),
                Err(e) => {
                    log_failure("get_batch", &e);
                    Ok(e.code.code().into_pyobject(py)?.into_any().unbind())
                }
            })
            .collect()
    }

    /// The value of `key` in a [`BufferHandle`] (copying call, no second copy).
    fn get_buffer(&self, py: Python<'_>, key: &str) -> PyResult<BufferHandle> {
        raise(block_on(py, self.read_staged(key))).map(BufferHandle::new)
    }

    /// [`NativeClient::get_buffer`] for many keys: a handle, or a negative code, per key.
    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Py<PyAny>>> {
        let results = self.batch_read_staged(py, &keys);
        results
            .into_iter()
            .map(|r| match r {
                Ok(v) => Ok(Py::new(py, BufferHandle::new(v))?.into_any()),
                Err(e) => {
                    log_failure("batch_get_buffer", &e);
                    Ok(e.code.code().into_pyobject(py)?.into_any().unbind())
                }
            })
            .collect()
    }

    /// The size of `key`'s value.
    fn get_size(&self, py: Python<'_>, key: &str) -> PyResult<u64> {
        raise(block_on(py, self.client.get_size(key)))
    }

    /// Whether `key` has a complete replica.
    fn exist(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        raise(block_on(py, self.client.exist(key)))
    }

    /// Whether `key` has a complete replica; if its only copy is on a node's disk, it is first
    /// brought back into memory (a prefetch, docs/prefetch.md; best effort, failures logged).
    fn exist_prefetch(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        raise(block_on(py, self.client.exist_prefetch(key)))
    }

    /// 1 (present), 0 (absent) or a negative code, per key.
    fn batch_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        match block_on(py, self.client.batch_exist(&refs)) {
            Ok(results) => results
                .iter()
                .map(|r| code_of(r, |&b| i64::from(b), "batch_is_exist"))
                .collect(),
            Err(e) => {
                log_failure("batch_is_exist", &e);
                vec![i64::from(e.code.code()); keys.len()]
            }
        }
    }

    /// Removes `key`.
    fn remove(&self, py: Python<'_>, key: &str) -> PyResult<()> {
        raise(block_on(py, self.client.remove(key)))
    }

    /// Removes many keys; one code per key.
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let results = block_on(py, async {
            let removals = keys.iter().map(|k| self.client.remove(k));
            futures_util::future::join_all(removals).await
        });
        results
            .iter()
            .map(|r| code_of(r, |_| 0, "batch_remove"))
            .collect()
    }

    /// Removes every key matching the regular expression; how many went.
    fn remove_by_regex(&self, py: Python<'_>, pattern: &str) -> PyResult<u64> {
        raise(block_on(py, self.client.remove_by_regex(pattern)))
    }

    /// Removes every removable key; how many went.
    fn remove_all(&self, py: Python<'_>) -> PyResult<u64> {
        raise(block_on(py, self.client.remove_all()))
    }

    /// Registers `size` bytes at address `ptr` for the zero-copy calls.
    fn register_buffer(&self, ptr: usize, size: usize) -> PyResult<()> {
        raise(self.registered.register(ptr, size))
    }

    /// Unregisters the buffer at `ptr`.
    fn unregister_buffer(&self, ptr: usize) -> PyResult<()> {
        raise(self.registered.unregister(ptr))
    }

    /// Checks that `size` bytes at `ptr` lie inside one registered buffer, so that Python
    /// may read them (a tensor's header, before it is stored from there).
    fn check_registered(&self, ptr: usize, size: usize) -> PyResult<()> {
        raise(self.registered.check(ptr, size))
    }

    /// Stores `size` bytes of registered memory at `ptr` (zero-copy).
    fn put_from(
        &self,
        py: Python<'_>,
        key: &str,
        ptr: usize,
        size: usize,
        config: ConfigArgs,
        upsert: bool,
    ) -> PyResult<()> {
        let region = raise(self.region(ptr, size))?;
        let config = raise(replicate_config(config))?;
        raise(block_on(
            py,
            write(&self.client, key, region.bytes(), &config, upsert),
        ))
    }

    /// Reads `key` into registered memory at `ptr` (at most `size` bytes); its length.
    fn get_into(&self, py: Python<'_>, key: &str, ptr: usize, size: usize) -> PyResult<u64> {
        let region = raise(self.region(ptr, size))?;
        // SAFETY: one region, so nothing overlaps it.
        let buf = unsafe { region.bytes_mut() };
        raise(block_on(py, self.client.get_into(key, buf))).map(|n| n as u64)
    }

    /// Stores each key's value from its registered parts (one part: zero-copy; several:
    /// gathered first); one code per key.
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<usize>>,
        config: ConfigArgs,
        upsert: bool,
    ) -> PyResult<Vec<i64>> {
        let config = raise(replicate_config(config))?;
        let mut early: Vec<Option<Error>> = Vec::with_capacity(keys.len());
        let mut gathered: Vec<Vec<u8>> = Vec::new();
        let mut sources: Vec<Option<Region>> = Vec::with_capacity(keys.len());
        let mut gathered_at: Vec<Option<usize>> = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            match self.part_regions(&ptrs[i], &sizes[i]) {
                Ok(regions) if regions.len() == 1 => {
                    sources.push(Some(regions[0]));
                    gathered_at.push(None);
                    early.push(None);
                }
                Ok(regions) => {
                    gathered_at.push(Some(gathered.len()));
                    gathered.push(regions.iter().flat_map(|r| r.bytes()).copied().collect());
                    sources.push(None);
                    early.push(None);
                }
                Err(e) => {
                    sources.push(None);
                    gathered_at.push(None);
                    early.push(Some(e));
                }
            }
        }
        let mut items: Vec<(&str, &[u8])> = Vec::new();
        let mut slot_of: Vec<Option<usize>> = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            let bytes = match (&sources[i], gathered_at[i]) {
                (Some(region), _) => Some(region.bytes()),
                (None, Some(g)) => Some(&gathered[g][..]),
                _ => None,
            };
            slot_of.push(bytes.map(|b| {
                items.push((&keys[i], b));
                items.len() - 1
            }));
        }
        let results = block_on(py, async {
            if items.is_empty() {
                Vec::new()
            } else if upsert {
                self.client.batch_upsert(&items, &config).await
            } else {
                let results = self.client.batch_put_from(&items, &config).await;
                results.into_iter().map(put_outcome).collect()
            }
        });
        Ok((0..keys.len())
            .map(|i| match (&early[i], slot_of[i]) {
                (Some(e), _) => {
                    log_failure("batch_put_from", e);
                    i64::from(e.code.code())
                }
                (None, Some(slot)) => code_of(&results[slot], |_| 0, "batch_put_from"),
                (None, None) => i64::from(ErrorCode::INTERNAL_ERROR.code()),
            })
            .collect())
    }

    /// Reads each key into its registered parts (one part: straight in; several: scattered
    /// after); the value's length, or a negative code, per key.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        let mut regions: Vec<Result<Vec<Region>>> = (0..keys.len())
            .map(|i| self.part_regions(&ptrs[i], &sizes[i]))
            .collect();
        let all: Vec<Region> = regions
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .flatten()
            .copied()
            .collect();
        if let Err(e) = disjoint(&all) {
            for r in regions.iter_mut() {
                if r.is_ok() {
                    *r = Err(e.clone());
                }
            }
        }
        let mut scratch: Vec<Vec<u8>> = Vec::new();
        let mut items: Vec<(&str, &mut [u8])> = Vec::new();
        let mut slot_of: Vec<Option<usize>> = vec![None; keys.len()];
        let mut scratch_of: Vec<Option<usize>> = vec![None; keys.len()];
        for (i, r) in regions.iter().enumerate() {
            if let Ok(parts) = r
                && parts.len() > 1
            {
                scratch_of[i] = Some(scratch.len());
                scratch.push(vec![0; parts.iter().map(Region::len).sum()]);
            }
        }
        let mut scratch_slices: Vec<Option<&mut [u8]>> =
            scratch.iter_mut().map(|s| Some(&mut s[..])).collect();
        for (i, r) in regions.iter().enumerate() {
            let Ok(parts) = r else { continue };
            let buf: &mut [u8] = match scratch_of[i] {
                Some(s) => scratch_slices[s]
                    .take()
                    .expect("one scratch buffer per key"),
                // SAFETY: `disjoint` found no two destination regions overlapping.
                None => unsafe { parts[0].bytes_mut() },
            };
            slot_of[i] = Some(items.len());
            items.push((&keys[i], buf));
        }
        let results = block_on(py, async {
            if items.is_empty() {
                Vec::new()
            } else {
                self.client.batch_get_into(&mut items).await
            }
        });
        drop(items);
        (0..keys.len())
            .map(|i| match (&regions[i], slot_of[i]) {
                (Err(e), _) => {
                    log_failure("batch_get_into", e);
                    i64::from(e.code.code())
                }
                (Ok(parts), Some(slot)) => match (&results[slot], scratch_of[i]) {
                    (Ok(len), Some(s)) => {
                        let mut from = &scratch[s][..*len];
                        for part in parts {
                            let n = from.len().min(part.len());
                            // SAFETY: `disjoint` found no two destination regions overlapping,
                            // and the batch's slices are gone.
                            let dest = unsafe { part.bytes_mut() };
                            dest[..n].copy_from_slice(&from[..n]);
                            from = &from[n..];
                        }
                        *len as i64
                    }
                    (r, _) => code_of(r, |&n| n as i64, "batch_get_into"),
                },
                (Ok(_), None) => i64::from(ErrorCode::INTERNAL_ERROR.code()),
            })
            .collect()
    }

    /// Mooncake's `get_into_ranges`: for each registered buffer, for each of its keys, copies
    /// fragments (source offset in the value, size) to offsets in the buffer. Answers, per
    /// buffer, per key, per fragment, the bytes copied or a negative code; a bad fragment
    /// fails alone.
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        ptrs: Vec<usize>,
        keys: Vec<Vec<String>>,
        dst_offsets: Vec<Vec<Vec<usize>>>,
        src_offsets: Vec<Vec<Vec<usize>>>,
        sizes: Vec<Vec<Vec<usize>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let bad = i64::from(ErrorCode::INVALID_PARAMS.code());
        // A buffer whose lists do not give one entry per key fails whole; a key whose three
        // lists differ in length fails alone. Failures are shaped by the destination offsets,
        // one code per fragment, as Mooncake shapes them.
        let listed = |b: usize| -> bool {
            let n = keys.get(b).map_or(usize::MAX, Vec::len);
            [dst_offsets.get(b), src_offsets.get(b), sizes.get(b)]
                .iter()
                .all(|lists| lists.is_some_and(|l| l.len() == n))
        };
        let failed = |b: usize, k: usize| -> Vec<i64> {
            vec![
                bad;
                dst_offsets
                    .get(b)
                    .and_then(|d| d.get(k))
                    .map_or(1, Vec::len)
            ]
        };
        let mut unique: Vec<&str> = keys.iter().flatten().map(String::as_str).collect();
        unique.sort_unstable();
        unique.dedup();
        let values = block_on(py, self.client.batch_get(&unique));
        let mut answer = Vec::with_capacity(ptrs.len());
        for (b, &ptr) in ptrs.iter().enumerate() {
            if !listed(b) {
                let n = keys.get(b).map_or(0, Vec::len);
                answer.push((0..n).map(|k| failed(b, k)).collect());
                continue;
            }
            let room = self.registered.room_at(ptr);
            let mut per_key = Vec::with_capacity(keys[b].len());
            for (k, key) in keys[b].iter().enumerate() {
                let fragments = sizes[b][k].len();
                if dst_offsets[b][k].len() != fragments || src_offsets[b][k].len() != fragments {
                    log_failure(
                        "get_into_ranges",
                        &invalid(format!(
                            "{key:?}: {} destination offsets, {} source offsets and {fragments} sizes: give one of each per fragment",
                            dst_offsets[b][k].len(),
                            src_offsets[b][k].len()
                        )),
                    );
                    per_key.push(failed(b, k));
                    continue;
                }
                let at = unique
                    .binary_search(&key.as_str())
                    .expect("every key was read");
                let mut per_fragment = Vec::with_capacity(sizes[b][k].len());
                for f in 0..sizes[b][k].len() {
                    let (dst, src, len) =
                        (dst_offsets[b][k][f], src_offsets[b][k][f], sizes[b][k][f]);
                    let copied = (|| -> Result<i64> {
                        let value = values[at].as_ref().map_err(Clone::clone)?;
                        let room = room.as_ref().map_err(Clone::clone)?;
                        if src.checked_add(len).is_none_or(|end| end > value.len()) {
                            return Err(invalid(format!(
                                "fragment {src}+{len} of {key:?} runs past its {} bytes",
                                value.len()
                            )));
                        }
                        if dst.checked_add(len).is_none_or(|end| end > *room) {
                            return Err(invalid(format!(
                                "fragment of {len} bytes at offset {dst} runs past the registered buffer ({room} bytes)"
                            )));
                        }
                        let region = self.region(ptr + dst, len)?;
                        // SAFETY: a fragment's copy is the only live slice of its bytes.
                        let dest = unsafe { region.bytes_mut() };
                        dest.copy_from_slice(&value[src..src + len]);
                        Ok(len as i64)
                    })();
                    per_fragment.push(code_of(&copied, |&n| n, "get_into_ranges"));
                }
                per_key.push(per_fragment);
            }
            answer.push(per_key);
        }
        answer
    }

    /// Where each key's complete replicas are: a list of (segment endpoint, address, size,
    /// on disk, status name) per key, or a negative code.
    fn replicas(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Py<PyAny>>> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let lists = block_on(py, async {
            let lists = self.client.batch_replicas(&refs).await?;
            let mut described = Vec::with_capacity(lists.len());
            for list in lists {
                described.push(match list {
                    Ok(list) => {
                        let ids: Vec<_> = list.replicas.iter().map(|r| r.segment).collect();
                        let names = self.client.segment_endpoints(&ids).await?;
                        Ok(list
                            .replicas
                            .iter()
                            .map(|r| {
                                (
                                    names.get(&r.segment).cloned().unwrap_or_default(),
                                    r.addr,
                                    r.len,
                                    r.medium == Medium::Disk,
                                    status_name(r.status),
                                )
                            })
                            .collect::<Vec<_>>())
                    }
                    Err(e) => Err(e),
                });
            }
            Ok::<_, Error>(described)
        });
        let lists = raise(lists)?;
        lists
            .into_iter()
            .map(|l| match l {
                Ok(replicas) => Ok(replicas.into_pyobject(py)?.into_any().unbind()),
                Err(e) => {
                    log_failure("get_replica_desc", &e);
                    Ok(e.code.code().into_pyobject(py)?.into_any().unbind())
                }
            })
            .collect()
    }
}

impl Drop for NativeClient {
    /// A store dropped without `close()` (the program forgot, or exited) still leaves the
    /// cluster: its segment is unmounted in the background rather than served until the
    /// master notices the silence.
    fn drop(&mut self) {
        let client = self.client.clone();
        crate::runtime().spawn(async move {
            if let Err(e) = client.close().await {
                tracing::debug!("closing a dropped store: {e}");
            }
        });
    }
}

impl NativeClient {
    /// Reads `key` whole, within the local buffer's limits.
    async fn read_staged(&self, key: &str) -> Result<Vec<u8>> {
        self.staging.check(0)?;
        let value = self.client.get(key).await?;
        self.staging.check(value.len() as u64)?;
        Ok(value)
    }

    fn batch_read_staged(&self, py: Python<'_>, keys: &[String]) -> Vec<Result<Vec<u8>>> {
        if let Err(e) = self.staging.check(0) {
            return vec![Err(e); keys.len()];
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut results = block_on(py, self.client.batch_get(&refs));
        for r in results.iter_mut() {
            if let Ok(v) = r
                && let Err(e) = self.staging.check(v.len() as u64)
            {
                *r = Err(e);
            }
        }
        results
    }
}

/// A put or an upsert.
async fn write(
    client: &Client,
    key: &str,
    value: &[u8],
    config: &ReplicateConfig,
    upsert: bool,
) -> Result<()> {
    if value.is_empty() {
        // Mooncake's put or upsert of nothing stores nothing and succeeds, with a warning.
        tracing::warn!(key, "an empty value: nothing stored");
        return Ok(());
    }
    if upsert {
        client.upsert(key, value, config).await
    } else {
        put_outcome(client.put(key, value, config).await)
    }
}

/// Mooncake's put convention: a put of a key that already exists keeps the stored value and
/// succeeds (Mooncake's client logs it at debug level); `upsert` is the call that replaces.
fn put_outcome(result: Result<()>) -> Result<()> {
    match result {
        Err(e) if e.code == ErrorCode::OBJECT_ALREADY_EXISTS => {
            tracing::debug!("already stored, kept as it is: {e}");
            Ok(())
        }
        other => other,
    }
}

/// Mooncake's name for a replica status.
fn status_name(status: ReplicaStatus) -> &'static str {
    match status {
        ReplicaStatus::Processing => "PROCESSING",
        ReplicaStatus::Complete => "COMPLETE",
    }
}
