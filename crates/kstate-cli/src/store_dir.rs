//! Opening a store for the operator. A path names a directory holding one store (the layout
//! kstate wrote first), or `<state-dir>/<app-id>/<p>/<store>`: a store of task *p*, at the path
//! where the oldest layout kept it, whichever layout holds it now (the RocksDB the
//! application's tasks share, `<state-dir>/<app-id>/rocksdb`, or an older one). kstate-rocksdb's
//! [`StateDir`] decides which copy that is, as it does for the application: the tool reads the
//! copy the application keeps ([`StateDir::read_store`]) and writes where the application
//! reads ([`StateDir::open_task`]). The tool never creates a RocksDB where the user mistyped a
//! path, and RocksDB's own lock refuses a directory a running application holds.

use std::path::Path;

use anyhow::{Context, Result, bail};
use kstate_kafka::{ChangelogPosition, StoreLocation};
use kstate_rocksdb::{
    Layout, OpenError, RocksDbOptions, RocksDbStore, SHARED_DIR, StateDir, migrate,
};

/// Opens the existing store at `dir`.
pub(crate) fn open_existing(dir: &Path) -> Result<RocksDbStore> {
    let options = RocksDbOptions::default();
    if let Some(at) = StateDir::parse_store_path(dir) {
        // The copy the application keeps, whichever layout holds it.
        return Ok(StateDir::read_store(&at, &options)?);
    }
    if !dir.join("CURRENT").is_file() {
        bail!(
            "{} is not a store directory (no RocksDB CURRENT file there), nor a store of a task's \
             RocksDB (none in its parent directory)",
            dir.display()
        );
    }
    match RocksDbStore::open(dir, &options) {
        Err(OpenError::WrongLayout {
            found: Layout::Task,
            ..
        }) => {
            let stores = migrate::task_dir_stores(dir, &options).unwrap_or_default();
            bail!(
                "{} holds the stores of a task ({}): name one as {}/<store>",
                dir.display(),
                stores.join(", "),
                dir.display()
            )
        }
        Err(OpenError::WrongLayout {
            found: Layout::Shared,
            ..
        }) => {
            let app = dir.parent().unwrap_or(dir);
            bail!(
                "{} holds the stores of an application's tasks: name one as {}/<partition>/<store>",
                dir.display(),
                app.display()
            )
        }
        result => result.with_context(|| format!("opening the store at {}", dir.display())),
    }
}

/// Where the store at `dir` is, for commands that may create it (`restore`, `reseed`): in the
/// application's shared RocksDB when `dir` is `<state-dir>/<app-id>/<p>/<store>` of an
/// application that has one (opened as the application opens a task: what older layouts left
/// for the store is moved in first), else a directory of its own. A store of a task's RocksDB
/// of the older layout, in a state directory without a shared RocksDB, is refused: the tool
/// does not write an older layout.
pub(crate) fn location(dir: &Path) -> Result<StoreLocation> {
    let Some(at) = StateDir::parse_store_path(dir) else {
        return Ok(StoreLocation::Directory(dir.to_path_buf()));
    };
    if !at.root.join(SHARED_DIR).join("CURRENT").is_file() {
        bail!(
            "{} is a store of a task's RocksDB of an older layout ({}): start the application \
             once (it moves its tasks into the RocksDB they share, {}), or write into a \
             directory of its own",
            dir.display(),
            at.root.join(at.task.to_string()).display(),
            at.root.join(SHARED_DIR).display()
        );
    }
    let options = RocksDbOptions::default();
    let state = StateDir::open(&at.root, &[&at.store], &options)
        .with_context(|| format!("opening the tasks' RocksDB in {}", at.root.display()))?;
    Ok(StoreLocation::InTask {
        db: state.open_task(at.task, &[&at.store])?,
        name: at.store,
    })
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

/// The bytes the store at `dir` takes on disk: every file of its directory, or, for a store of
/// a task, its SST files ([`RocksDbStore::sst_bytes`]).
pub(crate) fn disk_bytes(store: &RocksDbStore, dir: &Path) -> Result<u64> {
    if dir.is_dir() {
        return directory_bytes(dir);
    }
    Ok(store.sst_bytes()?)
}

/// The bytes of every file under `dir`.
fn directory_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            directory_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
