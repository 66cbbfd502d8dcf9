//! Layout 1: a RocksDB per store at `<task>/<store>/`, its data in the `default` column
//! family, its metadata unprefixed, no layout record. Read once, to be moved.

use std::path::Path;

use crate::db::OpenMode;
use crate::error::OpenError;
use crate::migrate::copy::Reader;
use crate::options::RocksDbOptions;
use crate::store::RocksDbStore;

/// A store directory of layout 1.
pub(crate) struct StoreDir(Reader);

impl StoreDir {
    /// The store directory at `path`, if there is one (a RocksDB: its `CURRENT` file).
    pub(crate) fn open(path: &Path, options: &RocksDbOptions) -> Result<Option<Self>, OpenError> {
        if !path.join("CURRENT").is_file() {
            return Ok(None);
        }
        let store = RocksDbStore::open_in(path, options, OpenMode::Legacy)?;
        Ok(Some(StoreDir(Reader::new(store))))
    }

    pub(crate) fn reader(&self) -> &Reader {
        &self.0
    }
}
