//! The worker's view of its consumer: the calls the task-state transitions make, behind a small
//! trait, so that every transition has a unit test without a broker (`worker::tests` has a fake
//! that records the calls and fails on request).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, ConsumerGroupMetadata};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::TaskError;
use crate::ids::InputPartition;

/// What the worker asks of its consumer.
pub(crate) trait Input {
    /// Stops fetching these partitions (they stay assigned).
    fn pause(&self, partitions: &[InputPartition]) -> Result<(), TaskError>;
    /// Fetches them again, from the position after the last record handed over.
    fn resume(&self, partitions: &[InputPartition]) -> Result<(), TaskError>;
    /// Moves the next fetch of `partition` to `offset`.
    fn seek(
        &self,
        partition: &InputPartition,
        offset: i64,
        timeout: Duration,
    ) -> Result<(), TaskError>;
    /// The group's committed offsets of `partitions`; a partition without one is absent.
    fn committed(
        &self,
        partitions: &[InputPartition],
        timeout: Duration,
    ) -> Result<BTreeMap<InputPartition, i64>, TaskError>;
    /// Where each of `partitions` starts (`latest`: ends), all in one round of list-offsets
    /// requests (one per partition leader): a fresh assignment of a thousand partitions asks
    /// once, not a thousand times, each behind the fetch the broker is holding.
    fn log_starts(
        &self,
        partitions: &[InputPartition],
        latest: bool,
        timeout: Duration,
    ) -> Result<BTreeMap<InputPartition, i64>, TaskError>;
    /// Commits offsets to the group (at-least-once). An asynchronous commit's result would come
    /// through the commit callback, which rust-rdkafka 0.39 never calls for one
    /// (fede1024/rust-rdkafka#856): the last commit is confirmed from [`committed`](Self::committed).
    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()>;
    /// The member's group metadata, for a transaction's offsets (exactly-once).
    fn group_metadata(&self) -> Option<ConsumerGroupMetadata>;
}

fn list(partitions: &[InputPartition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(&p.topic, p.partition);
    }
    tpl
}

/// The first partition of a call that concerns several, for its error.
fn first(partitions: &[InputPartition]) -> (String, i32) {
    partitions
        .first()
        .map_or((String::new(), -1), |p| (p.topic.clone(), p.partition))
}

fn input_error(
    operation: &'static str,
    partitions: &[InputPartition],
    source: rdkafka::error::KafkaError,
) -> TaskError {
    let (topic, partition) = first(partitions);
    TaskError::Input {
        operation,
        topic,
        partition,
        source: Box::new(source),
    }
}

impl<C: ConsumerContext> Input for rdkafka::consumer::BaseConsumer<C> {
    fn pause(&self, partitions: &[InputPartition]) -> Result<(), TaskError> {
        if partitions.is_empty() {
            return Ok(());
        }
        Consumer::pause(self, &list(partitions)).map_err(|e| input_error("pause", partitions, e))
    }

    fn resume(&self, partitions: &[InputPartition]) -> Result<(), TaskError> {
        if partitions.is_empty() {
            return Ok(());
        }
        Consumer::resume(self, &list(partitions)).map_err(|e| input_error("resume", partitions, e))
    }

    fn seek(
        &self,
        partition: &InputPartition,
        offset: i64,
        timeout: Duration,
    ) -> Result<(), TaskError> {
        // Through `seek_partitions`, whose answer keeps librdkafka's error code per partition
        // (rust-rdkafka's `seek` turns it into text): a seek refused while a rebalance is under
        // way must be told from one that cannot work.
        let error = |e| input_error("seek", std::slice::from_ref(partition), e);
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(
            &partition.topic,
            partition.partition,
            Offset::Offset(offset),
        )
        .map_err(error)?;
        let sought = Consumer::seek_partitions(self, list, timeout).map_err(error)?;
        sought
            .elements()
            .iter()
            .try_for_each(|e| e.error())
            .map_err(error)
    }

    fn committed(
        &self,
        partitions: &[InputPartition],
        timeout: Duration,
    ) -> Result<BTreeMap<InputPartition, i64>, TaskError> {
        if partitions.is_empty() {
            return Ok(BTreeMap::new());
        }
        // A group coordinator that moves (its broker restarting) answers with errors that
        // pass: asked again within the timeout.
        let committed = kstate_kafka::retry_in_motion(timeout, |left| {
            self.committed_offsets(list(partitions), left)
        })
        .map_err(|e| input_error("fetch the committed offsets", partitions, e))?;
        let mut offsets = BTreeMap::new();
        for element in committed.elements() {
            if let Offset::Offset(offset) = element.offset() {
                offsets.insert(
                    InputPartition::new(element.topic(), element.partition()),
                    offset,
                );
            }
        }
        Ok(offsets)
    }

    fn log_starts(
        &self,
        partitions: &[InputPartition],
        latest: bool,
        timeout: Duration,
    ) -> Result<BTreeMap<InputPartition, i64>, TaskError> {
        if partitions.is_empty() {
            return Ok(BTreeMap::new());
        }
        // ListOffsets' own timestamps: -2 the earliest offset, -1 the latest.
        let at = if latest {
            Offset::End
        } else {
            Offset::Beginning
        };
        let mut query = TopicPartitionList::new();
        for p in partitions {
            query
                .add_partition_offset(&p.topic, p.partition, at)
                .map_err(|e| input_error("ask where the inputs start", partitions, e))?;
        }
        // A partition without a leader for a moment (a broker restarting) is asked again
        // within the timeout, whether the whole request or one partition's answer says so.
        let found = kstate_kafka::retry_in_motion(timeout, |left| {
            let found = self.offsets_for_times(query.clone(), left)?;
            for element in found.elements() {
                if let Err(e) = element.error()
                    && kstate_kafka::error_in_motion(&e)
                {
                    return Err(e);
                }
            }
            Ok(found)
        })
        .map_err(|e| input_error("ask where the inputs start", partitions, e))?;
        let mut starts = BTreeMap::new();
        for element in found.elements() {
            let partition = InputPartition::new(element.topic(), element.partition());
            if let Err(e) = element.error() {
                return Err(input_error(
                    "ask where the input starts",
                    std::slice::from_ref(&partition),
                    e,
                ));
            }
            if let Offset::Offset(offset) = element.offset() {
                starts.insert(partition, offset);
            }
        }
        Ok(starts)
    }

    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        Consumer::commit(self, offsets, mode)
    }

    fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        Consumer::group_metadata(self)
    }
}
