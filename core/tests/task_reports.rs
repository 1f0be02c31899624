//! QueryTask: a copy or move task is reported while it runs and after it ends, with why it
//! failed; the newest ended tasks are kept, through a snapshot too, and older ones forgotten.

mod common;

use common::*;
use mooring_core::task_reports::KEPT_TASK_REPORTS;
use mooring_core::{
    ErrorCode, Master, MasterConfig, Millis, ReplicateConfig, TaskAction, TaskId, TaskState,
};

fn one_on(segment: &str) -> ReplicateConfig {
    ReplicateConfig::single().preferring(segment)
}

#[test]
fn a_copy_is_reported_running_then_succeeded() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "k", 4096, &one_on("seg0"));
    let started = f.now;
    let grant = f.m.copy_start(B, "k", &["seg1".into()], f.now).unwrap();
    f.advance(Millis(40));
    let running = f.m.query_task(grant.task, f.now).unwrap();
    assert_eq!(running.task, grant.task);
    assert_eq!(running.key, "k");
    assert_eq!(running.action, TaskAction::Copy);
    assert_eq!(running.client, B);
    assert_eq!(running.state, TaskState::Running);
    assert_eq!((running.started, running.updated), (started, started));
    assert_eq!(running.now, f.now, "the age of a report is now - started");
    assert!(running.message.is_empty());

    f.advance(Millis(10));
    let ended_at = f.now;
    f.m.task_end(B, grant.task, f.now).unwrap();
    f.advance(Millis(500));
    let done = f.m.query_task(grant.task, f.now).unwrap();
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!((done.started, done.updated), (started, ended_at));
    assert_eq!(done.now, f.now);
    assert!(done.message.is_empty());
    f.check();
}

#[test]
fn every_way_a_task_fails_is_reported_with_its_reason() {
    let mut f = Fixture::new(3, MIB);
    f.put(A, "k", 4096, &one_on("seg0"));
    let failed = |f: &Fixture, task: TaskId| {
        let report = f.m.query_task(task, f.now).unwrap();
        assert_eq!(report.state, TaskState::Failed, "{report:?}");
        report
    };

    let revoked = f.m.copy_start(B, "k", &["seg1".into()], f.now).unwrap();
    f.m.task_revoke(B, revoked.task, f.now).unwrap();
    assert!(
        failed(&f, revoked.task)
            .message
            .contains("could not read the source")
    );

    let aborted = f.m.move_start(B, "k", "seg0", "seg1", f.now).unwrap();
    f.m.task_abort(B, aborted.task, f.now).unwrap();
    let report = failed(&f, aborted.task);
    assert_eq!(report.action, TaskAction::Move);
    assert!(report.message.contains("writing the new replicas failed"));

    let forgotten = f.m.copy_start(B, "k", &["seg2".into()], f.now).unwrap();
    f.tick_after(Millis::from_secs(30));
    assert!(
        failed(&f, forgotten.task)
            .message
            .contains("did not end the task")
    );

    let orphaned = f.m.copy_start(B, "k", &["seg1".into()], f.now).unwrap();
    f.m.goodbye(B, f.now);
    f.check();
    let report = failed(&f, orphaned.task);
    assert_eq!(report.client, B);
    assert!(report.message.contains("left or was taken for dead"));

    // A refused end changes nothing: the task is still reported running.
    let refused = f.m.copy_start(A, "k", &["seg2".into()], f.now).unwrap();
    assert_eq!(
        code(f.m.task_end(B, refused.task, f.now)),
        ErrorCode::ILLEGAL_CLIENT
    );
    let report = f.m.query_task(refused.task, f.now).unwrap();
    assert_eq!(report.state, TaskState::Running);
}

#[test]
fn a_task_whose_object_is_lost_with_its_node_is_reported_failed() {
    let mut f = Fixture::new(0, MIB);
    f.mount("seg0", MIB);
    f.put(A, "k", 4096, &one_on("seg0"));
    // The target on a segment another node owns.
    let owner = mooring_core::ClientId(0x77);
    let spec = mooring_core::SegmentSpec {
        name: "far".into(),
        base: 0x9000_0000_0000,
        size: MIB,
        endpoint: "far:7000".into(),
        key: 9,
        rdma_key: None,
    };
    f.m.mount_segment(owner, &spec, f.now).unwrap();
    let task = f.m.copy_start(B, "k", &["far".into()], f.now).unwrap();
    // The source's node goes silent and expires: the object goes with it.
    for _ in 0..30 {
        f.advance(Millis::from_secs(1));
        for client in [A, B, owner] {
            f.m.heartbeat(client, f.now);
        }
        f.m.tick(f.now);
    }
    f.check();
    assert_eq!(code(f.get("k")), ErrorCode::OBJECT_NOT_FOUND);
    let report = f.m.query_task(task.task, f.now).unwrap();
    assert_eq!(report.state, TaskState::Failed);
    assert!(report.message.contains("lost"), "{report:?}");
}

#[test]
fn unknown_tasks_are_refused_and_only_the_newest_ended_ones_are_kept() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "k", 4096, &one_on("seg0"));
    let never = f.m.query_task(TaskId(12345), f.now);
    assert_eq!(code(never), ErrorCode::OBJECT_NO_REPLICATION_TASK);

    let mut tasks = Vec::new();
    for _ in 0..KEPT_TASK_REPORTS + 1 {
        let grant = f.m.copy_start(B, "k", &["seg1".into()], f.now).unwrap();
        f.m.task_revoke(B, grant.task, f.now).unwrap();
        tasks.push(grant.task);
    }
    assert_eq!(
        code(f.m.query_task(tasks[0], f.now)),
        ErrorCode::OBJECT_NO_REPLICATION_TASK,
        "the oldest ended task is forgotten"
    );
    for &task in &tasks[1..] {
        assert_eq!(
            f.m.query_task(task, f.now).unwrap().state,
            TaskState::Failed
        );
    }
    f.check();
}

#[test]
fn reports_survive_a_snapshot() {
    let mut f = Fixture::new(2, MIB);
    f.put(A, "k", 4096, &one_on("seg0"));
    let ended = f.m.copy_start(B, "k", &["seg1".into()], f.now).unwrap();
    f.m.task_end(B, ended.task, f.now).unwrap();
    f.put(A, "j", 4096, &one_on("seg0"));
    let running = f.m.copy_start(B, "j", &["seg1".into()], f.now).unwrap();
    let bytes = f.m.snapshot();
    let restored =
        Master::restore_unshifted(MasterConfig::default(), &bytes, &mooring_core::Sequential)
            .unwrap();
    for task in [ended.task, running.task] {
        assert_eq!(
            restored.query_task(task, f.now).unwrap(),
            f.m.query_task(task, f.now).unwrap()
        );
    }
}

#[test]
fn a_move_neither_starts_nor_ends_while_a_held_read_may_read_its_source() {
    let mut f = Fixture::new(3, MIB);
    f.put(A, "k", 4096, &one_on("seg0"));
    let (hold, _) = f.m.acquire_hold(A, "k", f.now).unwrap();
    assert_eq!(
        code(f.m.move_start(B, "k", "seg0", "seg1", f.now)),
        ErrorCode::OBJECT_REPLICA_BUSY
    );
    // A copy frees nothing: it may run beside held reads.
    let copy = f.m.copy_start(B, "k", &["seg2".into()], f.now).unwrap();
    f.m.task_end(B, copy.task, f.now).unwrap();
    f.m.release_hold(A, hold, f.now).unwrap();

    // A hold taken while the move runs keeps its source: the end is refused, the targets go.
    let moving = f.m.move_start(B, "k", "seg0", "seg1", f.now).unwrap();
    let (hold, held) = f.m.acquire_hold(A, "k", f.now).unwrap();
    let used = f.used();
    assert_eq!(
        code(f.m.task_end(B, moving.task, f.now)),
        ErrorCode::OBJECT_REPLICA_BUSY
    );
    f.check();
    assert_eq!(f.used(), used - 4096, "the move's target is freed at once");
    let report = f.m.query_task(moving.task, f.now).unwrap();
    assert_eq!(report.state, TaskState::Failed);
    assert!(report.message.contains("held reads"), "{report:?}");
    let now_listed = f.get("k").unwrap();
    assert_eq!(addrs(&now_listed.replicas), addrs(&held.replicas));
    f.m.release_hold(A, hold, f.now).unwrap();
    // With the reader gone the move goes through.
    let moving = f.m.move_start(B, "k", "seg0", "seg1", f.now).unwrap();
    f.m.task_end(B, moving.task, f.now).unwrap();
    f.check();
}
