//! The zero-copy calls' batches: values stored from registered memory and read into it, part
//! by part or fragment by fragment, each region checked to lie inside a registered buffer.

use mooring_core::{Error, ErrorCode, Result};
use mooring_device::pipeline::copy_to_device;
use pyo3::prelude::*;

use super::NativeClient;
use super::args::{ConfigArgs, code_of, replicate_config};
use super::device::{DeviceGroup, Placement, add_to_group, placement};
use crate::block_on;
use crate::errors::{invalid, log_failure, raise};
use crate::values::{Region, disjoint};

impl NativeClient {
    /// `size` bytes at `ptr`, if they lie inside one registered buffer.
    pub(super) fn region(&self, ptr: usize, size: usize) -> Result<Region> {
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

    /// The body of [`NativeClient::batch_put_from`].
    pub(super) fn put_from_parts(
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
        let mut on_devices: Vec<DeviceGroup> = Vec::new();
        for i in 0..keys.len() {
            let regions = self
                .part_regions(&ptrs[i], &sizes[i])
                .and_then(|r| placement(&r).map(|p| (r, p)));
            match regions {
                Ok((regions, Placement::Device)) => {
                    add_to_group(&mut on_devices, i, &regions);
                    sources.push(None);
                    gathered_at.push(None);
                    early.push(None);
                }
                Ok((regions, Placement::Host)) if regions.len() == 1 => {
                    sources.push(Some(regions[0].clone()));
                    gathered_at.push(None);
                    early.push(None);
                }
                Ok((regions, Placement::Host)) => {
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
        let (results, from_devices) = block_on(py, async {
            let results = if items.is_empty() {
                Vec::new()
            } else {
                self.client.batch_write(&items, &config, upsert, true).await
            };
            let from_devices = self
                .put_from_devices(&keys, &on_devices, &config, upsert)
                .await;
            (results, from_devices)
        });
        let mut codes: Vec<i64> = (0..keys.len())
            .map(|i| match (&early[i], slot_of[i]) {
                (Some(e), _) => {
                    log_failure("batch_put_from", e);
                    i64::from(e.code.code())
                }
                (None, Some(slot)) => code_of(&results[slot], |_| 0, "batch_put_from"),
                (None, None) => i64::from(ErrorCode::INTERNAL_ERROR.code()),
            })
            .collect();
        for (i, result) in from_devices {
            codes[i] = code_of(&result, |_| 0, "batch_put_from");
        }
        Ok(codes)
    }

    /// The body of [`NativeClient::batch_get_into`].
    pub(super) fn get_into_parts(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<Vec<usize>>,
        sizes: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        let mut regions: Vec<Result<Vec<Region>>> = (0..keys.len())
            .map(|i| {
                let parts = self.part_regions(&ptrs[i], &sizes[i])?;
                placement(&parts)?;
                Ok(parts)
            })
            .collect();
        let all: Vec<Region> = regions
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .flatten()
            .cloned()
            .collect();
        if let Err(e) = disjoint(&all) {
            for r in regions.iter_mut() {
                if r.is_ok() {
                    *r = Err(e.clone());
                }
            }
        }
        let mut into_devices: Vec<DeviceGroup> = Vec::new();
        let mut on_device = vec![false; keys.len()];
        for (i, r) in regions.iter().enumerate() {
            if let Ok(parts) = r
                && parts.first().is_some_and(|p| p.device().is_some())
            {
                add_to_group(&mut into_devices, i, parts);
                on_device[i] = true;
            }
        }
        let mut scratch: Vec<Vec<u8>> = Vec::new();
        let mut items: Vec<(&str, &mut [u8])> = Vec::new();
        let mut slot_of: Vec<Option<usize>> = vec![None; keys.len()];
        let mut scratch_of: Vec<Option<usize>> = vec![None; keys.len()];
        for (i, r) in regions.iter().enumerate() {
            if on_device[i] {
                continue;
            }
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
            if on_device[i] {
                continue;
            }
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
        let (results, into_devices) = block_on(py, async {
            let results = if items.is_empty() {
                Vec::new()
            } else {
                self.client.batch_get_into(&mut items).await
            };
            (results, self.get_into_devices(&keys, &into_devices).await)
        });
        drop(items);
        let mut codes: Vec<i64> = (0..keys.len())
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
            .collect();
        for (i, result) in into_devices {
            codes[i] = code_of(&result, |&n| n as i64, "batch_get_into");
        }
        codes
    }

    /// The body of [`NativeClient::get_into_ranges`].
    pub(super) fn get_into_fragments(
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
                        let fragment = &value[src..src + len];
                        if let Some(pool) = region.device() {
                            copy_to_device(pool, &[(region.start(), fragment)])?;
                            return Ok(len as i64);
                        }
                        // SAFETY: a fragment's copy is the only live slice of its bytes.
                        let dest = unsafe { region.bytes_mut() };
                        dest.copy_from_slice(fragment);
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
}
