//! Layout 2: a RocksDB per task at `<task>/`, a column family `store.<name>` per store, each
//! store's metadata under `store.<name>/`, layout record 2 (or, when its creation was cut short,
//! store column families and no record). Read once, to be moved.

use std::path::Path;

use crate::db::OpenMode;
use crate::error::OpenError;
use crate::migrate::copy::Reader;
use crate::options::RocksDbOptions;
use crate::task_db::TaskDb;

/// A task directory of layout 2.
pub(crate) struct TaskDir(TaskDb);

impl TaskDir {
    /// The task's RocksDB at `path`, if there is one (its `CURRENT` file).
    pub(crate) fn open(path: &Path, options: &RocksDbOptions) -> Result<Option<Self>, OpenError> {
        if !path.join("CURRENT").is_file() {
            return Ok(None);
        }
        Ok(Some(TaskDir(TaskDb::open_in(
            path,
            options,
            OpenMode::Legacy,
        )?)))
    }

    /// Store `name`, if the task's RocksDB has a column family for it.
    pub(crate) fn store(&self, name: &str) -> Result<Option<Reader>, OpenError> {
        if !self.0.stores().iter().any(|s| s == name) {
            return Ok(None);
        }
        Ok(Some(Reader::new(self.0.store(name)?)))
    }

    /// The stores it holds besides `declared`.
    pub(crate) fn stores_besides(&self, declared: &[&str]) -> Vec<String> {
        self.0
            .stores()
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

    /// The cut-short fixture: a task's RocksDB with column families and no layout record.
    fn cut_short() -> tempfile::TempDir {
        let from =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/layouts/v2_cut_short/0");
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for entry in std::fs::read_dir(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display()))
        {
            let entry = entry.unwrap_or_else(|e| panic!("{e}"));
            std::fs::copy(entry.path(), dir.path().join(entry.file_name()))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        dir
    }

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
        let dir = cut_short();
        let read = TaskDir::open(dir.path(), &RocksDbOptions::default())
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no task directory"));
        assert!(
            read.store("counts")
                .unwrap_or_else(|e| panic!("{e}"))
                .is_some()
        );
        drop(read);
        assert_eq!(layout_record(dir.path()), None);
        // Today's opener of an existing task RocksDB writes it: the reader is what differs.
        drop(
            TaskDb::open_existing(dir.path(), &RocksDbOptions::default())
                .unwrap_or_else(|e| panic!("{e}")),
        );
        assert!(layout_record(dir.path()).is_some());
    }
}
