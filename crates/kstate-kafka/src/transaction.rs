//! Exactly-once: one Kafka transaction carries the changelog records of every store attached to
//! a [`SharedProducer`], the outputs sent through it and, optionally, the input offsets the
//! records came from (EOS v2, KIP-447).
//!
//! # Why the overlay makes this clean
//! A store attached to a transactional producer never writes RocksDB before
//! `commit_transaction` returned: its writes wait in the overlay (DESIGN.md, "Exactly-once").
//! After the commit each store writes its overlay with the offset of its last changelog record
//! in one batch; after an abort the overlay is dropped and the store is exactly as at the last
//! commit. So a crash never needs a wipe: RocksDB holds a committed prefix of the changelog, and
//! restore replays the rest with `read_committed`. (Kafka Streams writes RocksDB first and,
//! until KIP-892, wipes the whole store after a crash under EOS; with the WAL off a memtable
//! flush can persist an aborted transaction's writes, KAFKA-20685.)
//!
//! # The stored position is the commit marker
//! A committed transaction leaves a commit marker in each partition it wrote, right after its
//! last record there (one writer per partition: nothing else lands in between, and the
//! coordinator lets the next transaction write the partition only after the marker). Each store
//! stores the marker's offset as its position, not its last record's. The restore's trust rule
//! (`restore::trust`) rebuilds a store whose position is older than `delete.retention.ms` when
//! anything follows the position. Were the last record stored, the marker would always follow
//! it, and a store idle for longer than that (a quiet partition, a nightly input, a long stop)
//! would be wiped and rebuilt on its next open though no tombstone can have been lost. With the
//! marker stored, an idle store's position is the log's end, as under at-least-once, and the
//! restore resumes at the offset after the marker: the next transaction's first record, nothing
//! skipped (the restore stores the end it reached the same way, markers included).
//!
//! `commit_transaction` returns once the coordinator has decided; it writes the markers a moment
//! later. A restore in between cannot mistake the position for one past the log's end: while the
//! marker is missing, the transaction holds the last stable offset below the high watermark, and
//! the restore waits for it to reach the end (`restore::end`) before it looks at the position.
//!
//! Refreshing the position's time at each flush instead would keep only an open store fresh: a
//! store closed for longer than `delete.retention.ms` would still be rebuilt.
//!
//! # Errors, as librdkafka defines them
//! Retriable errors are retried until the call's timeout. An abortable error aborts the
//! transaction here, drops the overlays and returns [`TransactionError::Aborted`]: the caller
//! rewinds its input to the committed offsets and goes on. A fatal error (fenced by a newer
//! producer with the same `transactional.id`, for one) returns [`TransactionError::Fatal`]:
//! nothing was applied, and the producer and its stores are done.
//!
//! # Delivery reports
//! librdkafka's `commit_transaction` flushes first, and its flush serves delivery reports on
//! the calling thread while the producer's own thread serves them too: two threads can hand a
//! partition's acknowledgements to the stores out of order. So the commit first waits, through
//! the stores' own trackers, until every record's report was served; librdkafka's flush then
//! has nothing left to serve.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kstate_core::PoisonReason;
use kstate_core::sync::read;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;

use crate::config::{ChangelogConfig, ProducerConfig};
use crate::error::{ChangelogError, TransactionError};
use crate::offsets_call::{GroupOffsets, OffsetsCall};
use crate::producer::SharedProducer;
use crate::transaction_member::{Transaction, TransactionMember};

/// Why a commit did not complete.
enum Failure {
    /// Abort, and report the abort.
    Abort(String),
    /// Abort, then report this error.
    AbortThen(String, TransactionError),
    /// Nothing to abort (it committed, or the producer failed for good): report this.
    Done(TransactionError),
}

/// What to do after a transactional call failed.
enum Next {
    Retry,
    Abort(String),
    /// The message, and whether the broker fenced the producer.
    Fatal(String, bool),
}

/// Whether a fatal error is the broker fencing the producer: a newer producer with the same
/// transactional id, or our own transaction timed out and the broker bumped our epoch.
fn is_fencing(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

fn classify(error: &KafkaError) -> Next {
    match error {
        KafkaError::Transaction(e) if e.is_fatal() => {
            Next::Fatal(e.to_string(), is_fencing(e.code()))
        }
        KafkaError::Transaction(e) if e.txn_requires_abort() => Next::Abort(e.to_string()),
        KafkaError::Transaction(e) if e.is_retriable() => Next::Retry,
        // Neither retriable nor fatal: try an abort, which fails fatally if it must.
        other => Next::Abort(other.to_string()),
    }
}

impl SharedProducer {
    /// A transactional producer: `transactional_id` must belong to this producer alone (one
    /// per worker thread of a task runtime); opening it fences any earlier producer with the
    /// same id and aborts its open transaction, so call it before restoring the stores it will
    /// carry. A transaction is open from here on: every write of an attached store, and every
    /// output, is part of it until [`commit_transaction`](Self::commit_transaction) or
    /// [`abort_transaction`](Self::abort_transaction), which open the next one.
    ///
    /// Records time out before the transaction does (`message.timeout.ms` is at most 90% of
    /// `transaction_timeout`).
    pub fn transactional(
        config: &ChangelogConfig,
        transactional_id: impl Into<String>,
        transaction_timeout: Duration,
    ) -> Result<Self, ChangelogError> {
        Self::transactional_with(&config.into(), transactional_id, transaction_timeout)
    }

    /// [`transactional`](Self::transactional) with a [`ProducerConfig`] of its own (a task
    /// runtime's worker producer): `init_transactions` waits up to the config's init timeout
    /// plus the transaction timeout.
    pub fn transactional_with(
        config: &ProducerConfig,
        transactional_id: impl Into<String>,
        transaction_timeout: Duration,
    ) -> Result<Self, ChangelogError> {
        let id = transactional_id.into();
        let producer = Self::build(
            config,
            Some(Transaction::new(id.clone(), transaction_timeout)),
        )?;
        let kafka = |operation, source| ChangelogError::Producer {
            bootstrap_servers: config.client.bootstrap_servers().to_string(),
            operation,
            source,
        };
        producer
            .inner
            .init_transactions(config.init_timeout + transaction_timeout)
            .map_err(|e| kafka("init transactions", e))?;
        producer
            .inner
            .begin_transaction()
            .map_err(|e| kafka("begin transaction", e))?;
        tracing::info!(transactional_id = %id, "transactional producer ready");
        Ok(producer)
    }

    /// Whether this producer is transactional.
    pub fn is_transactional(&self) -> bool {
        self.transaction.is_some()
    }

    /// A store's overlay reached its bound since the last commit: commit soon.
    pub fn commit_requested(&self) -> bool {
        self.transaction
            .as_ref()
            .is_some_and(|t| t.commit_is_requested())
    }

    /// Whether the open transaction holds a record (a changelog record or an output) sent
    /// through this producer. A commit of such a transaction must carry input offsets even
    /// when no input moved (a TTL sweep's tombstones, a timer's outputs): `TxnOffsetCommit` is
    /// where the broker checks the group generation, the only fence between a member that lost
    /// its tasks and the new owner's changelogs.
    pub fn transaction_holds_records(&self) -> bool {
        self.transaction.as_ref().is_some_and(|t| t.holds_records())
    }

    fn transaction_state(&self) -> Result<&Transaction, TransactionError> {
        self.transaction
            .as_deref()
            .ok_or_else(|| TransactionError::Fatal {
                transactional_id: String::new(),
                operation: "transaction",
                message: "this producer is not transactional (SharedProducer::transactional)"
                    .into(),
                fenced: false,
            })
    }

    fn members(&self) -> Vec<Arc<dyn TransactionMember>> {
        read(&self.routes)
            .members
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }

    /// Commits the open transaction: adds `offsets` (the next input offsets to read, with the
    /// consumer's current group metadata) to it, waits until the broker acknowledged every
    /// record, commits it, and then writes each attached store's overlay with its last offset
    /// into RocksDB. Opens the next transaction. Writes of the attached stores wait meanwhile.
    ///
    /// On an abortable error the transaction is aborted instead, every overlay dropped, and
    /// [`TransactionError::Aborted`] returned: rewind the input to its committed offsets.
    pub fn commit_transaction(
        &self,
        offsets: Option<(TopicPartitionList, ConsumerGroupMetadata)>,
        timeout: Duration,
    ) -> Result<(), TransactionError> {
        let offsets = offsets.map(Arc::new);
        let transaction = self.transaction_state()?;
        let started = Instant::now();
        let deadline = started + timeout;
        transaction.commit_started();
        let members = self.members();
        let held: Vec<_> = members.iter().map(|m| m.hold_sends()).collect();
        let outcome = self.commit_held(&members, transaction, offsets, deadline);
        drop(held);
        let (reason, error) = match outcome {
            Ok(()) => {
                metrics::histogram!("kstate_transaction_commit_seconds")
                    .record(started.elapsed().as_secs_f64());
                return Ok(());
            }
            Err(Failure::Done(error)) => {
                if matches!(error, TransactionError::Fatal { .. }) {
                    // Fenced, or worse: nothing was applied, and nothing will be.
                    self.failed_for_good(&members, &error);
                }
                return Err(error);
            }
            Err(Failure::Abort(reason)) => {
                let error = TransactionError::Aborted {
                    transactional_id: transaction.id.clone(),
                    reason: reason.clone(),
                };
                (reason, error)
            }
            Err(Failure::AbortThen(reason, error)) => (reason, error),
        };
        // A little more time for the abort itself: it is what keeps the stores usable.
        let deadline = deadline.max(Instant::now() + transaction.timeout);
        self.abort_members(&members, transaction, &reason, deadline)?;
        Err(error)
    }

    /// The commit, with every member's sends held.
    fn commit_held(
        &self,
        members: &[Arc<dyn TransactionMember>],
        transaction: &Transaction,
        offsets: Option<GroupOffsets>,
        deadline: Instant,
    ) -> Result<(), Failure> {
        // The offsets first: their two round trips to the group coordinator overlap the last
        // acknowledgements, which arrive meanwhile on the producer's own thread.
        if let Some(offsets) = offsets {
            self.retry(
                transaction,
                "send offsets",
                deadline,
                |left| match transaction.offsets.call(&self.inner, &offsets, left) {
                    OffsetsCall::Returned(result) => Ok(result),
                    OffsetsCall::Stuck(waited) => Err(Failure::Done(TransactionError::Fatal {
                        transactional_id: transaction.id.clone(),
                        operation: "send offsets",
                        message: format!(
                            "librdkafka's send_offsets_to_transaction did not return within \
                             {waited:?} (its group coordinator lookup can hang for good when \
                             the coordinator's broker left the cluster: \
                             confluentinc/librdkafka#5456, #5511); a new producer takes over"
                        ),
                        fenced: false,
                    })),
                    OffsetsCall::NoThread(e) => Err(Failure::Abort(format!(
                        "send offsets: cannot start its thread: {e}"
                    ))),
                },
            )?;
        }
        for member in members {
            if let Err(reason) = member.settle(deadline) {
                let why = format!("store {}: {reason}", member.member_name());
                if reason.is_transient() {
                    return Err(Failure::Abort(why));
                }
                let error = TransactionError::Store {
                    transactional_id: transaction.id.clone(),
                    store: member.member_name(),
                    source: kstate_core::Error::Poisoned {
                        store: member.member_name(),
                        reason,
                    },
                };
                return Err(Failure::AbortThen(why, error));
            }
        }
        self.settle_outputs(deadline).map_err(Failure::Abort)?;
        self.retry(transaction, "commit", deadline, |left| {
            Ok(self.inner.commit_transaction(left))
        })?;
        let mut applied = Ok(());
        for member in members {
            if let Err(source) = member.committed()
                && applied.is_ok()
            {
                applied = Err(Failure::Done(TransactionError::Store {
                    transactional_id: transaction.id.clone(),
                    store: member.member_name(),
                    source,
                }));
            }
        }
        self.begin(transaction, members).map_err(Failure::Done)?;
        applied
    }

    /// Aborts the open transaction: nothing of it becomes visible, every attached store's
    /// overlay is dropped (the stores are as at the last commit). Opens the next transaction.
    /// Rewind the input to its committed offsets afterwards.
    pub fn abort_transaction(&self, why: &str, timeout: Duration) -> Result<(), TransactionError> {
        let transaction = self.transaction_state()?;
        let members = self.members();
        self.abort_members(&members, transaction, why, Instant::now() + timeout)
    }

    /// Waits until every output's delivery report was served.
    fn settle_outputs(&self, deadline: Instant) -> Result<(), String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.flush(left).map_err(|e| e.to_string())?;
        // The reports were handed to us; librdkafka counts a record as in flight until it has
        // also freed it, a moment later.
        while self.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Calls `call` with the time left until it succeeds, fails for good or the deadline passes.
    /// `call` returns librdkafka's answer, or a failure of its own that ends the commit.
    fn retry(
        &self,
        transaction: &Transaction,
        operation: &'static str,
        deadline: Instant,
        mut call: impl FnMut(Duration) -> Result<Result<(), KafkaError>, Failure>,
    ) -> Result<(), Failure> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let error = match call(left)? {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            match classify(&error) {
                Next::Retry if !left.is_zero() => {
                    tracing::debug!(transactional_id = %transaction.id, operation, %error, "retrying");
                    std::thread::sleep(Duration::from_millis(50).min(left));
                }
                Next::Retry => {
                    return Err(Failure::Abort(format!("{operation}: {error} (timed out)")));
                }
                Next::Abort(message) => {
                    return Err(Failure::Abort(format!("{operation}: {message}")));
                }
                Next::Fatal(message, fenced) => {
                    return Err(Failure::Done(TransactionError::Fatal {
                        transactional_id: transaction.id.clone(),
                        operation,
                        message,
                        fenced,
                    }));
                }
            }
        }
    }

    fn abort_members(
        &self,
        members: &[Arc<dyn TransactionMember>],
        transaction: &Transaction,
        why: &str,
        deadline: Instant,
    ) -> Result<(), TransactionError> {
        tracing::warn!(transactional_id = %transaction.id, reason = why, "aborting the transaction");
        for member in members {
            member.abort_starting();
        }
        let held: Vec<_> = members.iter().map(|m| m.hold_sends()).collect();
        // The sends first, for half the time at most: delivered, their partitions are in the
        // transaction at the coordinator. librdkafka 2.12 counts an AddPartitionsToTxn that the
        // coordinator refused for now (CONCURRENT_TRANSACTIONS while the last commit's markers
        // are written, longer on a replicated cluster) as registered and sends the abort's
        // EndTxn anyway; the coordinator, its last transaction complete and nothing added to
        // this one, answers INVALID_TXN_STATE, fatal to the producer
        // (confluentinc/librdkafka#4849). On the three-node cluster a run with an abort every
        // 100 ms lost its producer thirty times in five minutes that way. Whatever the flush
        // leaves undelivered, the abort purges.
        let half = deadline.saturating_duration_since(Instant::now()) / 2;
        if let Err(e) = self.flush(half) {
            tracing::debug!(transactional_id = %transaction.id, error = %e, "sends not all delivered before the abort");
        }
        let aborted = self.retry(transaction, "abort", deadline, |left| {
            Ok(self.inner.abort_transaction(left))
        });
        if let Err(failure) = aborted {
            // An abort that cannot complete leaves the producer unusable.
            let fatal = match failure {
                Failure::Done(fatal) => fatal,
                Failure::Abort(message) | Failure::AbortThen(message, _) => {
                    TransactionError::Fatal {
                        transactional_id: transaction.id.clone(),
                        operation: "abort",
                        message,
                        fenced: false,
                    }
                }
            };
            self.failed_for_good(members, &fatal);
            return Err(fatal);
        }
        self.outputs.forget();
        for member in members {
            member.aborted();
        }
        metrics::counter!("kstate_transactions_aborted").increment(1);
        let begun = self.begin(transaction, members);
        drop(held);
        begun
    }

    fn begin(
        &self,
        transaction: &Transaction,
        members: &[Arc<dyn TransactionMember>],
    ) -> Result<(), TransactionError> {
        transaction.began();
        self.inner.begin_transaction().map_err(|e| {
            let fenced = matches!(&e, KafkaError::Transaction(t) if is_fencing(t.code()));
            let fatal = TransactionError::Fatal {
                transactional_id: transaction.id.clone(),
                operation: "begin",
                message: e.to_string(),
                fenced,
            };
            self.failed_for_good(members, &fatal);
            fatal
        })
    }

    fn failed_for_good(&self, members: &[Arc<dyn TransactionMember>], error: &TransactionError) {
        tracing::error!(%error, "transactional producer failed");
        for member in members {
            member.producer_failed(PoisonReason::ClientFailed {
                message: error.to_string(),
            });
        }
    }
}
