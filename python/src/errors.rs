//! Mooring errors on the Python side.
//!
//! Native calls raise `MooringError(code, message)`: the Mooncake code (negative) and a
//! message that says what went wrong and what to do. The `mooring.store` layer turns them
//! into Mooncake's return codes and logs the message, at most a few lines a second, so a
//! program that fails in a loop does not drown its own output.

use mooring_core::{Error, ErrorCode};
use mooring_proto::refusals::LogBudget;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;

create_exception!(
    _native,
    MooringError,
    PyException,
    "A Mooring call failed: args are (code, message), code being Mooncake's negative error code."
);

/// The Python exception for `error`.
pub(crate) fn to_py(error: &Error) -> PyErr {
    MooringError::new_err((error.code.code(), error.to_string()))
}

/// Converts a Mooring result into a Python one.
pub(crate) fn raise<T>(result: mooring_core::Result<T>) -> PyResult<T> {
    result.map_err(|e| to_py(&e))
}

/// An `INVALID_PARAMS` error with `message`.
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, message)
}

/// The failure lines' budget: a program failing in a loop must not drown its own output.
static FAILURES: LogBudget = LogBudget::new();

/// Logs a failed call at WARN, unless this second's share of lines is used up. A key that is
/// missing, or already there for a put, is logged at DEBUG: those are answers a program acts
/// on (a cache miss, a page some other writer stored first), not trouble.
pub(crate) fn log_failure(call: &str, error: &Error) {
    log_line(call, error.code, error);
}

/// Logs `text`, the message of a failure with `code`, as [`log_failure`] does.
fn log_line(call: &str, code: ErrorCode, text: &dyn std::fmt::Display) {
    if matches!(
        code,
        ErrorCode::OBJECT_NOT_FOUND | ErrorCode::OBJECT_ALREADY_EXISTS
    ) {
        tracing::debug!(call, "{text}");
        return;
    }
    let Some(suppressed) = FAILURES.admit() else {
        return;
    };
    if suppressed > 0 {
        tracing::warn!(
            call,
            suppressed,
            "{text} (and {suppressed} more failures not logged)"
        );
    } else {
        tracing::warn!(call, "{text}");
    }
}

/// Logs a failure the Python layer reports: `message` is a `MooringError`'s, or the Python
/// layer's own for a refusal it makes itself (then prefixed with the code's name).
#[pyfunction]
#[pyo3(name = "log_failure")]
pub(crate) fn log_failure_py(call: &str, code: i32, message: &str) {
    let code = ErrorCode::from_code(code).unwrap_or(ErrorCode::INTERNAL_ERROR);
    if message.starts_with(&format!("{code:?} (")) {
        log_line(call, code, &message);
    } else {
        log_line(call, code, &Error::new(code, message));
    }
}

/// Every Mooncake error code Mooring uses, by name, with what it means.
#[pyfunction]
pub(crate) fn error_codes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let codes = PyDict::new(py);
    for code in ErrorCode::ALL {
        codes.set_item(format!("{code:?}"), (code.code(), code.advice()))?;
    }
    Ok(codes)
}
