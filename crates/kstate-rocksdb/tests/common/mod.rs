//! What the crash tests share: running this test binary's own child test in a child process,
//! until it says it is ready to be killed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// What a child prints once it has written what the parent's check relies on.
pub const READY: &str = "KSTATE-CHILD-READY";

/// Runs test `child_test` of this binary in a child process with `env` naming `dir`, and returns
/// it once it printed [`READY`].
pub fn spawn_until_ready(child_test: &str, env: &str, dir: &Path) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(env, dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains(READY));
    assert!(
        ready,
        "the child exited before writing; see its output above"
    );
    child
}
