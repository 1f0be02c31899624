//! The group writer and removal: a put lays its values out as one bucket, writes and syncs the
//! data file and commits the meta by rename; removal and replacement rewrite a bucket's meta
//! with the keys still live in it, deleting the bucket once none is.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::Ordering;

use tracing::{debug, warn};

use super::{Bucket, Entry, check_items, meta, remove_if_present};
use crate::backend::Held;
use crate::record::RecordBuf;
use mooring_proto::disk::IoBuf;

impl Bucket {
    /// [`Backend::put`](crate::Backend::put): one bucket for all of `records`, written back
    /// to back from their own buffers.
    pub(super) async fn put_group(&self, records: Vec<RecordBuf>) -> io::Result<Vec<Held>> {
        if !self.recovered.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "bucket backend: recover() must run before the first put",
            ));
        }
        check_items(&records)?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (data, entries) = self.lay_out(records)?;
        let bytes: usize = data.iter().map(|b| b.len()).sum();
        let meta = meta::encode(id, &entries, self.disk.alignment());
        if let Err(e) = self.write_bucket(id, data, meta).await {
            self.discard(id).await;
            return Err(e);
        }
        debug!(bucket = id, keys = entries.len(), bytes, "bucket written");
        for old in self.publish(id, &entries) {
            // The new values are durable and served; the old entry stays on disk only until
            // this succeeds or, failing that, until recovery drops the lower version.
            if let Err(e) = self.rewrite_meta(old).await {
                warn!(
                    bucket = old,
                    "could not remove replaced values from their bucket: {e}"
                );
            }
        }
        Ok(entries
            .into_iter()
            .map(|e| Held {
                key: e.key,
                version: e.version,
                len: e.value_len,
                checksum: e.checksum,
                unit: id,
            })
            .collect())
    }

    /// The bucket's data file contents (the records' buffers, each padded to the layout's
    /// alignment, back to back) and its meta entries.
    fn lay_out(&self, records: Vec<RecordBuf>) -> io::Result<(Vec<IoBuf>, Vec<meta::MetaEntry>)> {
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "bucket too large");
        let mut entries = Vec::with_capacity(records.len());
        let mut data = Vec::with_capacity(records.len());
        let mut total = 0u64;
        for record in records {
            // Already padded to `self.align` when the caller asked `record_alignment`.
            let record = record.aligned_to(self.align);
            entries.push(meta::MetaEntry {
                key: record.key().to_string(),
                version: record.version(),
                offset: total,
                value_len: record.value_len(),
                checksum: record.checksum(),
            });
            let buf = record.into_buf();
            total = total.checked_add(buf.len() as u64).ok_or_else(too_large)?;
            data.push(buf);
        }
        usize::try_from(total).map_err(|_| too_large())?;
        Ok((data, entries))
    }

    /// Writes and syncs the data file, then commits the meta.
    async fn write_bucket(&self, id: u64, data: Vec<IoBuf>, meta: IoBuf) -> io::Result<()> {
        let name = Self::data_name(id);
        self.disk.create(&name).await?;
        self.disk.write_all_at(&name, 0, data).await.1?;
        self.disk.sync(&name).await?;
        self.write_meta(id, meta).await
    }

    /// Replaces bucket `id`'s meta atomically: temporary file, sync, rename.
    pub(super) async fn write_meta(&self, id: u64, meta: IoBuf) -> io::Result<()> {
        let tmp = Self::tmp_name(id);
        let written = async {
            self.disk.create(&tmp).await?;
            self.disk.write_at(&tmp, 0, meta).await.1?;
            self.disk.sync(&tmp).await?;
            self.disk.rename(&tmp, &Self::meta_name(id)).await
        }
        .await;
        if written.is_err() {
            let _ = remove_if_present(self.disk.as_ref(), &tmp).await;
        }
        written
    }

    /// Removes what a failed put of bucket `id` left behind (best effort: recovery removes
    /// anything left without a meta).
    async fn discard(&self, id: u64) {
        for name in [Self::meta_name(id), Self::tmp_name(id), Self::data_name(id)] {
            if let Err(e) = remove_if_present(self.disk.as_ref(), &name).await {
                warn!(file = %name, "could not remove a failed bucket write: {e}");
            }
        }
    }

    /// Deletes both files of bucket `id`, meta first (a data file without a meta is an
    /// unfinished write to recovery, never served).
    pub(super) async fn delete_bucket(&self, id: u64) -> io::Result<()> {
        remove_if_present(self.disk.as_ref(), &Self::meta_name(id)).await?;
        remove_if_present(self.disk.as_ref(), &Self::data_name(id)).await
    }

    /// Makes committed bucket `id`'s values the keys' current ones; returns the buckets that
    /// held earlier values of the keys, which lost them.
    fn publish(&self, id: u64, entries: &[meta::MetaEntry]) -> BTreeSet<u64> {
        let mut index = self.lock();
        let mut displaced = BTreeSet::new();
        for e in entries {
            let entry = Entry::of(id, e);
            if let Some(old) = index.keys.insert(e.key.clone(), entry)
                && let Some(live) = index.buckets.get_mut(&old.bucket)
            {
                live.remove(&e.key);
                displaced.insert(old.bucket);
            }
        }
        index
            .buckets
            .insert(id, entries.iter().map(|e| e.key.clone()).collect());
        displaced
    }

    /// Brings bucket `id`'s files in line with the index: its meta rewritten with the keys
    /// still live in it, or both files deleted if none is.
    async fn rewrite_meta(&self, id: u64) -> io::Result<()> {
        let _writing = self.meta_writes.lock().await;
        let mut entries = {
            let index = self.lock();
            let Some(live) = index.buckets.get(&id) else {
                return Ok(()); // already deleted
            };
            live.iter()
                .filter_map(|key| {
                    let e = index.keys.get(key).filter(|e| e.bucket == id)?;
                    Some(meta::MetaEntry {
                        key: key.clone(),
                        version: e.version,
                        offset: e.offset,
                        value_len: e.value_len,
                        checksum: e.checksum,
                    })
                })
                .collect::<Vec<_>>()
        };
        if entries.is_empty() {
            self.delete_bucket(id).await?;
            // Committed buckets never gain keys, so it is still empty.
            self.lock().buckets.remove(&id);
            debug!(bucket = id, "bucket deleted: no value left");
            return Ok(());
        }
        entries.sort_by_key(|e| e.offset);
        self.write_meta(id, meta::encode(id, &entries, self.disk.alignment()))
            .await
    }

    /// [`Backend::remove`](crate::Backend::remove): out of the index, then each touched
    /// bucket's meta rewritten once.
    pub(super) async fn remove_writes(&self, writes: &[(String, u64)]) -> io::Result<()> {
        let touched: BTreeSet<u64> = {
            let mut index = self.lock();
            let mut touched = BTreeSet::new();
            for (key, version) in writes {
                let Some(entry) = index.keys.get(key).copied() else {
                    continue;
                };
                if entry.version != *version {
                    continue; // another write of the key: it stays
                }
                index.keys.remove(key);
                if let Some(live) = index.buckets.get_mut(&entry.bucket) {
                    live.remove(key);
                }
                touched.insert(entry.bucket);
            }
            touched
        };
        // Every bucket is attempted; the first error is returned (the values are no longer
        // served either way; on disk they stay until a rewrite or recovery drops them).
        let mut result = Ok(());
        for id in touched {
            if let Err(e) = self.rewrite_meta(id).await {
                warn!(
                    bucket = id,
                    "could not rewrite a bucket after removals: {e}"
                );
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }
}
