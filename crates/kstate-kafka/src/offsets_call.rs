//! `send_offsets_to_transaction` on a thread of its own, waited for with a deadline.
//!
//! librdkafka (2.12) can block in `rd_kafka_send_offsets_to_transaction` past its timeout, for
//! good: its coordinator request never checks its own timeout (confluentinc/librdkafka#5456),
//! and when the group coordinator's broker has left the cluster's metadata (stopped or killed,
//! as in a rolling restart) the request waits for a state change of a broker thread that no
//! longer exists (#5511). Seen on a three-node cluster: a worker stuck for minutes in the call,
//! and its group's rebalance held with it. So the call runs on a helper thread, one per
//! transactional producer, and a commit that hears nothing back within its deadline and a grace
//! gives the producer up ([`OffsetsCall::Stuck`]): the task runtime drops its tasks, makes a new
//! producer with the same transactional id (which fences the stuck one) and rejoins. The stuck
//! thread keeps the old producer alive until librdkafka returns.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kstate_core::sync::lock;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};

/// How much longer than the timeout it was given the call may take before it counts as stuck.
const GRACE: Duration = Duration::from_secs(5);

/// The offsets of a commit and the group they belong to.
pub(crate) type GroupOffsets = Arc<(TopicPartitionList, ConsumerGroupMetadata)>;

struct Request {
    offsets: GroupOffsets,
    timeout: Duration,
    reply: SyncSender<Result<(), KafkaError>>,
}

/// What became of a call.
pub(crate) enum OffsetsCall {
    /// librdkafka returned.
    Returned(Result<(), KafkaError>),
    /// It did not return within its timeout and the grace: the producer cannot be used again.
    Stuck(Duration),
    /// The helper thread could not be started.
    NoThread(std::io::Error),
}

/// The helper thread of one transactional producer, started on first use.
#[derive(Default)]
pub(crate) struct OffsetsCaller {
    state: Mutex<CallerState>,
}

impl std::fmt::Debug for OffsetsCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*lock(&self.state) {
            CallerState::NotStarted => "not started",
            CallerState::Ready(_) => "ready",
            CallerState::Stuck => "stuck",
        };
        f.debug_struct("OffsetsCaller")
            .field("state", &state)
            .finish()
    }
}

#[derive(Default)]
enum CallerState {
    #[default]
    NotStarted,
    Ready(Sender<Request>),
    /// A call never returned; its thread is still inside librdkafka.
    Stuck,
}

impl OffsetsCaller {
    /// Adds `offsets` to `producer`'s open transaction, waiting at most `timeout` and the grace.
    pub(crate) fn call<C: ProducerContext + 'static>(
        &self,
        producer: &Arc<ThreadedProducer<C>>,
        offsets: &GroupOffsets,
        timeout: Duration,
    ) -> OffsetsCall {
        let waited = timeout + GRACE;
        let (reply, answer) = mpsc::sync_channel(1);
        let request = Request {
            offsets: offsets.clone(),
            timeout,
            reply,
        };
        {
            let mut state = lock(&self.state);
            if matches!(*state, CallerState::NotStarted) {
                match start(producer.clone()) {
                    Ok(sender) => *state = CallerState::Ready(sender),
                    Err(e) => return OffsetsCall::NoThread(e),
                }
            }
            match &*state {
                CallerState::Ready(sender) if sender.send(request).is_ok() => {}
                _ => return OffsetsCall::Stuck(Duration::ZERO),
            }
        }
        match answer.recv_timeout(waited) {
            Ok(result) => OffsetsCall::Returned(result),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                *lock(&self.state) = CallerState::Stuck;
                OffsetsCall::Stuck(waited)
            }
        }
    }
}

/// Starts the helper thread; it ends when its sender is dropped (with the producer's
/// transaction state).
fn start<C: ProducerContext + 'static>(
    producer: Arc<ThreadedProducer<C>>,
) -> std::io::Result<Sender<Request>> {
    let (sender, requests) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("kstate-txn-offsets".into())
        .spawn(move || serve(&producer, &requests))?;
    Ok(sender)
}

fn serve<C: ProducerContext>(producer: &ThreadedProducer<C>, requests: &Receiver<Request>) {
    while let Ok(request) = requests.recv() {
        let (offsets, group) = &*request.offsets;
        let result = producer.send_offsets_to_transaction(offsets, group, request.timeout);
        // The commit may have given up waiting: nobody to tell then.
        let _ = request.reply.send(result);
    }
}
