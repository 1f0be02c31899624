//! A master whose state directory fills up, on a real (small) file system: changes are
//! refused with a message that says the disk is full, a new client's get and `mooring stat`
//! go on, and once space frees changes are accepted again with no restart. Needs root (it
//! mounts a 16 MiB tmpfs); elsewhere it skips with its reason.

use std::process::Command;
use std::time::{Duration, Instant};

use mooring::{Client, ClientConfig};
use mooring_core::ReplicateConfig;

mod common;

use common::{BIN, Proc, free_port, start_nodes, value, wait_for_segments};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small_file_system() -> Result<Mount, String> {
    let at = std::env::temp_dir().join(format!("mooring-full-{}", std::process::id()));
    std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&at)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if !status.status.success() {
        let _ = std::fs::remove_dir(&at);
        return Err(format!(
            "mount -t tmpfs failed (not root, or no permission to mount here): {}",
            String::from_utf8_lossy(&status.stderr).trim()
        ));
    }
    Ok(Mount(at))
}

/// Writes a file into `dir` until the file system has no room left but `spare` bytes.
fn fill(dir: &std::path::Path, spare: u64) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0xAB_u8; 64 << 10];
    loop {
        match file.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    let len = file.metadata().unwrap().len();
    file.set_len(len.saturating_sub(spare)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_refuses_changes_keeps_serving_reads_and_recovers() {
    let mount = match small_file_system() {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    // Room for a few hundred records: the master fills it as it runs.
    let filler = fill(&mount.0, 256 << 10);
    let state = mount.0.join("state");
    let listen = format!("127.0.0.1:{}", free_port());
    let _master = Proc::start(&[
        "master",
        "--listen",
        &listen,
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let _nodes = start_nodes(&listen, 1, "16MiB");
    let writer = Client::connect(ClientConfig::new(listen.clone()))
        .await
        .unwrap();
    wait_for_segments(&writer, 1).await;
    let config = ReplicateConfig::single();
    writer
        .put("before", &value(1, 4000), &config)
        .await
        .unwrap();

    // Puts until one is refused: the change that first meets the full disk waits for room
    // (its record held in memory); the ones after it are refused at once, saying why.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0u64;
    let refused = loop {
        i += 1;
        let (key, bytes) = (format!("k{i}"), value(i, 100));
        let put = writer.put(&key, &bytes, &config);
        match tokio::time::timeout(Duration::from_secs(1), put).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(e)) => break e,
        }
        assert!(Instant::now() < deadline, "no put was refused after {i}");
    };
    let message = refused.to_string();
    assert!(message.contains("is full"), "{message}");

    // A new client reads, and `mooring stat` works.
    let reader = Client::connect(ClientConfig::new(listen.clone()))
        .await
        .expect("a new client is welcome while the disk is full");
    assert_eq!(reader.get("before").await.unwrap(), value(1, 4000));
    let stat = Command::new(BIN)
        .args(["stat", "--master", &listen])
        .output()
        .unwrap();
    assert!(
        stat.status.success(),
        "mooring stat: {}",
        String::from_utf8_lossy(&stat.stderr)
    );

    // Space frees: puts are accepted again, with no restart.
    std::fs::remove_file(filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match writer.put("after", &value(4, 4000), &config).await {
            Ok(()) => break,
            Err(e) => assert!(Instant::now() < deadline, "still refused: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reader.get("after").await.unwrap(), value(4, 4000));
    assert_eq!(reader.get("before").await.unwrap(), value(1, 4000));
}
