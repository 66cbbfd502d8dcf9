//! librdkafka's callbacks into the worker: rebalances, offset commits, statistics. They run
//! inside `poll` on the worker's own thread, so they share the worker's state through a mutex
//! that is never contended: the loop holds it between polls, the callbacks during them.
//!
//! The rebalance callback does librdkafka's part itself (assign, or unassign, incrementally
//! under a cooperative protocol) around the worker's: a new assignment is assigned, then paused
//! and restored; a revocation commits and closes first, then unassigns. A rebalance error
//! unassigns everything, so every task is dropped as if lost. A revocation while the thread
//! unwinds from a panic (the consumer's drop runs it) is treated as lost: nothing is committed.

use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};

use crate::error::TaskError;
use crate::ids::InputPartition;
use crate::worker::core::Core;
use kstate_core::sync::lock;

pub(crate) struct WorkerContext {
    pub(crate) core: Arc<Mutex<Core>>,
}

impl ClientContext for WorkerContext {
    /// Consumer lag per task, from librdkafka's statistics (every 5 s): the `metrics` gauge
    /// `kstate_task_consumer_lag{topic, partition}`, and each running task's `lag` in
    /// [`Running::tasks`](crate::Running::tasks).
    fn stats(&self, statistics: rdkafka::Statistics) {
        let core = lock(&self.core);
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                if *partition >= 0 && p.consumer_lag >= 0 {
                    core.input_lag(topic, *partition, p.consumer_lag);
                    metrics::gauge!(
                        "kstate_task_consumer_lag",
                        "topic" => topic.clone(),
                        "partition" => partition.to_string()
                    )
                    .set(p.consumer_lag as f64);
                }
            }
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<InputPartition> {
    let mut partitions: Vec<InputPartition> = tpl
        .elements()
        .iter()
        .map(|e| InputPartition::new(e.topic(), e.partition()))
        .collect();
    partitions.sort();
    partitions.dedup();
    partitions
}

impl ConsumerContext for WorkerContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let partitions = partitions_of(tpl);
        let mut core = lock(&self.core);
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let assigned = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                match assigned {
                    Ok(()) => core.assigned(consumer, &partitions),
                    Err(source) => {
                        let worker = core.index();
                        core.fail(TaskError::Consumer {
                            worker,
                            operation: "assign",
                            inputs: format!("{partitions:?}"),
                            source: Box::new(source),
                        });
                    }
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let lost = consumer.assignment_lost() || std::thread::panicking();
                core.revoked(consumer, &partitions, lost);
                unassign(consumer, tpl, cooperative);
            }
            other => {
                let code: rdkafka::types::RDKafkaErrorCode = other.into();
                core.rebalance_error(consumer, &code);
                unassign(consumer, tpl, cooperative);
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        lock(&self.core).offsets_committed(result, offsets);
    }
}

fn unassign(consumer: &BaseConsumer<WorkerContext>, tpl: &TopicPartitionList, cooperative: bool) {
    let done = if cooperative {
        consumer.incremental_unassign(tpl)
    } else {
        consumer.unassign()
    };
    if let Err(e) = done {
        tracing::warn!(error = %e, "unassign failed");
    }
}
