//! Member credentials and roles as users meet them: a real master holding the cluster token, a
//! real node holding only its own node credential, and members with credentials of each role
//! on loopback. Each role boundary is tried from the side that must be refused.

use std::path::PathBuf;

use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{Proc, issue, run_without_token as run, scratch};
use mooring::{Client, ClientConfig};
use mooring_core::{ClientId, ErrorCode, ReplicateConfig, SegmentSpec};
use mooring_proto::auth::{Claims, Credential, Roles};
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::{
    Follow, GetReplicaList, Goodbye, Hello, ListKeys, ListSegments, MasterRequest, MountSegment,
    PutStart, Remove, RemoveAll, StateFile,
};
use mooring_transport_tcp::TcpControlPlane;

/// A master holding the cluster token (with `extra` flags) and one node holding only a node
/// credential: the cluster token, the master's address and the processes.
struct Cluster {
    dir: PathBuf,
    secret: Credential,
    addr: String,
    _procs: Vec<Proc>,
}

impl Cluster {
    fn start(name: &str, extra: &[&str]) -> Cluster {
        Cluster::start_sized(name, extra, "8MiB")
    }

    fn start_sized(name: &str, extra: &[&str], node_size: &str) -> Cluster {
        let dir = scratch(name);
        let secret_file = dir.join("token");
        assert!(
            run(&["token", "new", secret_file.to_str().unwrap()])
                .status
                .success()
        );
        let secret = Credential::parse(&std::fs::read_to_string(&secret_file).unwrap()).unwrap();
        let mut args = vec![
            "master",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            secret_file.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let master = Proc::start_without_token(&args);
        let addr = master.announced_addr();
        let node_file = dir.join("node-1");
        issue(&secret_file, "node-1", "node", &node_file);
        let node = Proc::start_without_token(&[
            "node",
            "--master",
            &addr,
            "--size",
            node_size,
            "--no-prefault",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            node_file.to_str().unwrap(),
        ]);
        Cluster {
            dir,
            secret,
            addr,
            _procs: vec![master, node],
        }
    }

    /// A member credential for `name` with `roles`, issued in this process.
    fn member(&self, name: &str, roles: Roles, expires: u64) -> Credential {
        self.secret
            .issue(Claims {
                name: name.into(),
                tenant: "default".into(),
                roles,
                // Distinct per name, so revoking one serial revokes one member here.
                serial: name
                    .bytes()
                    .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
                expires,
            })
            .unwrap()
    }

    /// A control plane to the master holding `credential`, speaking for `id` (default: an id
    /// of its own).
    fn control(&self, credential: &Credential, id: Option<ClientId>) -> Arc<dyn ControlPlane> {
        let id = id.unwrap_or_else(|| ClientId(credential.client_id(0x77)));
        TcpControlPlane::new(
            &self.addr,
            Duration::from_secs(5),
            Duration::ZERO,
            Some(credential.clone()),
            id,
        )
    }

    async fn client(&self, credential: &Credential) -> Client {
        let mut config = ClientConfig::new(self.addr.clone());
        config.token = Some(credential.clone());
        Client::connect(config).await.unwrap()
    }

    /// The node's segment as the cluster token's holder sees it (owner included).
    async fn node_segment(&self) -> mooring_core::SegmentInfo {
        let admin = self.control(&self.secret, Some(ClientId(1)));
        let admin: &dyn ControlPlane = &*admin;
        for _ in 0..100 {
            if let Some(info) = admin.call(ListSegments {}).await.unwrap().pop() {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the node never mounted");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_say_goodbye_for_a_node() {
    let cluster = Cluster::start("goodbye", &[]);
    let node = cluster.node_segment().await;
    let writer = cluster
        .client(&cluster.member("writer", Roles::CLIENT, 0))
        .await;
    for i in 0..20 {
        writer
            .put(
                &format!("k{i}"),
                &[i as u8; 4096],
                &ReplicateConfig::single(),
            )
            .await
            .unwrap();
    }
    let mallory = cluster.member("mallory", Roles::ALL, 0);
    // Claiming the node's id in the handshake: refused before any request.
    let as_node = cluster.control(&mallory, Some(node.owner));
    let err = as_node
        .call(Hello { client: node.owner })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not belong"), "{err}");
    // On its own id, naming the node's: refused.
    let own = cluster.control(&mallory, None);
    let err = own.call(Goodbye { client: node.owner }).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::ILLEGAL_CLIENT, "{err}");
    // The node keeps its segment, and every object is still there.
    assert_eq!(cluster.node_segment().await.owner, node.owner);
    for i in 0..20 {
        assert_eq!(
            writer.get(&format!("k{i}")).await.unwrap(),
            vec![i as u8; 4096]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_does_only_its_own_work() {
    let cluster = Cluster::start("work", &[]);
    let node = cluster.node_segment().await;
    let spec = |name: &str| SegmentSpec {
        name: name.into(),
        base: 1 << 30,
        size: 1 << 20,
        endpoint: "127.0.0.1:1".into(),
        key: 1,
        rdma_key: None,
    };
    let put = |client| PutStart {
        client,
        key: "k".into(),
        size: 16,
        config: ReplicateConfig::single(),
        upsert: false,
    };
    let follow = Follow {
        follower: "standby-1".into(),
        at: StateFile::Snapshot(0),
        offset: 0,
    };
    let refused = |outcome: Result<(), mooring_core::Error>, what: &str| {
        let err = outcome.expect_err(what);
        assert_eq!(err.code, ErrorCode::ILLEGAL_CLIENT, "{what}: {err}");
        assert!(err.to_string().contains("holds the roles"), "{what}: {err}");
    };

    // A client: reads and writes; cannot mount, follow or remove everything, and sees no
    // owner of another's segment.
    let client = cluster.member("app", Roles::CLIENT, 0);
    let id = ClientId(client.client_id(1));
    let control = cluster.control(&client, Some(id));
    let control: &dyn ControlPlane = &*control;
    control.call(put(id)).await.unwrap();
    refused(
        control
            .call(MountSegment {
                client: id,
                spec: spec("fake"),
            })
            .await
            .map(drop),
        "a client mounts",
    );
    refused(
        control.call(follow.clone()).await.map(drop),
        "a client follows",
    );
    refused(
        control
            .call(RemoveAll {
                tenant: "default".into(),
            })
            .await
            .map(drop),
        "a client removes all",
    );
    let listed = control.call(ListSegments {}).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].owner, ClientId(0), "a client sees no owner");
    assert_eq!(listed[0].endpoint, node.endpoint, "but can reach the node");

    // A node: mounts its own segments; cannot write objects.
    let other_node = cluster.member("node-2", Roles::NODE, 0);
    let id = ClientId(other_node.client_id(2));
    let control = cluster.control(&other_node, Some(id));
    let control: &dyn ControlPlane = &*control;
    control
        .call(MountSegment {
            client: id,
            spec: spec("node-2"),
        })
        .await
        .unwrap();
    refused(control.call(put(id)).await.map(drop), "a node writes");
    assert!(
        control
            .call(ListSegments {})
            .await
            .unwrap()
            .iter()
            .any(|info| info.owner == node.owner),
        "a node sees owners"
    );

    // A standby follows; an admin removes everything.
    let standby = cluster.member("standby-1", Roles::STANDBY, 0);
    let control = cluster.control(&standby, None);
    // This master keeps no journal, so it has nothing to send; but the role let it in.
    let answer = control.call(follow).await.unwrap_err();
    assert_eq!(
        answer.code,
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
        "{answer}"
    );
    refused(
        control
            .call(RemoveAll {
                tenant: "default".into(),
            })
            .await
            .map(drop),
        "a standby removes all",
    );
    let admin = cluster.member("ops", Roles::ADMIN, 0);
    cluster
        .control(&admin, None)
        .call(RemoveAll {
            tenant: "default".into(),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_revoked_and_foreign_credentials_are_refused() {
    let scratch_dir = scratch("roles-revoked-list");
    let list = scratch_dir.join("revoked");
    std::fs::write(&list, "# nobody yet\n").unwrap();
    let cluster = Cluster::start("revoked", &["--revoked-file", list.to_str().unwrap()]);
    let _ = cluster.node_segment().await;

    let expired = cluster.member("old", Roles::CLIENT, unix_now() - 1);
    let err = cluster
        .control(&expired, None)
        .call(ListSegments {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");

    let foreign = Credential::from_secret([0x42; 32])
        .issue(
            cluster
                .member("app", Roles::ALL, 0)
                .claims()
                .unwrap()
                .clone(),
        )
        .unwrap();
    let err = cluster
        .control(&foreign, None)
        .call(ListSegments {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("authentication failed"), "{err}");

    // Revoked while connected: its next request is refused, and so is every new connection.
    let app = cluster.member("app", Roles::CLIENT, 0);
    let control = cluster.control(&app, None);
    control.call(ListSegments {}).await.unwrap();
    std::fs::write(
        &list,
        format!("serial {:016x}\n", app.claims().unwrap().serial),
    )
    .unwrap();
    let mut refused = None;
    for _ in 0..100 {
        match control.call(ListSegments {}).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let err = refused.expect("the revocation took effect within 10 s");
    assert!(err.to_string().contains("revoked"), "{err}");
    let err = cluster
        .control(&app, None)
        .call(ListSegments {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
    // Another member is not affected.
    let other = cluster.member("app-2", Roles::CLIENT, 0);
    cluster
        .control(&other, None)
        .call(ListSegments {})
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&scratch_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_cannot_hold_the_pool_hostage() {
    let cluster = Cluster::start_sized("hostage", &[], "64MiB");
    let _ = cluster.node_segment().await;
    let hog = cluster.member("hog", Roles::CLIENT, 0);
    let start = |client: ClientId, key: &str, size: u64| PutStart {
        client,
        key: key.into(),
        size,
        config: ReplicateConfig::single(),
        upsert: false,
    };
    // One open put of nearly the whole pool: refused, past the member's share (0.75).
    let first = ClientId(hog.client_id(1));
    let control = cluster.control(&hog, Some(first));
    let err = control
        .call(start(first, "hog/1", 62 << 20))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::NO_AVAILABLE_HANDLE, "{err}");
    assert!(err.to_string().contains("unfinished_put_share"), "{err}");
    // Within its share it may hold a put open; a second process of the same member shares
    // that share.
    control.call(start(first, "hog/2", 40 << 20)).await.unwrap();
    let second = ClientId(hog.client_id(2));
    let err = cluster
        .control(&hog, Some(second))
        .call(start(second, "hog/3", 16 << 20))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unfinished_put_share"), "{err}");
    // Honest members keep writing beside it.
    let honest = cluster
        .client(&cluster.member("honest", Roles::CLIENT, 0))
        .await;
    for i in 0..2 {
        let value = vec![i as u8; 8 << 20];
        honest
            .put(&format!("honest/{i}"), &value, &ReplicateConfig::single())
            .await
            .unwrap();
        assert_eq!(honest.get(&format!("honest/{i}")).await.unwrap(), value);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_meet() {
    let cluster = Cluster::start("tenants", &[]);
    let _ = cluster.node_segment().await;
    let in_tenant = |name: &str, tenant: &str| {
        cluster
            .secret
            .issue(Claims {
                name: name.into(),
                tenant: tenant.into(),
                roles: Roles::CLIENT.union(Roles::ADMIN),
                serial: tenant.len() as u64,
                expires: 0,
            })
            .unwrap()
    };
    let (a, b) = (in_tenant("app", "team-a"), in_tenant("app", "team-b"));
    let (ca, cb) = (cluster.client(&a).await, cluster.client(&b).await);
    assert_eq!((ca.tenant(), cb.tenant()), ("team-a", "team-b"));
    let single = ReplicateConfig::single();
    ca.put("k", b"a's", &single).await.unwrap();
    // b neither reads, lists nor removes a's key; its own `k` is another object.
    assert_eq!(
        cb.get("k").await.unwrap_err().code,
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert!(cb.query(".*").await.unwrap().is_empty());
    cb.put("k", b"b's", &single).await.unwrap();
    assert_eq!(cb.remove_all().await.unwrap(), 1);
    assert_eq!(ca.get("k").await.unwrap(), b"a's");
    let listed = ca.query(".*").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].key, "k",
        "keys are listed as the tenant named them"
    );
    // A client of the default tenant (the cluster token) does not see them either.
    let admin = cluster.client(&cluster.secret).await;
    assert!(admin.query(".*").await.unwrap().is_empty());
    // Below the library, b names a's stored key or a's tenant: refused by the master.
    let raw = cluster.control(&b, None);
    for request in [
        MasterRequest::from(GetReplicaList {
            key: "team-a\u{1f}k".into(),
        }),
        MasterRequest::from(Remove {
            key: "team-a\u{1f}k".into(),
        }),
        MasterRequest::from(ListKeys {
            tenant: "team-a".into(),
            pattern: ".*".into(),
        }),
        MasterRequest::from(RemoveAll {
            tenant: "team-a".into(),
        }),
    ] {
        let name = request.name();
        let err = raw.send(request).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::ILLEGAL_CLIENT, "{name}: {err}");
        assert!(err.to_string().contains("reaches into tenant"), "{err}");
    }
    assert_eq!(ca.get("k").await.unwrap(), b"a's");
    // A credential cannot be used for another tenant.
    let mut config = ClientConfig::new(cluster.addr.clone());
    config.token = Some(a.clone());
    config.tenant = Some("team-b".into());
    let err = Client::connect(config).await.err().expect("refused");
    assert!(err.to_string().contains("belongs to tenant"), "{err}");
}

#[test]
fn credentials_are_issued_shown_and_kept_from_masters() {
    let dir = scratch("roles-cli");
    let secret = dir.join("token");
    assert!(
        run(&["token", "new", secret.to_str().unwrap()])
            .status
            .success()
    );
    let member = dir.join("app");
    let issued = run(&[
        "token",
        "issue",
        "--token-file",
        secret.to_str().unwrap(),
        "--name",
        "app",
        "--role",
        "client,admin",
        "--expires",
        "30d",
        member.to_str().unwrap(),
    ]);
    assert!(issued.status.success(), "{issued:?}");
    let shown = run(&["token", "show", member.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(
        shown.contains("member default/app, roles client,admin") && shown.contains("expires"),
        "{shown}"
    );
    let file = std::fs::read_to_string(&member).unwrap();
    let key_line = file.lines().find(|l| l.starts_with("key ")).unwrap();
    assert!(!shown.contains(&key_line[4..]), "show prints no key");
    // A bad role, or a member's credential used to issue, is refused with a reason.
    let bad = run(&[
        "token",
        "issue",
        "--token-file",
        secret.to_str().unwrap(),
        "--name",
        "x",
        "--role",
        "root",
        dir.join("x").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown role"));
    let bad = run(&[
        "token",
        "issue",
        "--token-file",
        member.to_str().unwrap(),
        "--name",
        "x",
        "--role",
        "client",
        dir.join("x").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("only the cluster secret"));
    // A master cannot run on a member's credential: it could verify no one.
    let out = run(&[
        "master",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        member.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must hold the cluster token itself"),
        "{out:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
