//! Text from a job or a client never reaches the operator's terminal raw: `explain`, `status` and
//! `history` show the control characters of a run's output, a pause's reason and its `by` as visible
//! escapes (`\x1b`), on a real worker's history in the embedded store.

use std::time::Duration;

use crate::cli::{output, redcron};
use crate::embedded::start_worker;
use crate::support::TestDir;

/// The control bytes of `text` other than newlines (the layout's own), as (offset, byte); a C1 control
/// is two bytes in UTF-8 (0xC2 0x80–0x9F), reported by its second.
fn raw_controls(text: &str) -> Vec<(usize, u8)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        let c0 = (b < 0x20 && b != b'\n') || b == 0x7f;
        let c1 = i > 0 && bytes[i - 1] == 0xc2 && (0x80..=0x9f).contains(&b);
        if c0 || c1 {
            found.push((i, b));
        }
    }
    found
}

/// A job whose failing run prints a title change, a screen clear and a C1 CSI, paused with a reason
/// holding ESC and a newline by a `$USER` holding ESC: the three reports' text has no raw control
/// character, and shows them as escapes.
#[test]
fn reports_escape_what_jobs_and_clients_wrote() {
    let dir = TestDir::new();
    let jobs = "  - name: noisy\n    schedule: \"* * * * * *\"\n    command: \
                'printf \"\\033]0;pwned\\007\\033[2Jgone\\302\\233x\\n\"; exit 3'\n";
    let (worker, path) = start_worker(&dir, "w", jobs);
    let failed = worker
        .wait_for(Duration::from_secs(20), |e| {
            e["event"] == "run.finished" && e["job"] == "noisy"
        })
        .expect("the job ran");
    assert_eq!(failed["exit_code"], 3, "{failed}");
    let tick = failed["tick"].as_str().expect("a tick").to_string();
    let (code, _, stderr) = output(
        redcron(dir.path())
            .env("USER", "mallory\u{1b}[2J")
            .args([
                "pause",
                "noisy",
                "--reason",
                "fix\u{1b}]0;owned\u{7}\nforged row",
                "-c",
            ])
            .arg(&path),
    );
    assert_eq!(code, 0, "{stderr}");
    // The pause reaches the history once a worker has written it or the CLI has (it writes it itself).
    std::thread::sleep(Duration::from_millis(500));
    for args in [
        vec!["explain", "noisy", tick.as_str()],
        vec!["status"],
        vec!["history", "--job", "noisy"],
    ] {
        let (code, stdout, stderr) = output(redcron(dir.path()).args(&args).arg("-c").arg(&path));
        assert_eq!(code, 0, "{args:?}: {stderr}");
        let raw = raw_controls(&stdout);
        assert!(
            raw.is_empty(),
            "{args:?} printed raw controls {raw:?}:\n{stdout:?}"
        );
        assert!(raw_controls(&stderr).is_empty(), "{args:?}: {stderr:?}");
        match args[0] {
            "explain" => assert!(
                stdout.contains(r"\x1b]0;pwned\x07\x1b[2Jgone\u{9b}x"),
                "{stdout}"
            ),
            "status" => assert!(
                stdout.contains(r"fix\x1b]0;owned\x07\nforged row"),
                "{stdout}"
            ),
            _ => assert!(stdout.contains(r"by mallory\x1b[2J@"), "{stdout}"),
        }
    }
    drop(worker);
}
