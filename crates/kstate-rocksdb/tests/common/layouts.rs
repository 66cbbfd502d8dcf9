//! What the layout fixtures hold (`tests/fixtures/layouts/`), as their reader
//! (`layout_fixtures.rs`) sees it: each fixture is a state directory of one application
//! (`<state-dir>/<app-id>`) as some kstate layout left it, and `expected.txt` lists every entry
//! and metadata record of every store in it, one line each, as [`Line`] prints it. (Their
//! writer, deleted since, shared this file: see the fixtures' README.)

use std::fmt;
use std::path::{Path, PathBuf};

use kstate_core::KeyValueStore;
use kstate_rocksdb::RocksDbStore;

/// The fixtures, by directory name.
pub const FIXTURES: [&str; 7] = [
    "v1_store_dirs",
    "v2_task_dir",
    "v2_with_v1_inside",
    "v2_undeclared_store",
    "v2_cut_short",
    "v3_mid_move",
    "v3_shared",
];

/// Where a copy of a store's data is in a fixture.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Copy {
    /// Layout 1: `<p>/<store>/`, a RocksDB of its own.
    StoreDir { task: u32 },
    /// Layout 2: `<p>/`, the task's RocksDB, a column family per store.
    TaskDir { task: u32 },
    /// Layout 3: `rocksdb/`, the process's RocksDB, a key prefix per task.
    Shared { task: u32 },
}

impl fmt::Display for Copy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Copy::StoreDir { task } => write!(f, "v1:{task}"),
            Copy::TaskDir { task } => write!(f, "v2:{task}"),
            Copy::Shared { task } => write!(f, "v3:{task}"),
        }
    }
}

/// One line of `expected.txt`: `<copy> <store> entry|meta <key hex> <value hex>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Line {
    pub copy: Copy,
    pub store: String,
    pub meta: bool,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.meta { "meta" } else { "entry" };
        write!(
            f,
            "{} {} {kind} {} {}",
            self.copy,
            self.store,
            hex(&self.key),
            hex(&self.value)
        )
    }
}

impl Line {
    /// Parses a line as [`Display`](fmt::Display) prints it.
    pub fn parse(line: &str) -> Result<Line, String> {
        let fields: Vec<&str> = line.split(' ').collect();
        let [copy, store, kind, key, value] = fields[..] else {
            return Err(format!("not five fields: {line:?}"));
        };
        let (layout, task) = copy
            .split_once(':')
            .ok_or_else(|| format!("no layout:task in {copy:?}"))?;
        let task: u32 = task.parse().map_err(|e| format!("task {task:?}: {e}"))?;
        let copy = match layout {
            "v1" => Copy::StoreDir { task },
            "v2" => Copy::TaskDir { task },
            "v3" => Copy::Shared { task },
            other => return Err(format!("no layout {other:?}")),
        };
        let meta = match kind {
            "entry" => false,
            "meta" => true,
            other => return Err(format!("neither entry nor meta: {other:?}")),
        };
        Ok(Line {
            copy,
            store: store.to_string(),
            meta,
            key: unhex(key)?,
            value: unhex(value)?,
        })
    }
}

/// Every entry and metadata record of `store`, a copy at `copy`, as lines.
pub fn lines_of(copy: &Copy, name: &str, store: &RocksDbStore) -> Vec<Line> {
    let line = |meta, (key, value)| Line {
        copy: copy.clone(),
        store: name.to_string(),
        meta,
        key,
        value,
    };
    let entries = store
        .all()
        .expect("scan")
        .collect::<Result<Vec<_>, _>>()
        .expect("read");
    let mut lines: Vec<Line> = entries.into_iter().map(|e| line(false, e)).collect();
    let metadata = store.metadata_entries().expect("metadata");
    lines.extend(metadata.into_iter().map(|e| line(true, e)));
    lines
}

/// The fixtures' directory in the source tree.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/layouts")
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "-".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if text == "-" {
        return Ok(Vec::new());
    }
    if !text.len().is_multiple_of(2) {
        return Err(format!("odd length hex {text:?}"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|e| format!("{text:?}: {e}")))
        .collect()
}
