//! Opening a store directory for the operator: it must already be a RocksDB directory (the
//! tool never creates one by mistake where the user mistyped a path), and RocksDB's own lock
//! refuses a directory a running application holds.

use std::path::Path;

use anyhow::{Context, Result, bail};
use kstate_kafka::ChangelogPosition;
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

/// Opens the existing store at `dir`.
pub(crate) fn open_existing(dir: &Path) -> Result<RocksDbStore> {
    if !dir.join("CURRENT").is_file() {
        bail!(
            "{} is not a store directory (no RocksDB CURRENT file there)",
            dir.display()
        );
    }
    RocksDbStore::open(dir, &RocksDbOptions::default())
        .with_context(|| format!("opening the store at {}", dir.display()))
}

/// The changelog position stored in `store`, or an error naming `dir` if there is none.
pub(crate) fn position(store: &RocksDbStore, dir: &Path) -> Result<ChangelogPosition> {
    ChangelogPosition::read(store)
        .with_context(|| format!("reading the changelog position of {}", dir.display()))?
        .with_context(|| {
            format!(
                "{} holds no changelog position: not a kstate logged store, or never committed",
                dir.display()
            )
        })
}

/// The bytes of every file under `dir`.
pub(crate) fn disk_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            disk_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
