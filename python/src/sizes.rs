//! Sizes as Mooncake's `setup` reads them: a number of bytes, or a number with a unit where
//! K, KB, M, MB, G, GB, T and TB are powers of 1024 ("16MB" is 16 MiB, as in Mooncake, so a
//! program keeps the sizes it had). KiB, MiB, GiB and TiB are accepted too; fractions
//! ("1.5 GB") round down to whole bytes. Anything else (a percentage, a negative number, an
//! unknown unit) is refused with the reason.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};

/// Parses `text` as a Mooncake size.
pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let refuse = || {
        format!(
            "{text:?} is not a size: write bytes (16777216) or a number and a unit (16MB, 1.5 GB)"
        )
    };
    if number.is_empty() {
        return Err(refuse());
    }
    let value: f64 = number.parse().map_err(|_| refuse())?;
    let multiplier: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(refuse()),
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes as u64)
}

/// A size given as an int (bytes) or a string ("16MB").
pub(crate) fn from_py(value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(int) = value.cast::<PyInt>() {
        return int.extract::<u64>().map_err(|_| {
            PyValueError::new_err(format!("a size must be 0 to 2**64-1 bytes, got {int}"))
        });
    }
    if let Ok(text) = value.cast::<PyString>() {
        return parse(text.to_str()?).map_err(PyValueError::new_err);
    }
    Err(PyTypeError::new_err(format!(
        "a size is an int (bytes) or a str such as \"16MB\", got {}",
        value.get_type().name()?
    )))
}

/// `parse_size(value) -> int`: bytes in `value`, an int or a Mooncake size string ("16MB" is
/// 16 MiB). Raises ValueError for anything else ("50%").
#[pyfunction]
pub(crate) fn parse_size(value: &Bound<'_, PyAny>) -> PyResult<u64> {
    from_py(value)
}
