//! Where rows go: a kstate store, or one of the baselines a store is judged against (a bare
//! RocksDB with or without its WAL, a bare producer with a logged store's settings).

use std::path::Path;
use std::time::Duration;

use kstate_core::{Batch, KeyValueStore};
use kstate_kafka::{ChangelogConfig, ProducerConfig, RestoreClients};
use kstate_rocksdb::rocksdb::{self, ColumnFamilyDescriptor, DB, WriteOptions};
use kstate_rocksdb::{METADATA_CF, RocksDbOptions};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};

use crate::BenchError;
use crate::kafka::{Settled, send, wait_for_leaders};

/// Where rows go.
pub trait RowSink: Send {
    /// Writes one row.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), BenchError>;
    /// Writes `rows` in one call.
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<(), BenchError>;
    /// Makes the rows durable in the engine (flush memtables; for a logged store: commit and
    /// close; for a producer: every acknowledgement).
    fn finish(&mut self) -> Result<(), BenchError>;
}

/// Any kstate store.
pub struct StoreSink<S: KeyValueStore>(pub S);

impl<S: KeyValueStore + Send> RowSink for StoreSink<S> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), BenchError> {
        self.0.put(key, value).map_err(BenchError::store("put"))
    }
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<(), BenchError> {
        let mut batch = Batch::with_capacity(rows.len());
        for (k, v) in rows {
            batch.put(k.as_slice(), v.as_slice());
        }
        self.0.write(batch).map_err(BenchError::store("write"))
    }
    fn finish(&mut self) -> Result<(), BenchError> {
        self.0.close().map_err(BenchError::store("close"))
    }
}

/// A bare `rocksdb::DB` opened with exactly the store's options and column families.
pub struct BareRocks {
    db: DB,
    write_opts: WriteOptions,
}

impl BareRocks {
    /// Opens `path` with `options`, writing with the WAL on or off.
    pub fn open(path: &Path, options: &RocksDbOptions, wal: bool) -> Result<Self, BenchError> {
        let opts = options.to_rocksdb();
        let families = [
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(METADATA_CF, opts.clone()),
        ];
        let db = DB::open_cf_descriptors(&opts, path, families)
            .map_err(BenchError::store(format!("open {}", path.display())))?;
        let mut write_opts = WriteOptions::default();
        // The baseline: the WAL on, as RocksDB ships. Not synced, like Samza's baseline.
        write_opts.disable_wal(!wal);
        Ok(BareRocks { db, write_opts })
    }
}

impl RowSink for BareRocks {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), BenchError> {
        self.db
            .put_opt(key, value, &self.write_opts)
            .map_err(BenchError::store("bare put"))
    }
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<(), BenchError> {
        let mut wb = rocksdb::WriteBatch::default();
        for (k, v) in rows {
            wb.put(k, v);
        }
        self.db
            .write_opt(wb, &self.write_opts)
            .map_err(BenchError::store("bare write"))
    }
    fn finish(&mut self) -> Result<(), BenchError> {
        self.db.flush().map_err(BenchError::store("bare flush"))
    }
}

/// A bare rdkafka producer with the settings of a logged store's producer: the changelog
/// without the store.
pub struct BareProducer {
    producer: ThreadedProducer<Settled>,
    topic: String,
    partition: i32,
    sent: u64,
}

impl BareProducer {
    /// Creates `config`'s topic of `partitions` partitions (one per thread, as the logged
    /// configurations have) and a producer exactly like the one a store opened with `config`
    /// sends through, and waits until it knows every partition's leader: a logged store's open
    /// waits for its topic too, so neither clock holds the topic's creation.
    pub fn open(config: &ChangelogConfig, partitions: i32) -> Result<Self, BenchError> {
        let what = format!("create topic {}", config.topic());
        let clients = RestoreClients::new(config).map_err(BenchError::store(what.clone()))?;
        clients
            .create_missing_topics(std::slice::from_ref(config), None)
            .map_err(BenchError::store(what))?;
        let producer: ThreadedProducer<Settled> = ProducerConfig::from(config)
            .client_config()
            .create_with_context(Settled::default())
            .map_err(BenchError::kafka("bare producer"))?;
        wait_for_leaders(producer.client(), config.topic(), partitions)?;
        Ok(BareProducer {
            producer,
            topic: config.topic().to_string(),
            partition: config.partition(),
            sent: 0,
        })
    }
}

impl RowSink for BareProducer {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), BenchError> {
        let record = BaseRecord::to(&self.topic)
            .partition(self.partition)
            .key(key)
            .payload(value);
        send(&self.producer, record);
        self.sent += 1;
        Ok(())
    }
    fn put_batch(&mut self, rows: &[(Vec<u8>, Vec<u8>)]) -> Result<(), BenchError> {
        for (k, v) in rows {
            self.put(k, v)?;
        }
        Ok(())
    }
    /// Waits for the broker's acknowledgement of every row, as a logged store's close does.
    fn finish(&mut self) -> Result<(), BenchError> {
        self.producer
            .context()
            .wait_for(self.sent, Duration::from_secs(120))
    }
}
