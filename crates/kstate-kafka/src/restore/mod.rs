//! Restore: replay the changelog into a fresh or stale RocksDB when a store opens.
//!
//! Each step decides one thing, in its own module:
//!
//! 1. Open RocksDB and read the stored [`ChangelogPosition`].
//! 2. Make sure the topic is there ([`crate::topic`]); a store that holds a position never
//!    recreates a missing changelog on its own ([`LostChangelog`]).
//! 3. Capture the end ([`end`]): the partition's real high watermark, once no open transaction
//!    holds the last stable offset below it.
//! 4. Decide whether the stored position can be trusted ([`trust`]): resume after it, rebuild
//!    from the low watermark (with a warning), reseed the changelog from the store, or refuse.
//!    Wipes rename the directory aside first ([`wipe`]); copies a killed wipe left behind are
//!    deleted when the store next opens.
//! 5. Replay with `isolation.level=read_committed` ([`replay`]) into batches written atomically
//!    with their last offset, or, into an empty store, into sorted SST files.
//! 6. Report to the [`RestoreListener`], through `tracing` spans and `metrics`.
//!
//! A restore ends at the end captured in step 3; records written later are the store's own (or,
//! if another writer's, poison it: see the producer's offset checks).

mod clients;
mod consumer;
mod end;
mod follow;
mod location;
mod replay;
mod trust;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use kstate_core::{BoxError, KeyValueStore};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};

use crate::config::{ChangelogConfig, LostChangelog};
use crate::error::ChangelogError;
use crate::position::ChangelogPosition;
use crate::topic::TopicFacts;

pub use clients::{PREFETCHED_END_TTL, RestoreClients, RestoreCluster};
pub use follow::{FollowerGroup, Following};
pub use location::StoreLocation;

/// The restore consumer's fetch settings, measured on 1,000,000-record restores (BENCHMARKS.md).
/// Once the local queue is full, librdkafka postpones the next fetch by `fetch.queue.backoff.ms`
/// (1 s by default); a restore drains the queue far sooner and then sat idle, losing most of a
/// second per million records. 2 MiB fetches with the default queue (100,000 messages) beat
/// 16 MiB with 200,000 by about 18%: less memory to fault in per response. A changelog written
/// in transactions ends with a marker, which the position passes only with the fetch after the
/// last record's, one that finds nothing new: the broker holds such a fetch for
/// `fetch.wait.max.ms` (500 ms by default), and every restore of a short tail took half a second
/// more (a restart after a SIGKILL under exactly-once, BENCHMARKS.md). Public so that a baseline
/// consumer (the rows-per-second example's) reads with exactly these. A follower, which waits
/// for new records for as long as it runs, keeps the default wait of 500 ms.
pub const RESTORE_FETCH_SETTINGS: &[(&str, &str)] = &[
    ("fetch.queue.backoff.ms", "10"),
    ("max.partition.fetch.bytes", "2097152"),
    ("fetch.wait.max.ms", "10"),
];

/// A follower's (a standby's) `fetch.wait.max.ms`: librdkafka's default. It waits for new
/// records for as long as it runs, and a short wait would make it ask the broker a hundred times
/// a second.
pub(crate) const FOLLOW_FETCH_WAIT: (&str, &str) = ("fetch.wait.max.ms", "500");

/// Checks a replayed record before it is applied, e.g. that the typed layer can decode it.
/// A rejected record fails the restore with an error naming topic, partition and offset.
pub type RecordCheck = Arc<dyn Fn(&[u8], &[u8]) -> Result<(), BoxError> + Send + Sync>;

/// Where and how far a restore goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreStart {
    /// The changelog topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The first offset read.
    pub start_offset: i64,
    /// The high watermark captured at the start: the restore ends there.
    pub end_offset: i64,
    /// Why the store was wiped and rebuilt from the beginning, if it was.
    pub rebuild_reason: Option<String>,
}

/// One batch written to RocksDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRestored {
    /// The changelog topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// The offset of the batch's last record, stored with it.
    pub last_offset: i64,
    /// Records in this batch.
    pub records: usize,
    /// Bytes of keys and values in this batch.
    pub bytes: usize,
    /// Records so far.
    pub total_records: u64,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// Where it started and ended.
    pub start: RestoreStart,
    /// Records applied.
    pub records: u64,
    /// Batches written.
    pub batches: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl RestoreReport {
    /// Records per second.
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Hears about restores. Every method has an empty default.
pub trait RestoreListener: Send + Sync {
    /// Before the first record.
    fn on_restore_start(&self, _start: &RestoreStart) {}
    /// After each batch is written, in changelog order, from the restore's writer thread (the
    /// other two methods are called from the thread that opens the store).
    fn on_batch_restored(&self, _batch: &BatchRestored) {}
    /// After the last batch.
    fn on_restore_end(&self, _report: &RestoreReport) {}
}

/// Cancels a restore from another thread: the restore returns
/// [`ChangelogError::Cancelled`] within about 100 ms, or, for [`follow_changelog`], ends normally.
/// Cheap to clone; every clone cancels the same restore.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not cancelled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Hooks for a restore ([`LoggedStore::open_with`](crate::LoggedStore::open_with),
/// [`RestoredStore::restore`]).
#[derive(Default, Clone)]
pub struct OpenHooks {
    /// Hears about the restore.
    pub listener: Option<Arc<dyn RestoreListener>>,
    /// Checks every replayed record (e.g. that the typed layer decodes it).
    pub record_check: Option<RecordCheck>,
    /// Cancels the restore from another thread.
    pub cancel: Option<CancelToken>,
}

/// A store brought up to its changelog's end by [`RestoredStore::restore`], not yet writing:
/// the restore as a step of its own, so that a task runtime can run it on a restorer thread,
/// cancel it, and then [`attach`](crate::LoggedStore::attach) the store to the producer of the
/// worker that owns the task.
pub struct RestoredStore {
    pub(crate) path: PathBuf,
    pub(crate) config: ChangelogConfig,
    pub(crate) restored: Restored,
}

impl std::fmt::Debug for RestoredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoredStore")
            .field("path", &self.path)
            .field("report", &self.restored.report)
            .finish_non_exhaustive()
    }
}

impl RestoredStore {
    /// Opens the store at `location` (a directory, or a store of a task's RocksDB) and replays
    /// what it lacks of `config`'s changelog, up to the end captured when the restore starts.
    pub fn restore(
        location: impl Into<StoreLocation>,
        options: &RocksDbOptions,
        config: ChangelogConfig,
        hooks: &OpenHooks,
    ) -> Result<Self, ChangelogError> {
        let clients = RestoreClients::new(&config)?;
        Self::restore_with(location, options, config, hooks, &clients)
    }

    /// [`restore`](Self::restore) through clients kept from earlier restores (see
    /// [`RestoreClients`]), which saves about a second per store on a cold client. `clients`
    /// must [suit](RestoreClients::suits) `config`: an [`InvalidConfig`] error otherwise.
    ///
    /// [`InvalidConfig`]: ChangelogError::InvalidConfig
    pub fn restore_with(
        location: impl Into<StoreLocation>,
        options: &RocksDbOptions,
        config: ChangelogConfig,
        hooks: &OpenHooks,
        clients: &RestoreClients,
    ) -> Result<Self, ChangelogError> {
        if !clients.suits(&config) {
            return Err(ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: format!(
                    "the restore clients were made for another cluster or other client \
                     properties ({clients:?}); the changelog's are {:?}",
                    config.client
                ),
            });
        }
        let location = location.into();
        let restored = restore(&location, options, &config, hooks, clients)?;
        Ok(RestoredStore {
            path: location.path(),
            config,
            restored,
        })
    }

    /// What the restore did.
    pub fn report(&self) -> &RestoreReport {
        &self.restored.report
    }

    /// Closes the restored store without attaching it (a restore as an operator's step, e.g.
    /// `kstate restore`): its position and data are flushed, and the directory's lock is
    /// released. Returns what the restore did.
    pub fn close(self) -> Result<RestoreReport, ChangelogError> {
        self.restored.store.close()?;
        Ok(self.restored.report)
    }
}

/// Restores the store at `location`, then keeps applying the changelog's new records as they arrive
/// (a standby replica) until `stop` is cancelled; then closes the store and returns what was
/// applied. Promoting the standby is an ordinary open of the same directory, which replays only
/// the records written since the follower's last batch.
pub fn follow_changelog(
    location: impl Into<StoreLocation>,
    options: &RocksDbOptions,
    config: &ChangelogConfig,
    listener: Option<Arc<dyn RestoreListener>>,
    stop: &CancelToken,
) -> Result<RestoreReport, ChangelogError> {
    let cluster = Arc::new(RestoreCluster::new(config)?);
    follow_changelog_sharing(cluster, location, options, config, listener, stop)
}

/// [`follow_changelog`] with the metadata and admin clients of `cluster`, which many followers
/// and restores share. Many followers are better served by one [`FollowerGroup`], whose few
/// consumers follow them all: this one runs a group of its own. `cluster` must
/// [suit](RestoreCluster::suits) `config`.
pub fn follow_changelog_sharing(
    cluster: Arc<RestoreCluster>,
    location: impl Into<StoreLocation>,
    options: &RocksDbOptions,
    config: &ChangelogConfig,
    listener: Option<Arc<dyn RestoreListener>>,
    stop: &CancelToken,
) -> Result<RestoreReport, ChangelogError> {
    let group = FollowerGroup::new(cluster.clone());
    let following = {
        let clients = RestoreClients::sharing(cluster, config)?;
        group.follow(location, options, config, listener, stop, &clients)?
    };
    following.wait()
}

/// What [`restore`] leaves behind.
pub(crate) struct Restored {
    /// The store, up to the captured end.
    pub(crate) store: RocksDbStore,
    /// What the restore did.
    pub(crate) report: RestoreReport,
    /// Set when the local contents must be written into the empty changelog
    /// ([`LostChangelog::Reseed`]): why.
    pub(crate) reseed: Option<String>,
    /// What the topic said of itself.
    pub(crate) topic: TopicFacts,
}

/// Checks the topic (creating it when `create` allows) and captures its end; also returns when
/// the restore's own time starts (the topic check is the open's).
#[allow(clippy::type_complexity)]
fn check_and_capture(
    config: &ChangelogConfig,
    clients: &RestoreClients,
    create: bool,
    cancel: Option<&CancelToken>,
) -> Result<(Option<TopicFacts>, Option<end::Watermarks>, Instant), ChangelogError> {
    let facts = clients.ensure_topic(config, create, cancel)?;
    let started = Instant::now();
    let watermarks = match facts {
        Some(_) => Some(end::capture_end(
            config,
            clients.probe(),
            &clients.consumer,
            cancel,
        )?),
        None => None,
    };
    Ok((facts, watermarks, started))
}

/// The topic's facts and its end captured now: after a recent topic check only the end, else
/// [`check_and_capture`]. `started` is when the restore's own time started, kept unless the
/// topic is checked now.
#[allow(clippy::type_complexity)]
fn capture_now(
    config: &ChangelogConfig,
    clients: &RestoreClients,
    create: bool,
    started: Instant,
    cancel: Option<&CancelToken>,
) -> Result<(Option<TopicFacts>, Option<end::Watermarks>, Instant), ChangelogError> {
    let Some(facts) = clients.checked(config) else {
        return check_and_capture(config, clients, create, cancel);
    };
    match end::capture_end(config, clients.probe(), &clients.consumer, cancel) {
        Ok(watermarks) => Ok((Some(facts), Some(watermarks), started)),
        Err(e @ ChangelogError::Cancelled { .. }) => Err(e),
        // What a recent check found is out of date (the topic deleted since?): check again.
        Err(e) => {
            tracing::debug!(error = %e, "end offsets failed after a recent topic check; checking the topic again");
            check_and_capture(config, clients, create, cancel)
        }
    }
}

/// Opens the store at `location` and brings it up to the changelog's current end.
pub(crate) fn restore(
    location: &StoreLocation,
    options: &RocksDbOptions,
    config: &ChangelogConfig,
    hooks: &OpenHooks,
    clients: &RestoreClients,
) -> Result<Restored, ChangelogError> {
    let listener = hooks.listener.as_deref();
    let check = hooks.record_check.as_ref();
    let (topic, partition) = (config.topic.as_str(), config.partition);
    let span = tracing::info_span!("restore", topic, partition);
    let _entered = span.enter();

    let path = location.path();
    let path = path.as_path();
    let mut store = location.open(options)?;
    let position = ChangelogPosition::read(&store)?;

    let has_data = store.all()?.next().is_some();
    // A store that holds state never recreates its missing changelog on its own; one that
    // holds nothing (a position alone, as a restore from an empty changelog leaves) has
    // nothing to lose.
    let create = position.is_none() || !has_data || config.lost_changelog != LostChangelog::Refuse;
    let consumer = &clients.consumer;
    // However the restore ends, the consumer leaves this partition for the next restore.
    let _unassign = clients::Unassign(consumer);
    let started = Instant::now();
    let reseed_pending = crate::position::is_reseeding(&store)?;
    let decide = |watermarks, delete_retention| {
        trust::decide(&trust::Facts {
            path,
            config,
            position: position.as_ref(),
            has_data,
            watermarks,
            delete_retention,
            reseed_pending,
        })
    };
    // An end prefetched with the other partitions of an assignment, and a recent topic check,
    // serve a store that resumes or holds nothing: no round trip to the broker. An end older
    // than the partition's is safe for both, as for any restore whose end another writer passes
    // later: the store's first record then lands past where the restore ended, and the
    // producer's offset check poisons it. Any other plan (a refusal, a rebuild, a reseed) is made
    // again on an end captured now.
    let prefetched = clients
        .checked(config)
        .and_then(|facts| Some((facts, clients.take_prefetched_end(config)?)))
        .and_then(
            |(facts, end)| match decide(Some(end), facts.delete_retention) {
                Ok(plan @ (trust::Plan::Resume { .. } | trust::Plan::FromStart { wipe: None })) => {
                    Some((facts, end, plan))
                }
                _ => None,
            },
        );
    let (topic_facts, watermarks, started, plan) = match prefetched {
        Some((facts, end, plan)) => (Some(facts), Some(end), started, plan),
        None => {
            let (topic_facts, watermarks, started) =
                capture_now(config, clients, create, started, hooks.cancel.as_ref())?;
            let delete_retention = topic_facts.as_ref().and_then(|f| f.delete_retention);
            let plan = decide(watermarks, delete_retention)?;
            (topic_facts, watermarks, started, plan)
        }
    };
    // The plan refuses a missing topic, except to finish a reseed, which needs the topic too.
    let (Some(topic_facts), Some(watermarks)) = (topic_facts, watermarks) else {
        let stored_offset = position.map_or(-1, |p| p.offset);
        return Err(trust::topic_missing(path, config, stored_offset));
    };
    let high = watermarks.high;
    let (start_offset, rebuild_reason, bulk, reseed) = match plan {
        trust::Plan::Resume { from } => (from, None, false, None),
        trust::Plan::FromStart { wipe } => {
            if let Some(reason) = &wipe {
                tracing::warn!(%reason, path = %path.display(), "wiping the store and rebuilding it from the changelog");
                store = location.wipe(store, options)?;
            }
            (watermarks.low, wipe, true, None)
        }
        trust::Plan::Reseed { reason } => (high, None, false, Some(reason)),
    };
    let start = RestoreStart {
        topic: topic.to_string(),
        partition,
        start_offset,
        end_offset: high,
        rebuild_reason,
    };
    tracing::info!(
        start_offset,
        end_offset = high,
        low = watermarks.low,
        "restore starting"
    );
    if let Some(l) = listener {
        l.on_restore_start(&start);
    }

    // What the replayed positions may claim (see ChangelogPosition::written_at): into an empty
    // store, every record is read from now on; onto a stale one, the store also holds records
    // applied when its old position was written.
    let since = match (&position, bulk) {
        (Some(p), false) => p.written_at.map(|t| t.min(SystemTime::now())),
        _ => Some(SystemTime::now()),
    };
    let (records, batches) = if start_offset < high {
        replay::replay(replay::Replay {
            since,
            path,
            store: &store,
            consumer,
            config,
            start_offset,
            high,
            bulk,
            listener,
            check,
            span: &span,
            cancel: hooks.cancel.as_ref(),
        })?
    } else {
        (0, 0)
    };
    if start_offset < high || bulk {
        // Every offset below the end is covered now, those no record holds too (transaction
        // markers, records compacted away): the position says so, and the next restore starts
        // at the end instead of reading markers again. A store restored from an empty
        // changelog holds a position too (one before the end): its first commit may write
        // local entries alone (a stream time, dropped segments), and data without a position
        // would be refused as not a changelog store when it opens again.
        let covered = ChangelogPosition {
            topic: topic.to_string(),
            partition,
            offset: high - 1,
            written_at: since,
        };
        covered.write_with(&store, std::iter::empty())?;
    }
    if records > 0 || start_offset < high || bulk {
        // The replayed batches sit in memtables (no WAL): a crash soon after the restore would
        // replay them all again. One flush makes the restored position durable, so the next
        // restore of this directory replays only what was written after it.
        store.flush()?;
    }
    let report = RestoreReport {
        start,
        records,
        batches,
        elapsed: started.elapsed(),
    };
    tracing::info!(
        records,
        batches,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "restore done"
    );
    metrics::histogram!("kstate_restore_seconds").record(report.elapsed.as_secs_f64());
    metrics::gauge!("kstate_restore_rate", "topic" => topic.to_string())
        .set(report.records_per_sec());
    if let Some(l) = listener {
        l.on_restore_end(&report);
    }
    Ok(Restored {
        store,
        report,
        reseed,
        topic: topic_facts,
    })
}
