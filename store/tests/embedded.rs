//! The library end to end, in one process: a master, nodes and clients over real loopback TCP.

use mooring::{EmbeddedCluster, EmbeddedConfig};
use mooring_core::{ErrorCode, MasterConfig, Millis, ReplicateConfig};

fn value(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) >> 3) as u8)
        .collect()
}

async fn cluster(local_memcpy: bool) -> EmbeddedCluster {
    EmbeddedCluster::start(EmbeddedConfig {
        nodes: 3,
        node_size: 32 << 20,
        local_memcpy,
        master: MasterConfig {
            lease_ttl: Millis(300),
            ..MasterConfig::default()
        },
        ..EmbeddedConfig::default()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_over_tcp_and_memcpy() {
    for memcpy in [false, true] {
        let cluster = cluster(memcpy).await;
        let client = cluster.client().await.unwrap();
        for (i, len) in [1usize, 100, 4096, 65_537, 3 << 20].into_iter().enumerate() {
            let key = format!("k{i}");
            let v = value(i as u64, len);
            client
                .put(&key, &v, &ReplicateConfig::replicas(2))
                .await
                .unwrap();
            assert_eq!(
                client.get(&key).await.unwrap(),
                v,
                "len {len} memcpy {memcpy}"
            );
            let mut buf = vec![0u8; len + 10];
            assert_eq!(client.get_into(&key, &mut buf).await.unwrap(), len);
            assert_eq!(&buf[..len], &v[..]);
        }
        let e = client
            .put("k0", b"x", &ReplicateConfig::single())
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::OBJECT_ALREADY_EXISTS);
        client
            .upsert("k0", b"new", &ReplicateConfig::single())
            .await
            .unwrap();
        assert_eq!(client.get("k0").await.unwrap(), b"new");
        let mut small = [0u8; 2];
        assert_eq!(
            client.get_into("k0", &mut small).await.unwrap_err().code,
            ErrorCode::BUFFER_OVERFLOW
        );
        assert_eq!(
            client.get("nope").await.unwrap_err().code,
            ErrorCode::OBJECT_NOT_FOUND
        );
        cluster.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_metadata() {
    let cluster = cluster(false).await;
    let client = cluster.client().await.unwrap();
    let values: Vec<Vec<u8>> = (0..32).map(|i| value(i, 1000 + i as usize * 100)).collect();
    let keys: Vec<String> = (0..32).map(|i| format!("batch/{i}")).collect();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .map(|k| k.as_str())
        .zip(values.iter().map(|v| v.as_slice()))
        .collect();
    for r in client
        .batch_put(&items, &ReplicateConfig::replicas(2))
        .await
    {
        r.unwrap();
    }
    let key_refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    let got = client.batch_get(&key_refs).await;
    for (g, v) in got.iter().zip(&values) {
        assert_eq!(g.as_ref().unwrap(), v);
    }
    let mut bufs: Vec<Vec<u8>> = values.iter().map(|v| vec![0; v.len()]).collect();
    let mut into: Vec<(&str, &mut [u8])> = key_refs
        .iter()
        .copied()
        .zip(bufs.iter_mut().map(|b| &mut b[..]))
        .collect();
    for (r, v) in client
        .batch_get_into(&mut into)
        .await
        .into_iter()
        .zip(&values)
    {
        assert_eq!(r.unwrap(), v.len());
    }
    assert_eq!(bufs, values);
    let exists = client.batch_exist(&["batch/0", "missing"]).await.unwrap();
    assert_eq!(
        (exists[0].clone().unwrap(), exists[1].clone().unwrap()),
        (true, false)
    );
    assert!(client.exist("batch/3").await.unwrap());
    assert_eq!(client.get_size("batch/5").await.unwrap(), 1500);
    let listed = client.query("^batch/1").await.unwrap();
    assert_eq!(listed.len(), 11);
    assert!(listed.iter().all(|k| k.replicas == 2));
    assert_eq!(
        client.remove("batch/0").await.unwrap_err().code,
        ErrorCode::OBJECT_HAS_LEASE
    );
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.objects, 32);
    assert_eq!(client.segments().await.unwrap().len(), 3);
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_reads_release_their_hold() {
    let cluster = cluster(false).await;
    let client = cluster.client().await.unwrap();
    let v = value(7, 200_000);
    client
        .put("held", &v, &ReplicateConfig::replicas(2))
        .await
        .unwrap();
    assert_eq!(client.get_held("held").await.unwrap(), v);
    assert_eq!(
        client.get_held("missing").await.unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    // The hold is gone with the read; the lease it granted ends after its TTL (300 ms).
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.holds, 0, "the read released its hold");
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    client.remove("held").await.unwrap();
    assert_eq!(
        client.get("held").await.unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
}

/// A batch reads the values it read lately where it read them, alongside asking the master,
/// and keeps those bytes only while the master names the same value: an upsert between two
/// batches (inside the first one's lease, so the old bytes are still in place) is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sees_an_upsert_of_a_value_it_read_lately() {
    let cluster = EmbeddedCluster::start(EmbeddedConfig {
        nodes: 2,
        node_size: 32 << 20,
        local_memcpy: false,
        master: MasterConfig {
            lease_ttl: Millis(2_000),
            ..MasterConfig::default()
        },
        ..EmbeddedConfig::default()
    })
    .await
    .unwrap();
    let writer = cluster.client().await.unwrap();
    let reader = cluster.client().await.unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("lately/{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (i, key) in keys.iter().enumerate() {
        let v = value(i as u64, 4096);
        writer
            .put(key, &v, &ReplicateConfig::single())
            .await
            .unwrap();
    }
    let expect = |values: Vec<mooring_core::Result<Vec<u8>>>, changed: &[usize], round: u64| {
        for (i, got) in values.into_iter().enumerate() {
            let seed = if changed.contains(&i) {
                100 + round * 10 + i as u64
            } else {
                i as u64
            };
            assert_eq!(got.unwrap(), value(seed, 4096), "key {i}, round {round}");
        }
    };
    // Remembered by single gets and by a batch, then read again unchanged.
    for key in &keys[..4] {
        reader.get(key).await.unwrap();
    }
    expect(reader.batch_get(&refs).await, &[], 0);
    expect(reader.batch_get(&refs).await, &[], 0);
    // New values of the same size: fresh buffers, as the reader's lease is on, so the old
    // bytes are still where the reader read them.
    for round in 1..=2u64 {
        for i in [1usize, 5] {
            let v = value(100 + round * 10 + i as u64, 4096);
            writer
                .upsert(&keys[i], &v, &ReplicateConfig::single())
                .await
                .unwrap();
        }
        expect(reader.batch_get(&refs).await, &[1, 5], round);
        let mut buffers = vec![vec![0u8; 8192]; keys.len()];
        let mut items: Vec<(&str, &mut [u8])> = refs
            .iter()
            .copied()
            .zip(buffers.iter_mut().map(Vec::as_mut_slice))
            .collect();
        let lens = reader.batch_get_into(&mut items).await;
        for (i, len) in lens.into_iter().enumerate() {
            assert_eq!(len.unwrap(), 4096);
            let seed = if [1, 5].contains(&i) {
                100 + round * 10 + i as u64
            } else {
                i as u64
            };
            assert_eq!(
                &buffers[i][..4096],
                &value(seed, 4096)[..],
                "key {i}, round {round}"
            );
        }
    }
    // A value of another size: the remembered length no longer fits the list.
    let longer = value(7, 8000);
    writer
        .upsert(&keys[2], &longer, &ReplicateConfig::single())
        .await
        .unwrap();
    let got = reader.batch_get(&refs).await;
    assert_eq!(got[2].as_ref().unwrap(), &longer);
    cluster.shutdown().await.unwrap();
}
