#[allow(unused_imports)]
use mooring_benches::malloc_conf as _;
use mooring_benches::{filled_master, key};
use mooring_core::{MasterConfig, rng::Rng};
use std::time::Instant;

fn main() {
    let (mut m, now) = filled_master(MasterConfig::default(), 64, 64u64 << 40, 1_000_000);
    let mut rng = Rng::seeded(11);
    let lookups: Vec<String> = (0..1 << 16).map(|_| key(rng.below(1_000_000))).collect();
    for round in 0..3 {
        let t = Instant::now();
        let mut n = 0u64;
        for k in lookups.iter().cycle().take(2_000_000) {
            n += m.get_size(k).unwrap();
        }
        let size_ns = t.elapsed().as_nanos() as f64 / 2e6;
        let t = Instant::now();
        for k in lookups.iter().cycle().take(2_000_000) {
            n += m.get_replica_list(k, now).unwrap().replicas.len() as u64;
        }
        let get_ns = t.elapsed().as_nanos() as f64 / 2e6;
        let t = Instant::now();
        for k in lookups.iter().cycle().take(2_000_000) {
            n += m.exist(k, now).unwrap() as u64;
        }
        let exist_ns = t.elapsed().as_nanos() as f64 / 2e6;
        let t = Instant::now();
        for _ in 0..2_000_000 {
            n += m.get_replica_list(&lookups[0], now).unwrap().replicas.len() as u64;
        }
        let hot_ns = t.elapsed().as_nanos() as f64 / 2e6;
        let t = Instant::now();
        for _ in 0..2_000_000 {
            n += m.get_size(&lookups[0]).unwrap();
        }
        let hot_size_ns = t.elapsed().as_nanos() as f64 / 2e6;
        let seq: Vec<String> = (0..1 << 16).map(|i| key(i * 15 % 1_000_000)).collect();
        let t = Instant::now();
        for k in seq.iter().cycle().take(2_000_000) {
            n += m.get_size(k).unwrap();
        }
        let seq_ns = t.elapsed().as_nanos() as f64 / 2e6;
        eprintln!("strided get_size {seq_ns:.0} ns");
        eprintln!("hot get {hot_ns:.0} ns, hot size {hot_size_ns:.0} ns");
        eprintln!(
            "round {round}: get_size {size_ns:.0} ns, get_replica_list {get_ns:.0} ns, exist {exist_ns:.0} ns ({n})"
        );
    }
}
