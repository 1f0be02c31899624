//! `NativeClient`: one Mooring client, shared by every Python thread of a store.
//!
//! Each method releases the GIL for the whole network call. Single-key calls raise
//! `MooringError(code, message)`; batch calls answer one int per key (0 or a length on
//! success, a negative Mooncake code on failure), so one bad key never hides the others.

mod args;
mod backend;
mod connect;
mod copying;
mod device;
mod mooncake;
pub(crate) mod replicas;
mod zero_copy;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use mooring_core::{Error, Medium, Millis, TaskAction, TaskId, TaskState};
use mooring_device::pipeline::copy_to_host;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::block_on;
use crate::errors::{log_failure, raise};
use crate::handle::BufferHandle;
use crate::registered::Registered;
use crate::staging::Staging;
use crate::values::BufferView;
use args::{ConfigArgs, TaskTuple, code_of, replicate_config};
use backend::Backend;
use connect::{PortRange, transport_choice};
use mooncake::status_name;

/// How many keys of a prefetching `batch_is_exist` are probed at once: each probe is a
/// request to the master, and a promotion from a node's disk for a key found only there, so a
/// lookup of many blocks costs about one round trip per this many keys instead of one per key.
const PREFETCHES_AT_ONCE: usize = 32;

/// A connected client; see the module docs.
#[pyclass(module = "mooring._native", frozen)]
pub struct NativeClient {
    client: Backend,
    hostname: String,
    staging: Staging,
    registered: Arc<Registered>,
    /// Bytes stored from and read into device memory, for `device_stat`.
    device_bytes_put: AtomicU64,
    device_bytes_got: AtomicU64,
}

#[pymethods]
impl NativeClient {
    /// Connects to the master at `master`, or joins the peer cluster `peer://...` names (see
    /// the module docs of `mooring.store`).
    #[staticmethod]
    #[pyo3(signature = (master, hostname, segment_size, local_buffer_size, token_file, ports, protocol = "tcp", rdma_devices = "", tenant = None, transport = None, device_staging_size = 64 << 20, device_wave_size = mooring_device::pool::WAVE_BYTES))]
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
        tenant: Option<String>,
        transport: Option<&str>,
        device_staging_size: usize,
        device_wave_size: usize,
    ) -> PyResult<NativeClient> {
        let rdma =
            (protocol == "rdma").then(|| mooring::transports::device_names(Some(rdma_devices)));
        let transport = raise(transport.map(transport_choice).transpose())?;
        let (client, hostname) = raise(block_on(
            py,
            NativeClient::join(
                master,
                hostname,
                segment_size,
                token_file,
                ports,
                rdma,
                tenant,
                transport,
            ),
        ))?;
        Ok(NativeClient {
            client,
            hostname,
            staging: Staging::new(local_buffer_size),
            registered: Arc::new(Registered::new(device_staging_size, device_wave_size)),
            device_bytes_put: AtomicU64::new(0),
            device_bytes_got: AtomicU64::new(0),
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
        let task = {
            let master = raise(self.client.master("create_copy_task"))?;
            raise(block_on(py, master.start_copy(key, &targets)))?
        };
        Ok(task.0)
    }

    /// Starts moving `key`'s replica from segment `source` to `target` in the background;
    /// returns the task id.
    fn start_move(&self, py: Python<'_>, key: &str, source: &str, target: &str) -> PyResult<u64> {
        let task = {
            let master = raise(self.client.master("create_move_task"))?;
            raise(block_on(py, master.start_move(key, source, target)))?
        };
        Ok(task.0)
    }

    /// Where task `task` stands: (key, action name, state name, client id, age of its start in
    /// ms, age of its last change in ms, failure message).
    fn query_task(&self, py: Python<'_>, task: u64) -> PyResult<TaskTuple> {
        let report = {
            let master = raise(self.client.master("query_task"))?;
            raise(block_on(py, master.query_task(TaskId(task))))?
        };
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
            self.client.write(key, bytes, &config, upsert).await
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
            self.client.write(key, &value, &config, upsert).await
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
            self.client
                .batch_write(&items, &config, upsert, false)
                .await
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
        raise(block_on(py, self.client.exist(key, false)))
    }

    /// Whether `key` has a complete replica; if its only copy is on a node's disk, it is first
    /// brought back into memory (a prefetch, docs/prefetch.md; best effort, failures logged).
    fn exist_prefetch(&self, py: Python<'_>, key: &str) -> PyResult<bool> {
        raise(block_on(py, self.client.exist(key, true)))
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

    /// [`NativeClient::exist_prefetch`] for many keys, [`PREFETCHES_AT_ONCE`] at a time: 1, 0
    /// or a negative code per key.
    fn batch_exist_prefetch(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let probes: Vec<_> = keys.iter().map(|k| self.client.exist(k, true)).collect();
        let results = block_on(py, async {
            futures_util::stream::iter(probes)
                .buffered(PREFETCHES_AT_ONCE)
                .collect::<Vec<_>>()
                .await
        });
        results
            .iter()
            .map(|r| code_of(r, |&b| i64::from(b), "batch_is_exist"))
            .collect()
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
        raise(block_on(py, async {
            self.client
                .master("remove_by_regex")?
                .remove_by_regex(pattern)
                .await
        }))
    }

    /// Removes every removable key; how many went.
    fn remove_all(&self, py: Python<'_>) -> PyResult<u64> {
        raise(block_on(py, async {
            self.client.master("remove_all")?.remove_all().await
        }))
    }

    /// Registers `size` bytes at address `ptr` for the zero-copy calls. Device (GPU) memory
    /// is recognised here and staged through pinned host memory from then on.
    fn register_buffer(&self, ptr: usize, size: usize) -> PyResult<()> {
        raise(self.registered.register(ptr, size))
    }

    /// Unregisters the buffer at `ptr`, waiting (without the GIL) for the calls using it.
    fn unregister_buffer(&self, py: Python<'_>, ptr: usize) -> PyResult<()> {
        raise(py.detach(|| self.registered.unregister(ptr)))
    }

    /// Checks that `size` bytes at `ptr` lie inside one registered buffer; what memory it is:
    /// `None` for host memory (Python may read it: a tensor's header, before it is stored
    /// from there), else the device's name and its CUDA ordinal (-1 for another device).
    fn check_registered(&self, ptr: usize, size: usize) -> PyResult<Option<(String, i32)>> {
        let region = raise(self.region(ptr, size))?;
        Ok(region.device().map(|pool| {
            let device = pool.device();
            (device.describe(), device.cuda_ordinal().unwrap_or(-1))
        }))
    }

    /// `size` bytes of registered memory at `ptr`, copied out (through the device's copy
    /// engine for device memory): for the few bytes Python must inspect, such as a tensor's
    /// header.
    fn read_registered<'py>(
        &self,
        py: Python<'py>,
        ptr: usize,
        size: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let region = raise(self.region(ptr, size))?;
        let bytes = match region.device() {
            None => region.bytes().to_vec(),
            Some(pool) => {
                let mut bytes = vec![0u8; size];
                raise(py.detach(|| copy_to_host(pool, &mut [(ptr, &mut bytes[..])])))?;
                bytes
            }
        };
        Ok(PyBytes::new(py, &bytes))
    }

    /// How device memory moves for this client: `devices` (per device with registered
    /// memory: its name, the path, registered bytes, the staging slabs' size and count) and
    /// the bytes moved so far.
    fn device_stat<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let devices = PyList::empty(py);
        for (name, registered, slab, slabs) in self.registered.devices() {
            let device = PyDict::new(py);
            device.set_item("device", name)?;
            device.set_item("path", "staging through pinned host memory")?;
            device.set_item("registered_bytes", registered)?;
            device.set_item("staging_slab_bytes", slab)?;
            device.set_item("staging_slabs", slabs)?;
            devices.append(device)?;
        }
        let stat = PyDict::new(py);
        stat.set_item("devices", devices)?;
        let put = self.device_bytes_put.load(Ordering::Relaxed);
        stat.set_item("device_bytes_put", put)?;
        let got = self.device_bytes_got.load(Ordering::Relaxed);
        stat.set_item("device_bytes_got", got)?;
        Ok(stat)
    }

    /// Stores `size` bytes of registered memory at `ptr` (zero-copy from host memory; staged
    /// from device memory).
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
        if region.device().is_some() {
            let mut groups = Vec::new();
            device::add_to_group(&mut groups, 0, &[region]);
            let keys = [key.to_string()];
            let mut results = block_on(py, self.put_from_devices(&keys, &groups, &config, upsert));
            return raise(results.pop().expect("one key").1);
        }
        raise(block_on(
            py,
            self.client.write(key, region.bytes(), &config, upsert),
        ))
    }

    /// Reads `key` into registered memory at `ptr` (at most `size` bytes); its length.
    fn get_into(&self, py: Python<'_>, key: &str, ptr: usize, size: usize) -> PyResult<u64> {
        let region = raise(self.region(ptr, size))?;
        if region.device().is_some() {
            let mut groups = Vec::new();
            device::add_to_group(&mut groups, 0, &[region]);
            let keys = [key.to_string()];
            let mut results = block_on(py, self.get_into_devices(&keys, &groups));
            return raise(results.pop().expect("one key").1).map(|n| n as u64);
        }
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
        self.put_from_parts(py, keys, ptrs, sizes, config, upsert)
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
        self.get_into_parts(py, keys, ptrs, sizes)
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
        self.get_into_fragments(py, ptrs, keys, dst_offsets, src_offsets, sizes)
    }

    /// Where each key's complete replicas are: a list of (segment endpoint, address, size,
    /// on disk, status name) per key, or a negative code.
    fn replicas(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<Py<PyAny>>> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let lists = block_on(py, async {
            let master = self.client.master("get_replica_desc")?;
            let lists = master.batch_replicas(&refs).await?;
            let mut described = Vec::with_capacity(lists.len());
            for list in lists {
                described.push(match list {
                    Ok(list) => {
                        let ids: Vec<_> = list.replicas.iter().map(|r| r.segment).collect();
                        let names = master.segment_endpoints(&ids).await?;
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
        match &self.client {
            Backend::Master(client) => {
                let client = client.clone();
                crate::runtime().spawn(async move {
                    if let Err(e) = client.close().await {
                        tracing::debug!("closing a dropped store: {e}");
                    }
                });
            }
            Backend::Peer(peer) => {
                let peer = peer.clone();
                crate::runtime().spawn(async move { peer.close().await });
            }
        }
    }
}
