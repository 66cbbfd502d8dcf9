//! Following many changelogs with a few consumers: the steady state of standby replicas.
//!
//! A standby follows every store of every task it may take over; a process can follow hundreds of
//! changelog partitions. A consumer, a thread and a writer thread per followed partition cost
//! thousands of threads and sockets at that scale, outside every budget. A [`FollowerGroup`]
//! follows them all on a few *lanes*: one `read_committed` consumer and one thread each, the
//! consumer assigned many partitions at once.
//!
//! **Why lanes.** librdkafka reports that a partition reached its end as
//! `PartitionEOF(partition)`, without the topic. A lane follows at most one changelog per
//! partition number, so the end it hears of is never ambiguous: a task's stores (one changelog
//! each, all of the task's partition) spread over as many lanes as the task has stores, and a
//! thousand tasks of three stores take three lanes.
//!
//! **How a store joins.** [`FollowerGroup::follow`] restores the store to the changelog's end
//! first (an ordinary restore, which may ingest a whole changelog as SST files), then assigns its
//! partition to a lane right after the restored position. A lane applies what it reads in chunks
//! written with their last offset, as a restore does: when a chunk fills, when the lane goes
//! quiet, and at least every [`SWEEP`]. When a partition reaches its end it also stores the
//! offsets the end covers (transaction markers after its last record) and a fresh `written_at`
//! (the time the end was seen, less a margin): every record after that position was appended
//! later, so a promotion days later resumes instead of taking the position for one older than
//! the topic's `delete.retention.ms`.
//!
//! **How it leaves.** Cancelling the store's token ends its follow within a sweep: the lane
//! writes what it holds, unassigns the partition and closes the store at its position; the
//! [`Following`] handle then says how it ended. A store that fails (a record that does not
//! map, a write that fails) ends with its error and cancels its token, which a task's stores
//! share: a task is followed whole or not at all. A read error that names no partition (the
//! log start moved past a position) ends every follow of its lane; each restarts with a restore
//! that decides again whether its position can be trusted.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use kstate_core::sync::lock;
use kstate_core::{BoxError, ChangelogReplay, KeyValueStore as _};
use kstate_rocksdb::{RocksDbOptions, RocksDbStore};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::ChangelogConfig;
use crate::error::ChangelogError;
use crate::position::ChangelogPosition;
use crate::restore::clients::{RestoreClients, RestoreCluster};
use crate::restore::consumer::RestoreConsumer;
use crate::restore::replay::{
    Chunk, ChunkEnd, ChunkWriter, WRITTEN_AT_MARGIN, WRITTEN_AT_REFRESH, end_chunk,
    sent_stream_time,
};
use crate::restore::{
    CancelToken, FOLLOW_FETCH_WAIT, OpenHooks, RestoreListener, RestoreReport, StoreLocation,
};

/// A lane's bound on the records its consumer fetched and the lane has not applied yet
/// (librdkafka's default is 64 MiB per consumer): the lane applies as it reads, so the queue
/// fills only in a burst, and a few lanes then hold at most a few times this.
const LANE_QUEUE: (&str, &str) = ("queued.max.messages.kbytes", "16384");

/// How long a lane's poll waits for a record.
const POLL: Duration = Duration::from_millis(100);
/// How often a lane writes what its partitions hold, stores the ends they reached, and stops
/// the follows that were cancelled.
const SWEEP: Duration = Duration::from_millis(100);

/// Changelog partitions of one cluster followed on a few lanes (see the module doc). Dropping
/// the group ends every follow, each store closed at its position.
pub struct FollowerGroup {
    cluster: Arc<RestoreCluster>,
    lanes: Mutex<Vec<Lane>>,
}

impl std::fmt::Debug for FollowerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowerGroup")
            .field("lanes", &lock(&self.lanes).len())
            .finish_non_exhaustive()
    }
}

/// One consumer and its thread.
struct Lane {
    /// How many follows of each partition number it holds (one at most: see the module doc),
    /// counted out by the lane when a follow ends.
    partitions: Arc<Mutex<HashMap<i32, usize>>>,
    commands: Sender<Box<Followed>>,
    stop: CancelToken,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("a follower lane's thread panicked");
        }
    }
}

impl FollowerGroup {
    /// A group whose lanes share `cluster`'s metadata and admin clients; it starts a lane (a
    /// consumer and a thread) when no lane can take a partition.
    pub fn new(cluster: Arc<RestoreCluster>) -> Self {
        FollowerGroup {
            cluster,
            lanes: Mutex::default(),
        }
    }

    /// Whether the group follows the cluster `config` names, as `config` would.
    pub fn suits(&self, config: &ChangelogConfig) -> bool {
        self.cluster.suits(config)
    }

    /// How many lanes (consumers and threads) the group runs.
    pub fn lanes(&self) -> usize {
        lock(&self.lanes).len()
    }

    /// Restores the store at `location` to the end of `config`'s changelog through `clients`,
    /// then follows it on a lane until `stop` is cancelled. `clients` (the restore's consumer)
    /// and `config` must [suit](RestoreCluster::suits) the group's cluster: an
    /// [`InvalidConfig`](ChangelogError::InvalidConfig) error otherwise.
    pub fn follow(
        &self,
        location: impl Into<StoreLocation>,
        options: &RocksDbOptions,
        config: &ChangelogConfig,
        listener: Option<Arc<dyn RestoreListener>>,
        stop: &CancelToken,
        clients: &RestoreClients,
    ) -> Result<Following, ChangelogError> {
        if !self.cluster.suits(config) || !clients.cluster().suits(config) {
            return Err(ChangelogError::InvalidConfig {
                topic: config.topic.clone(),
                message: format!(
                    "the follower group was made for another cluster or other client \
                     properties ({:?}); the changelog's are {:?}",
                    self.cluster, config.client
                ),
            });
        }
        let started = Instant::now();
        let hooks = OpenHooks {
            listener: listener.clone(),
            record_check: None,
            cancel: Some(stop.clone()),
        };
        let location = location.into();
        let restored = crate::restore::restore(&location, options, config, &hooks, clients)?;
        let store = restored.store;
        let position = ChangelogPosition::read(&store)?;
        let replay = match &config.keys {
            Some(keys) => Some(keys.replay(&store)?),
            None => None,
        };
        let from = position.as_ref().map_or(-1, |p| p.offset);
        let following = Following {
            restored: restored.report,
            from,
            started,
            ending: Arc::default(),
        };
        let followed = Box::new(Followed {
            store,
            config: config.clone(),
            replay,
            chunk: Chunk::default(),
            last_time: None,
            last_offset: from,
            stored_offset: from,
            since: position.and_then(|p| p.written_at),
            refreshed: Instant::now(),
            end_seen: None,
            listener,
            stop: stop.clone(),
            records: 0,
            batches: 0,
            ending: following.ending.clone(),
        });
        self.hand_to_a_lane(followed)?;
        Ok(following)
    }

    /// Gives `followed` to the first lane that follows nothing of its partition number,
    /// starting a lane if none can take it.
    fn hand_to_a_lane(&self, followed: Box<Followed>) -> Result<(), ChangelogError> {
        let partition = followed.config.partition;
        let mut lanes = lock(&self.lanes);
        let free = lanes.iter().position(|lane| {
            let mut held = lock(&lane.partitions);
            let free = held.get(&partition).is_none_or(|n| *n == 0);
            if free {
                *held.entry(partition).or_default() += 1;
            }
            free
        });
        let lane = match free {
            Some(i) => &lanes[i],
            None => {
                let lane = self.start_lane(&followed.config, lanes.len())?;
                *lock(&lane.partitions).entry(partition).or_default() += 1;
                lanes.push(lane);
                lanes.last().unwrap_or_else(|| unreachable!("just pushed"))
            }
        };
        lane.commands.send(followed).map_err(|lost| {
            // The lane's thread is gone (it panicked): nothing follows this store.
            ChangelogError::Store(kstate_core::Error::backend(
                lost.0.config.topic.clone(),
                "hand a store to a follower lane",
                std::io::Error::other("the lane's thread ended"),
            ))
        })
    }

    fn start_lane(&self, config: &ChangelogConfig, number: usize) -> Result<Lane, ChangelogError> {
        let clients = RestoreClients::with_settings(
            self.cluster.clone(),
            config,
            &[FOLLOW_FETCH_WAIT, LANE_QUEUE],
        )?;
        let (commands, received) = std::sync::mpsc::channel();
        let partitions: Arc<Mutex<HashMap<i32, usize>>> = Arc::default();
        let stop = CancelToken::new();
        let (held, stopped) = (partitions.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("kstate-follow-{number}"))
            .spawn(move || run_lane(&clients.consumer, &received, &stopped, &held))
            .map_err(|e| {
                ChangelogError::Store(kstate_core::Error::backend(
                    config.topic.clone(),
                    "start a follower lane's thread",
                    e,
                ))
            })?;
        Ok(Lane {
            partitions,
            commands,
            stop,
            thread: Some(thread),
        })
    }
}

/// How a follow ended: `None` while it runs; then the records and batches it applied after
/// its restore, or why it failed.
type Ending = Arc<(Mutex<Option<Result<(u64, u64), ChangelogError>>>, Condvar)>;

/// One followed store, as its caller holds it.
#[derive(Debug)]
pub struct Following {
    restored: RestoreReport,
    /// The stored position the follow started after.
    from: i64,
    started: Instant,
    ending: Ending,
}

impl Following {
    /// What the restore before the follow did.
    pub fn restored(&self) -> &RestoreReport {
        &self.restored
    }

    /// The offset the restore left the store at, which the follow started after (-1: none).
    /// A restore with nothing to replay reports no batch; this is where the store is then.
    pub fn restored_to(&self) -> i64 {
        self.from
    }

    /// Whether the follow ended (its store closed, its partition unassigned).
    pub fn is_done(&self) -> bool {
        lock(&self.ending.0).is_some()
    }

    /// Waits for the follow to end; returns what the restore and the follow applied, in all.
    pub fn wait(self) -> Result<RestoreReport, ChangelogError> {
        let (ending, ended) = &*self.ending;
        let mut ending = ended
            .wait_while(lock(ending), |e| e.is_none())
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (records, batches) = ending.take().unwrap_or(Ok((0, 0)))?;
        let mut report = self.restored;
        report.records += records;
        report.batches += batches;
        report.elapsed = self.started.elapsed();
        Ok(report)
    }
}

/// A followed store, as its lane holds it.
struct Followed {
    store: RocksDbStore,
    config: ChangelogConfig,
    /// Maps each record to the store's keys (a store of time).
    replay: Option<Box<dyn ChangelogReplay>>,
    chunk: Chunk,
    /// The stream time sent with the last record read into the chunk.
    last_time: Option<i64>,
    last_offset: i64,
    /// The offset of the last position written.
    stored_offset: i64,
    /// The `written_at` of the positions it writes.
    since: Option<SystemTime>,
    /// When a position was last stored with a fresh `written_at`.
    refreshed: Instant,
    /// When the partition's end was last seen, if since the last sweep.
    end_seen: Option<SystemTime>,
    listener: Option<Arc<dyn RestoreListener>>,
    stop: CancelToken,
    records: u64,
    batches: u64,
    ending: Ending,
}

impl Drop for Followed {
    /// A follow dropped without [`finish`](Followed::finish) (its lane's thread panicked, or
    /// ended before it took the store) still ends: whoever waits for it hears why.
    fn drop(&mut self) {
        let (ending, ended) = &*self.ending;
        let mut ending = lock(ending);
        if ending.is_none() {
            *ending = Some(Err(ChangelogError::Store(kstate_core::Error::backend(
                self.config.topic.clone(),
                "follow",
                std::io::Error::other("the follower lane's thread ended"),
            ))));
            self.stop.cancel();
        }
        ended.notify_all();
    }
}

impl Followed {
    fn bad(&self, offset: i64, problem: &str, source: Option<BoxError>) -> ChangelogError {
        ChangelogError::BadRecord {
            topic: self.config.topic.clone(),
            partition: self.config.partition,
            offset,
            problem: problem.into(),
            source,
        }
    }

    /// Reads one record into the chunk; writes the chunk when it is full.
    fn take(&mut self, message: &BorrowedMessage<'_>) -> Result<(), ChangelogError> {
        let offset = message.offset();
        let Some(key) = message.key() else {
            return Err(self.bad(offset, "the record has no key", None));
        };
        let value = message.payload();
        self.chunk.read += 1;
        match self.replay.as_mut() {
            None => self.chunk.push(key, value),
            Some(replay) => {
                if let Err(e) = replay.record(key, value, &mut self.chunk) {
                    return Err(self.bad(offset, "the record's key does not map", Some(e)));
                }
                self.last_time = sent_stream_time(message);
            }
        }
        self.last_offset = offset;
        if self.chunk.full(
            self.config.restore_batch_records,
            self.config.restore_batch_bytes,
        ) {
            self.write(ChunkEnd::at(offset))?;
        }
        Ok(())
    }

    /// Writes the chunk (with the store's derived keys) and the position `end`.
    fn write(&mut self, end: ChunkEnd) -> Result<(), ChangelogError> {
        end_chunk(&mut self.replay, self.last_time, &mut self.chunk);
        let mut writer = ChunkWriter {
            store: &self.store,
            topic: &self.config.topic,
            partition: self.config.partition,
            high: end.offset + 1,
            bulk: false,
            since: self.since,
            listener: self.listener.as_deref(),
            scratch: Vec::new(),
            records: self.records,
            batches: self.batches,
        };
        writer.write(&mut self.chunk, end)?;
        (self.since, self.records, self.batches) = (writer.since, writer.records, writer.batches);
        self.stored_offset = end.offset;
        Ok(())
    }

    /// The sweep: stores the end it reached (the offsets the end covers, dated when it was
    /// seen) or what the chunk holds.
    fn sweep(&mut self, positions: &HashMap<(String, i32), i64>) -> Result<(), ChangelogError> {
        let at_end = self.end_seen.take();
        if let Some(seen) = at_end {
            let position = positions
                .get(&(self.config.topic.clone(), self.config.partition))
                .copied();
            let covered = position.map_or(self.last_offset, |p| (p - 1).max(self.last_offset));
            if self.chunk.read > 0
                || covered > self.stored_offset
                || self.refreshed.elapsed() >= WRITTEN_AT_REFRESH
            {
                self.refreshed = Instant::now();
                return self.write(ChunkEnd {
                    offset: covered,
                    written_at: seen.checked_sub(WRITTEN_AT_MARGIN),
                });
            }
        }
        if self.chunk.read > 0 {
            return self.write(ChunkEnd::at(self.last_offset));
        }
        Ok(())
    }

    /// Writes what it holds, closes the store, and says how the follow ended.
    fn finish(mut self: Box<Self>, failed: Option<ChangelogError>) {
        let written = match failed {
            Some(e) => Err(e),
            None => self
                .write(ChunkEnd::at(self.last_offset))
                .and_then(|()| Ok(self.store.close()?)),
        };
        if let Err(e) = &written {
            if !self.stop.is_cancelled() {
                tracing::warn!(
                    topic = %self.config.topic,
                    partition = self.config.partition,
                    error = %e,
                    "a follow ended"
                );
            }
            // The task's other stores stop too.
            self.stop.cancel();
        }
        let (ending, ended) = &*self.ending;
        *lock(ending) = Some(written.map(|()| (self.records, self.batches)));
        ended.notify_all();
        // Dropped here: its store closes, the task's lease goes with it.
    }
}

/// A lane's thread: takes new follows, polls, applies, sweeps; at `stop`, ends every follow.
fn run_lane(
    consumer: &RestoreConsumer,
    commands: &Receiver<Box<Followed>>,
    stop: &CancelToken,
    held: &Mutex<HashMap<i32, usize>>,
) {
    // By partition number: one follow each (see the module doc).
    let mut followed: HashMap<i32, Box<Followed>> = HashMap::new();
    let mut swept = Instant::now();
    let end = |followed: Box<Followed>, failed: Option<ChangelogError>| {
        let partition = followed.config.partition;
        let mut gone = TopicPartitionList::new();
        let _ = gone.add_partition(&followed.config.topic, partition);
        if let Err(e) = consumer.incremental_unassign(&gone) {
            tracing::warn!(topic = %followed.config.topic, partition, error = %e, "a follower lane could not unassign a partition");
        }
        followed.finish(failed);
        if let Some(n) = lock(held).get_mut(&partition) {
            *n = n.saturating_sub(1);
        }
    };
    loop {
        // New follows: wait for one when the lane is idle.
        loop {
            let next = if followed.is_empty() && !stop.is_cancelled() {
                match commands.recv_timeout(POLL) {
                    Ok(f) => Some(f),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        stop.cancel();
                        None
                    }
                }
            } else {
                match commands.try_recv() {
                    Ok(f) => Some(f),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => {
                        stop.cancel();
                        None
                    }
                }
            };
            let Some(f) = next else { break };
            let mut assignment = TopicPartitionList::new();
            let assigned = assignment
                .add_partition_offset(
                    &f.config.topic,
                    f.config.partition,
                    Offset::Offset(f.last_offset + 1),
                )
                .and_then(|()| consumer.incremental_assign(&assignment));
            match assigned {
                Ok(()) => {
                    if let Some(old) = followed.insert(f.config.partition, f) {
                        // Never: the group hands a lane one follow per partition number.
                        end(old, None);
                    }
                }
                Err(e) => {
                    let failed = ChangelogError::Kafka {
                        topic: f.config.topic.clone(),
                        partition: f.config.partition,
                        operation: "assign a followed partition",
                        source: e,
                    };
                    end(f, Some(failed));
                }
            }
        }
        if stop.is_cancelled() {
            for (_, f) in followed.drain() {
                end(f, None);
            }
            return;
        }
        if followed.is_empty() {
            continue;
        }
        match consumer.poll(POLL) {
            Some(Ok(message)) => {
                let partition = message.partition();
                let taken = match followed.get_mut(&partition) {
                    Some(f) if f.config.topic == message.topic() => f.take(&message),
                    // A record of a partition unassigned a moment ago.
                    _ => Ok(()),
                };
                drop(message);
                if let Err(e) = taken
                    && let Some(f) = followed.remove(&partition)
                {
                    end(f, Some(e));
                }
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                if let Some(f) = followed.get_mut(&partition) {
                    f.end_seen = Some(SystemTime::now());
                }
            }
            Some(Err(e @ KafkaError::MessageConsumption(code)))
                if code == RDKafkaErrorCode::OffsetOutOfRange
                    || code == RDKafkaErrorCode::AutoOffsetReset =>
            {
                // No partition named: every follow of the lane restores again.
                for (_, f) in followed.drain() {
                    let failed = ChangelogError::Kafka {
                        topic: f.config.topic.clone(),
                        partition: f.config.partition,
                        operation: "follow (the log moved past a follower's position)",
                        source: e.clone(),
                    };
                    end(f, Some(failed));
                }
                continue;
            }
            Some(Err(e)) => {
                // Transient (a broker restarting, a connection dropped): librdkafka retries.
                tracing::warn!(error = %e, "follower read error; retrying");
            }
            None => {
                // Quiet: the sweep below writes what every partition holds.
                swept = swept.min(Instant::now() - SWEEP);
            }
        }
        if swept.elapsed() >= SWEEP {
            swept = Instant::now();
            sweep(consumer, &mut followed, &end);
        }
    }
}

/// Ends the cancelled follows and writes what the others hold.
fn sweep(
    consumer: &RestoreConsumer,
    followed: &mut HashMap<i32, Box<Followed>>,
    end: &dyn Fn(Box<Followed>, Option<ChangelogError>),
) {
    let positions: HashMap<(String, i32), i64> = if followed.values().any(|f| f.end_seen.is_some())
    {
        consumer
            .position()
            .map(|list| {
                list.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    } else {
        HashMap::new()
    };
    let partitions: Vec<i32> = followed.keys().copied().collect();
    for partition in partitions {
        let Some(f) = followed.get_mut(&partition) else {
            continue;
        };
        if f.stop.is_cancelled() {
            if let Some(f) = followed.remove(&partition) {
                end(f, None);
            }
            continue;
        }
        if let Err(e) = f.sweep(&positions)
            && let Some(f) = followed.remove(&partition)
        {
            end(f, Some(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follow_dropped_unfinished_ends_with_an_error_and_stops_its_task() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksDbStore::open(dir.path(), &RocksDbOptions::default()).unwrap();
        let stop = CancelToken::new();
        let following = Following {
            restored: RestoreReport {
                start: crate::restore::RestoreStart {
                    topic: "t".into(),
                    partition: 0,
                    start_offset: 0,
                    end_offset: 0,
                    rebuild_reason: None,
                },
                records: 0,
                batches: 0,
                elapsed: Duration::ZERO,
            },
            from: -1,
            started: Instant::now(),
            ending: Arc::default(),
        };
        let followed = Followed {
            store,
            config: ChangelogConfig::new("localhost:9092", "t", 0),
            replay: None,
            chunk: Chunk::default(),
            last_time: None,
            last_offset: -1,
            stored_offset: -1,
            since: None,
            refreshed: Instant::now(),
            end_seen: None,
            listener: None,
            stop: stop.clone(),
            records: 0,
            batches: 0,
            ending: following.ending.clone(),
        };
        // As when a lane's thread panics with the store in its map.
        drop(followed);
        assert!(following.is_done(), "a dropped follow must end");
        assert!(stop.is_cancelled(), "its task's other stores must stop too");
        assert!(
            following.wait().is_err(),
            "the waiter must hear that it failed"
        );
    }
}
