//! Recovery: lists the bucket files, drops unfinished writes (a temporary meta, a data file
//! without a meta), damaged metas and records that fail their checks, keeps the higher
//! version where a crash left a key in two buckets, rewrites the metas it changed and fills
//! the index.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::atomic::Ordering;

use tracing::{info, warn};

use super::{Bucket, DATA_EXT, DIR, Entry, META_EXT, TMP_EXT, meta, remove_if_present};
use crate::backend::{Held, Recovered, check_record, read_len};
use crate::record;
use mooring_proto::disk::IoBuf;

/// Why a file or value found by recovery is not kept.
type Damage = String;

impl Bucket {
    /// [`Backend::recover`](crate::Backend::recover).
    pub(super) async fn recover_all(&self) -> io::Result<Recovered> {
        let mut found = Recovered::default();
        let mut data_ids = BTreeSet::new();
        let mut meta_ids = BTreeSet::new();
        let mut max_id = 0;
        for name in self.disk.list().await? {
            let Some((id, ext)) = parse_name(&name) else {
                continue; // not ours
            };
            max_id = max_id.max(id);
            match ext {
                TMP_EXT => {
                    self.drop_file(&mut found, &name, "an unfinished meta write".into())
                        .await?
                }
                DATA_EXT => _ = data_ids.insert(id),
                _ => _ = meta_ids.insert(id),
            }
        }
        let mut buckets: BTreeMap<u64, Vec<meta::MetaEntry>> = BTreeMap::new();
        let mut dirty = BTreeSet::new();
        for &id in data_ids.union(&meta_ids) {
            let data = Self::data_name(id);
            if !meta_ids.contains(&id) {
                let why = "no meta: an unfinished bucket write".to_string();
                self.drop_file(&mut found, &data, why).await?;
                continue;
            }
            let entries = match self.read_meta(id).await? {
                Ok(entries) => entries,
                Err(why) => {
                    // Meta first: a crash in between leaves a data file without a meta.
                    self.drop_file(&mut found, &Self::meta_name(id), why.clone())
                        .await?;
                    if data_ids.contains(&id) {
                        self.drop_file(&mut found, &data, why).await?;
                    }
                    continue;
                }
            };
            let data_len = match self.disk.len(&data).await {
                Ok(len) => len,
                Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                Err(e) => return Err(e),
            };
            let mut kept = Vec::with_capacity(entries.len());
            for entry in entries {
                match self.check_entry(&data, data_len, &entry).await? {
                    Ok(()) => kept.push(entry),
                    Err(why) => {
                        warn!(key = %entry.key, file = %data, "dropping on recovery: {why}");
                        found
                            .dropped
                            .push((format!("{} in {data}", entry.key), why));
                        dirty.insert(id);
                    }
                }
            }
            buckets.insert(id, kept);
        }
        drop_superseded(&mut buckets, &mut dirty, &mut found);
        for id in dirty {
            let entries = buckets.get(&id).map_or(&[][..], Vec::as_slice);
            if entries.is_empty() {
                self.delete_bucket(id).await?;
                buckets.remove(&id);
            } else {
                let bytes = meta::encode(id, entries, self.disk.alignment());
                self.write_meta(id, bytes).await?;
            }
        }
        self.install(&buckets, &mut found);
        self.next_id.store(max_id + 1, Ordering::Relaxed);
        self.recovered.store(true, Ordering::Release);
        info!(
            buckets = buckets.len(),
            objects = found.objects.len(),
            dropped = found.dropped.len(),
            "bucket backend recovered"
        );
        Ok(found)
    }

    /// Fills the index with the recovered buckets and lists their values.
    fn install(&self, buckets: &BTreeMap<u64, Vec<meta::MetaEntry>>, found: &mut Recovered) {
        let mut index = self.lock();
        for (&id, entries) in buckets {
            let mut live = BTreeSet::new();
            for e in entries {
                let entry = Entry::of(id, e);
                index.keys.insert(e.key.clone(), entry);
                live.insert(e.key.clone());
                found.objects.push(Held {
                    key: e.key.clone(),
                    version: e.version,
                    len: e.value_len,
                    checksum: e.checksum,
                    unit: id,
                });
            }
            index.buckets.insert(id, live);
        }
    }

    /// Bucket `id`'s meta entries, or why the meta is damaged. Errors are I/O failures.
    async fn read_meta(&self, id: u64) -> io::Result<Result<Vec<meta::MetaEntry>, Damage>> {
        let name = Self::meta_name(id);
        let len = self.disk.len(&name).await?;
        let Ok(len) = usize::try_from(len) else {
            return Ok(Err(format!("meta of {len} bytes is too large")));
        };
        let buf = IoBuf::new(len, self.disk.alignment());
        let (buf, read) = self.disk.read_at(&name, 0, buf).await;
        let n = read?;
        Ok(meta::decode(&buf[..n.min(len)], id).map_err(|why| format!("damaged meta: {why}")))
    }

    /// Reads the record `entry` points at and checks it. Errors are I/O failures.
    async fn check_entry(
        &self,
        data: &str,
        data_len: u64,
        entry: &meta::MetaEntry,
    ) -> io::Result<Result<(), Damage>> {
        let a = self.disk.alignment() as u64;
        let record_len = (record::HEADER_LEN + entry.key.len()) as u64;
        let end = record_len
            .checked_add(entry.value_len)
            .and_then(|len| len.checked_add(entry.offset));
        match end {
            _ if !entry.offset.is_multiple_of(a) => {
                return Ok(Err(format!("offset {} is not aligned", entry.offset)));
            }
            Some(end) if end <= data_len => {}
            _ => {
                return Ok(Err(format!(
                    "torn record: the data file ends at {data_len}, before the record's end"
                )));
            }
        }
        let len = read_len(&entry.key, entry.value_len, a as usize);
        let mut buf = IoBuf::new(len, a as usize);
        buf.set_len(len);
        let (buf, read) = self.disk.read_at(data, entry.offset, buf).await;
        let n = read?;
        Ok(check_record(&buf[..n], &entry.key, entry.version, data)
            .map(|_| ())
            .map_err(|e| e.to_string()))
    }

    async fn drop_file(&self, found: &mut Recovered, name: &str, why: Damage) -> io::Result<()> {
        warn!(file = %name, "dropping on recovery: {why}");
        remove_if_present(self.disk.as_ref(), name).await?;
        found.dropped.push((name.to_string(), why));
        Ok(())
    }
}

/// Bucket id and extension of one of our file names.
fn parse_name(name: &str) -> Option<(u64, &'static str)> {
    let file = name.strip_prefix(DIR)?.strip_prefix('/')?;
    let (stem, ext) = [TMP_EXT, DATA_EXT, META_EXT]
        .into_iter()
        .find_map(|ext| Some((file.strip_suffix(ext)?, ext)))?;
    if stem.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(stem, 16).ok()?, ext))
}

/// Where two buckets hold the same key (a crash between a new bucket's commit and the old
/// entry's removal), keeps the higher version (the later bucket on a tie) and drops the other.
fn drop_superseded(
    buckets: &mut BTreeMap<u64, Vec<meta::MetaEntry>>,
    dirty: &mut BTreeSet<u64>,
    found: &mut Recovered,
) {
    let mut best: HashMap<&str, (u64, u64)> = HashMap::new();
    for (&id, entries) in buckets.iter() {
        for e in entries {
            let held = best.entry(&e.key).or_insert((e.version, id));
            *held = (*held).max((e.version, id));
        }
    }
    let best: HashMap<String, (u64, u64)> =
        best.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    for (&id, entries) in buckets.iter_mut() {
        entries.retain(|e| {
            let (version, bucket) = best[&e.key];
            if bucket == id {
                return true;
            }
            let why = format!("superseded by write {version} in bucket {bucket:016x}");
            info!(key = %e.key, bucket = id, "dropping on recovery: {why}");
            found
                .dropped
                .push((format!("{} in {}", e.key, Bucket::data_name(id)), why));
            dirty.insert(id);
            false
        });
    }
}
