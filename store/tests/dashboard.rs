//! The dashboards in a real browser: headless Chromium loads the master's page while a real
//! master and node hold objects the CLI put, and the figures appear (a screenshot is saved);
//! and a peer's page, while two real peers hold a value.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::{BIN, Proc, start_master_with_scrape_token};

fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MOORING_CHROMIUM") {
        return Some(path.into());
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            let out = Command::new("which").arg(name).output().ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

/// Runs headless Chromium on `url` with `extra` arguments and a fresh profile in `dir`.
fn browse(browser: &Path, dir: &Path, url: &str, extra: &[&str]) -> std::process::Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            // Lets the page's fetch and first render finish before the DOM or picture is taken.
            "--virtual-time-budget=4000",
            "--window-size=1280,900",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium")
}

#[test]
fn the_dashboard_shows_the_cluster_in_a_browser() {
    let Some(browser) = chromium() else {
        eprintln!(
            "skipping the dashboard browser test: no chromium (install Debian's `chromium`, or \
             set MOORING_CHROMIUM); scripts/test-all.sh installs it when it can"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("mooring-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "dash-token\n").unwrap();
    let (master, metrics) = start_master_with_scrape_token(&token_file);
    let addr = master.announced_addr();
    let _node = Proc::start_without_token(&[
        "node",
        "--master",
        &addr,
        "--size",
        "16MiB",
        "--no-prefault",
        "--name",
        "node-a",
    ]);
    for i in 0..7 {
        let out = Command::new(BIN)
            .args([
                "put",
                "--master",
                &addr,
                "--value",
                "some value",
                &format!("k{i}"),
            ])
            .env_remove("MOORING_TOKEN_FILE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let got = Command::new(BIN)
        .args(["get", "--master", &addr, "k0"])
        .env_remove("MOORING_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(got.status.success());
    let url = format!("http://{metrics}/#token=dash-token");

    let dom = browse(&browser, &dir, &url, &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains(r#"id="objects">7<"#),
        "objects not shown:\n{dom}"
    );
    assert!(
        dom.contains(r#"id="reads-by-tier">1 memory, 0 disk, 0 misses<"#),
        "reads not shown:\n{dom}"
    );
    assert!(
        dom.contains(r#"data-segment="node-a""#),
        "segment not shown:\n{dom}"
    );
    assert!(
        dom.contains(r#"data-kind="PutStart""#),
        "requests not shown:\n{dom}"
    );
    assert!(
        dom.contains("updated "),
        "the page did not load its figures:\n{dom}"
    );

    // Without the token the page says what to do instead of showing figures.
    let refused = browse(
        &browser,
        &dir,
        &format!("http://{metrics}/"),
        &["--dump-dom"],
    );
    let refused = String::from_utf8_lossy(&refused.stdout);
    assert!(refused.contains("asks for a token"), "{refused}");

    let shot = std::env::var_os("MOORING_DASHBOARD_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("dashboard.png"));
    let _ = std::fs::remove_file(&shot);
    browse(
        &browser,
        &dir,
        &url,
        &[&format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot).expect("chromium saved a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    assert!(
        png.len() > 10_000,
        "a {}-byte screenshot is blank",
        png.len()
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}

/// A peer's dashboard (`mooring peer --metrics-listen`): headless Chromium loads it while two
/// real peers hold a value the CLI put through one of them and read through the other.
#[test]
fn a_peers_dashboard_shows_the_peer_in_a_browser() {
    let Some(browser) = chromium() else {
        eprintln!(
            "skipping the peer dashboard browser test: no chromium (install Debian's \
             `chromium`, or set MOORING_CHROMIUM); scripts/test-all.sh installs it when it can"
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("mooring-peer-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("scrape-token");
    std::fs::write(&token_file, "peer-dash-token\n").unwrap();
    let token_arg = token_file.display().to_string();
    let disk_arg = dir.join("disk").display().to_string();
    let (_first, [first, metrics]) = Proc::start_on_free_ports(false, |[listen, metrics]| {
        common::args(&[
            "peer",
            "--listen",
            listen,
            "--size",
            "16MiB",
            "--disk-dir",
            &disk_arg,
            "--metrics-listen",
            metrics,
            "--metrics-token-file",
            &token_arg,
        ])
    });
    let (_second, [second]) = Proc::start_on_free_ports(false, |[listen]| {
        common::args(&[
            "peer", "--listen", listen, "--size", "16MiB", "--seeds", &first,
        ])
    });
    let cli = |args: &[&str]| {
        // The second peer serves clients once it has joined: retry until it has.
        for _ in 0..100 {
            let out = Command::new(BIN)
                .args(args)
                .env_remove("MOORING_TOKEN_FILE")
                .output()
                .unwrap();
            if out.status.success() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("mooring {args:?} kept failing");
    };
    let at = |peer: &str| format!("peer://{peer}");
    cli(&[
        "put",
        "--master",
        &at(&first),
        "--value",
        "a value",
        "dash/k",
    ]);
    cli(&["get", "--master", &at(&first), "dash/k"]);
    cli(&["get", "--master", &at(&second), "dash/k"]);
    let url = format!("http://{metrics}/#token=peer-dash-token");

    let dom = browse(&browser, &dir, &url, &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    for shown in [
        r#"id="ready">serving<"#.to_string(),
        r#"id="values">1<"#.to_string(),
        r#"id="member-count">2<"#.to_string(),
        // The value's disk copy, written behind its put.
        r#"id="disk">1 copy<"#.to_string(),
        format!(r#"data-member="{second}""#),
        r#"data-op="get""#.to_string(),
        "updated ".to_string(),
    ] {
        assert!(dom.contains(&shown), "{shown} not shown:\n{dom}");
    }
    // Its one read was a hit: the latency table counts it.
    assert!(
        dom.contains(r#"<tr data-op="get"><td>get</td><td>1</td>"#),
        "the get not counted:\n{dom}"
    );

    // Without the token the page says what to do instead of showing figures.
    let refused = browse(
        &browser,
        &dir,
        &format!("http://{metrics}/"),
        &["--dump-dom"],
    );
    let refused = String::from_utf8_lossy(&refused.stdout);
    assert!(refused.contains("asks for a token"), "{refused}");
}
