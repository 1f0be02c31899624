//! Authentication as users meet it: real `mooring` processes on loopback sharing a token file,
//! and strangers without it (no token, a wrong token) refused with a clear message.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;

use common::{BIN, Proc, run_without_token as run, scratch};

/// Starts `mooring args...` with no token in its environment (only what `args` give) and
/// returns it with its first stdout line.
fn start(args: &[&str]) -> (Proc, String) {
    let proc = Proc::start_without_token(args);
    let line = proc.line.clone();
    (proc, line)
}

/// A master and one node holding the token in `token_file`: the master's address, and the
/// processes (killed when dropped).
fn token_cluster(token_file: &str) -> (String, [Proc; 2]) {
    let (master, line) = start(&[
        "master",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token_file,
    ]);
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    let (node, _) = start(&node_args(&addr, token_file));
    (addr, [master, node])
}

/// `mooring node` joining the master at `addr` with the token in `token_file`.
fn node_args<'a>(addr: &'a str, token_file: &'a str) -> [&'a str; 10] {
    [
        "node",
        "--master",
        addr,
        "--size",
        "8MiB",
        "--no-prefault",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token_file,
    ]
}

fn new_token(path: &Path) {
    let out = run(&["token", "new", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn only_members_holding_the_token_get_in() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("auth-members");
    let (token, wrong) = (dir.join("token"), dir.join("wrong"));
    new_token(&token);
    new_token(&wrong);
    let mode = std::fs::metadata(&token).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "a token file is its owner's alone");
    assert!(
        !run(&["token", "new", token.to_str().unwrap()])
            .status
            .success(),
        "never replaced"
    );
    let token = token.to_str().unwrap();
    let wrong = wrong.to_str().unwrap();

    let (addr, _cluster) = token_cluster(token);
    // A member stores and reads.
    let put = run(&[
        "put",
        "--master",
        &addr,
        "--token-file",
        token,
        "k",
        "--value",
        "secret",
    ]);
    assert!(put.status.success(), "{put:?}");
    let get = run(&["get", "--master", &addr, "--token-file", token, "k"]);
    assert_eq!(get.stdout, b"secret");
    // The token also comes from the environment, for programs that take no flag.
    let env = Command::new(BIN)
        .args(["get", "--master", &addr, "k"])
        .env("MOORING_TOKEN_FILE", token)
        .output()
        .unwrap();
    assert_eq!(env.stdout, b"secret", "{env:?}");
    // Strangers learn nothing and change nothing: no token, or the wrong one.
    for stranger in [&["--timeout", "2s"][..], &["--token-file", wrong]] {
        for command in [&["get", "k"][..], &["stat"], &["rm", "--all"], &["ls"]] {
            let out = Command::new(BIN)
                .args(command)
                .args(["--master", &addr])
                .args(stranger)
                .env_remove("MOORING_TOKEN_FILE")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{command:?} {stranger:?} got in: {out:?}"
            );
            assert!(stderr.contains("authentication failed"), "{stderr}");
            assert!(!String::from_utf8_lossy(&out.stdout).contains("secret"));
        }
    }
    // A node with the wrong token cannot join.
    let node = run(&node_args(&addr, wrong));
    assert!(!node.status.success(), "{node:?}");
    assert!(String::from_utf8_lossy(&node.stderr).contains("authentication failed"));
    // Nothing the strangers tried changed anything.
    let get = run(&["get", "--master", &addr, "--token-file", token, "k"]);
    assert_eq!(get.stdout, b"secret");
    let stat = run(&["stat", "--master", &addr, "--token-file", token]);
    assert!(
        String::from_utf8_lossy(&stat.stdout).contains("segments       1"),
        "{stat:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_token_servers_stay_on_loopback_unless_told_insecure() {
    let out = run(&["master", "--listen", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("without a cluster token"), "{stderr}");
    let out = run(&["node", "--listen", "0.0.0.0:0", "--size", "8MiB"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without a cluster token"));
    // Loopback needs no token; --insecure opens the port anyway, with a warning.
    let (_loopback, line) = start(&["master", "--listen", "127.0.0.1:0"]);
    assert!(line.contains("listening on 127.0.0.1:"), "{line}");
    let (_open, line) = start(&["master", "--listen", "0.0.0.0:0", "--insecure"]);
    assert!(line.contains("listening on 0.0.0.0:"), "{line}");
    // A client with a token refuses a master without one: it cannot prove it is the cluster.
    let dir = scratch("auth-insecure");
    let token = dir.join("token");
    new_token(&token);
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .replace("0.0.0.0", "127.0.0.1");
    let out = run(&[
        "stat",
        "--master",
        &addr,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("runs without a cluster token"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_can_act_as_another() {
    use mooring_core::{ClientId, ErrorCode};
    use mooring_proto::auth::Credential;
    use mooring_proto::transport::ControlPlane;
    use mooring_proto::wire::{ListSegments, UnmountSegment};
    use mooring_transport_tcp::TcpControlPlane;

    let dir = scratch("auth-impostor");
    let token_file = dir.join("token");
    new_token(&token_file);
    let token = Credential::parse(&std::fs::read_to_string(&token_file).unwrap()).unwrap();
    let token_file = token_file.to_str().unwrap();
    let (addr, _cluster) = token_cluster(token_file);
    // A member holding the token, speaking for itself...
    let me = ClientId(0x1234);
    let control = TcpControlPlane::new(
        &addr,
        Duration::from_secs(5),
        Duration::ZERO,
        Some(token),
        me,
    );
    let control: &dyn ControlPlane = &*control;
    let segments = control.call(ListSegments {}).await.unwrap();
    let victim = &segments[0];
    // ...cannot unmount the node's segment by naming the node's id.
    let err = control
        .call(UnmountSegment {
            client: victim.owner,
            name: victim.name.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::ILLEGAL_CLIENT, "{err}");
    assert_eq!(
        control.call(ListSegments {}).await.unwrap().len(),
        1,
        "still mounted"
    );
    // Acting as itself, it reaches the core, whose own rule refuses a non-owner.
    let err = control
        .call(UnmountSegment {
            client: me,
            name: victim.name.clone(),
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("belongs to client"), "{err}");
    assert_eq!(
        control.call(ListSegments {}).await.unwrap().len(),
        1,
        "still mounted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
