//! Item 8, the dashboard's jobs page at 1,000 jobs (issue 24: a page of 1,000 jobs weighs under 300 KB and
//! renders on the server in under 50 ms).
//!
//! One worker on 5 Redis nodes runs 1,000 jobs every second (`* * * * * *`, `true`) for 20 s, so that each
//! job's tick strip is full (20 cells). Then `/?per=1000` — all 1,000 jobs on one page — is asked 20 times
//! while the jobs go on running, and 20 times more after a reload moved every schedule to once a year: the
//! same jobs, history and strips, without the runs' load on the same cores. The page weight is what a
//! browser downloads: the body of a request that accepts compression as browsers do (`gzip, deflate, br`),
//! as it comes over the wire, beside the HTML's own size. Each answer's `Server-Timing` (`store;dur=…, render;dur=…`) is the worker's own time reading the store
//! and rendering the HTML. The client's time for the whole request is set beside the time of `/metrics`
//! asked right after it (the peer: the same listener's cheapest page, in the same process, at the same
//! moment), as a ratio. The page's cells, counted by outcome, say whether this machine kept up with the
//! runs (a tick nobody ran in time is `missed`, not `ran`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use testkit::Worker;

use super::nodes::Backend;
use super::stats::{ms, ratio, Samples, Table, Verdict};
use super::workers::config_yaml;

/// The issue's targets.
const MAX_WEIGHT_KB: f64 = 300.0;
const MAX_RENDER: Duration = Duration::from_millis(50);
/// Requests before the measured ones (the first page pays for connections and caches).
const WARM: usize = 2;

/// How big the run is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub jobs: usize,
    /// How long the jobs run every second before the page is measured.
    pub seconds: u64,
    /// Measured requests of the page per phase.
    pub requests: usize,
}

impl Size {
    pub fn full() -> Size {
        Size {
            jobs: 1_000,
            seconds: 20,
            requests: 20,
        }
    }

    pub fn smoke() -> Size {
        Size {
            jobs: 20,
            seconds: 3,
            requests: 3,
        }
    }
}

/// What one phase measured.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub name: &'static str,
    /// Rows of the page's jobs table (all the jobs, or the page is wrong).
    pub rows: usize,
    /// Tick cells on the last page asked, by outcome (`ran`, `missed`, …).
    pub cells: BTreeMap<String, usize>,
    /// The largest page's HTML in bytes.
    pub bytes: usize,
    /// The page as a browser downloads it (asking for compression), in bytes, and its `Content-Encoding`
    /// (empty: none).
    pub wire_bytes: usize,
    pub encoding: String,
    /// The worker's `Server-Timing`: rendering, and reading the store.
    pub render: Samples,
    pub store: Samples,
    /// The client's whole request of the page, and of `/metrics` right after it.
    pub request: Samples,
    pub metrics: Samples,
}

impl Phase {
    /// What a browser downloads, in KB.
    pub fn weight_kb(&self) -> f64 {
        self.wire_bytes as f64 / 1024.0
    }

    /// Tick cells per row.
    pub fn cells_per_row(&self) -> f64 {
        let cells: usize = self.cells.values().sum();
        cells as f64 / self.rows.max(1) as f64
    }
}

/// What item 8 measured.
#[derive(Debug, Clone)]
pub struct Page {
    pub size: Size,
    /// While the jobs run, then after they were moved to once a year.
    pub phases: Vec<Phase>,
}

/// Runs item 8 with the `redcron` binary `worker`.
pub fn run(worker: &Path, size: Size, print: &mut dyn FnMut(&str)) -> Result<Page, String> {
    let nodes = Backend::Redis.start_nodes(5);
    let urls = nodes.urls();
    let dir = tempfile::Builder::new()
        .prefix("redcron-bench-dashboard-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let config = dir.path().join("jobs.yaml");
    let command = ["true".to_string()];
    let yaml = |port: u16, schedule: &str| {
        let yaml = config_yaml(Backend::Redis, &urls, "w1", size.jobs, schedule, &command);
        yaml.replacen(
            "worker:\n",
            &format!("worker:\n  listen: 127.0.0.1:{port}\n"),
            1,
        )
    };
    let (mut worker, port) = listening(worker, &config, |port| yaml(port, "* * * * * *"))?;
    std::thread::sleep(Duration::from_secs(size.seconds + 1));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut phases = vec![measure(
        &agent,
        port,
        size,
        "while the jobs run every second",
    )?];
    std::fs::write(&config, yaml(port, "0 0 1 1 *")).map_err(|e| e.to_string())?;
    worker.signal(libc::SIGHUP);
    worker
        .wait_for_event("config.reloaded", Duration::from_secs(60))
        .ok_or("the worker did not reload its config")?;
    phases.push(measure(&agent, port, size, "after, the jobs once a year")?);
    drop(worker);
    let page = Page { size, phases };
    print(&table(&page));
    Ok(page)
}

/// A worker of `binary` on `config` (written by `yaml(port)`) that listens: it and its port.
fn listening(
    binary: &Path,
    config: &Path,
    yaml: impl Fn(u16) -> String,
) -> Result<(Worker, u16), String> {
    for _ in 0..5 {
        let port = testkit::free_port();
        std::fs::write(config, yaml(port)).map_err(|e| e.to_string())?;
        let worker = Worker::builder(config).binary(binary).spawn();
        let first = worker.wait_for(Duration::from_secs(60), |e| {
            e["event"] == "worker.listening" || e["event"] == "worker.failed"
        });
        match first {
            Some(event) if event["event"] == "worker.listening" => return Ok((worker, port)),
            Some(event)
                if event["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("in use")) => {}
            other => return Err(format!("the worker is not listening: {other:?}")),
        }
    }
    Err("no free port in 5 attempts".to_string())
}

/// Asks `/?per=1000` and then `/metrics` `size.requests` times (after [`WARM`]).
fn measure(
    agent: &ureq::Agent,
    port: u16,
    size: Size,
    name: &'static str,
) -> Result<Phase, String> {
    let mut phase = Phase {
        name,
        ..Phase::default()
    };
    for i in 0..WARM + size.requests {
        let got = get(agent, port, "/?per=1000", &[])?;
        let metrics = get(agent, port, "/metrics", &[])?.took;
        if i < WARM {
            continue;
        }
        let (timing, page) = (&got.timing, String::from_utf8_lossy(&got.body));
        let dur = |name: &str| -> Result<Duration, String> {
            timing
                .split(", ")
                .find_map(|part| part.strip_prefix(name)?.strip_prefix(";dur="))
                .and_then(|ms| ms.parse::<f64>().ok())
                .map(|ms| Duration::from_secs_f64(ms / 1e3))
                .ok_or_else(|| format!("no {name} in Server-Timing {timing:?}"))
        };
        phase.render.push(dur("render")?);
        phase.store.push(dur("store")?);
        phase.request.push(got.took);
        phase.metrics.push(metrics);
        phase.bytes = phase.bytes.max(page.len());
        let browser = [("accept-encoding", "gzip, deflate, br")];
        let wire = get(agent, port, "/?per=1000", &browser)?;
        phase.wire_bytes = phase.wire_bytes.max(wire.body.len());
        phase.encoding = wire.encoding;
        phase.rows = page.matches("<tr data-job=\"").count();
        phase.cells = BTreeMap::new();
        // A cell is `<li class="tick t-<outcome>" …>`.
        for cell in page.split("<li class=\"tick t-").skip(1) {
            let outcome = cell.split('"').next().unwrap_or("").to_string();
            *phase.cells.entry(outcome).or_default() += 1;
        }
    }
    if phase.rows != size.jobs {
        return Err(format!(
            "{name}: the page lists {} jobs of {}",
            phase.rows, size.jobs
        ));
    }
    Ok(phase)
}

/// What one GET brought.
struct Got {
    /// From before the request to the last byte of the body.
    took: Duration,
    /// The `Server-Timing` and `Content-Encoding` headers (empty when absent).
    timing: String,
    encoding: String,
    /// The body as it came (this client decodes no compression).
    body: Vec<u8>,
}

/// One GET of `path` with `headers`; an answer other than 200 is an error.
fn get(
    agent: &ureq::Agent,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Got, String> {
    let started = Instant::now();
    let request = headers.iter().fold(
        agent.get(format!("http://127.0.0.1:{port}{path}")),
        |request, (name, value)| request.header(*name, *value),
    );
    let mut response = request.call().map_err(|e| format!("GET {path}: {e}"))?;
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (timing, encoding) = (header("server-timing"), header("content-encoding"));
    let body = response
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_vec()
        .map_err(|e| format!("GET {path}: {e}"))?;
    let took = started.elapsed();
    if status != 200 {
        let text = String::from_utf8_lossy(&body);
        return Err(format!("GET {path}: {status}: {text}"));
    }
    Ok(Got {
        took,
        timing,
        encoding,
        body,
    })
}

fn table(page: &Page) -> String {
    let mut table = Table::new(&[
        "phase",
        "rows",
        "cells per row",
        "HTML (KB)",
        "downloaded (KB)",
        "render p50 (ms)",
        "render p99 (ms)",
        "store p50 (ms)",
        "store p99 (ms)",
        "request p50 (ms)",
        "/metrics p50 (ms)",
        "request ÷ /metrics",
    ]);
    for phase in &page.phases {
        table.row(vec![
            phase.name.to_string(),
            phase.rows.to_string(),
            format!("{:.1}", phase.cells_per_row()),
            format!("{:.0}", phase.bytes as f64 / 1024.0),
            match phase.encoding.as_str() {
                "" => format!("{:.0}, not compressed", phase.weight_kb()),
                encoding => format!("{:.0}, {encoding}", phase.weight_kb()),
            },
            ms(phase.render.p50()),
            ms(phase.render.p99()),
            ms(phase.store.p50()),
            ms(phase.store.p99()),
            ms(phase.request.p50()),
            ms(phase.metrics.p50()),
            ratio(phase.request.p50(), phase.metrics.p50()),
        ]);
    }
    let cells: Vec<String> = page
        .phases
        .iter()
        .map(|phase| {
            let counts: Vec<String> = phase
                .cells
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            format!("{}: {}", phase.name, counts.join(", "))
        })
        .collect();
    let size = page.size;
    format!(
        "\n## 8. The dashboard at {} jobs\n\n{} jobs on `* * * * * *` ran for {} s on one worker on 5 Redis \
         nodes; then `/?per=1000` (all jobs, a strip of up to 20 ticks each) was asked {} times, each \
         followed by `/metrics`, while the jobs ran and again after a reload moved them to once a year. \
         Downloaded is the page as a browser asking for compression gets it (the weight target); render and \
         store are the worker's `Server-Timing`; request is the client's whole request.\n\n{}\n\
         Cells on the last page by outcome — {}.\n",
        size.jobs,
        size.jobs,
        size.seconds,
        size.requests,
        table.render(),
        cells.join("; ")
    )
}

/// The issue's targets, in every phase.
pub fn verdicts(page: &Page) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for phase in &page.phases {
        let weight = phase.weight_kb();
        verdicts.push(Verdict::new(
            format!(
                "Dashboard, {} jobs on one page ({}): weight < {MAX_WEIGHT_KB:.0} KB",
                page.size.jobs, phase.name
            ),
            format!("{weight:.0} KB"),
            Some(weight < MAX_WEIGHT_KB),
        ));
        let render = phase.render.p99();
        verdicts.push(Verdict::new(
            format!(
                "Dashboard, {} jobs on one page ({}): render p99 < {} ms",
                page.size.jobs,
                phase.name,
                MAX_RENDER.as_millis()
            ),
            format!("{} ms", ms(render)),
            render.map(|r| r < MAX_RENDER),
        ));
    }
    verdicts
}
