//! The worker's pages in a real browser: Debian's headless Chromium, driven over WebDriver by testkit's
//! [`Browser`], looks at what a person would see.

use std::path::Path;
use std::time::Duration;

use crate::support::{free_port, Backend, TestDir, Worker};
use testkit::Browser;

/// The harness itself: a worker's read-only dashboard (no token, loopback) loads in headless Chromium,
/// which shows the job's row and takes a screenshot that is a PNG. (`/metrics` would not do: Chromium
/// downloads an OpenMetrics answer rather than showing it.)
#[test]
fn chromium_loads_a_worker_page_and_takes_a_screenshot() {
    let store = Backend::Embedded.start();
    let dir = TestDir::new();
    let jobs = "  - name: yearly\n    schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n";
    let (_worker, port) = listening_worker(&dir, "w0", |port| {
        store.config(&format!("  id: w0\n  listen: 127.0.0.1:{port}\n"), jobs)
    });
    let browser = Browser::start();

    browser.goto(&format!("http://127.0.0.1:{port}/"));
    let row = browser.text(r#"#jobs tr[data-job="yearly"]"#);
    assert!(row.contains("yearly"), "the job's row: {row}");
    let shot = dir.join("index.png");
    browser.screenshot(&shot);
    assert_png(&shot);
}

/// A worker of the config `yaml` makes for a listen port, started and listening; on another port if the
/// one picked was taken before the worker bound it.
fn listening_worker(dir: &TestDir, name: &str, yaml: impl Fn(u16) -> String) -> (Worker, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut worker = Worker::spawn(dir.write(format!("{name}.yaml"), yaml(port)), &[]);
        let first = worker.wait_for(Duration::from_secs(30), |e| {
            e["event"] == "worker.listening" || e["event"] == "worker.failed"
        });
        match first {
            Some(event) if event["event"] == "worker.listening" => return (worker, port),
            Some(event)
                if event["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("in use")) =>
            {
                worker.wait_timeout(Duration::from_secs(10));
            }
            other => panic!("{name} is not listening: {other:?}\n{}", worker.stderr()),
        }
    }
    panic!("{name}: no free port in 5 attempts");
}

/// Panics unless `path` is a PNG image of the browser's window, 1280 pixels wide.
fn assert_png(path: &Path) {
    let png = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
    // The IHDR chunk comes first: its width is the big-endian u32 at bytes 16..20.
    let width = png
        .get(16..20)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    assert_eq!(width, Some(1280), "{} is not 1280 px wide", path.display());
}
