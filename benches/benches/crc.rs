//! Criterion benchmark of value checksums: `mooring-crc` (folding beside three `crc32`
//! streams) against the `crc32c` crate (the `crc32` instruction alone), on a 128 KiB piece
//! (what a transfer hands the summing helper at a time, in cache) and a 4 MiB value; and a
//! copy that is summed, as a same-host read makes one: 1 MiB values from a source too large
//! for the caches (like a segment) into a 32 MiB batch of destinations, copied alone, copied
//! then summed piece by piece while each piece is in cache, and copied and summed in one pass
//! (`mooring_crc::copy_append`), and that copy shared with the process's helper thread
//! (`mooring_proto::striped`, as same-host puts and gets of large values make it); the rows
//! "from the source" sum from the source, as a write into shared memory does.
//!
//! Run: `cargo bench -p mooring-benches --bench crc`. Throughput is reported in bytes/s.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn checksums(c: &mut Criterion) {
    let value: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for len in [128 << 10, 4 << 20] {
        let bytes = &value[..len];
        let mut group = c.benchmark_group(format!("crc32c {} KiB", len >> 10));
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function("mooring-crc", |b| {
            b.iter(|| mooring_crc::append(0, black_box(bytes)))
        });
        if mooring_crc::x86::available() {
            group.bench_function("mooring-crc 256-bit engine", |b| {
                b.iter(|| mooring_crc::x86::append(0, black_box(bytes)))
            });
        }
        group.bench_function("crc32c crate", |b| {
            b.iter(|| crc32c::crc32c(black_box(bytes)))
        });
        group.finish();
    }
}

fn copies(c: &mut Criterion) {
    const VALUE: usize = 1 << 20;
    let source: Vec<u8> = (0..256u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut batch = vec![0u8; 32 * VALUE];
    let mut group = c.benchmark_group("copy 1 MiB from a cold source");
    group.throughput(Throughput::Bytes(VALUE as u64));
    let mut next = 0usize;
    // The next value's source and destination: the source walks all of `source`, so each
    // value comes from memory, not cache.
    let mut step = || {
        let at = next % (source.len() / VALUE);
        next += 1;
        (at * VALUE, (next % 32) * VALUE)
    };
    group.bench_function("copy", |b| {
        b.iter(|| {
            let (from, to) = step();
            batch[to..to + VALUE].copy_from_slice(&source[from..from + VALUE]);
        })
    });
    type CopySum = unsafe fn(u32, *const u8, *mut u8, usize, mooring_crc::Own) -> u32;
    let read = mooring_crc::Own::Destination;
    let write = mooring_crc::Own::Source;
    /// [`mooring_proto::striped::copy_summed`] in the shape of the others (it starts from 0).
    unsafe fn striped(
        _: u32,
        src: *const u8,
        dst: *mut u8,
        len: usize,
        own: mooring_crc::Own,
    ) -> u32 {
        // SAFETY: the caller's promise, passed on.
        unsafe { mooring_proto::striped::copy_summed(src, dst, len, own) }
    }
    let ways: [(&str, CopySum, mooring_crc::Own); 6] = [
        (
            "copy, then sum each piece",
            mooring_crc::copy_then_sum,
            read,
        ),
        ("copy and sum in one pass", mooring_crc::copy_append, read),
        (
            "copy and sum in one pass, from the source (a write)",
            mooring_crc::copy_append,
            write,
        ),
        (
            "copy, then sum each piece from the source (a write)",
            mooring_crc::copy_then_sum,
            write,
        ),
        (
            "copy and sum in one pass, shared with the helper thread",
            striped,
            read,
        ),
        (
            "copy and sum in one pass from the source, shared with the helper thread",
            striped,
            write,
        ),
    ];
    for (name, copy_sum, own) in ways {
        group.bench_function(name, |b| {
            b.iter(|| {
                let (from, to) = step();
                // SAFETY: `source[from..]` has VALUE readable bytes, apart from `batch`.
                black_box(unsafe {
                    copy_sum(
                        0,
                        source[from..].as_ptr(),
                        batch[to..].as_mut_ptr(),
                        VALUE,
                        own,
                    )
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, checksums, copies);
criterion_main!(benches);
