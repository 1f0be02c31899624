//! Log shipping without etcd: a leader's journal copied by a standby through `Follow`, across
//! snapshots and journal generations; acknowledgements wait for the in-sync standby, and go on
//! without it once it is recorded out of sync. The standby's copy recovers to the leader's
//! exact state.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooring::ha::ship::InSyncRecord;
use mooring::ha::standby::Copier;
use mooring::master::MasterService;
use mooring_core::{
    Checksum, ClientId, ErrorCode, MasterConfig, ReplicateConfig, Result, SegmentSpec,
};
use mooring_proto::transport::{Answer, BoxFuture, ControlPlane, RpcHandler};
use mooring_proto::wire::{
    Follow, Hello, MasterRequest, MountSegment, PutEnd, PutStart, Reply, StateFile,
};

const CLIENT: ClientId = ClientId(7);

/// The leader's service called in-process, answers waiting as the TCP server makes them wait.
struct Direct(Arc<MasterService>);

impl ControlPlane for Direct {
    fn send(&self, request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async move {
            match self.0.answer(request) {
                Answer::Now(response) => response,
                Answer::WhenDurable(response) => response.await,
            }
        })
    }
}

/// The in-sync sets recorded, in order.
#[derive(Default)]
struct Recorded(Mutex<Vec<Vec<String>>>);

impl InSyncRecord for Recorded {
    fn record(&self, members: Vec<String>) -> BoxFuture<'_, Result<()>> {
        self.0.lock().unwrap().push(members);
        Box::pin(async { Ok(()) })
    }
}

impl Recorded {
    fn last(&self) -> Vec<String> {
        self.0.lock().unwrap().last().cloned().unwrap_or_default()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mooring-ship-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn put(leader: &(dyn ControlPlane + 'static), key: &str) {
    let grant = leader
        .call(PutStart {
            client: CLIENT,
            key: key.into(),
            size: 1000,
            config: ReplicateConfig::single(),
            upsert: false,
        })
        .await
        .unwrap();
    leader
        .call(PutEnd {
            client: CLIENT,
            key: key.into(),
            write: grant.write_id,
            checksum: Checksum::of(key.as_bytes()),
        })
        .await
        .unwrap();
}

fn leader(dir: &Path) -> (Arc<MasterService>, Arc<Recorded>) {
    // A small snapshot threshold: the copy crosses snapshots and generations.
    let service = MasterService::persistent(dir, MasterConfig::default(), 8 << 10).unwrap();
    let recorded = Arc::new(Recorded::default());
    service
        .start_shipping(
            "leader#1".into(),
            recorded.clone(),
            Duration::from_millis(300),
        )
        .unwrap();
    (service, recorded)
}

async fn mount(control: &(dyn ControlPlane + 'static)) {
    control.call(Hello { client: CLIENT }).await.unwrap();
    control
        .call(MountSegment {
            client: CLIENT,
            spec: SegmentSpec {
                name: "seg".into(),
                base: 0,
                size: 1 << 30,
                endpoint: "node:1".into(),
                key: 1,
                rdma_key: None,
            },
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_copy_recovers_to_the_leaders_state_and_holds_every_acknowledged_put() {
    let (leader_dir, copy_dir) = (scratch("leader"), scratch("copy"));
    let (service, recorded) = leader(&leader_dir);
    let control: Arc<dyn ControlPlane> = Arc::new(Direct(service.clone()));
    mount(control.as_ref()).await;
    for i in 0..100 {
        put(control.as_ref(), &format!("early{i}")).await;
    }
    // The standby starts late: it gets the newest snapshot, then the journals after it.
    let mut copier = Copier::fresh(
        Arc::new(mooring_disk::PosixStateDir::new(&copy_dir)),
        "standby",
    )
    .unwrap();
    let name = copier.name().to_string();
    let following = {
        let control = control.clone();
        tokio::spawn(async move {
            loop {
                copier.step(control.as_ref()).await.unwrap();
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !recorded.last().contains(&name) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never in sync: {:?}",
            recorded.0
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // From here every acknowledged put is on the standby's disk when acknowledged.
    for i in 0..300 {
        put(control.as_ref(), &format!("k{i}")).await;
    }
    following.abort();
    let _ = following.await;
    let live = service.with_master(|m, _| m.state_fingerprint());
    let copy = mooring::master::journal::recover(
        &mooring_disk::PosixStateDir::new(&copy_dir),
        MasterConfig::default(),
    )
    .unwrap()
    .master;
    assert_eq!(
        copy.state_fingerprint(),
        live,
        "the copy is the leader's state"
    );
    assert_eq!(
        recorded.0.lock().unwrap()[0],
        vec!["leader#1".to_string(), name]
    );
    drop(service);
    let _ = std::fs::remove_dir_all(&leader_dir);
    let _ = std::fs::remove_dir_all(&copy_dir);
}

/// A standby copying into `dir` that follows the leader until the leader records it in sync,
/// then stops following; its name in the in-sync set.
async fn follow_until_in_sync(
    leader: &(dyn ControlPlane + 'static),
    recorded: &Recorded,
    dir: &Path,
) -> String {
    let mut copier =
        Copier::fresh(Arc::new(mooring_disk::PosixStateDir::new(dir)), "standby").unwrap();
    let name = copier.name().to_string();
    while !recorded.last().contains(&name) {
        copier.step(leader).await.unwrap();
    }
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_stops_is_recorded_out_of_sync_before_anything_is_acknowledged_without_it() {
    let (leader_dir, copy_dir) = (scratch("leader-stall"), scratch("copy-stall"));
    let (service, recorded) = leader(&leader_dir);
    let control: Arc<dyn ControlPlane> = Arc::new(Direct(service.clone()));
    mount(control.as_ref()).await;
    // Follow until in sync, then stop following.
    follow_until_in_sync(control.as_ref(), &recorded, &copy_dir).await;
    let records_before = recorded.0.lock().unwrap().len();
    let started = tokio::time::Instant::now();
    put(control.as_ref(), "after-the-standby-stopped").await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "acknowledged without the in-sync standby before the timeout"
    );
    let records = recorded.0.lock().unwrap().clone();
    assert_eq!(records.len(), records_before + 1, "{records:?}");
    assert_eq!(records.last().unwrap(), &vec!["leader#1".to_string()]);
    // No longer waited for: the next put needs no further change to the in-sync set.
    put(control.as_ref(), "next").await;
    assert_eq!(recorded.0.lock().unwrap().len(), records_before + 1);
    drop(service);
    let _ = std::fs::remove_dir_all(&leader_dir);
    let _ = std::fs::remove_dir_all(&copy_dir);
}

/// A leader that lost its office acknowledges nothing more and leaves the in-sync set to the
/// next leader: its standby stops hearing from it (the deposed leader refuses it), falls
/// behind only for that reason, and must not be recorded out of sync, or no standby could take
/// over (simulation seed 13216).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_leaves_the_in_sync_set_alone() {
    let (leader_dir, copy_dir) = (scratch("leader-deposed"), scratch("copy-deposed"));
    let service = MasterService::persistent(&leader_dir, MasterConfig::default(), 8 << 10).unwrap();
    let recorded = Arc::new(Recorded::default());
    let shipping = service
        .start_shipping(
            "leader#1".into(),
            recorded.clone(),
            Duration::from_millis(300),
        )
        .unwrap();
    let control: Arc<dyn ControlPlane> = Arc::new(Direct(service.clone()));
    mount(control.as_ref()).await;
    let name = follow_until_in_sync(control.as_ref(), &recorded, &copy_dir).await;
    let records_before = recorded.0.lock().unwrap().len();
    shipping.stop("deposed".into());
    // A change made now is on the deposed leader's disk alone: its outcome is unknown, and it
    // is never acknowledged.
    let unknown = control
        .call(PutStart {
            client: CLIENT,
            key: "after-the-leader-was-deposed".into(),
            size: 1000,
            config: ReplicateConfig::single(),
            upsert: false,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code, ErrorCode::RPC_FAIL, "{unknown}");
    // The standby holds back that change past the timeout, several checks over.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let records = recorded.0.lock().unwrap().clone();
    assert_eq!(records.len(), records_before, "{records:?}");
    assert!(records.last().unwrap().contains(&name), "{records:?}");
    drop(service);
    let _ = std::fs::remove_dir_all(&leader_dir);
    let _ = std::fs::remove_dir_all(&copy_dir);
}

/// A `Follow` that claims more of the journal than the leader ever sent under that name (a
/// confused standby, or a token holder posing as one) counts only as far as was sent: the
/// claimant is never recorded in sync, and acknowledgements never wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_claims_what_it_was_never_sent_is_never_in_sync() {
    let leader_dir = scratch("leader-forged");
    let (service, recorded) = leader(&leader_dir);
    let control: Arc<dyn ControlPlane> = Arc::new(Direct(service.clone()));
    mount(control.as_ref()).await;
    for i in 0..20 {
        put(control.as_ref(), &format!("k{i}")).await;
    }
    let forged = Follow {
        follower: "forger#1".into(),
        at: StateFile::Journal(u64::MAX),
        offset: u64::MAX,
    };
    // Its answer does not matter (there is no such journal); its claim must not count.
    let _ = control.call(forged).await;
    let started = tokio::time::Instant::now();
    for i in 0..20 {
        put(control.as_ref(), &format!("after{i}")).await;
    }
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "acknowledgements waited for the claimant"
    );
    let records = recorded.0.lock().unwrap().clone();
    assert!(
        records
            .iter()
            .all(|set| !set.iter().any(|m| m == "forger#1")),
        "the claimant was recorded in sync: {records:?}"
    );
    drop(service);
    let _ = std::fs::remove_dir_all(&leader_dir);
}

/// A control plane to a master that refuses as a standby (one elected that stepped back).
struct Refusing;

impl ControlPlane for Refusing {
    fn send(&self, _request: MasterRequest) -> BoxFuture<'_, Result<Reply>> {
        Box::pin(async {
            Err(mooring_core::Error::new(
                mooring_core::ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                mooring_proto::wire::STANDBY_REFUSAL,
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_started_afresh_keeps_the_old_one_until_the_new_leader_answers() {
    let (leader_dir, copy_dir) = (scratch("leader-late"), scratch("copy-late"));
    let (service, _recorded) = leader(&leader_dir);
    let control: Arc<dyn ControlPlane> = Arc::new(Direct(service.clone()));
    mount(control.as_ref()).await;
    put(control.as_ref(), "before").await;
    let dir = Arc::new(mooring_disk::PosixStateDir::new(&copy_dir));
    let mut copier = Copier::fresh(dir.clone(), "standby").unwrap();
    for _ in 0..3 {
        copier.step(control.as_ref()).await.unwrap();
    }
    let incarnation = mooring::ha::standby::incarnation(&*dir).unwrap();
    let files = std::fs::read_dir(&copy_dir).unwrap().count();
    // A master elected and stepping back is taken for the leader: following it begins a new
    // copy, but it never answers, so the copy (and the incarnation the in-sync set names)
    // stays.
    let mut elsewhere = Copier::fresh(dir.clone(), "standby").unwrap();
    assert!(elsewhere.step(&Refusing).await.is_err());
    assert_eq!(
        mooring::ha::standby::incarnation(&*dir).unwrap(),
        incarnation
    );
    assert_eq!(std::fs::read_dir(&copy_dir).unwrap().count(), files);
    // The real leader's first answer starts the new copy under its new incarnation.
    elsewhere.step(control.as_ref()).await.unwrap();
    let renewed = mooring::ha::standby::incarnation(&*dir).unwrap();
    assert_ne!(renewed, incarnation);
    assert!(elsewhere.name().ends_with(&format!("#{renewed}")));
    drop(service);
    let _ = std::fs::remove_dir_all(&leader_dir);
    let _ = std::fs::remove_dir_all(&copy_dir);
}
