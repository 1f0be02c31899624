//! Mooncake's `batch_replica_clear`, as a module function over a [`NativeClient`].
//!
//! It is a function, not a method, so that `NativeClient` keeps a single `#[pymethods]`
//! block (pyo3 allows more only with its `multiple-pymethods` feature).

use pyo3::prelude::*;

use super::NativeClient;
use crate::block_on;
use crate::errors::raise;

/// Clears `client`'s own objects among `keys`: each whole, or, with `segment`, only its
/// replica on that segment (an object whose only replica that was goes whole). Objects
/// another client wrote, and those leased, held, being written or being copied, are skipped,
/// as Mooncake's master skips them. Answers the keys cleared.
#[pyfunction]
#[pyo3(signature = (client, keys, segment = None))]
pub(crate) fn clear_replicas(
    py: Python<'_>,
    client: &NativeClient,
    keys: Vec<String>,
    segment: Option<String>,
) -> PyResult<Vec<String>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let cleared = raise(block_on(py, async {
        let master = client.client.master("batch_replica_clear")?;
        master.clear_replicas(&keys, segment.as_deref()).await
    }))?;
    tracing::debug!(
        asked = keys.len(),
        cleared = cleared.len(),
        segment = segment.as_deref().unwrap_or("(all)"),
        "replicas cleared"
    );
    Ok(cleared)
}
