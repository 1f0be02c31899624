//! `mooring._native`: the Rust half of the `mooring` Python package.
//!
//! The Python half (`python/py/mooring`) gives Mooncake's `MooncakeDistributedStore` its
//! names, signatures and return conventions; this half does the work with the GIL released:
//!
//! | module | concept |
//! | --- | --- |
//! | `client` | [`client::NativeClient`]: one Mooring client (and, optionally, its in-process node) |
//! | `values` | reading Python buffers and registered memory as byte slices |
//! | `registered` | the memory regions a program registered, which raw pointers must lie in, and which device holds them |
//! | `device_model` | [`device_model::DeviceModel`]: the software GPU that tests stage through |
//! | `staging` | the local buffer that copying calls stage their bytes in |
//! | `lmcache` | [`lmcache::MooringConnector`]: the client as an L2 store of LMCache's server |
//! | `handle` | [`handle::BufferHandle`]: a value read into memory the caller can view |
//! | `sizes` | sizes written the way Mooncake reads them ("16MB") |
//! | `errors` | Mooring errors as `MooringError(code, message)` and rate-limited warnings |
//!
//! Every network call runs on one shared tokio runtime while the calling thread has let go of
//! the GIL, so one client serves many Python threads at once.

use std::future::Future;
use std::sync::OnceLock;

use pyo3::prelude::*;

mod client;
mod device_model;
mod errors;
mod handle;
mod lmcache;
mod registered;
mod sizes;
mod staging;
mod values;

/// The runtime every client of this process runs on: `MOORING_WORKER_THREADS` worker threads
/// (as for the `mooring` binary), by default one per core (at least two): the in-process
/// node's data server serves other machines on them. Calls run on the Python threads that
/// make them (see [`block_on`]); the workers also run heartbeats and watch the sockets of
/// calls that had to park.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let threads = std::env::var("MOORING_WORKER_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().max(2)));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("mooring-io")
            .enable_all()
            .build()
            .expect("the mooring runtime starts (threads and an epoll instance)")
    })
}

/// Runs `work` to completion on the shared runtime with the GIL released.
///
/// The work runs on the calling thread, which busy-polls its sockets for a moment before
/// parking (see `mooring::tuning`), so a quick answer costs no wake-up from another thread.
/// Measured here with 4 KiB gets: 71-79 µs this way; 98 µs when the work ran as a task on
/// the runtime's workers and the caller parked until it finished, and 140 µs when the caller
/// spun instead (two spinning threads starve the master and node on a 2-core host).
fn block_on<F>(py: Python<'_>, work: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(work))
}

/// Logs go to stderr, filtered by `MOORING_LOG` (default `warn`: refusals and failures).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MOORING_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A host program may have installed a subscriber already; it keeps it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add("MooringError", m.py().get_type::<errors::MooringError>())?;
    m.add_class::<client::NativeClient>()?;
    m.add_class::<handle::BufferHandle>()?;
    m.add_class::<lmcache::MooringConnector>()?;
    m.add_class::<device_model::DeviceModel>()?;
    m.add_function(wrap_pyfunction!(sizes::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_codes, m)?)?;
    m.add_function(wrap_pyfunction!(errors::log_failure_py, m)?)?;
    m.add_function(wrap_pyfunction!(client::replicas::clear_replicas, m)?)?;
    Ok(())
}
