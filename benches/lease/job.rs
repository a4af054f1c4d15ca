//! The benchmark's job: `probe.rs`, compiled for the run.
//!
//! Shared by the bench target (`main.rs`, which runs itself as `--probe` where this fails) and the smoke
//! test, which runs its workers on the compiled probe so that a broken probe fails the tests.

use std::path::{Path, PathBuf};

/// Compiles `probe.rs` (embedded in this binary, so the checkout need not be where it was built) into
/// `dir` with `rustc -O` (`$RUSTC` when set), and returns the program's path. Linked statically where
/// the C library allows it: a start without the dynamic loader costs what `/bin/true`'s does (~0.6 ms of
/// CPU here, against ~0.9 ms linked dynamically and ~2 ms for this binary itself).
pub fn compile_probe(dir: &Path) -> Result<PathBuf, String> {
    let source = dir.join("probe.rs");
    let program = dir.join("redcron-bench-probe");
    std::fs::write(&source, include_str!("probe.rs")).map_err(|e| e.to_string())?;
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut why = String::new();
    for linking in [&["-C", "target-feature=+crt-static"][..], &[]] {
        let output = std::process::Command::new(&rustc)
            .args([
                "--edition",
                "2021",
                "-O",
                "-C",
                "panic=abort",
                "-C",
                "strip=symbols",
            ])
            .args(linking)
            .arg("-o")
            .arg(&program)
            .arg(&source)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", rustc.to_string_lossy()))?;
        if output.status.success() {
            return Ok(program);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        why = format!(
            "{} failed: {}",
            rustc.to_string_lossy(),
            stderr
                .lines()
                .find(|line| line.starts_with("error"))
                .unwrap_or("no message")
        );
    }
    Err(why)
}
