//! [`LoggedStore`]: a RocksDB store whose every mutation is mirrored to a Kafka changelog.
//!
//! # Commit protocol (DESIGN.md)
//! - `put`/`delete`/`write`: under the send lock, each mutation is sent to the changelog (the
//!   producer batches: that is the group commit), then recorded in the overlay, in the same order.
//! - [`commit`](LoggedStore::commit): freeze the overlay (new writes go to a fresh one), wait until
//!   the broker acknowledged its last record, then write the frozen entries and that record's
//!   offset in one atomic RocksDB `WriteBatch`. No fsync, no memtable flush, no checkpoint file.
//! - Reads merge the overlay (newest first: active, then frozen) over RocksDB.
//! - The overlay is bounded; a write that reaches the bound commits before it returns. So is
//!   the memory of all overlays together: each charges its bytes to its RocksDB's budget
//!   ([`MemoryBudget::pending`](kstate_rocksdb::MemoryBudget::pending)), and a write that finds
//!   the budget's pending share full commits its store (under a transaction: asks for the
//!   commit), however little the store holds itself.
//! - A timer flushes RocksDB's memtables well inside the topic's `delete.retention.ms`
//!   ([`ChangelogConfig::flush_interval`]), so the durable position never lags so far that a
//!   restart must rebuild (a tombstone after it may be compacted away by then).
//!
//! # Locks: readers never wait on the broker
//! Writers hold the send lock while librdkafka's queue is full, which can last as long as the
//! broker is slow. The overlay has a lock of its own, a read-write lock held only to look up or
//! insert, so `get` and `scan` never wait for the producer; a commit takes both, briefly, to
//! freeze the overlay at a known sequence number.
//!
//! # Bounded commits
//! [`commit`](LoggedStore::commit) waits for the acknowledgement up to the delivery timeout
//! plus 30 s and then poisons: a changelog stuck that long is broken. A caller with a deadline
//! of its own (a task handed over in a rebalance must be let go within the rebalance's time)
//! uses [`commit_within`](LoggedStore::commit_within) instead, which gives up at the deadline
//! with [`Error::Timeout`](kstate_core::Error::Timeout) and leaves the store as it was before
//! the commit: the frozen overlay goes back under the newer writes, RocksDB keeps the previous
//! commit. Giving up is safe because nothing unacknowledged reached RocksDB: the caller may
//! commit again later, or drop the store; its next open replays what the broker did
//! acknowledge, and the caller's input, rewound to its own last commit, writes the rest again.
//!
//! # Failures
//! A failed send, a stuck acknowledgement or another writer's record in the partition poisons
//! the store: every later operation, reads included, returns
//! [`Error::Poisoned`](kstate_core::Error::Poisoned) with a typed
//! [`PoisonReason`](kstate_core::PoisonReason) until it is reopened. The overlay may hold writes
//! the changelog never got, and serving them would show values a reopen loses; nothing
//! unacknowledged ever reaches RocksDB. Reopening restores from the changelog, which holds exactly
//! what the broker acknowledged.
//!
//! # Batches
//! A [`Batch`] is applied to RocksDB atomically, but in the changelog it is one record per
//! mutation: a crash in the middle of sending a batch can restore a prefix of it. (Making
//! batches atomic in the changelog needs Kafka transactions: the exactly-once mode.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use kstate_core::sync::{lock, read, wait_timeout, write};
use kstate_core::{Batch, EntryIter, Error, KeyRange, KeyValueStore, Order, PoisonReason, Result};
use kstate_rocksdb::{PendingCharge, PendingMemory, RocksDbOptions, RocksDbStore};

use crate::config::ChangelogConfig;
use crate::durability::{Durability, ParseDurabilityError};
use crate::error::ChangelogError;
use crate::overlay::{Frozen, Map, MergeScan, Overlay, overlay_range};
use crate::position::ChangelogPosition;
use crate::producer::{ChangelogProducer, SharedProducer};
use crate::restore::{OpenHooks, RestoreReport, RestoredStore, StoreLocation};
use crate::transaction_member::{Transaction, TransactionMember};

/// Extra time, beyond the delivery timeout, a commit waits before declaring the changelog stuck.
const ACK_SLACK: Duration = Duration::from_secs(30);

/// How long dropping a store waits for its commit thread before leaving it to finish alone.
const DROP_JOIN_LIMIT: Duration = Duration::from_secs(5);

/// The flush interval when neither the configuration nor the topic says: a quarter of Kafka's
/// default `delete.retention.ms` (24 h).
const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(6 * 3600);

/// The overlay: what reads merge over RocksDB, charged to the memory budget's pending account
/// ([`PendingMemory`](kstate_rocksdb::PendingMemory)) for as long as it holds it.
#[derive(Debug)]
struct State {
    active: Overlay,
    frozen: Option<Arc<Frozen>>,
    /// The bytes of the frozen layer (its keys and values, as the active layer counts them).
    frozen_bytes: usize,
    charge: PendingCharge,
}

impl State {
    fn new(charge: PendingCharge) -> Self {
        State {
            active: Overlay::default(),
            frozen: None,
            frozen_bytes: 0,
            charge,
        }
    }

    /// Charges the budget with what both layers hold now.
    fn recharge(&mut self) {
        self.charge.set(self.active.bytes + self.frozen_bytes);
    }

    /// Whether the overlay should be committed: past its own bounds, or its budget's pending
    /// account full (a store holding nothing has nothing to give back).
    fn over(&self, config: &ChangelogConfig) -> bool {
        self.active.bytes >= config.overlay_max_bytes
            || self.active.len() >= config.overlay_max_records
            || (!self.active.is_empty() && self.charge.account().is_full())
    }

    /// The active layer becomes the frozen one (still charged), for a commit to apply.
    fn freeze(&mut self) -> Arc<Frozen> {
        let (frozen, bytes) = self.active.take_frozen();
        let frozen = Arc::new(frozen);
        self.frozen = Some(frozen.clone());
        self.frozen_bytes = bytes;
        frozen
    }

    /// The frozen layer is gone (applied to RocksDB, or back under the active one).
    fn drop_frozen(&mut self) {
        self.frozen = None;
        self.frozen_bytes = 0;
        self.recharge();
    }
}

/// How a `close` ended, kept so that a second `close` reports it again.
#[derive(Debug, Clone)]
enum CloseOutcome {
    Closed,
    Poisoned(PoisonReason),
    Failed(String),
}

/// How a store is driven: who commits its writes to RocksDB and who flushes it. Chosen at open,
/// never changed.
enum Drive {
    /// Its own timer thread commits (in `group` mode) and flushes it ([`LoggedStore::open`]).
    OwnTimer,
    /// Its owner commits and flushes it ([`LoggedStore::attach`]ed to a producer that is not
    /// transactional: a task's worker).
    Owner,
    /// The transactions of the producer it is [attached](LoggedStore::attach) to: a commit
    /// applies its writes, an abort drops them, and the store commits nothing by itself.
    Transactional {
        transaction: Arc<Transaction>,
        /// The sequence number of the last record sent before the open transaction began (its
        /// records are the ones after it).
        base: AtomicU64,
    },
}

struct Shared {
    name: String,
    store: RocksDbStore,
    producer: ChangelogProducer,
    config: ChangelogConfig,
    state: RwLock<State>,
    /// Held while sending and recording a write, and while freezing the overlay: records are
    /// sent in sequence order and the overlay matches them.
    send: Mutex<()>,
    /// The sequence number of the last record sent.
    sent_seq: AtomicU64,
    drive: Drive,
    commit_serial: Mutex<()>,
    mode: Mutex<Durability>,
    mode_changed: Condvar,
    flush_interval: Duration,
    shutdown: AtomicBool,
    closed: AtomicBool,
    close_outcome: Mutex<Option<CloseOutcome>>,
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
    /// The account of its RocksDB's budget that this store's overlay charges; layers above it
    /// (a task's coalescing cache) charge it too.
    pub fn pending_memory(&self) -> &PendingMemory {
        self.shared.store.pending_memory()
    }

    /// Opens the store at `location` (a directory of its own, or a store of a task's RocksDB)
    /// with its changelog: creates or verifies the topic, restores what RocksDB lacks, and
    /// starts the group-commit and flush timer.
    pub fn open(
        location: impl Into<StoreLocation>,
        options: &RocksDbOptions,
        config: ChangelogConfig,
    ) -> Result<Self, ChangelogError> {
        Self::open_with(location, options, config, OpenHooks::default())
    }

    /// [`open`](Self::open) with a restore listener, a record check and a cancel token.
    pub fn open_with(
        location: impl Into<StoreLocation>,
        options: &RocksDbOptions,
        config: ChangelogConfig,
        hooks: OpenHooks,
    ) -> Result<Self, ChangelogError> {
        // The producer first: an idempotent producer cannot send until it has a producer id,
        // and librdkafka asks for one only when its 500 ms retry timer finds a broker connection
        // up. Created here, that wait overlaps the topic check and the restore instead of
        // stalling the first writes after open (measured: up to 0.5 s).
        let producer = SharedProducer::new(&config)?;
        let restored = RestoredStore::restore(location, options, config, &hooks)?;
        Self::start(restored, producer, true)
    }

    /// A restored store that sends through `producer` (shared with other stores, e.g. those of
    /// a worker thread's tasks) and is driven from outside: no timer thread of its own, so its
    /// owner [`commit`](Self::commit)s it (the task's commit interval; `group` mode commits
    /// nothing by itself here) and [`flush`](KeyValueStore::flush)es it every
    /// [`flush_interval`](Self::flush_interval).
    ///
    /// Attached to a [transactional](SharedProducer::transactional) producer, the store is part
    /// of its transactions instead: its writes reach RocksDB only when
    /// [`SharedProducer::commit_transaction`] commits them (a [`Batch`] is then atomic through
    /// any crash), an abort drops them, and [`commit`](Self::commit) is refused. A full overlay
    /// asks the producer's owner to commit ([`SharedProducer::commit_requested`]); `sync` mode
    /// does not wait (nothing is durable before the commit).
    pub fn attach(
        restored: RestoredStore,
        producer: &SharedProducer,
    ) -> Result<Self, ChangelogError> {
        Self::start(restored, producer.clone(), false)
    }

    fn start(
        restored: RestoredStore,
        producer: SharedProducer,
        own_timer: bool,
    ) -> Result<Self, ChangelogError> {
        let RestoredStore {
            path,
            config,
            restored,
        } = restored;
        let producer = ChangelogProducer::new(producer, &config)?;
        let drive = match producer.transaction() {
            Some(transaction) => Drive::Transactional {
                transaction: transaction.clone(),
                base: AtomicU64::new(0),
            },
            None if own_timer => Drive::OwnTimer,
            None => Drive::Owner,
        };
        if matches!(drive, Drive::Transactional { .. }) && restored.reseed.is_some() {
            return Err(ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: "LostChangelog::Reseed writes outside any transaction: reseed with a \
                          producer that is not transactional, then attach"
                    .into(),
            });
        }
        // One writer per partition: this store's first record must land where the restore
        // ended (under a transaction: or past markers only), each next one right after it.
        producer.tracker.expect_offsets_from(
            restored.report.start.end_offset,
            producer.transaction().is_some(),
        );
        let flush_interval = config.flush_interval.unwrap_or_else(|| {
            restored
                .topic
                .delete_retention
                .map_or(DEFAULT_FLUSH_INTERVAL, |retention| retention / 4)
                .max(Duration::from_millis(10))
        });
        let charge = restored.store.pending_memory().charge();
        let shared = Arc::new(Shared {
            name: format!(
                "{} (changelog {}/{})",
                path.display(),
                config.topic,
                config.partition
            ),
            store: restored.store,
            producer,
            mode: Mutex::new(config.durability),
            config,
            state: RwLock::new(State::new(charge)),
            send: Mutex::new(()),
            sent_seq: AtomicU64::new(0),
            drive,
            commit_serial: Mutex::new(()),
            mode_changed: Condvar::new(),
            flush_interval,
            shutdown: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            close_outcome: Mutex::new(None),
        });
        if let Drive::Transactional { .. } = shared.drive {
            let member: std::sync::Weak<dyn TransactionMember> = Arc::downgrade(&shared) as _;
            shared.producer.join_transactions(member);
        }
        if let Some(reason) = &restored.reseed {
            tracing::warn!(store = %shared.name, %reason, "writing the local store into the empty changelog (LostChangelog::Reseed)");
            shared.reseed(restored.report.start.end_offset)?;
        }
        let committer = if let Drive::OwnTimer = shared.drive {
            let shared = shared.clone();
            let thread = std::thread::Builder::new()
                .name("kstate-group-commit".into())
                .spawn(move || shared.timer_loop())
                .map_err(|e| {
                    ChangelogError::Store(Error::backend(
                        path.display().to_string(),
                        "start commit thread",
                        e,
                    ))
                })?;
            Some(thread)
        } else {
            None
        };
        Ok(LoggedStore {
            shared,
            committer: Mutex::new(committer),
            restore: restored.report,
        })
    }

    /// How often the store's owner should [`flush`](KeyValueStore::flush) it (a store with its
    /// own timer does it itself): often enough that a restart never has to rebuild because
    /// compaction may have removed tombstones after its durable position.
    pub fn flush_interval(&self) -> Duration {
        self.shared.flush_interval
    }

    /// When the RocksDB under this store last completed a flush, whichever of its stores asked
    /// for it (a flush covers every store of a RocksDB): what an owner flushing on
    /// [`flush_interval`](Self::flush_interval) compares with.
    pub fn flushed_at(&self) -> std::time::Instant {
        self.shared.store.flushed_at()
    }

    /// What the restore at open did.
    pub fn restore_report(&self) -> &RestoreReport {
        &self.restore
    }

    /// Makes every write so far safe without a replay of its records: waits for the broker to
    /// acknowledge them, then writes them to RocksDB with their changelog offset, atomically.
    /// RocksDB holds them in its memtable until it flushes (when a memtable fills, on the flush
    /// timer, or on [`flush`](KeyValueStore::flush)); a crash before that replays them from the
    /// changelog, which holds them either way.
    pub fn commit(&self) -> Result<()> {
        self.shared.check_open()?;
        self.shared.commit()
    }

    /// [`commit`](Self::commit), giving up after `timeout`: for a caller that must let the
    /// store go by a deadline of its own.
    ///
    /// `timeout` covers waiting for an earlier commit, for writers waiting for room in the
    /// producer queue, and for the broker's acknowledgement. When it passes first, this returns
    /// [`Error::Timeout`] and the store is exactly as before the call: not poisoned, none of the
    /// writes since the last commit in RocksDB (which holds the previous commit and its
    /// position), all of them still readable. Their records stay with the producer and may be
    /// acknowledged later. The store can then be committed again (a later commit covers them),
    /// or dropped without a commit: its next open replays whatever the broker acknowledged, and
    /// the rest is lost, which is safe when the writes come from an input that is replayed from
    /// its own last commit.
    ///
    /// Every other outcome is [`commit`](Self::commit)'s: a failed record or another writer's
    /// poisons the store, and a `timeout` of the delivery timeout plus 30 s or more is
    /// `commit()`'s own limit, after which a stuck changelog poisons it. Under a transaction the
    /// commit is refused, as `commit()` is.
    pub fn commit_within(&self, timeout: Duration) -> Result<()> {
        self.shared.check_open()?;
        self.shared.commit_bounded(Some(timeout))
    }

    /// [`flush`](KeyValueStore::flush), its commit bounded as
    /// [`commit_within`](Self::commit_within)`(timeout)` is: after a timeout nothing was
    /// committed or flushed. The memtable flush that follows a commit is local, and not bounded.
    pub fn flush_within(&self, timeout: Duration) -> Result<()> {
        self.shared.check_open()?;
        self.shared.flush_bounded(Some(timeout))
    }

    /// Writes sent to the changelog that the broker has not acknowledged yet. They are readable,
    /// but a crash before their acknowledgement may lose them; 0 once everything written is
    /// safe in the changelog (committed to RocksDB or not).
    pub fn unacknowledged(&self) -> u64 {
        let sent = self.shared.sent_seq.load(Ordering::Acquire);
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

    /// The changelog position RocksDB's contents correspond to: the last committed record, or
    /// under a transaction the commit marker after it.
    pub fn committed_position(&self) -> Result<Option<ChangelogPosition>, ChangelogError> {
        ChangelogPosition::read(&self.shared.store)
    }

    /// Stops the timer thread, waiting for it at most `limit` (`None`: as long as it takes).
    fn stop_committer(&self, limit: Option<Duration>) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.mode_changed.notify_all();
        let Some(handle) = lock(&self.committer).take() else {
            return;
        };
        if let Some(limit) = limit {
            let deadline = Instant::now() + limit;
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if !handle.is_finished() {
                // It is waiting for the broker inside a commit, which ends within the
                // acknowledgement timeout; it holds the store until then.
                tracing::warn!(store = %self.shared.name, "the commit thread is still waiting for the broker; leaving it to finish");
                return;
            }
        }
        if handle.join().is_err() {
            tracing::error!(store = %self.shared.name, "the group-commit thread panicked");
        }
    }
}

impl Drop for LoggedStore {
    /// Stops the commit timer without committing: acknowledged writes are in the changelog and
    /// the next open replays them. Call [`close`](KeyValueStore::close) to commit first. Bounded
    /// in time: a timer thread still waiting for the broker after a few seconds is left to end
    /// on its own (it holds the RocksDB directory until it does).
    fn drop(&mut self) {
        self.stop_committer(Some(DROP_JOIN_LIMIT));
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

    /// Open and not poisoned: the check of every read and write.
    fn check_usable(&self) -> Result<()> {
        self.check_open()?;
        match self.producer.tracker.poisoned() {
            Some(reason) => Err(self.poisoned(reason)),
            None => Ok(()),
        }
    }

    fn poisoned(&self, reason: PoisonReason) -> Error {
        Error::Poisoned {
            store: self.name.clone(),
            reason,
        }
    }

    fn ack_timeout(&self) -> Duration {
        self.config.delivery_timeout + ACK_SLACK
    }

    fn write(&self, batch: Batch, time: Option<i64>) -> Result<()> {
        self.check_usable()?;
        // Refuse oversized records before sending any of the batch: the broker would reject
        // them, and a rejected send poisons the store.
        if let Some((key, value)) = batch
            .mutations()
            .iter()
            .find(|(k, v)| self.oversized(k, v.as_deref()))
        {
            return Err(self.too_large(key, value.as_deref()));
        }
        let mutations = batch.into_mutations();
        let send = self.begin_send()?;
        for (key, value) in &mutations {
            self.send_logged(key, value.as_deref(), time)?;
        }
        self.finish_write(send, |overlay| {
            for (key, value) in mutations {
                overlay.insert(key, value);
            }
        })
    }

    /// One put or delete: [`write`](Self::write) without building a batch.
    fn write_one(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.check_usable()?;
        if self.oversized(key, value) {
            return Err(self.too_large(key, value));
        }
        let send = self.begin_send()?;
        self.send_logged(key, value, None)?;
        self.finish_write(send, |overlay| {
            overlay.insert(key.to_vec(), value.map(<[u8]>::to_vec));
        })
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

    /// Takes the send lock for a write. Checks again under it that the store is open: `close`
    /// sets it under this lock, so no write can slip in after the final commit and be dropped
    /// with the producer.
    fn begin_send(&self) -> Result<MutexGuard<'_, ()>> {
        let send = lock(&self.send);
        self.check_open()?;
        Ok(send)
    }

    /// Sends the changelog record of a write to store key `key`, unless it is a local key (see
    /// [`ChangelogConfig::keys`]); the caller holds the send lock.
    fn send_logged(&self, key: &[u8], value: Option<&[u8]>, time: Option<i64>) -> Result<()> {
        match &self.config.keys {
            None => self.send_next(key, value, time).map(drop),
            Some(keys) => match keys.to_changelog(key) {
                Some(logged) => self.send_next(&logged, value, time).map(drop),
                None => Ok(()),
            },
        }
    }

    /// Sends one record with the next sequence number; the caller holds the send lock. A full
    /// producer queue waits here, holding only that lock.
    fn send_next(&self, key: &[u8], value: Option<&[u8]>, time: Option<i64>) -> Result<u64> {
        let seq = self.sent_seq.load(Ordering::Acquire) + 1;
        self.producer
            .send(seq, key, value, time, self.config.delivery_timeout)
            .map_err(|reason| self.poisoned(reason))?;
        self.sent_seq.store(seq, Ordering::Release);
        Ok(seq)
    }

    /// Ends a write whose records were sent under `send`: `record`s them in the overlay (all at
    /// once, so readers never see part of a batch), commits if the overlay is full, and waits
    /// for the acknowledgement in `sync` mode.
    fn finish_write(
        &self,
        send: MutexGuard<'_, ()>,
        record: impl FnOnce(&mut Overlay),
    ) -> Result<()> {
        let my_seq = self.sent_seq.load(Ordering::Acquire);
        let full = {
            let mut state = write(&self.state);
            record(&mut state.active);
            state.recharge();
            state.over(&self.config)
        };
        drop(send);
        if let Drive::Transactional { transaction, .. } = &self.drive {
            // Under a transaction nothing reaches RocksDB before the commit: ask for it.
            if full {
                transaction.request_commit();
            }
            return Ok(());
        }
        if full {
            self.commit()?;
        }
        if *lock(&self.mode) == Durability::Sync
            && let Err(reason) = self.producer.tracker.wait_for(my_seq, self.ack_timeout())
        {
            // A record stuck past the timeout: nothing after it may be trusted either.
            self.producer.tracker.poison(reason.clone());
            return Err(self.poisoned(reason));
        }
        Ok(())
    }

    fn commit(&self) -> Result<()> {
        self.commit_bounded(None)
    }

    /// Takes `m`, giving up at `deadline` (`None`: waits as long as it takes).
    fn lock_before<'a, T>(
        &self,
        m: &'a Mutex<T>,
        deadline: Option<(Instant, Duration)>,
        waiting_for: &str,
    ) -> Result<MutexGuard<'a, T>> {
        let Some((deadline, timeout)) = deadline else {
            return Ok(lock(m));
        };
        loop {
            match m.try_lock() {
                Ok(guard) => return Ok(guard),
                Err(TryLockError::Poisoned(e)) => return Ok(e.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    return Err(self.commit_timed_out(timeout, waiting_for));
                }
                // Held by a commit waiting for the broker, or by a writer waiting for queue
                // room: next to either, a try every millisecond costs nothing.
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    fn commit_timed_out(&self, timeout: Duration, waiting_for: &str) -> Error {
        Error::Timeout {
            store: self.name.clone(),
            operation: "commit",
            waiting_for: waiting_for.to_string(),
            timeout,
        }
    }

    /// Gives back the layer a commit froze and then gave up on: under the writes made since
    /// (newer), so that the next commit covers them all and reads still see them.
    fn unfreeze(&self, frozen: Arc<Frozen>) {
        let mut state = write(&self.state);
        // The state's own handle goes first, so that the map is usually moved, not copied.
        state.frozen = None;
        let frozen = Arc::try_unwrap(frozen).unwrap_or_else(|shared| (*shared).clone());
        state.active.put_under(frozen);
        state.drop_frozen();
    }

    /// The commit; with a `limit` below the acknowledgement timeout, it gives up once `limit`
    /// has passed and leaves the store as it was ([`LoggedStore::commit_within`]).
    fn commit_bounded(&self, limit: Option<Duration>) -> Result<()> {
        if let Drive::Transactional { .. } = self.drive {
            return Err(Error::InvalidArgument {
                store: self.name.clone(),
                message: "this store is part of a transactional producer's transactions: \
                          SharedProducer::commit_transaction commits it"
                    .into(),
            });
        }
        let deadline = limit
            .filter(|limit| *limit < self.ack_timeout())
            .map(|limit| (Instant::now() + limit, limit));
        let _serial = self.lock_before(&self.commit_serial, deadline, "an earlier commit")?;
        if let Some(reason) = self.producer.tracker.poisoned() {
            return Err(self.poisoned(reason));
        }
        let started = Instant::now();
        let (frozen, known_offset, frozen_at) = {
            // No record can be sent while we hold the send lock, so the tracker can tell us the
            // offset of exactly this snapshot's last record.
            let _send = self.lock_before(
                &self.send,
                deadline,
                "a write waiting for room in the producer queue",
            )?;
            let mut state = write(&self.state);
            if state.active.is_empty() {
                return Ok(());
            }
            let frozen = state.freeze();
            let known = self
                .producer
                .tracker
                .watch(self.sent_seq.load(Ordering::Acquire))
                .map_err(|reason| self.poisoned(reason))?;
            // Every record after this snapshot is sent after this moment.
            (frozen, known, SystemTime::now())
        };
        metrics::gauge!("kstate_changelog_in_flight").set(f64::from(self.producer.in_flight()));
        let wait = deadline.map_or(self.ack_timeout(), |(deadline, _)| {
            deadline.saturating_duration_since(Instant::now())
        });
        let offset = match known_offset {
            Some(offset) => offset,
            None => match self.producer.tracker.wait_for_watched(wait) {
                Ok(offset) => offset,
                Err(reason) => {
                    if let Some((_, timeout)) = deadline
                        && self.producer.tracker.poisoned().is_none()
                    {
                        // The caller's deadline passed and nothing failed: give up, poisoning
                        // nothing.
                        self.unfreeze(frozen);
                        return Err(self.commit_timed_out(
                            timeout,
                            "the acknowledgement of the commit's last record",
                        ));
                    }
                    // Stuck or failed: the store is poisoned, and serves nothing.
                    self.producer.tracker.poison(reason.clone());
                    return Err(self.poisoned(reason));
                }
            },
        };
        self.apply_frozen(&frozen, Some((offset, frozen_at)))?;
        metrics::histogram!("kstate_commit_seconds").record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Writes the frozen overlay (its drops first, then its entries) and the position `at`
    /// (its last record's offset, or under a transaction the commit marker's after it, and the
    /// time of the freeze) to RocksDB in one batch, then drops the frozen layer. Without a
    /// position (a transaction in which this store sent no record: its writes were local keys
    /// and drops only) the stored position stays. A failure poisons: the entries are in the
    /// changelog but not in RocksDB, and going on would let a later commit store an offset past
    /// them (reopening restores them).
    fn apply_frozen(&self, frozen: &Frozen, at: Option<(i64, SystemTime)>) -> Result<()> {
        let data = frozen.map.iter().map(|(k, v)| (k.as_slice(), v.as_deref()));
        let written = match at {
            Some((offset, written_at)) => ChangelogPosition {
                topic: self.config.topic.clone(),
                partition: self.config.partition,
                offset,
                written_at: Some(written_at),
            }
            .write_after_drops(&self.store, &frozen.drops, data),
            None => self.store.write_after_drops(&frozen.drops, data, &[]),
        };
        if let Err(e) = written {
            let reason = PoisonReason::LocalWriteFailed {
                message: e.to_string(),
            };
            self.producer.tracker.poison(reason.clone());
            return Err(self.poisoned(reason));
        }
        write(&self.state).drop_frozen();
        Ok(())
    }

    /// Commits, then flushes RocksDB's memtables: the durable position is now. Under a
    /// transaction, flushes what the last committed transaction applied.
    fn flush(&self) -> Result<()> {
        self.flush_bounded(None)
    }

    /// [`flush`](Self::flush), its commit bounded by `limit` as
    /// [`commit_bounded`](Self::commit_bounded)'s is.
    fn flush_bounded(&self, limit: Option<Duration>) -> Result<()> {
        match self.drive {
            Drive::OwnTimer | Drive::Owner => self.commit_bounded(limit)?,
            Drive::Transactional { .. } => {}
        }
        self.store.flush()
    }

    /// Writes every entry of the local store into the (empty) changelog, then stores the offset
    /// of the last one: [`LostChangelog::Reseed`](crate::LostChangelog::Reseed).
    fn reseed(&self, end: i64) -> Result<(), ChangelogError> {
        let _send = lock(&self.send);
        crate::position::mark_reseeding(&self.store)?;
        let (mut records, mut last_seq) = (0u64, None);
        for entry in self.store.all()? {
            let (key, value) = entry?;
            let logged = match &self.config.keys {
                None => Some(std::borrow::Cow::Borrowed(key.as_slice())),
                Some(keys) => keys.to_changelog(&key),
            };
            if let Some(logged) = logged {
                last_seq = Some(self.send_next(&logged, Some(&value), None)?);
                records += 1;
            }
        }
        let offset = match last_seq {
            None => end - 1,
            Some(seq) => self
                .producer
                .tracker
                .offset_of(seq, self.ack_timeout())
                .map_err(|reason| self.poisoned(reason))?,
        };
        let position = ChangelogPosition {
            topic: self.config.topic.clone(),
            partition: self.config.partition,
            offset,
            written_at: Some(SystemTime::now()),
        };
        position.write_finishing_reseed(&self.store)?;
        self.store.flush()?;
        tracing::info!(store = %self.name, records, offset, "reseeded the changelog");
        Ok(())
    }

    /// The timer thread: commits every `group` interval in group mode, and commits and flushes
    /// every flush interval in any mode.
    fn timer_loop(&self) {
        let mut next_flush = Instant::now() + self.flush_interval;
        let mut mode = lock(&self.mode);
        while !self.shutdown.load(Ordering::Acquire) {
            let until_flush = next_flush.saturating_duration_since(Instant::now());
            let wait = match *mode {
                Durability::Group(interval) => interval.min(until_flush),
                _ => Duration::from_secs(1).min(until_flush),
            };
            mode = wait_timeout(&self.mode_changed, mode, wait);
            if self.shutdown.load(Ordering::Acquire) {
                break;
            }
            let group = matches!(*mode, Durability::Group(_));
            let flush_due = Instant::now() >= next_flush;
            // A poisoned store commits nothing more; its callers hear why.
            let poisoned = self.producer.tracker.poisoned().is_some();
            if (group || flush_due) && !poisoned {
                drop(mode);
                let done = if flush_due {
                    next_flush = Instant::now() + self.flush_interval;
                    self.flush()
                } else {
                    self.commit()
                };
                if let Err(e) = done {
                    tracing::warn!(store = %self.name, error = %e, "timed commit failed");
                }
                mode = lock(&self.mode);
            }
        }
    }
}

impl TransactionMember for Shared {
    fn member_name(&self) -> String {
        self.name.clone()
    }

    fn settle(&self, deadline: Instant) -> Result<(), PoisonReason> {
        let sent = self.sent_seq.load(Ordering::Acquire);
        let left = deadline.saturating_duration_since(Instant::now());
        self.producer.tracker.wait_for(sent, left)
    }

    fn hold_sends(&self) -> MutexGuard<'_, ()> {
        lock(&self.send)
    }

    fn committed(&self) -> Result<()> {
        let Drive::Transactional { base, .. } = &self.drive else {
            return Ok(()); // never a member
        };
        let sent = self.sent_seq.load(Ordering::Acquire);
        let sent_none = sent == base.swap(sent, Ordering::AcqRel);
        if self.closed.load(Ordering::Acquire) {
            return Ok(()); // closed since: its open transaction's writes were dropped
        }
        let offset = if sent_none {
            None
        } else {
            let offset = self
                .producer
                .tracker
                .all_acknowledged(sent)
                .map_err(|reason| self.poisoned(reason))?;
            // Records past a repeated commit marker: nothing but markers may lie between, or
            // the position would skip another writer's records.
            for gap in self.producer.tracker.take_marker_gaps() {
                if let Err(reason) = crate::marker_gap::check_marker_gap(&self.config, gap) {
                    self.producer.tracker.poison(reason.clone());
                    return Err(self.poisoned(reason));
                }
            }
            self.producer.tracker.transaction_committed();
            offset
        };
        let frozen = {
            let mut state = write(&self.state);
            if state.active.is_empty() {
                return Ok(());
            }
            state.freeze()
        };
        // The position is the commit marker, right after the transaction's last record (see
        // the transaction module): an idle store then has nothing after its position, and a
        // restore never takes it for a stale one. A transaction in which this store sent
        // nothing still commits its local writes (a stream time moved by `observe`) and its
        // drops, at the position it had: dropping them would undo a commit whose input offsets
        // moved on.
        self.apply_frozen(
            &frozen,
            offset.map(|offset| (offset + 1, SystemTime::now())),
        )
    }

    fn abort_starting(&self) {
        self.producer.tracker.abort_starting();
    }

    fn aborted(&self) {
        let Drive::Transactional { base, .. } = &self.drive else {
            return; // never a member
        };
        let sent = self.sent_seq.load(Ordering::Acquire);
        let base = base.swap(sent, Ordering::AcqRel);
        {
            let mut state = write(&self.state);
            state.active = Overlay::default();
            state.drop_frozen();
        }
        self.producer.tracker.transaction_aborted(base + 1, sent);
    }

    fn producer_failed(&self, reason: PoisonReason) {
        self.producer.tracker.poison(reason);
    }
}

impl KeyValueStore for LoggedStore {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.shared.check_usable()?;
        {
            let state = read(&self.shared.state);
            if let Some(value) = state.active.lookup(key) {
                return Ok(value);
            }
            if let Some(value) = state.frozen.as_ref().and_then(|f| f.lookup(key)) {
                return Ok(value);
            }
        }
        // A commit writes RocksDB before it drops the frozen overlay, so a key missing from both
        // layers is in RocksDB by now if it was in the overlay a moment ago.
        self.shared.store.get(key)
    }

    fn write(&self, batch: Batch) -> Result<()> {
        self.shared.write(batch, None)
    }

    /// Its changelog records carry `time` in a header ([`TIME_HEADER`](crate::TIME_HEADER)).
    fn write_at(&self, batch: Batch, time: i64) -> Result<()> {
        self.shared.write(batch, Some(time))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.shared.write_one(key, Some(value))
    }

    fn delete(&self, key: &[u8]) -> Result<()> {
        self.shared.write_one(key, None)
    }

    fn scan(&self, range: &KeyRange, order: Order) -> Result<EntryIter<'_>> {
        self.shared.check_usable()?;
        let (overlay, dropped) = {
            let state = read(&self.shared.state);
            let mut layers: Vec<(&Map, &[KeyRange])> =
                vec![(&state.active.map, &state.active.drops)];
            if let Some(frozen) = &state.frozen {
                layers.push((&frozen.map, &frozen.drops));
            }
            let dropped: Vec<KeyRange> = layers
                .iter()
                .flat_map(|(_, drops)| drops.iter().cloned())
                .collect();
            (overlay_range(&layers, range, order), dropped)
        };
        let stored = self.shared.store.scan(range, order)?;
        Ok(Box::new(MergeScan::new(overlay, stored, dropped, order)))
    }

    /// Drops the range without a record in the changelog (its retention removes them there).
    /// Reads no longer see it at once; RocksDB drops it with the next commit, before that
    /// commit's writes (the writes made since the drop land, inside the range too), because the
    /// drop was decided by a write of the same commit (a window store's stream time): an abort
    /// or a crash before it leaves the range in place, with the time it is live at.
    fn drop_range(&self, range: &KeyRange) -> Result<()> {
        self.shared.check_usable()?;
        let mut state = write(&self.shared.state);
        state.active.drop_range(range);
        state.recharge();
        Ok(())
    }

    fn approximate_len(&self) -> Result<u64> {
        self.shared.check_usable()?;
        let pending = {
            let state = read(&self.shared.state);
            state.active.len() + state.frozen.as_ref().map_or(0, |f| f.map.len())
        } as u64;
        Ok(self.shared.store.approximate_len()? + pending)
    }

    /// Commits, then flushes RocksDB's memtables: what was written survives a crash without a
    /// replay from the changelog.
    fn flush(&self) -> Result<()> {
        self.shared.check_open()?;
        self.shared.flush()
    }

    /// Refuses further writes, commits what was written, stops the commit timer and closes
    /// RocksDB. A failed commit is reported (the acknowledged writes are in the changelog and the
    /// next open restores them); RocksDB is closed either way. A second `close` returns the
    /// first one's error again.
    fn close(&self) -> Result<()> {
        let mut outcome = lock(&self.shared.close_outcome);
        if let Some(earlier) = &*outcome {
            return match earlier.clone() {
                CloseOutcome::Closed => Ok(()),
                CloseOutcome::Poisoned(reason) => Err(self.shared.poisoned(reason)),
                CloseOutcome::Failed(message) => Err(Error::backend(
                    self.shared.name.clone(),
                    "close (an earlier attempt)",
                    message,
                )),
            };
        }
        {
            // Under the send lock: no write is between sending and recording when we stop them.
            let _send = lock(&self.shared.send);
            self.shared.closed.store(true, Ordering::Release);
        }
        let committed = match self.shared.drive {
            Drive::OwnTimer | Drive::Owner => self.shared.commit(),
            Drive::Transactional { .. } => {
                // What the open transaction holds is not committed: dropped.
                let pending = std::mem::take(&mut write(&self.shared.state).active).len();
                if pending > 0 {
                    tracing::warn!(store = %self.shared.name, pending, "closed with writes of an open transaction; they are dropped");
                }
                Ok(())
            }
        };
        self.stop_committer(None);
        let closed = self.shared.store.close();
        let result = committed.and(closed);
        *outcome = Some(match &result {
            Ok(()) => CloseOutcome::Closed,
            Err(Error::Poisoned { reason, .. }) => CloseOutcome::Poisoned(reason.clone()),
            Err(e) => CloseOutcome::Failed(e.to_string()),
        });
        result
    }
}
