//! [`OpenError`]: why a RocksDB store could not be opened, naming the path.
//!
//! RocksDB reports every open failure as a status string. The cases a user can act on (the
//! directory is already open, the path is a file, the directory is not writable) are classified
//! here so that callers can match on them instead of parsing messages.

use std::path::PathBuf;

/// Why [`RocksDbStore::open`](crate::RocksDbStore::open), a shared RocksDB
/// ([`SharedDb::open`](crate::SharedDb::open)) or a task's stores
/// ([`StateDir::open_task`](crate::StateDir::open_task)) failed to open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Reading a store at `path` to find its newest copy failed.
    #[error("reading the store at {path} failed: {source}")]
    Read {
        /// The store, named as `<task directory>/<store>`.
        path: PathBuf,
        /// The failure.
        #[source]
        source: kstate_core::Error,
    },

    /// Moving what an older layout left at `path` into today's failed; the older copy is
    /// intact (it is deleted only once the new one holds its metadata).
    #[error("moving the {from} at {path} into the shared RocksDB failed: {source}")]
    Migrate {
        /// The older layout's directory.
        path: PathBuf,
        /// Its layout.
        from: crate::layout::Layout,
        /// The failure.
        #[source]
        source: kstate_core::Error,
    },

    /// A wipe was refused because the directory holds something RocksDB did not write.
    #[error(
        "refusing to wipe {path}: it holds {unexpected}, which is not a RocksDB file; is this \
         really a store directory?"
    )]
    NotAStoreDirectory {
        /// The directory.
        path: PathBuf,
        /// The first entry that is not a RocksDB file.
        unexpected: String,
    },

    /// Removing a store directory for a rebuild failed.
    #[error("cannot wipe {path} for a rebuild: {source}")]
    Wipe {
        /// The store directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },

    /// Another handle, in this process or another, holds the store's `LOCK` file.
    #[error(
        "cannot open store at {path}: it is already open (RocksDB's LOCK file is held): {source}"
    )]
    AlreadyOpen {
        /// The store directory.
        path: PathBuf,
        /// RocksDB's report.
        #[source]
        source: rocksdb::Error,
    },

    /// A task of a shared RocksDB is still open in this process (a task moving between two
    /// workers is still closing in the one it left).
    #[error("task {task} of the RocksDB at {path} is already open in this process")]
    TaskHeld {
        /// The shared RocksDB's directory.
        path: PathBuf,
        /// The task.
        task: u32,
    },

    /// The path exists and is not a directory.
    #[error("cannot open store at {path}: the path exists and is not a directory")]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },

    /// The directory cannot be created or written.
    #[error("cannot open store at {path}: permission denied: {source}")]
    PermissionDenied {
        /// The store directory.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: kstate_core::BoxError,
    },

    /// The store's files are damaged.
    #[error("cannot open store at {path}: the store is corrupt: {source}")]
    Corrupt {
        /// The store directory.
        path: PathBuf,
        /// RocksDB's report.
        #[source]
        source: rocksdb::Error,
    },

    /// Any other file system failure while preparing the directory.
    #[error("cannot open store at {path}: {source}")]
    Io {
        /// The store directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },

    /// An operator's tool named a directory that holds no RocksDB.
    #[error("cannot open {path}: there is no RocksDB there (no CURRENT file)")]
    NotFound {
        /// The directory.
        path: PathBuf,
    },

    /// The directory holds a RocksDB of the other layout: a single store where a task's stores
    /// were expected, or the reverse.
    #[error("cannot open {path} as {wanted}: it holds {found}")]
    WrongLayout {
        /// The directory.
        path: PathBuf,
        /// What it holds.
        found: crate::layout::Layout,
        /// What was asked for.
        wanted: crate::layout::Layout,
    },

    /// The directory's layout record or a store name is unusable.
    #[error("cannot open {path}: {message}")]
    Layout {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// A task's RocksDB holds no store of that name.
    #[error("{path} holds no store {store:?} (it holds {held:?})")]
    NoSuchStore {
        /// The task's RocksDB directory.
        path: PathBuf,
        /// The store asked for.
        store: String,
        /// The stores it holds.
        held: Vec<String>,
    },

    /// Any other failure RocksDB reported.
    #[error("cannot open store at {path}: {source}")]
    Rocks {
        /// The store directory.
        path: PathBuf,
        /// RocksDB's report.
        #[source]
        source: rocksdb::Error,
    },
}

impl OpenError {
    /// Classifies an I/O error from preparing the directory.
    pub(crate) fn from_io(path: PathBuf, source: std::io::Error) -> Self {
        match source.kind() {
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                OpenError::PermissionDenied {
                    path,
                    source: Box::new(source),
                }
            }
            std::io::ErrorKind::NotADirectory | std::io::ErrorKind::AlreadyExists => {
                OpenError::NotADirectory { path }
            }
            _ => OpenError::Io { path, source },
        }
    }

    /// Classifies RocksDB's status from `DB::open`.
    pub(crate) fn from_rocks(path: PathBuf, source: rocksdb::Error) -> Self {
        let message = source.as_ref().to_ascii_lowercase();
        if message.contains("lock")
            && (message.contains("lock hold by current process")
                || message.contains("resource temporarily unavailable")
                || message.contains("no locks available"))
        {
            OpenError::AlreadyOpen { path, source }
        } else if message.contains("permission denied") || message.contains("read-only file system")
        {
            OpenError::PermissionDenied {
                path,
                source: Box::new(source),
            }
        } else if matches!(source.kind(), rocksdb::ErrorKind::Corruption) {
            OpenError::Corrupt { path, source }
        } else {
            OpenError::Rocks { path, source }
        }
    }
}
