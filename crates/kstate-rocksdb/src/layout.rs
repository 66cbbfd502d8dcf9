//! Which of the three layouts a RocksDB directory holds, and the metadata record that says so:
//! what an open checks before it touches anything, and what an error names when the directory
//! is of another layout.

/// The metadata record (unprefixed) that names a directory's layout; absent in the store layout.
pub(crate) const LAYOUT_KEY: &[u8] = b"kstate.layout.version";

/// The layout version of a task's RocksDB.
pub(crate) const TASK_LAYOUT_VERSION: u32 = 2;

/// The layout version of a RocksDB shared by many tasks.
pub(crate) const SHARED_LAYOUT_VERSION: u32 = 3;

/// How a directory's stores are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One store per directory (data in `default`).
    Store,
    /// The stores of one task, one column family each.
    Task,
    /// The stores of many tasks: a column family per store name, a key prefix per task.
    Shared,
}

impl Layout {
    /// The version its layout record holds (`None`: it has no record).
    pub(crate) fn version(self) -> Option<u32> {
        match self {
            Layout::Store => None,
            Layout::Task => Some(TASK_LAYOUT_VERSION),
            Layout::Shared => Some(SHARED_LAYOUT_VERSION),
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Store => "one store per directory",
            Layout::Task => "a task's stores, one column family each",
            Layout::Shared => "the stores of many tasks, a key prefix per task",
        })
    }
}
