//! Bad paths and double opens give typed errors that name the path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a panic

use std::os::unix::fs::PermissionsExt;

use kstate_rocksdb::{OpenError, RocksDbOptions, RocksDbStore};

#[test]
fn opening_an_open_store_again_is_already_open() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
    let err = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::AlreadyOpen { ref path, .. } if path == dir.path()),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
}

#[test]
fn reopening_after_drop_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    drop(RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap());
    RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
}

#[test]
fn a_path_that_is_a_file_is_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a store").unwrap();
    let err = RocksDbStore::open(&file, &RocksDbOptions::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::NotADirectory { ref path } if *path == file),
        "{err:?}"
    );
    assert!(err.to_string().contains("plain-file"), "{err}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"not a store",
        "the file is left as it was"
    );

    let below = file.join("store");
    let err = RocksDbStore::open(&below, &RocksDbOptions::default()).unwrap_err();
    assert!(matches!(err, OpenError::NotADirectory { .. }), "{err:?}");
}

#[test]
fn an_unwritable_directory_is_permission_denied() {
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("read-only");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores permission bits (CI runs as root). Then use sysfs, where nobody may create
    // a directory, so the test checks the same classification either way.
    let target = if std::fs::write(locked.join("probe"), b"").is_ok() {
        std::path::PathBuf::from("/sys/kstate-open-errors-test/store")
    } else {
        locked.join("store")
    };
    let err = RocksDbStore::open(&target, &RocksDbOptions::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::PermissionDenied { ref path, .. } if *path == target),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&target.display().to_string()),
        "{err}"
    );
}
