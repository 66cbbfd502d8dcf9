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
    /// The low and high watermarks of `partition`.
    fn watermarks(
        &self,
        partition: &InputPartition,
        timeout: Duration,
    ) -> Result<(i64, i64), TaskError>;
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
        Consumer::seek(
            self,
            &partition.topic,
            partition.partition,
            Offset::Offset(offset),
            timeout,
        )
        .map_err(|e| input_error("seek", std::slice::from_ref(partition), e))
    }

    fn committed(
        &self,
        partitions: &[InputPartition],
        timeout: Duration,
    ) -> Result<BTreeMap<InputPartition, i64>, TaskError> {
        if partitions.is_empty() {
            return Ok(BTreeMap::new());
        }
        let committed = self
            .committed_offsets(list(partitions), timeout)
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

    fn watermarks(
        &self,
        partition: &InputPartition,
        timeout: Duration,
    ) -> Result<(i64, i64), TaskError> {
        self.fetch_watermarks(&partition.topic, partition.partition, timeout)
            .map_err(|e| input_error("fetch the watermarks", std::slice::from_ref(partition), e))
    }

    fn commit(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        Consumer::commit(self, offsets, mode)
    }

    fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        Consumer::group_metadata(self)
    }
}
