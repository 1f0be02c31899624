//! The staging pipeline over the software device model: values put from device memory and
//! read back into it, wave by wave, with the overlap, the bounded pool and every failure the
//! model can be told to cause.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Result};
use mooring_device::model::ModelDevice;
use mooring_device::pool::SLABS;
use mooring_device::{GetInto, Part, PutFrom, StagingPool, get_into, put_from};

/// A store in memory standing in for the cluster, keyed by batch index. It records how many
/// copy jobs the model had started each time a wave arrived, to see the overlap.
#[derive(Default)]
struct Store {
    values: Mutex<HashMap<usize, Vec<u8>>>,
    started_at_put: Mutex<Vec<u64>>,
    refuse: Option<usize>,
    model: Option<Arc<ModelDevice>>,
    hang: bool,
    /// Batches begun: one per call, however many waves it takes.
    begins: Mutex<u64>,
}

impl PutFrom for Store {
    /// The values sent and not yet ended.
    type Batch = HashMap<usize, Vec<u8>>;

    async fn begin(&self, _items: &[(usize, u64)]) -> Self::Batch {
        *self.begins.lock().unwrap() += 1;
        HashMap::new()
    }

    async fn send(&self, batch: &mut Self::Batch, items: &[(usize, &[u8])]) -> Vec<Result<()>> {
        if let Some(model) = &self.model {
            self.started_at_put.lock().unwrap().push(model.started());
        }
        if self.hang {
            std::future::pending::<()>().await;
        }
        items
            .iter()
            .map(|&(i, bytes)| {
                if self.refuse == Some(i) {
                    return Err(Error::new(ErrorCode::NO_AVAILABLE_HANDLE, "full"));
                }
                batch.insert(i, bytes.to_vec());
                Ok(())
            })
            .collect()
    }

    /// Only values whose bytes all went out become visible, as the master's End does.
    async fn end(&self, mut batch: Self::Batch, sent: Vec<(usize, Result<()>)>) -> Vec<Result<()>> {
        let mut values = self.values.lock().unwrap();
        sent.into_iter()
            .map(|(i, outcome)| {
                let bytes = batch.remove(&i);
                outcome?;
                values.insert(i, bytes.expect("sent before it ended"));
                Ok(())
            })
            .collect()
    }
}

/// Reads from a store, item `i` of the get batch being value `keys[i]`.
struct Reader<'a> {
    store: &'a Store,
    keys: Vec<usize>,
}

impl GetInto for Reader<'_> {
    type Batch = ();

    async fn begin(&self, _items: &[usize]) {
        *self.store.begins.lock().unwrap() += 1;
    }

    async fn get(&self, _batch: &(), items: &mut [(usize, &mut [u8])]) -> Vec<Result<usize>> {
        let values = self.store.values.lock().unwrap();
        items
            .iter_mut()
            .map(|(i, buf)| {
                let value = values
                    .get(&self.keys[*i])
                    .ok_or_else(|| Error::new(ErrorCode::OBJECT_NOT_FOUND, "no such value"))?;
                if value.len() > buf.len() {
                    return Err(Error::new(ErrorCode::BUFFER_OVERFLOW, "too small"));
                }
                buf[..value.len()].copy_from_slice(value);
                Ok(value.len())
            })
            .collect()
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

/// `count` values of `len` bytes each in model memory, each split into `parts` parts.
fn values(model: &ModelDevice, count: usize, len: usize, parts: usize) -> Vec<Vec<Part>> {
    (0..count)
        .map(|v| {
            let bytes = pattern(v, len);
            let addr = model.alloc(len).unwrap();
            model.write(addr, &bytes).unwrap();
            let piece = len.div_ceil(parts);
            (0..len)
                .step_by(piece.max(1))
                .map(|at| Part {
                    addr: addr + at,
                    len: piece.min(len - at),
                })
                .collect()
        })
        .collect()
}

fn model() -> Arc<ModelDevice> {
    Arc::new(ModelDevice::new().expect("the model reserves its address space"))
}

/// A pool whose slabs are 1 MiB, the smallest, and whose waves fill a slab.
fn pool(model: &Arc<ModelDevice>) -> StagingPool {
    StagingPool::new(model.clone(), SLABS << 20, 1 << 20)
}

#[tokio::test]
async fn values_round_trip_through_the_slabs_in_many_waves() {
    let model = model();
    let pool = pool(&model);
    // 24 values of 300 KiB: three per 1 MiB slab, so eight waves; three parts each.
    let sources = values(&model, 24, 300 << 10, 3);
    let store = Store::default();
    let put = put_from(&pool, &sources, &store).await;
    assert!(put.iter().all(Result::is_ok), "{put:?}");
    for (i, parts) in sources.iter().enumerate() {
        assert_eq!(store.values.lock().unwrap()[&i], pattern(i, 300 << 10));
        assert_eq!(parts.len(), 3);
    }
    // Read them back into fresh device memory, in reverse order, split in two parts.
    let targets: Vec<Vec<Part>> = (0..24)
        .map(|_| {
            let addr = model.alloc(300 << 10).unwrap();
            vec![
                Part {
                    addr,
                    len: 100 << 10,
                },
                Part {
                    addr: addr + (100 << 10),
                    len: 200 << 10,
                },
            ]
        })
        .collect();
    let reader = Reader {
        store: &store,
        keys: (0..24).rev().collect(),
    };
    let got = get_into(&pool, &targets, &reader).await;
    // Eight waves each way, one batch begun each way.
    assert_eq!(*store.begins.lock().unwrap(), 2);
    for (i, outcome) in got.iter().enumerate() {
        assert_eq!(outcome.as_ref().ok(), Some(&(300 << 10)), "item {i}");
        let bytes = model.read(targets[i][0].addr, 300 << 10).unwrap();
        assert_eq!(bytes, pattern(23 - i, 300 << 10), "item {i}");
    }
    assert_eq!(pool.available(), SLABS);
}

#[tokio::test]
async fn the_next_waves_copy_runs_while_a_wave_is_sent() {
    let model = model();
    model.set_delay(Duration::from_millis(5));
    let pool = pool(&model);
    let sources = values(&model, 12, 512 << 10, 1); // two per slab: six waves
    let store = Store {
        model: Some(model.clone()),
        ..Store::default()
    };
    let put = put_from(&pool, &sources, &store).await;
    assert!(put.iter().all(Result::is_ok));
    // When wave w was sent, the copy of wave w + 1 had already been started.
    let started = store.started_at_put.lock().unwrap().clone();
    assert_eq!(started, vec![2, 3, 4, 5, 6, 6]);
}

#[tokio::test]
async fn a_value_larger_than_a_slab_is_refused_alone() {
    let model = model();
    let pool = pool(&model);
    let mut sources = values(&model, 3, 4096, 1);
    sources.insert(1, values(&model, 1, (1 << 20) + 1, 1).remove(0));
    let store = Store::default();
    let put = put_from(&pool, &sources, &store).await;
    assert!(put[0].is_ok() && put[2].is_ok() && put[3].is_ok());
    let refused = put[1].as_ref().unwrap_err();
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS);
    assert!(
        refused.to_string().contains("device_staging_size"),
        "{refused}"
    );
    assert_eq!(store.values.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_failed_copy_fails_its_wave_only_and_nothing_of_it_is_stored() {
    let model = model();
    let pool = pool(&model);
    let sources = values(&model, 9, 400 << 10, 2); // two per slab: five waves
    model.fail_copy(1); // the second wave's copy
    let store = Store::default();
    let put = put_from(&pool, &sources, &store).await;
    let failed: Vec<usize> = (0..9).filter(|&i| put[i].is_err()).collect();
    assert_eq!(failed, vec![2, 3]);
    assert_eq!(put[2].as_ref().unwrap_err().code, ErrorCode::TRANSFER_FAIL);
    {
        let stored = store.values.lock().unwrap();
        assert!(!stored.contains_key(&2) && !stored.contains_key(&3));
        assert_eq!(stored.len(), 7);
    }
    // A failed copy onto the device fails the get of its wave, and only those.
    let targets = values(&model, 9, 400 << 10, 1);
    model.fail_copy(0);
    let reader = Reader {
        store: &store,
        keys: (0..9).collect(),
    };
    let got = get_into(&pool, &targets, &reader).await;
    let codes: Vec<Option<ErrorCode>> = got
        .iter()
        .map(|r| r.as_ref().err().map(|e| e.code))
        .collect();
    use ErrorCode as E;
    assert_eq!(
        codes,
        vec![
            Some(E::TRANSFER_FAIL),
            Some(E::TRANSFER_FAIL),
            Some(E::OBJECT_NOT_FOUND),
            Some(E::OBJECT_NOT_FOUND),
            None,
            None,
            None,
            None,
            None
        ]
    );
    assert_eq!(
        model.read(targets[4][0].addr, 400 << 10).unwrap(),
        pattern(4, 400 << 10)
    );
    assert_eq!(pool.available(), SLABS);
}

#[tokio::test]
async fn a_device_lost_mid_transfer_fails_every_value_still_in_flight() {
    let model = model();
    model.set_delay(Duration::from_millis(100));
    let pool = pool(&model);
    let sources = values(&model, 6, 512 << 10, 1);
    let loser = {
        let model = model.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            model.set_lost(true);
        })
    };
    let store = Store::default();
    let put = put_from(&pool, &sources, &store).await;
    loser.join().unwrap();
    // The first wave's copy ended before the loss; every later one fails.
    assert!(put[0].is_ok() && put[1].is_ok(), "{put:?}");
    for outcome in &put[2..] {
        let e = outcome.as_ref().unwrap_err();
        assert_eq!(e.code, ErrorCode::TRANSFER_FAIL);
        assert!(e.to_string().contains("lost"), "{e}");
    }
    assert_eq!(store.values.lock().unwrap().len(), 2);
    assert_eq!(pool.available(), SLABS);
    model.set_lost(false);
}

#[tokio::test]
async fn an_abandoned_call_lets_its_copies_end_before_the_slabs_are_reused() {
    let model = model();
    model.set_delay(Duration::from_millis(30));
    let pool = pool(&model);
    let sources = values(&model, 6, 512 << 10, 1);
    let store = Store {
        hang: true,
        ..Store::default()
    };
    // The sink never answers: the call is abandoned while wave 1's copy is in flight.
    let abandoned =
        tokio::time::timeout(Duration::from_millis(10), put_from(&pool, &sources, &store)).await;
    assert!(abandoned.is_err());
    // Dropping it waited for the copy it had started, and gave back both slabs.
    assert_eq!(model.started(), 2);
    assert_eq!(model.copies().0, 2);
    assert_eq!(pool.available(), SLABS);
}

#[tokio::test]
async fn threads_sharing_a_pool_never_pin_more_than_its_slabs() {
    let model = model();
    let pool = Arc::new(pool(&model));
    let sources = Arc::new(values(&model, 16, 300 << 10, 1));
    let store = Arc::new(Store::default());
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let (pool, sources, store) = (pool.clone(), sources.clone(), store.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for _ in 0..5 {
                    let put = runtime.block_on(put_from(&pool, &sources, &*store));
                    assert!(put.iter().all(Result::is_ok));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert!(
        model.host_buffers() <= SLABS as u64,
        "{}",
        model.host_buffers()
    );
    assert_eq!(pool.available(), SLABS);
}

#[tokio::test]
async fn a_short_value_fills_only_its_length_and_a_failed_put_is_reported() {
    let model = model();
    let pool = pool(&model);
    let store = Store {
        refuse: Some(1),
        ..Store::default()
    };
    let sources = values(&model, 3, 1000, 1);
    let put = put_from(&pool, &sources, &store).await;
    assert_eq!(
        put[1].as_ref().unwrap_err().code,
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    let target = model.alloc(4000).unwrap();
    model.write(target, &[7u8; 4000]).unwrap();
    let reader = Reader {
        store: &store,
        keys: vec![2],
    };
    let got = get_into(
        &pool,
        &[vec![Part {
            addr: target,
            len: 4000,
        }]],
        &reader,
    )
    .await;
    assert_eq!(got[0].as_ref().ok(), Some(&1000));
    let bytes = model.read(target, 4000).unwrap();
    assert_eq!(&bytes[..1000], &pattern(2, 1000)[..]);
    assert!(bytes[1000..].iter().all(|&b| b == 7));
}
