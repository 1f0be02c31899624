//! `mooring bench` as a user runs it: it starts its own master, writer and readers as
//! processes, verifies every value it reads (a wrong byte fails the run), and reports each
//! phase. No figure is asserted (speed is for the benchmark's readers, not for tests); the
//! phases, their counts and the byte totals are.

use std::process::{Command, Stdio};

mod common;

use common::BIN;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn every_phase_is_reported_for_each_transport_with_many_readers() {
    for transport in ["shm", "tcp"] {
        let out = bench(&[
            "--embedded",
            "--sizes",
            "4KiB,64KiB",
            "--count",
            "40",
            "--batch",
            "8",
            "--readers",
            "2",
            "--transport",
            transport,
            "--json",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{transport}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let phases = report["phases"].as_array().unwrap();
        let find = |name: &str, size: u64| {
            phases
                .iter()
                .find(|p| p["phase"] == name && p["size"] == size)
                .unwrap_or_else(|| panic!("{transport}: no {name} phase for {size}: {report}"))
        };
        for size in [4096u64, 65536] {
            for (name, keys) in [
                ("put", 40),
                ("memcpy", 40),
                ("get", 40),
                ("batch8-get", 40),
                ("get-2readers", 80),
            ] {
                let phase = find(name, size);
                assert_eq!(phase["keys"], keys, "{transport} {name} {size}");
                assert_eq!(phase["bytes"], keys * size, "{transport} {name} {size}");
                assert!(phase["seconds"].as_f64().unwrap() > 0.0);
            }
            let loopback = find("tcp-loopback-2", size);
            assert!(loopback["bytes"].as_u64().unwrap() > 0, "{loopback}");
        }
    }
    let out = bench(&["--embedded", "--readers", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least one reader"));
}

#[test]
fn many_clients_report_the_requests_the_master_answered_and_its_cpu() {
    // The master its own process (the default) and inside the writer: its CPU is measured
    // either way.
    for placement in ["process", "writer"] {
        let out = bench(&[
            "--embedded",
            placement,
            "--sizes",
            "4KiB",
            "--count",
            "100",
            "--clients",
            "3",
            "--json",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{placement}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let phase = report["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["phase"] == "exist-3clients")
            .unwrap_or_else(|| panic!("{placement}: no many-clients phase: {report}"));
        // Ten calls per --count for each client, none moving bytes.
        assert_eq!(phase["keys"], 3 * 100 * 10, "{phase}");
        assert_eq!(phase["bytes"], 0, "{phase}");
        let cpu = phase["master_cpu"].as_f64().expect("the master's CPU");
        assert!(cpu > 0.0 && cpu < 64.0, "{placement}: {cpu}");
    }
}
