//! The layout fixtures (`tests/fixtures/layouts/`) for the crate's unit tests: a test opens a
//! copy, since an open writes RocksDB's MANIFEST and OPTIONS files.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::path::{Path, PathBuf};

/// A copy of `fixture` (a path under `tests/fixtures/layouts`, e.g. `v2_cut_short/0`) in a
/// temporary directory, and the copy's path.
pub(crate) fn copy(fixture: &str) -> (tempfile::TempDir, PathBuf) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/layouts")
        .join(fixture);
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("copy");
    copy_tree(&from, &to);
    (dir, to)
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
