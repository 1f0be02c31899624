//! On a machine with an RDMA device and a build with `--features rdma`: a master, a node
//! serving its segment over RDMA, and `mooring put` / `mooring get` with `--transport rdma`,
//! each its own process. Anywhere else it prints why it skipped.
//!
//! `cargo test --release -p mooring --features rdma --test rdma_device -- --nocapture`
//! (`MOORING_RDMA_DEVICE` picks the device).

mod common;

use std::process::Command;

use common::{BIN, Proc, value};

#[test]
fn put_and_get_over_rdma_between_processes() {
    let devices: Vec<String> = std::env::var("MOORING_RDMA_DEVICE")
        .map(|d| d.split(',').map(String::from).collect())
        .unwrap_or_default();
    if let Err(e) = mooring_transport_rdma::device::choose(&devices, 64 << 20) {
        eprintln!("SKIPPED: no usable RDMA device: {e}");
        return;
    }
    if !cfg!(feature = "rdma") {
        eprintln!("SKIPPED: built without --features rdma");
        return;
    }
    let device_flag = devices.join(",");
    let mut node_args = vec![
        "node",
        "--size",
        "64MiB",
        "--listen",
        "127.0.0.1:0",
        "--no-prefault",
        "--transports",
        "tcp,rdma",
    ];
    if !device_flag.is_empty() {
        node_args.extend(["--rdma-device", &device_flag]);
    }
    let master = Proc::start(&["master", "--listen", "127.0.0.1:0"]);
    let addr = master.announced_addr();
    let mut args = node_args.clone();
    args.extend(["--master", &addr]);
    let _node = Proc::start(&args);

    let dir = std::env::temp_dir().join(format!("mooring-rdma-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("value");
    let output = dir.join("copy");
    let data = value(16, 3 << 20);
    std::fs::write(&input, &data).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--master", &addr, "--transport", "rdma"])
            .output()
            .expect("run mooring");
        assert!(
            out.status.success(),
            "mooring {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["put", "rdma/key", input.to_str().unwrap()]);
    run(&["get", "rdma/key", "--out", output.to_str().unwrap()]);
    assert_eq!(std::fs::read(&output).unwrap(), data);
    std::fs::remove_dir_all(&dir).unwrap();
}
