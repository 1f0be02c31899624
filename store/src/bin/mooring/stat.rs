//! `mooring stat`: the master's counters and census, and each segment's use, as a table or
//! as JSON.

use mooring_core::Error;

use super::args::StatArgs;
use super::shell::with_client;

pub(crate) async fn run_stat(args: StatArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let report = client.report().await?;
        let segments = client.segments().await?;
        if args.json {
            out!("{}", mooring::ops::metrics::stats_json(&report, &segments));
            return Ok(());
        }
        let (s, c) = (&report.stats, &report.census);
        let pct = if s.capacity == 0 {
            0.0
        } else {
            100.0 * s.used as f64 / s.capacity as f64
        };
        out!("objects        {} ({} being written)", s.objects, s.writing);
        out!(
            "memory         {} of {} bytes used ({pct:.1}%)",
            s.used,
            s.capacity
        );
        out!(
            "by state       {} complete, {} hard-pinned, {} soft-pinned, {} leased, {} held, {} only on disk",
            c.complete,
            c.hard_pinned,
            c.soft_pinned,
            c.leased,
            c.held,
            c.disk_only
        );
        out!(
            "values         {} bytes in memory (every replica), {} bytes on disk",
            c.memory_bytes,
            c.disk_bytes
        );
        out!(
            "reads          {} from memory, {} from disk, {} misses",
            s.reads.memory,
            s.reads.disk,
            s.reads.misses
        );
        out!("segments       {}", s.segments);
        out!("clients        {}", s.clients);
        out!("held reads     {}", s.holds);
        out!("copy tasks     {}", s.tasks);
        out!(
            "evicted        {} objects, {} bytes ({} live on on disk)",
            s.evicted_objects,
            s.evicted_bytes,
            s.evicted_to_disk
        );
        out!(
            "discarded      {} unfinished writes ({} blocks awaiting release)",
            s.discarded_writes,
            s.discarded_blocks
        );
        out!(
            "lost           {} objects (their last node went away)",
            s.lost_objects
        );
        out!(
            "upserts        {} new keys, {} in place, {} copied beside readers, {} resized",
            s.upserts.created,
            s.upserts.in_place,
            s.upserts.copied,
            s.upserts.resized
        );
        out!(
            "disk           {} objects with a disk copy, {} copies recorded, {} awaiting deletion",
            s.disk_replicas,
            s.disk_copies_recorded,
            s.disk_tombstones
        );
        out!(
            "prefetches     {} started, {} found no memory",
            s.prefetches,
            s.prefetch_failures
        );
        out!(
            "repairs        {} objects waiting for replicas lost with a segment",
            s.repairs_waiting
        );
        if s.events_dropped > 0 {
            out!(
                "events dropped {} (the master fell behind logging them)",
                s.events_dropped
            );
        }
        for seg in segments {
            out!(
                "  {:<24} {:>14} / {:<14} {}",
                seg.name,
                seg.used,
                seg.size,
                seg.endpoint
            );
        }
        Ok(())
    })
    .await
}
