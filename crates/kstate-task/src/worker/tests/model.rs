//! Random sequences of what a worker meets (assignments, revocations, lost assignments,
//! restores that finish or fail, records, commits, aborts, a fenced producer) against a model
//! as simple as can be: the set of input partitions the group assigned. After every step the
//! worker must agree with the model and with itself:
//!
//! - its slots hold exactly the assigned input partitions;
//! - the status registry shows exactly its restoring and running tasks;
//! - a running task holds every input, and an assigned input is paused unless its task runs;
//! - no offset commit names an input partition lost (until it is assigned again), nor an
//!   offset past the records handed to the worker.
//!
//! A seek refused while the group rebalances is one of the steps: the task it starts restores
//! again instead of running on from wherever the consumer was.
//!
//! The worker's loop is played as `worker::run` plays it: a lost producer is replaced and the
//! held tasks restore again.

use proptest::prelude::*;

use super::*;
use crate::worker::health::MAX_PRODUCER_LOSSES;
use crate::worker::retries::MAX_ABORTS;

const INPUTS: [&str; 2] = ["a", "b"];
const PARTITIONS: i32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Assign(usize, i32),
    Revoke(usize, i32),
    Lose(usize, i32),
    FinishRestores,
    /// The oldest restore job not answered yet fails.
    FailRestore,
    Record(usize, i32),
    Commit,
    /// Exactly-once: the next commit aborts.
    AbortNextCommit,
    /// Exactly-once: the next commit finds the producer fenced.
    FenceNextCommit,
    /// The next seek is refused as while the group rebalances.
    RefuseNextSeek,
}

fn op() -> impl Strategy<Value = Op> {
    let input = 0..INPUTS.len();
    let partition = 0..PARTITIONS;
    prop_oneof![
        6 => (input.clone(), partition.clone()).prop_map(|(i, p)| Op::Assign(i, p)),
        2 => (input.clone(), partition.clone()).prop_map(|(i, p)| Op::Revoke(i, p)),
        1 => (input.clone(), partition.clone()).prop_map(|(i, p)| Op::Lose(i, p)),
        4 => Just(Op::FinishRestores),
        1 => Just(Op::FailRestore),
        8 => (input, partition).prop_map(|(i, p)| Op::Record(i, p)),
        3 => Just(Op::Commit),
        1 => Just(Op::AbortNextCommit),
        1 => Just(Op::FenceNextCommit),
        1 => Just(Op::RefuseNextSeek),
    ]
}

/// The model, and what the fake consumer has handed out.
#[derive(Default)]
struct Model {
    assigned: BTreeSet<InputPartition>,
    /// Lost, and not assigned again since.
    lost: BTreeSet<InputPartition>,
    /// The next offset the consumer hands out per input partition (a seek moves it).
    position: BTreeMap<InputPartition, i64>,
    /// The highest offset ever handed out per input partition.
    highest: BTreeMap<InputPartition, i64>,
    seeks_seen: usize,
    commits_seen: usize,
}

fn apply(h: &mut Harness, model: &mut Model, op: &Op, transactional: bool) {
    match *op {
        Op::Assign(i, p) => {
            let ip = ip(INPUTS[i], p);
            if model.assigned.insert(ip.clone()) {
                model.lost.remove(&ip);
                h.core.assigned(&h.input, &[ip]);
            }
        }
        Op::Revoke(i, p) | Op::Lose(i, p) => {
            let ip = ip(INPUTS[i], p);
            if model.assigned.remove(&ip) {
                let lost = matches!(op, Op::Lose(..));
                if lost {
                    model.lost.insert(ip.clone());
                }
                h.core.revoked(&h.input, &[ip], lost);
            }
        }
        Op::FinishRestores => h.finish_restores(),
        Op::FailRestore => {
            if let Ok(job) = h.jobs.try_recv() {
                let error = TaskError::Thread {
                    name: "kstate-restorer".into(),
                    message: "a restore failed".into(),
                };
                let done = Done {
                    id: job.id,
                    task: job.task,
                    result: Err(error),
                };
                h.core.restored(&h.input, vec![done]);
            }
        }
        Op::Record(i, p) => {
            let ip = ip(INPUTS[i], p);
            // The consumer hands out only what is assigned (paused or not: records fetched
            // before a pause took hold come all the same).
            if model.assigned.contains(&ip) {
                let offset = *model.position.entry(ip.clone()).or_insert(0);
                model.position.insert(ip.clone(), offset + 1);
                let highest = model.highest.entry(ip.clone()).or_insert(offset);
                *highest = (*highest).max(offset);
                h.core.record(&h.input, &record(INPUTS[i], p, offset, b"k"));
            }
        }
        Op::Commit => h.core.commit(&h.input),
        Op::AbortNextCommit if transactional => {
            let aborted = Ok(Committed::Aborted("the broker aborted it".into()));
            h.log.lock().unwrap().script.push_back(aborted);
        }
        Op::FenceNextCommit if transactional => {
            h.log.lock().unwrap().script.push_back(Err(fenced()));
        }
        Op::AbortNextCommit | Op::FenceNextCommit => {}
        Op::RefuseNextSeek => h.input.refuse_seeks.set(1),
    }
    // As the poll loop does: a lost producer is replaced, and the held tasks restore again.
    if matches!(h.core.health(), Health::ProducerLost(_)) {
        h.core.replace_producer();
        if h.core.health().is_ok() {
            h.core.restore_held(&h.input);
        }
    }
    // The consumer reads on from where the worker sought.
    let seeks = h.input.seeks.borrow();
    for (ip, offset) in &seeks[model.seeks_seen..] {
        model.position.insert(ip.clone(), *offset);
    }
    model.seeks_seen = seeks.len();
}

fn check(h: &mut Harness, model: &mut Model, step: usize) -> Result<(), TestCaseError> {
    let held: BTreeSet<InputPartition> = h.core.slots().held().into_iter().collect();
    prop_assert_eq!(
        &held,
        &model.assigned,
        "step {}: the slots hold what is assigned",
        step
    );

    let mut slots: BTreeMap<i32, TaskState> = BTreeMap::new();
    for p in 0..PARTITIONS {
        let state = match h.core.slots().get(p) {
            Some(Slot::Restoring(_)) => Some(TaskState::Restoring),
            Some(Slot::Running(_)) => Some(TaskState::Running),
            Some(Slot::Incomplete { .. }) | None => None,
        };
        if let Some(state) = state {
            slots.insert(p, state);
        }
        let running = h.running(p);
        for input in INPUTS {
            let ip = ip(input, p);
            if running {
                prop_assert!(
                    model.assigned.contains(&ip),
                    "step {}: task {} runs without {:?}",
                    step,
                    p,
                    ip
                );
            }
            if model.assigned.contains(&ip) {
                prop_assert_eq!(
                    h.input.is_paused(&ip),
                    !running,
                    "step {}: {:?} is paused exactly while its task does not run",
                    step,
                    ip
                );
            }
        }
    }
    let registry: BTreeMap<i32, TaskState> = h.states().into_iter().collect();
    prop_assert_eq!(
        &registry,
        &slots,
        "step {}: the registry shows the slots",
        step
    );

    let commits = h.input.commits.borrow();
    for (offsets, _) in &commits[model.commits_seen..] {
        for (ip, offset) in offsets {
            prop_assert!(
                !model.lost.contains(ip),
                "step {}: a commit names {:?}, lost",
                step,
                ip
            );
            let highest = model.highest.get(ip).copied().unwrap_or(-1);
            prop_assert!(
                *offset <= highest + 1,
                "step {}: {:?} committed at {} past the records handed out (up to {})",
                step,
                ip,
                offset,
                highest
            );
        }
    }
    model.commits_seen = commits.len();
    Ok(())
}

fn run(ops: &[Op], transactional: bool) -> Result<(), TestCaseError> {
    let guarantee = if transactional {
        ProcessingGuarantee::ExactlyOnce
    } else {
        ProcessingGuarantee::AtLeastOnce
    };
    let mut h = harness(&INPUTS, guarantee, ErrorPolicy::Fail);
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        apply(&mut h, &mut model, op, transactional);
        if h.core.health().is_failed() {
            // The worker stops; only what the sequence asked for may have failed it.
            let failure = h.core.finish().expect("a failure");
            let text = failure.to_string();
            let done = &ops[..=step];
            let count = |f: fn(&Op) -> bool| done.iter().filter(|o| f(o)).count();
            let explained = (text.contains("a restore failed")
                && count(|o| matches!(o, Op::FailRestore)) > 0)
                || (matches!(failure, TaskError::RetriesExhausted { .. })
                    && count(|o| matches!(o, Op::AbortNextCommit)) >= MAX_ABORTS as usize - 1)
                || (text.contains("fenced by a newer producer")
                    && count(|o| matches!(o, Op::FenceNextCommit)) >= MAX_PRODUCER_LOSSES);
            prop_assert!(explained, "step {}: the worker failed: {}", step, text);
            return Ok(());
        }
        check(&mut h, &mut model, step)?;
    }
    h.core.end(&h.input);
    prop_assert!(
        h.states().is_empty(),
        "the end leaves no task: {:?}",
        h.states()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn at_least_once_the_slots_agree_with_the_assignment_through_random_sequences(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run(&ops, false)?;
    }

    #[test]
    fn exactly_once_the_slots_agree_with_the_assignment_through_random_sequences(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        run(&ops, true)?;
    }
}
