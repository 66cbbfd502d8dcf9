//! Wiping a store directory for a rebuild, without ever deleting what is not a store.
//!
//! The directory is first renamed aside, atomically, to a hidden sibling, then deleted. A crash
//! in the middle leaves either the old store or an empty place for the new one, never a
//! half-deleted store that opens as a corrupt or partial one, and the leftover sibling says what
//! it was. And a directory holding anything RocksDB does not write (a subdirectory, a user's
//! file) is refused: a mistyped path must not cost someone their home directory.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::ChangelogError;

/// Whether RocksDB writes files of this name into a database directory.
fn is_rocksdb_file(name: &str) -> bool {
    const NAMES: &[&str] = &["CURRENT", "IDENTITY", "LOCK", "LOG"];
    const PREFIXES: &[&str] = &["MANIFEST-", "OPTIONS-", "LOG.old.", "CURRENT.", "IDENTITY."];
    const SUFFIXES: &[&str] = &[".sst", ".log", ".blob", ".ldb", ".dbtmp", ".tmp"];
    NAMES.contains(&name)
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// Checks that `path` holds only files RocksDB writes.
fn check_is_store_directory(path: &Path) -> Result<(), ChangelogError> {
    let io = |source| ChangelogError::Wipe {
        path: path.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(path).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().map_err(io)?.is_file();
        if !is_file || !is_rocksdb_file(&name) {
            return Err(ChangelogError::NotAStoreDirectory {
                path: path.to_path_buf(),
                unexpected: if is_file {
                    format!("the file {name:?}")
                } else {
                    format!("the directory or link {name:?}")
                },
            });
        }
    }
    Ok(())
}

/// Renames the store directory at `path` aside and deletes it. The store must be closed.
pub(crate) fn wipe(path: &Path) -> Result<(), ChangelogError> {
    check_is_store_directory(path)?;
    let aside = aside_name(path);
    std::fs::rename(path, &aside).map_err(|source| ChangelogError::Wipe {
        path: path.to_path_buf(),
        source,
    })?;
    // The store's place is free now; a failure below leaves only the renamed copy behind.
    if let Err(e) = std::fs::remove_dir_all(&aside) {
        tracing::warn!(path = %aside.display(), error = %e, "could not delete a wiped store; delete it by hand");
    }
    Ok(())
}

/// `<parent>/.<name>.kstate-wiped-<pid>-<nanos>`: hidden, unique, on the same file system.
fn aside_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "store".into(), |n| n.to_string_lossy().into_owned());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    path.with_file_name(format!(
        ".{name}.kstate-wiped-{}-{nanos}",
        std::process::id()
    ))
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
        assert!(
            matches!(err, ChangelogError::NotAStoreDirectory { .. }),
            "{err}"
        );
        assert!(store.join("thesis.tex").exists());
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
