//! The services the runtime's tests and the benchmarks run as processes of their own
//! (`count_by_key`, `windowed_count`) answer `--help` with the flags those callers pass. Being
//! an integration test of this crate, it also makes `cargo test --workspace` build the crate's
//! binaries, where the workspace's tests find them (`$CARGO_TARGET_DIR/release/<name>`).

use std::process::Command;

/// `binary --help`'s output, once it exited with success.
fn help(binary: &str) -> String {
    let output = Command::new(binary)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{binary}: {e}"));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{binary} --help: {output:?}");
    text
}

#[test]
fn each_service_answers_help_with_the_flags_its_callers_pass() {
    let services = [
        (
            env!("CARGO_BIN_EXE_count_by_key"),
            &[
                "--application-id",
                "--input",
                "--output",
                "--state-dir",
                "--instance-id",
            ][..],
        ),
        (
            env!("CARGO_BIN_EXE_windowed_count"),
            &[
                "--application-id",
                "--input",
                "--output",
                "--window-secs",
                "--grace-secs",
            ][..],
        ),
    ];
    for (binary, flags) in services {
        let text = help(binary);
        for flag in flags {
            assert!(text.contains(flag), "{binary} --help lacks {flag}:\n{text}");
        }
    }
}
