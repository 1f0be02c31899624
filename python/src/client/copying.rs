//! The copying calls' reads: whole values, within the local buffer's limits.

use mooring_core::Result;
use pyo3::prelude::*;

use super::NativeClient;
use crate::block_on;

impl NativeClient {
    /// Reads `key` whole, within the local buffer's limits.
    pub(super) async fn read_staged(&self, key: &str) -> Result<Vec<u8>> {
        self.staging.check(0)?;
        let value = self.client.get(key).await?;
        self.staging.check(value.len() as u64)?;
        Ok(value)
    }

    pub(super) fn batch_read_staged(
        &self,
        py: Python<'_>,
        keys: &[String],
    ) -> Vec<Result<Vec<u8>>> {
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
