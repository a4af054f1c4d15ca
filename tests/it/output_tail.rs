//! A failed run's output tail (`output_tail`), kept by a real worker and read back through the store.

use std::time::Duration;

use redcron::history::Kind;

use crate::history::history;
use crate::support::{Persistence, RedisCluster, TestDir};
use crate::worker::start_workers;

/// A shell command printing 200 numbered lines on stdout and on stderr, then exiting with `code`.
fn loud(code: i32) -> String {
    format!(
        "'i=0; while [ $i -lt 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done; exit {code}'"
    )
}

/// The last `n` bytes of what [`loud`] prints on `stream` (`out` or `err`).
fn last(stream: &str, n: usize) -> String {
    let all: String = (0..200).map(|i| format!("{stream}{i}\n")).collect();
    all[all.len() - n..].to_string()
}

/// One worker, four jobs every second: a failing job that prints far more than its `output_tail` of 100
/// bytes has exactly the last 100 bytes of each stream in its run's end entry; the same output from a
/// job that succeeds leaves none; a failing job that printed nothing, or whose `output_tail` is 0, none.
#[test]
fn a_failed_run_keeps_the_tail_of_its_output() {
    let cluster = RedisCluster::builder()
        .nodes(3)
        .persistence(Persistence::None)
        .start();
    let dir = TestDir::new();
    let job = |name: &str, extra: &str, command: &str| {
        format!("  - name: {name}\n    schedule: \"* * * * * *\"\n{extra}    command: {command}\n")
    };
    let jobs = [
        job("fails", "    output_tail: 100\n", &loud(1)),
        job("succeeds", "    output_tail: 100\n", &loud(0)),
        job("silent", "", "'exit 2'"),
        job("off", "    output_tail: 0\n", &loud(1)),
    ]
    .concat();
    let workers = start_workers(&cluster, &dir, 1, "", &jobs);
    let finished = |job: &str| {
        workers[0]
            .events("run.finished")
            .iter()
            .filter(|e| e["job"] == job)
            .count()
    };
    let names = ["fails", "succeeds", "silent", "off"];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while names.iter().any(|job| finished(job) < 2) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(workers); // SIGTERM: runs end, the writer flushes its queue.

    for name in names {
        let ended: Vec<_> = history(&cluster, name)
            .into_iter()
            .filter(|e| e.kind == Kind::Run && e.outcome.is_some())
            .collect();
        let expected = if name == "succeeds" {
            "success"
        } else {
            "failure"
        };
        let checked = ended
            .iter()
            .filter(|e| e.outcome.as_deref() == Some(expected));
        assert!(checked.count() >= 2, "{name}: {ended:?}");
        for entry in ended {
            let tails = (entry.tail_out.as_deref(), entry.tail_err.as_deref());
            match (name, entry.outcome.as_deref()) {
                ("fails", Some("failure")) => {
                    let (out, err) = (last("out", 100), last("err", 100));
                    assert_eq!(tails, (Some(out.as_str()), Some(err.as_str())));
                }
                ("succeeds", Some("success")) | ("silent" | "off", Some("failure")) => {
                    assert_eq!(tails, (None, None), "{name}: {entry:?}")
                }
                // A run that the shutdown stopped is none of these.
                (_, Some("shutdown")) => {}
                (_, outcome) => panic!("{name}: unexpected outcome {outcome:?}: {entry:?}"),
            }
        }
    }
}
