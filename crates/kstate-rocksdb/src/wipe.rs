//! Wiping a store directory for a rebuild, without ever deleting what is not a store.
//!
//! The directory is first renamed aside, atomically, to a hidden sibling, then deleted. A crash
//! in the middle leaves either the old store or an empty place for the new one, never a
//! half-deleted store that opens as a corrupt or partial one, and the leftover sibling says what
//! it was. And a directory holding anything RocksDB does not write (a subdirectory, a user's
//! file) is refused: a mistyped path must not cost someone their home directory.
//!
//! Deleting a large copy takes minutes, and a process killed meanwhile leaves the copy behind
//! for good. So each restore first deletes the leftover copies of its own store
//! ([`remove_leftover_copies`]), each with a warning naming it: a directory named exactly as a
//! wipe of this store names its copy, holding only RocksDB's files, and not being deleted right
//! now. The name carries the wiping process's id: a copy of another process that is still alive
//! may still be in its deletion and is left to it (where there is no `/proc` to ask, every other
//! process counts as alive); a copy with this process's id that no wipe of this process is
//! deleting was left by an earlier process that had the same id (a restarted container).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use kstate_core::sync::lock;

use crate::error::OpenError;

/// Whether RocksDB writes files of this name into a database directory.
fn is_rocksdb_file(name: &str) -> bool {
    const NAMES: &[&str] = &["CURRENT", "IDENTITY", "LOCK", "LOG"];
    const PREFIXES: &[&str] = &["MANIFEST-", "OPTIONS-", "LOG.old.", "CURRENT.", "IDENTITY."];
    const SUFFIXES: &[&str] = &[".sst", ".log", ".blob", ".ldb", ".dbtmp", ".tmp"];
    NAMES.contains(&name)
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// What `path` holds besides the files RocksDB writes: each entry described ("the file
/// \"x\"", "the directory or link \"y\""). A wipe refuses a directory holding any.
pub fn foreign_entries(path: &Path) -> Result<Vec<String>, OpenError> {
    let io = |source| OpenError::Wipe {
        path: path.to_path_buf(),
        source,
    };
    let mut foreign = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().map_err(io)?.is_file();
        if !is_file || !is_rocksdb_file(&name) {
            foreign.push(if is_file {
                format!("the file {name:?}")
            } else {
                format!("the directory or link {name:?}")
            });
        }
    }
    Ok(foreign)
}

/// Checks that `path` holds only files RocksDB writes.
fn check_is_store_directory(path: &Path) -> Result<(), OpenError> {
    match foreign_entries(path)?.into_iter().next() {
        None => Ok(()),
        Some(unexpected) => Err(OpenError::NotAStoreDirectory {
            path: path.to_path_buf(),
            unexpected,
        }),
    }
}

/// The copies this process's wipes are deleting right now.
static DELETING: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn deleting() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    lock(&DELETING)
}

/// Renames the store directory at `path` aside and deletes it. The store must be closed.
pub fn wipe(path: &Path) -> Result<(), OpenError> {
    check_is_store_directory(path)?;
    let aside = aside_name(path);
    deleting().insert(aside.clone());
    let wiped = rename_aside_and_delete(path, &aside);
    deleting().remove(&aside);
    wiped
}

fn rename_aside_and_delete(path: &Path, aside: &Path) -> Result<(), OpenError> {
    std::fs::rename(path, aside).map_err(|source| OpenError::Wipe {
        path: path.to_path_buf(),
        source,
    })?;
    // The store's place is free now; a failure below leaves only the renamed copy behind.
    if let Err(e) = std::fs::remove_dir_all(aside) {
        tracing::warn!(path = %aside.display(), error = %e, "could not delete a wiped store; delete it by hand");
    }
    Ok(())
}

/// The store's file name, as the copies' names carry it.
fn store_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "store".into(), |n| n.to_string_lossy().into_owned())
}

/// `<parent>/.<name>.kstate-wiped-<pid>-<nanos>`: hidden, unique, on the same file system.
fn aside_name(path: &Path) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    path.with_file_name(format!(
        ".{}.kstate-wiped-{}-{nanos}",
        store_name(path),
        std::process::id()
    ))
}

/// The id of the process that named a copy `file_name` when wiping the store `name`; `None`
/// when `file_name` is not such a copy's name.
fn wiping_process(file_name: &str, name: &str) -> Option<u32> {
    let rest = file_name
        .strip_prefix('.')?
        .strip_prefix(name)?
        .strip_prefix(".kstate-wiped-")?;
    let (pid, nanos) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(nanos) {
        return None;
    }
    pid.parse().ok()
}

/// Whether the wipe that made the copy `aside` (named by process `pid`) may still be deleting it.
fn may_still_be_deleting(pid: u32, aside: &Path) -> bool {
    if pid == std::process::id() {
        return deleting().contains(aside);
    }
    let proc = Path::new("/proc");
    // Without a /proc to ask, the process may be alive.
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// Deletes the copies that wipes of the store at `path` renamed aside and did not finish
/// deleting (their process was killed), warning for each. Anything else is left alone: other
/// stores' copies, copies a live process may still be deleting, and whatever is not a directory
/// of RocksDB files named as a copy. Failures only warn: a leftover wastes space, nothing more.
pub fn remove_leftover_copies(path: &Path) {
    let Some(parent) = path.parent() else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let name = store_name(path);
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|file_name| wiping_process(file_name, &name))
        else {
            continue;
        };
        let aside = entry.path();
        // A real directory (never a link's target), holding what a wipe would have deleted.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || may_still_be_deleting(pid, &aside) {
            continue;
        }
        if let Err(e) = check_is_store_directory(&aside) {
            tracing::warn!(path = %aside.display(), error = %e, "left alone: named as a wiped store's copy, but not one");
            continue;
        }
        match std::fs::remove_dir_all(&aside) {
            Ok(()) => {
                tracing::warn!(path = %aside.display(), "deleted a wiped store's copy an interrupted wipe left behind");
            }
            Err(e) => {
                tracing::warn!(path = %aside.display(), error = %e, "could not delete a wiped store's copy an interrupted wipe left behind; delete it by hand");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_a_foreign_file_is_not_wiped() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(store.join("CURRENT"), b"MANIFEST-000001\n")
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(store.join("thesis.tex"), b"years of work")
            .unwrap_or_else(|e| panic!("{e}"));
        let err = wipe(&store).unwrap_err();
        assert!(matches!(err, OpenError::NotAStoreDirectory { .. }), "{err}");
        assert!(store.join("thesis.tex").exists());
    }

    #[test]
    fn only_the_exact_name_of_this_stores_copy_is_taken_for_one() {
        assert_eq!(wiping_process(".s.kstate-wiped-42-1700", "s"), Some(42));
        assert_eq!(wiping_process(".a.b.kstate-wiped-7-1", "a.b"), Some(7));
        for (file_name, store) in [
            (".s.kstate-wiped-42-1700", "t"),
            (".s.kstate-wiped-42-1700", "s.x"),
            ("s.kstate-wiped-42-1700", "s"),
            (".s.kstate-wiped-42", "s"),
            (".s.kstate-wiped-42-", "s"),
            (".s.kstate-wiped--1700", "s"),
            (".s.kstate-wiped-42-1700-old", "s"),
            (".s.kstate-wiped-x-1700", "s"),
        ] {
            assert_eq!(
                wiping_process(file_name, store),
                None,
                "{file_name} for store {store}"
            );
        }
    }

    #[test]
    fn a_store_directory_is_renamed_aside_and_deleted() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap_or_else(|e| panic!("{e}"));
        for name in [
            "CURRENT",
            "MANIFEST-000005",
            "000007.sst",
            "OPTIONS-000009",
            "LOG",
        ] {
            std::fs::write(store.join(name), b"x").unwrap_or_else(|e| panic!("{e}"));
        }
        wipe(&store).unwrap_or_else(|e| panic!("{e}"));
        assert!(!store.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .collect();
        assert!(left.is_empty(), "nothing is left behind: {left:?}");
    }
}
