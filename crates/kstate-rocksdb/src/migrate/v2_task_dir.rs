//! Layout 2: a RocksDB per task at `<task>/`, a column family `store.<name>` per store, each
//! store's metadata under `store.<name>/`, layout record 2 (or, when its creation was cut short,
//! store column families and no record). Read once, to be moved.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::db::{Db, OpenMode, store_cf};
use crate::error::OpenError;
use crate::layout::Layout;
use crate::migrate::copy::Reader;
use crate::options::RocksDbOptions;
use crate::part::Prefixes;
use crate::store::RocksDbStore;

/// A task directory of layout 2.
pub(crate) struct TaskDir {
    db: Arc<Db>,
    path: PathBuf,
}

impl TaskDir {
    /// The task's RocksDB at `path`, if there is one (its `CURRENT` file), opened without
    /// writing a layout record into it.
    pub(crate) fn open(path: &Path, options: &RocksDbOptions) -> Result<Option<Self>, OpenError> {
        if !path.join("CURRENT").is_file() {
            return Ok(None);
        }
        let db = Db::open(path, options, Layout::Task, &[], OpenMode::Legacy)?;
        Ok(Some(TaskDir {
            db: Arc::new(db),
            path: path.to_path_buf(),
        }))
    }

    /// The stores it holds, by name, in name order.
    pub(crate) fn stores(&self) -> Vec<String> {
        self.db.store_names()
    }

    /// A handle on store `name`, if the task's RocksDB has a column family for it (named in
    /// messages as `<task directory>/<name>`).
    pub(crate) fn store_handle(&self, name: &str) -> Option<RocksDbStore> {
        let cf = store_cf(name);
        if !self.db.families.contains(&cf) {
            return None;
        }
        let prefixes = Prefixes {
            metadata: format!("{cf}/").into_bytes(),
            ..Prefixes::default()
        };
        let display = self.path.join(name).display().to_string();
        Some(RocksDbStore::on(self.db.clone(), cf, prefixes, display))
    }

    /// Store `name`, for reading, if the task's RocksDB has a column family for it.
    pub(crate) fn store(&self, name: &str) -> Option<Reader> {
        self.store_handle(name).map(Reader::new)
    }

    /// The stores it holds besides `declared`.
    pub(crate) fn stores_besides(&self, declared: &[&str]) -> Vec<String> {
        self.stores()
            .into_iter()
            .filter(|s| !declared.contains(&s.as_str()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::METADATA_CF;
    use crate::layout::LAYOUT_KEY;

    fn layout_record(path: &Path) -> Option<Vec<u8>> {
        let db = rocksdb::DB::open_cf(
            &rocksdb::Options::default(),
            path,
            ["default", METADATA_CF, "store.counts"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let meta = db
            .cf_handle(METADATA_CF)
            .unwrap_or_else(|| panic!("no {METADATA_CF}"));
        db.get_cf(&meta, LAYOUT_KEY)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_task_directory_read_to_be_moved_gets_no_layout_record() {
        // The cut-short fixture: a task's RocksDB with column families and no layout record.
        let (_dir, path) = crate::test_fixtures::copy("v2_cut_short/0");
        let read = TaskDir::open(&path, &RocksDbOptions::default())
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no task directory"));
        assert!(read.store("counts").is_some());
        drop(read);
        assert_eq!(layout_record(&path), None);
        // An open of an existing RocksDB of the same layout writes it: the mode is what differs.
        drop(
            Db::open(
                &path,
                &RocksDbOptions::default(),
                Layout::Task,
                &[],
                OpenMode::Existing,
            )
            .unwrap_or_else(|e| panic!("{e}")),
        );
        assert!(layout_record(&path).is_some());
    }
}
