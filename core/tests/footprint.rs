//! Metadata footprint: at most 100 bytes per resident object, key bytes excluded, measured by
//! counting every heap byte the master allocates (not by estimating); and at most 100 bytes
//! per directory entry of a peer's shard, measured the same way.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use mooring_core::peer::directory::{DirectoryShard, Location, Stamp};

use mooring_core::{
    Checksum, ClientId, Master, MasterConfig, Millis, ReplicateConfig, SegmentSpec,
};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
/// One measure at a time: the counter is the whole process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

#[test]
fn at_most_100_bytes_of_metadata_per_object() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let objects: usize = if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    };
    let client = ClientId(1);
    let now = Millis(1);
    let before = LIVE.load(Ordering::Relaxed);
    let mut master = Master::new(MasterConfig::default()).unwrap();
    for s in 0..16u64 {
        let spec = SegmentSpec {
            name: format!("node{s}"),
            base: s << 44,
            size: 1 << 40,
            endpoint: format!("10.0.0.{s}:7000"),
            key: 7,
            rdma_key: None,
        };
        master.mount_segment(client, &spec, now).unwrap();
    }
    let config = ReplicateConfig::single();
    let mut key_bytes = 0;
    for i in 0..objects {
        let key = format!("kv/model-7b/tp0/layer-{:02}/block-{i:09}", i % 32);
        key_bytes += key.len();
        let g = master
            .put_start(client, &key, 64 * 1024, &config, now)
            .unwrap();
        master
            .put_end(client, &key, g.write_id, Checksum::of(key.as_bytes()), now)
            .unwrap();
        // As every driver does after each call: what is reported is not kept by the master.
        master.drain_key_changes();
    }
    let total = LIVE.load(Ordering::Relaxed) - before;
    let per_object = (total - key_bytes) as f64 / objects as f64;
    assert!(
        per_object <= 100.0,
        "{per_object:.1} bytes of metadata per object ({total} total, {key_bytes} of keys)"
    );
    // Keep the number visible in the test log for the issue note.
    assert!(per_object > 60.0, "implausibly small: {per_object:.1}");
    std::hint::black_box(&master);
    let reported = master.metadata_heap_bytes() as f64 / objects as f64;
    assert!(
        (reported - per_object).abs() < 16.0,
        "metadata_heap_bytes {reported:.1} vs measured {per_object:.1}"
    );
}

#[test]
fn at_most_100_bytes_per_directory_entry() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let entries: usize = if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    };
    let peers: Vec<String> = (0..64)
        .map(|i| format!("10.0.{}.{}:7000", i / 8, i % 8))
        .collect();
    let before = LIVE.load(Ordering::Relaxed);
    let mut shard = DirectoryShard::new();
    let mut key_bytes = 0;
    for i in 0..entries {
        let key = format!("kv/model-7b/tp0/layer-{:02}/block-{i:09}", i % 32);
        key_bytes += key.len();
        let peer = &peers[i % peers.len()];
        let location = Location {
            peer: peer.as_str().into(),
            offset: (i as u64) << 16,
            len: 64 * 1024,
            stamp: Stamp {
                clock: i as u64,
                writer: i as u64 % 64,
            },
            checksum: Checksum(i as u32),
            resident: true,
        };
        shard.publish(peer, &key, location, true).unwrap();
    }
    let total = LIVE.load(Ordering::Relaxed) - before;
    let per_entry = (total - key_bytes) as f64 / entries as f64;
    assert!(
        per_entry <= 100.0,
        "{per_entry:.1} bytes per directory entry ({total} total, {key_bytes} of keys)"
    );
    assert!(per_entry > 40.0, "implausibly small: {per_entry:.1}");
    let reported = (shard.heap_bytes() - key_bytes) as f64 / entries as f64;
    assert!(
        (reported - per_entry).abs() < 8.0,
        "heap_bytes {reported:.1} vs measured {per_entry:.1}"
    );
    std::hint::black_box(&shard);
}
