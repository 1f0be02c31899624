//! A small demonstration of the core deciding a prefill/decode workload: model weights are
//! hard-pinned, a system prompt is soft-pinned, KV-cache blocks stream in past capacity and
//! are evicted least-recently-used first, a weight shard is upserted while a reader holds it,
//! and a crashed writer's half-finished put is cleaned up.
//!
//! Run: `cargo run --release -p mooring-core --example demo`

#![allow(clippy::print_stdout)]

use mooring_core::{
    Checksum, ClientId, Event, Master, MasterConfig, Millis, ReplicateConfig, SegmentSpec,
    invariants,
};

const MIB: u64 = 1 << 20;

/// The checksum a client would compute over the value it wrote; this demo moves no bytes, so
/// it names each value by its key.
fn sum(key: &str) -> Checksum {
    Checksum::of(key.as_bytes())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut master = Master::new(MasterConfig::default())?;
    let mut now = Millis(0);
    let (node_a, node_b) = (ClientId(0xA), ClientId(0xB));
    let (prefill, decode) = (ClientId(0x1), ClientId(0x2));
    for (node, name) in [(node_a, "node-a:7000"), (node_b, "node-b:7000")] {
        let spec = SegmentSpec {
            name: name.into(),
            base: 1 << 40,
            size: 256 * MIB,
            endpoint: name.into(),
            key: 7,
            rdma_key: None,
        };
        master.mount_segment(node, &spec, now)?;
    }
    println!("mounted 2 segments, {} MiB", master.stats().capacity / MIB);

    // Weights: hard-pinned, two replicas each.
    let weights = ReplicateConfig::replicas(2).hard_pinned();
    for shard in 0..4 {
        let key = format!("llama/weights/shard-{shard}");
        let grant = master.put_start(prefill, &key, 16 * MIB, &weights, now)?;
        master.put_end(prefill, &key, grant.write_id, sum(&key), now)?;
    }
    let prompt = "llama/system-prompt/kv";
    let grant = master.put_start(
        prefill,
        prompt,
        4 * MIB,
        &ReplicateConfig::single().soft_pinned(None),
        now,
    )?;
    master.put_end(prefill, prompt, grant.write_id, sum(prompt), now)?;
    println!("stored 4 hard-pinned weight shards (2 replicas) and a soft-pinned system prompt");

    // Prefill writes KV blocks; decode reads each one shortly after.
    let mut evicted = 0;
    for block in 0..400 {
        now = now + Millis(50);
        let key = format!("llama/req-{}/kv-block-{block}", block / 16);
        let grant = master.put_start(prefill, &key, 2 * MIB, &ReplicateConfig::single(), now)?;
        master.put_end(prefill, &key, grant.write_id, sum(&key), now)?;
        master.get_replica_list(&key, now + Millis(5))?;
        for client in [node_a, node_b, prefill, decode] {
            master.heartbeat(client, now);
        }
        master.tick(now);
        evicted += master
            .drain_events()
            .iter()
            .filter(|e| matches!(e, Event::Evicted { .. }))
            .count();
    }
    let stats = master.stats();
    println!(
        "wrote 400 KV blocks of 2 MiB: {} objects resident, {evicted} evicted, {:.0}% full",
        stats.objects,
        100.0 * stats.used as f64 / stats.capacity as f64
    );
    for shard in 0..4 {
        master.get_replica_list(&format!("llama/weights/shard-{shard}"), now)?;
    }
    master.get_replica_list(prompt, now)?;
    println!("all weight shards and the system prompt survived eviction");

    // Upsert a weight shard while decode is reading it: fresh buffers, old bytes kept.
    let reading = master.get_replica_list("llama/weights/shard-0", now)?;
    let grant = master.upsert_start(prefill, "llama/weights/shard-0", 16 * MIB, &weights, now)?;
    let moved = grant.replicas[0].addr != reading.replicas[0].addr;
    let shard = "llama/weights/shard-0";
    master.upsert_end(prefill, shard, grant.write_id, sum(shard), now)?;
    println!(
        "upserted shard-0 while it was being read: new buffers = {moved} (the reader's bytes stay intact)"
    );

    // A writer that crashes mid-put: the key is free again after the discard timeout.
    master.put_start(
        decode,
        "llama/req-crash/kv-block-0",
        2 * MIB,
        &ReplicateConfig::single(),
        now,
    )?;
    now = now + Millis::from_secs(31);
    for client in [node_a, node_b, prefill] {
        master.heartbeat(client, now);
    }
    master.tick(now);
    let cleaned = master
        .drain_events()
        .iter()
        .any(|e| matches!(e, Event::WriteDiscarded { .. }));
    println!("a crashed writer's put was discarded after the timeout: {cleaned}");

    invariants::check(&master)?;
    let snapshot = master.snapshot();
    let restored = Master::restore(MasterConfig::default(), &snapshot, Millis(0))?;
    println!(
        "snapshot: {} KiB; restored {} objects; invariants hold",
        snapshot.len() / 1024,
        restored.stats().objects
    );
    Ok(())
}
