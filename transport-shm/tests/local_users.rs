//! Another local user cannot use, or starve, a node's shared-memory socket: its abstract name
//! has no file permissions, so the node checks who connected (`SO_PEERCRED`) before giving
//! the peer a handoff slot. A real process running as `nobody` floods the socket while this
//! process (the node's own user) redeems tickets; every one of the owner's requests must be
//! answered. Needs root (to start the other user's process); skipped otherwise.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mooring_transport_shm::handoff::{encode_request, recv_reply};
use mooring_transport_shm::{ShmServer, socket_address};

/// Checks that the node hangs up at once on this user, then opens connections to the
/// abstract socket named by argv[1] as fast as it can for argv[2] seconds, keeping up to 64
/// open (each would hold a handoff slot for a second if the node served it).
const FLOOD: &str = r#"
import socket, sys, time
# First: does the node hang up at once on this user? (It would wait a second for a ticket
# from a user it serves.)
hung_up = 0
for _ in range(10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + sys.argv[1])
    s.settimeout(0.5)
    try:
        hung_up += s.recv(1) == b""
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
end = time.time() + float(sys.argv[2])
held, opened = [], 0
while time.time() < end:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\0" + sys.argv[1])
        held.append(s)
        opened += 1
    except OSError:
        time.sleep(0.001)
    if len(held) > 64:
        held.pop(0).close()
print(hung_up, opened)
"#;

const NOBODY: u32 = 65534;

#[test]
fn another_local_user_cannot_starve_the_owner() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: starting a process as another user needs root");
        return;
    }
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        eprintln!("SKIPPED: {python} is not installed (it plays the other user)");
        return;
    }
    let server = ShmServer::start().expect("the shared-memory socket");
    let (address, name) = socket_address(&server.socket()).expect("its address");
    let flood = Command::new(python)
        .args(["-c", FLOOD, &name, "3"])
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the other user's process");
    std::thread::sleep(Duration::from_millis(1_000));

    let (mut asked, mut answered) = (0, 0);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        asked += 1;
        let Ok(mut stream) = UnixStream::connect_addr(&address) else {
            continue;
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .expect("a timeout");
        // A ticket the node never issued: it answers with a refusal, which is an answer.
        if stream.write_all(&encode_request(&[7; 16])).is_ok() && recv_reply(&stream).is_ok() {
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = flood
        .wait_with_output()
        .expect("the other user's process ends");
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    let counts: Vec<u64> = report
        .split_whitespace()
        .map(|n| n.parse().expect("the flood reports numbers"))
        .collect();
    let [hung_up, opened] = counts[..] else {
        panic!("the flood's report: {report:?}");
    };
    assert_eq!(hung_up, 10, "the node served uid {NOBODY}'s connections");
    assert!(opened > 100, "the flood opened only {opened} connections");
    assert_eq!(
        answered, asked,
        "the owner's requests were answered {answered} of {asked} times while uid {NOBODY} \
         opened {opened} connections"
    );
}
