//! Criterion benchmark of value checksums: `mooring-crc` (folding beside three `crc32`
//! streams) against the `crc32c` crate (the `crc32` instruction alone), on a 128 KiB piece
//! (what a transfer hands the summing helper at a time, in cache) and a 4 MiB value.
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
        group.bench_function("crc32c crate", |b| {
            b.iter(|| crc32c::crc32c(black_box(bytes)))
        });
        group.finish();
    }
}

criterion_group!(benches, checksums);
criterion_main!(benches);
