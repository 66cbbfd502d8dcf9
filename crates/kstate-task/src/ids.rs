//! The names everything else in the crate uses: a task, an input record, a timer. Nothing here
//! depends on the rest of the crate.

/// A task: partition *p* of every input topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    /// The input partition.
    pub partition: i32,
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {}", self.partition)
    }
}

/// One input record.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The input topic.
    pub topic: &'a str,
    /// Its partition (the task's).
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp in milliseconds since the epoch, if it has one.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value (`None`: a tombstone).
    pub value: Option<&'a [u8]>,
}

/// A timer's identity, from [`Context::schedule`](crate::Context::schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerId(pub(crate) u64);

impl std::fmt::Display for TimerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "timer {}", self.0)
    }
}

/// One partition of one input topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct InputPartition {
    pub(crate) topic: String,
    pub(crate) partition: i32,
}

impl InputPartition {
    pub(crate) fn new(topic: impl Into<String>, partition: i32) -> Self {
        InputPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl std::fmt::Display for InputPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}
