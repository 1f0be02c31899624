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
