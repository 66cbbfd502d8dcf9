//! [`LoggedStore`]: a RocksDB store whose every mutation is mirrored to a Kafka changelog.
//!
//! # Commit protocol (DESIGN.md)
//! - `put`/`delete`/`write`: under the state lock, each mutation is sent to the changelog (the
//!   producer batches: that is the group commit) and recorded in the overlay, in the same order.
//! - [`commit`](LoggedStore::commit): freeze the overlay (new writes go to a fresh one), wait until
//!   the broker acknowledged its last record, then write the frozen entries and that record's
//!   offset in one atomic RocksDB `WriteBatch`. No fsync, no memtable flush, no checkpoint file.
//! - Reads merge the overlay (newest first: active, then frozen) over RocksDB.
//! - The overlay is bounded; a write that reaches the bound commits before it returns.
//!
//! # Failures
//! A failed send poisons the store: every later write returns
//! [`Error::Poisoned`](kstate_core::Error::Poisoned) until it is reopened, and nothing
//! unacknowledged ever reaches RocksDB. Reopening restores from the changelog, which holds
//! exactly what the broker acknowledged.
//!
//! # Batches
//! A [`Batch`] is applied to RocksDB atomically, but in the changelog it is one record per
//! mutation: a crash in the middle of sending a batch can restore a prefix of it. (Making
//! batches atomic in the changelog needs Kafka transactions; not built yet.)

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kstate_core::{Batch, EntryIter, Error, KeyRange, KeyValueStore, Order, Result};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

use crate::config::ChangelogConfig;
use crate::durability::{Durability, ParseDurabilityError};
use crate::error::ChangelogError;
use crate::overlay::{Map, MergeScan, Overlay, overlay_range};
use crate::position::ChangelogPosition;
use crate::producer::ChangelogProducer;
use crate::restore::{RecordCheck, RestoreListener, RestoreReport, restore};

/// Extra time, beyond the delivery timeout, a commit waits before declaring the changelog stuck.
const ACK_SLACK: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct State {
    active: Overlay,
    frozen: Option<Arc<Map>>,
    sent_seq: u64,
}

struct Shared {
    name: String,
    store: RocksDbStore,
    producer: ChangelogProducer,
    config: ChangelogConfig,
    state: Mutex<State>,
    commit_serial: Mutex<()>,
    mode: Mutex<Durability>,
    mode_changed: Condvar,
    shutdown: AtomicBool,
    closed: AtomicBool,
}

/// Hooks for [`LoggedStore::open_with`].
#[derive(Default, Clone)]
pub struct OpenHooks {
    /// Hears about the restore.
    pub listener: Option<Arc<dyn RestoreListener>>,
    /// Checks every replayed record (e.g. that the typed layer decodes it).
    pub record_check: Option<RecordCheck>,
}

/// A [`KeyValueStore`] on RocksDB whose durability is a Kafka changelog.
pub struct LoggedStore {
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
    restore: RestoreReport,
}

impl std::fmt::Debug for LoggedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggedStore")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl LoggedStore {
    /// Opens the store in `path` with its changelog: creates or verifies the topic, restores
    /// what RocksDB lacks, and starts the group-commit timer if the mode asks for it.
    pub fn open(
        path: impl AsRef<Path>,
        options: &RocksDbOptions,
        config: ChangelogConfig,
    ) -> Result<Self, ChangelogError> {
        Self::open_with(path, options, config, OpenHooks::default())
    }

    /// [`open`](Self::open) with a restore listener and a record check.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &RocksDbOptions,
        config: ChangelogConfig,
        hooks: OpenHooks,
    ) -> Result<Self, ChangelogError> {
        let path = path.as_ref();
        // The producer first: an idempotent producer cannot send until it has a producer id,
        // and librdkafka asks for one only when its 500 ms retry timer finds a broker connection
        // up. Created here, that wait overlaps the topic check and the restore instead of
        // stalling the first writes after open (measured: up to 0.5 s).
        let producer = ChangelogProducer::new(&config)?;
        crate::topic::ensure_topic(&config)?;
        let (store, report) = restore(
            path,
            options,
            &config,
            hooks.listener.as_deref(),
            hooks.record_check.as_ref(),
        )?;
        let shared = Arc::new(Shared {
            name: format!(
                "{} (changelog {}/{})",
                path.display(),
                config.topic,
                config.partition
            ),
            store,
            producer,
            mode: Mutex::new(config.durability),
            config,
            state: Mutex::default(),
            commit_serial: Mutex::new(()),
            mode_changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        let committer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("kstate-group-commit".into())
                .spawn(move || shared.group_commit_loop())
                .map_err(|e| {
                    ChangelogError::Store(Error::backend(
                        path.display().to_string(),
                        "start commit thread",
                        e,
                    ))
                })?
        };
        Ok(LoggedStore {
            shared,
            committer: Mutex::new(Some(committer)),
            restore: report,
        })
    }

    /// What the restore at open did.
    pub fn restore_report(&self) -> &RestoreReport {
        &self.restore
    }

    /// Makes every write so far durable locally: waits for the broker to acknowledge them, then
    /// writes them to RocksDB with their changelog offset, atomically. Once it returns, those
    /// writes survive a crash without replay.
    pub fn commit(&self) -> Result<()> {
        self.shared.check_open()?;
        self.shared.commit()
    }

    /// Writes sent to the changelog that the broker has not acknowledged yet. They are readable,
    /// but a crash before their acknowledgement may lose them; 0 once everything written is
    /// safe in the changelog (committed to RocksDB or not).
    pub fn unacknowledged(&self) -> u64 {
        let sent = lock(&self.shared.state).sent_seq;
        sent.saturating_sub(self.shared.producer.tracker.acked_seq())
    }

    /// The current durability mode.
    pub fn durability(&self) -> Durability {
        *lock(&self.shared.mode)
    }

    /// Switches the durability mode; takes effect for the next write. The producer's linger is
    /// the one chosen at open ([`ChangelogConfig::linger`]): unless set explicitly, a store
    /// opened in `async` or `group` mode keeps its 1 ms linger when switched to `sync`, which
    /// each `sync` put then waits out.
    pub fn set_durability(&self, mode: Durability) {
        *lock(&self.shared.mode) = mode;
        self.shared.mode_changed.notify_all();
        tracing::info!(store = %self.shared.name, %mode, "durability mode changed");
    }

    /// Parses `text` and switches to it; invalid text leaves the mode as it was.
    pub fn set_durability_text(&self, text: &str) -> Result<Durability, ParseDurabilityError> {
        let mode: Durability = text.parse()?;
        self.set_durability(mode);
        Ok(mode)
    }

    /// The changelog position RocksDB's contents correspond to (the last committed record).
    pub fn committed_position(&self) -> Result<Option<ChangelogPosition>, ChangelogError> {
        ChangelogPosition::read(&self.shared.store)
    }

    fn stop_committer(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.mode_changed.notify_all();
        if let Some(handle) = lock(&self.committer).take()
            && handle.join().is_err()
        {
            tracing::error!(store = %self.shared.name, "the group-commit thread panicked");
        }
    }
}

impl Drop for LoggedStore {
    /// Stops the commit timer without committing: acknowledged writes are in the changelog and
    /// the next open replays them. Call [`close`](KeyValueStore::close) to commit first.
    fn drop(&mut self) {
        self.stop_committer();
    }
}

impl Shared {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed {
                store: self.name.clone(),
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        self.check_open()?;
        match self.producer.tracker.poisoned() {
            Some(reason) => Err(self.poisoned(reason)),
            None => Ok(()),
        }
    }

    fn poisoned(&self, reason: String) -> Error {
        Error::Poisoned {
            store: self.name.clone(),
            reason,
        }
    }

    fn ack_timeout(&self) -> Duration {
        self.config.delivery_timeout + ACK_SLACK
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.check_writable()?;
        // Refuse oversized records before sending any of the batch: the broker would reject
        // them, and a rejected send poisons the store.
        if let Some((key, value)) = batch
            .mutations()
            .iter()
            .find(|(k, v)| self.oversized(k, v.as_deref()))
        {
            return Err(self.too_large(key, value.as_deref()));
        }
        self.apply(batch.into_mutations())
    }

    /// One put or delete: [`write`](Self::write) without building a batch.
    fn write_one(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.check_writable()?;
        if self.oversized(key, value) {
            return Err(self.too_large(key, value));
        }
        self.apply(std::iter::once((key.to_vec(), value.map(<[u8]>::to_vec))))
    }

    fn oversized(&self, key: &[u8], value: Option<&[u8]>) -> bool {
        key.len() + value.map_or(0, <[u8]>::len) > self.config.max_record_bytes
    }

    fn too_large(&self, key: &[u8], value: Option<&[u8]>) -> Error {
        Error::InvalidArgument {
            store: self.name.clone(),
            message: format!(
                "a record of {} bytes (key {}) exceeds the changelog's limit of {} bytes \
                 (ChangelogConfig::max_record_bytes)",
                key.len() + value.map_or(0, <[u8]>::len),
                kstate_core::HexBytes(key),
                self.config.max_record_bytes
            ),
        }
    }

    /// Sends `mutations` and records them in the overlay, in order; commits if the overlay is
    /// full, and waits for the acknowledgement in `sync` mode.
    fn apply(&self, mutations: impl IntoIterator<Item = kstate_core::Mutation>) -> Result<()> {
        let (my_seq, full) = {
            let mut state = lock(&self.state);
            // Checked again under the lock: `close` sets it under this lock, so no write can
            // slip in after the final commit and be dropped with the producer.
            self.check_open()?;
            for (key, value) in mutations {
                let seq = state.sent_seq + 1;
                self.producer
                    .send(seq, &key, value.as_deref(), self.config.delivery_timeout)
                    .map_err(|reason| self.poisoned(reason))?;
                state.sent_seq = seq;
                state.active.insert(key, value);
            }
            let full = state.active.bytes >= self.config.overlay_max_bytes
                || state.active.len() >= self.config.overlay_max_records;
            (state.sent_seq, full)
        };
        if full {
            self.commit()?;
        }
        if *lock(&self.mode) == Durability::Sync {
            self.producer
                .tracker
                .wait_for(my_seq, self.ack_timeout())
                .map_err(|reason| self.poisoned(reason))?;
        }
        Ok(())
    }

    fn commit(&self) -> Result<()> {
        let _serial = lock(&self.commit_serial);
        if let Some(reason) = self.producer.tracker.poisoned() {
            return Err(self.poisoned(reason));
        }
        let started = Instant::now();
        let (frozen, known_offset) = {
            let mut state = lock(&self.state);
            if state.active.len() == 0 {
                return Ok(());
            }
            let frozen = Arc::new(std::mem::take(&mut state.active).map);
            state.frozen = Some(frozen.clone());
            // No record after sent_seq can be sent while we hold the state lock, so the tracker
            // can tell us the offset of exactly this snapshot's last record.
            let known = self
                .producer
                .tracker
                .watch(state.sent_seq)
                .map_err(|reason| self.poisoned(reason))?;
            (frozen, known)
        };
        metrics::gauge!("kstate_changelog_in_flight").set(f64::from(self.producer.in_flight()));
        let offset = match known_offset {
            Some(offset) => offset,
            None => match self.producer.tracker.wait_for_watched(self.ack_timeout()) {
                Ok(offset) => offset,
                Err(reason) => {
                    // Stuck or failed: the frozen entries stay readable, writes are refused.
                    self.producer.tracker.poison(reason.clone());
                    return Err(self.poisoned(reason));
                }
            },
        };
        let position = ChangelogPosition {
            topic: self.config.topic.clone(),
            partition: self.config.partition,
            offset,
        }
        .encode();
        let meta: Vec<(&[u8], Option<&[u8]>)> = position
            .iter()
            .map(|(k, v)| (*k, Some(v.as_slice())))
            .collect();
        let data = frozen.iter().map(|(k, v)| (k.as_slice(), v.as_deref()));
        if let Err(e) = self.store.write_with_metadata(data, &meta) {
            // The frozen entries are acknowledged but not in RocksDB. Going on would let the next
            // commit store an offset past them; refuse writes instead (reopen restores them).
            let reason = format!("commit could not write to RocksDB: {e}");
            self.producer.tracker.poison(reason.clone());
            return Err(self.poisoned(reason));
        }
        lock(&self.state).frozen = None;
        metrics::histogram!("kstate_commit_seconds").record(started.elapsed().as_secs_f64());
        Ok(())
    }

    fn group_commit_loop(&self) {
        let mut mode = lock(&self.mode);
        while !self.shutdown.load(Ordering::Acquire) {
            let wait = match *mode {
                Durability::Group(interval) => interval,
                _ => Duration::from_secs(1),
            };
            mode = self
                .mode_changed
                .wait_timeout(mode, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if self.shutdown.load(Ordering::Acquire) {
                break;
            }
            if let Durability::Group(_) = *mode {
                drop(mode);
                if let Err(e) = self.commit() {
                    tracing::warn!(store = %self.name, error = %e, "group commit failed");
                }
                mode = lock(&self.mode);
            }
        }
    }
}

impl KeyValueStore for LoggedStore {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.shared.check_open()?;
        {
            let state = lock(&self.shared.state);
            if let Some(value) = state.active.map.get(key) {
                return Ok(value.clone());
            }
            if let Some(value) = state.frozen.as_ref().and_then(|f| f.get(key)) {
                return Ok(value.clone());
            }
        }
        // A commit writes RocksDB before it drops the frozen overlay, so a key missing from both
        // layers is in RocksDB by now if it was in the overlay a moment ago.
        self.shared.store.get(key)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.shared.write(batch)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.shared.write_one(key, Some(value))
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        self.shared.write_one(key, None)
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.shared.check_open()?;
        let overlay = {
            let state = lock(&self.shared.state);
            let mut layers: Vec<&Map> = vec![&state.active.map];
            if let Some(frozen) = &state.frozen {
                layers.push(frozen);
            }
            overlay_range(&layers, range, order)
        };
        let stored = self.shared.store.scan(range, order)?;
        Ok(Box::new(MergeScan::new(overlay, stored, order)))
    }

    fn approximate_len(&self) -> Result<u64> {
        self.shared.check_open()?;
        let pending = {
            let state = lock(&self.shared.state);
            state.active.len() + state.frozen.as_ref().map_or(0, |f| f.len())
        } as u64;
        Ok(self.shared.store.approximate_len()? + pending)
    }

    /// Commits, then flushes RocksDB's memtables.
    fn flush(&self) -> Result<()> {
        self.commit()?;
        self.shared.store.flush()
    }

    /// Refuses further writes, commits what was written, stops the commit timer and closes
    /// RocksDB. A failed commit is reported (the writes are in the changelog and the next open
    /// restores them); RocksDB is closed either way.
    fn close(&self) -> Result<()> {
        {
            let _state = lock(&self.shared.state);
            if self.shared.closed.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
        }
        let committed = self.shared.commit();
        self.stop_committer();
        let closed = self.shared.store.close();
        committed.and(closed)
    }
}
