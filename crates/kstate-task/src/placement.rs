//! Where the group puts each task, computed instead of observed: a model of librdkafka's `range`
//! assignor ([`GroupProtocol::Eager`](crate::GroupProtocol::Eager)) for a group of static members.
//!
//! librdkafka has no pluggable assignor, so a process cannot *choose* where a task's standby
//! copy goes; but with static membership it can *predict* where the task will go. librdkafka's
//! `range` assignor orders static members by their `group.instance.id` (bytewise,
//! `rd_kafka_group_member_cmp` in `src/rdkafka_assignor.c`), and, with no racks configured, hands
//! the *i*-th member a contiguous range of task numbers: every member gets `tasks / members`, and
//! the first `tasks % members` one more (`rd_kafka_assign_ranges`; co-partitioned topics get the
//! same ranges for every input). The assignment is a pure function of the member ids and the
//! task count, so every process can compute the one the group reaches after any process fails,
//! and keep warm copies of exactly the tasks that would come to it. `tests/standby_placement.rs`
//! checks the model against librdkafka's own assignor with real consumers.
//!
//! The prediction holds for the classic protocol's eager `range` only: `cooperative-sticky` and
//! KIP-848's broker-side assignors are sticky, so their result depends on history. A process is
//! all the workers of one [`AppBuilder`](crate::AppBuilder): their instance ids are
//! `<app-id>-<instance-id>-<worker>` ([`process_of`]), and a crash takes them all at once.

use std::collections::BTreeSet;
use std::ops::Range;

use crate::ids::TaskId;

/// The tasks of a group of static members under librdkafka's `range` assignor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangePlacement {
    /// The members' `group.instance.id`s, sorted bytewise and without duplicates.
    members: Vec<String>,
    /// Tasks `0..tasks` (every input's partition count).
    tasks: i32,
}

impl RangePlacement {
    /// The placement of tasks `0..tasks` over `members` (their `group.instance.id`s, in any
    /// order; duplicates count once, as the group fences a duplicate static member).
    pub fn new<I, S>(members: I, tasks: i32) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        RangePlacement {
            members,
            tasks: tasks.max(0),
        }
    }

    /// The members, in the assignor's order.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The tasks `member` runs (empty if it is not a member, or has none).
    pub fn tasks_of(&self, member: &str) -> Range<i32> {
        match self.members.binary_search_by(|m| m.as_str().cmp(member)) {
            Ok(i) => self.range_of(i),
            Err(_) => 0..0,
        }
    }

    /// The member that runs `task` (`None`: no members, or a task past the count).
    pub fn owner(&self, task: TaskId) -> Option<&str> {
        let p = task.partition;
        if self.members.is_empty() || p < 0 || p >= self.tasks {
            return None;
        }
        let (share, extra) = self.shares();
        let wide = extra * (share + 1);
        let i = if p < wide {
            p / (share + 1)
        } else {
            extra + (p - wide) / share
        };
        Some(&self.members[i as usize])
    }

    /// The placement after every member for which `gone` holds has left.
    pub fn without(&self, gone: impl Fn(&str) -> bool) -> RangePlacement {
        RangePlacement {
            members: self.members.iter().filter(|m| !gone(m)).cloned().collect(),
            tasks: self.tasks,
        }
    }

    /// The processes of the members ([`process_of`]), sorted.
    pub fn processes(&self) -> BTreeSet<&str> {
        self.members.iter().map(|m| process_of(m)).collect()
    }

    /// The tasks `process` does not run now but would if up to `failures` other processes
    /// failed at once: where a standby copy on `process` turns a failover into a tail replay.
    /// With `failures` 1, every single failure; with 2, also every pair; and so on (each set of
    /// failed processes is one range assignment over the rest, so this enumerates
    /// `C(p-1, 1) + … + C(p-1, failures)` of them for `p` processes). A task can be here for
    /// more than one failure (a failure shifts the ranges next to the failed member's too).
    pub fn standbys_of(&self, process: &str, failures: usize) -> BTreeSet<TaskId> {
        let ours = |m: &str| process_of(m) == process;
        let now = self.tasks_of_process(ours);
        let others: Vec<&str> = self
            .processes()
            .into_iter()
            .filter(|p| *p != process)
            .collect();
        let mut standbys = BTreeSet::new();
        let mut failed: Vec<&str> = Vec::new();
        each_failure_set(&others, failures, &mut failed, &mut |failed| {
            let after = self.without(|m| failed.contains(&process_of(m)));
            standbys.extend(after.tasks_of_process(ours).difference(&now).copied());
        });
        standbys
    }

    /// Every task of the members for which `of` holds.
    fn tasks_of_process(&self, of: impl Fn(&str) -> bool) -> BTreeSet<TaskId> {
        (0..self.members.len())
            .filter(|&i| of(&self.members[i]))
            .flat_map(|i| self.range_of(i))
            .map(|partition| TaskId { partition })
            .collect()
    }

    /// Each member's share and how many members get one more.
    fn shares(&self) -> (i32, i32) {
        let n = self.members.len() as i32;
        (self.tasks / n, self.tasks % n)
    }

    /// The tasks of the `i`-th member in the assignor's order.
    fn range_of(&self, i: usize) -> Range<i32> {
        let (share, extra) = self.shares();
        let i = i as i32;
        let start = i * share + i.min(extra);
        start..start + share + i32::from(i < extra)
    }
}

/// Calls `visit` with every non-empty subset of `candidates` of at most `max` elements (each
/// once, in the candidates' order), `chosen` holding the subset.
fn each_failure_set<'a>(
    candidates: &[&'a str],
    max: usize,
    chosen: &mut Vec<&'a str>,
    visit: &mut impl FnMut(&[&'a str]),
) {
    if chosen.len() == max {
        return;
    }
    for (i, candidate) in candidates.iter().enumerate() {
        chosen.push(candidate);
        visit(chosen);
        each_failure_set(&candidates[i + 1..], max, chosen, visit);
        chosen.pop();
    }
}

/// The process a worker's `group.instance.id` belongs to: `<app-id>-<instance-id>-<worker>`
/// without its last `-<worker>` (an id without one is a process of its own).
pub fn process_of(member: &str) -> &str {
    match member.rsplit_once('-') {
        Some((process, worker))
            if !worker.is_empty() && worker.bytes().all(|b| b.is_ascii_digit()) =>
        {
            process
        }
        _ => member,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn task(partition: i32) -> TaskId {
        TaskId { partition }
    }

    #[test]
    fn ranges_follow_librdkafka_the_first_members_one_more() {
        // RangeAssignorTest: 3 consumers, 7 partitions → 0-2, 3-4, 5-6.
        let p = RangePlacement::new(["c", "a", "b"], 7);
        assert_eq!(p.members(), ["a", "b", "c"]);
        assert_eq!(p.tasks_of("a"), 0..3);
        assert_eq!(p.tasks_of("b"), 3..5);
        assert_eq!(p.tasks_of("c"), 5..7);
        assert_eq!(p.tasks_of("d"), 0..0);
        assert_eq!(p.owner(task(2)), Some("a"));
        assert_eq!(p.owner(task(3)), Some("b"));
        assert_eq!(p.owner(task(7)), None);
    }

    #[test]
    fn members_sort_bytewise_not_numerically() {
        let p = RangePlacement::new(["app-h-2", "app-h-10", "app-h-1"], 3);
        assert_eq!(p.members(), ["app-h-1", "app-h-10", "app-h-2"]);
        assert_eq!(p.owner(task(1)), Some("app-h-10"));
    }

    #[test]
    fn more_members_than_tasks_leave_the_last_idle() {
        let p = RangePlacement::new(["a", "b", "c"], 2);
        assert_eq!(p.tasks_of("a"), 0..1);
        assert_eq!(p.tasks_of("b"), 1..2);
        assert_eq!(p.tasks_of("c"), 2..2);
    }

    #[test]
    fn a_process_is_its_workers_ids_without_the_worker() {
        assert_eq!(process_of("orders-host-1-0"), "orders-host-1");
        assert_eq!(process_of("orders-host-12"), "orders-host");
        assert_eq!(process_of("orders-host-"), "orders-host-");
        assert_eq!(process_of("solo"), "solo");
    }

    #[test]
    fn a_standby_waits_where_each_failure_sends_the_task() {
        // Three processes of two workers, 12 tasks: 2 per worker.
        let members = ["x-a-0", "x-a-1", "x-b-0", "x-b-1", "x-c-0", "x-c-1"];
        let p = RangePlacement::new(members, 12);
        // a runs 0-3, b 4-7, c 8-11. Without b: a 0-5, c 6-11; without c: a 0-5, b 6-11;
        // without a: b 0-5, c 6-11. The middle process stands by for both neighbours.
        let set = |tasks: &[i32]| -> BTreeSet<TaskId> { tasks.iter().copied().map(task).collect() };
        assert_eq!(p.standbys_of("x-a", 1), set(&[4, 5]));
        assert_eq!(p.standbys_of("x-b", 1), set(&[0, 1, 2, 3, 8, 9, 10, 11]));
        assert_eq!(p.standbys_of("x-c", 1), set(&[6, 7]));
        // Two at once: whoever survives runs everything.
        let all: Vec<i32> = (0..12).collect();
        assert_eq!(p.standbys_of("x-a", 2), set(&all[4..]));
        assert_eq!(p.standbys_of("x-c", 2), set(&all[..8]));
        assert_eq!(p.standbys_of("x-b", 2), p.standbys_of("x-b", 1));
    }

    #[test]
    fn failure_sets_are_every_subset_up_to_the_bound_once() {
        let mut seen = Vec::new();
        each_failure_set(&["a", "b", "c"], 2, &mut Vec::new(), &mut |s| {
            seen.push(s.join(""))
        });
        assert_eq!(seen, ["a", "ab", "ac", "b", "bc", "c"]);
        let mut n = 0;
        each_failure_set(&["a", "b", "c", "d", "e"], 3, &mut Vec::new(), &mut |_| {
            n += 1
        });
        assert_eq!(n, 5 + 10 + 10);
    }

    proptest! {
        /// Every task has exactly one owner, ranges are contiguous in member order, and no two
        /// members' shares differ by more than one.
        #[test]
        fn ranges_cover_every_task_once(
            ids in prop::collection::btree_set("[a-c]{1,3}-[0-9]", 1..8),
            tasks in 0i32..40,
        ) {
            let p = RangePlacement::new(ids.iter().cloned(), tasks);
            let mut next = 0;
            let mut sizes = Vec::new();
            for m in p.members() {
                let r = p.tasks_of(m);
                prop_assert_eq!(r.start, next);
                for t in r.clone() {
                    prop_assert_eq!(p.owner(task(t)), Some(m.as_str()));
                }
                next = r.end;
                sizes.push(r.len());
            }
            prop_assert_eq!(next, tasks);
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(hi - lo <= 1);
        }

        /// After any `replicas` or fewer processes fail at once (one or two here), each task
        /// that lands on a surviving process and was not there before is in that process's
        /// standbys: a standby is where the task goes.
        #[test]
        fn every_moved_task_finds_its_standby(
            processes in prop::collection::btree_set("[a-e]{1,2}", 2..6),
            workers in 1usize..4,
            tasks in 1i32..40,
            replicas in 1usize..3,
        ) {
            let members: Vec<String> = processes
                .iter()
                .flat_map(|p| (0..workers).map(move |w| format!("{p}-{w}")))
                .collect();
            let placement = RangePlacement::new(members, tasks);
            let processes: Vec<&str> = processes.iter().map(String::as_str).collect();
            let mut failure_sets: Vec<Vec<&str>> = Vec::new();
            each_failure_set(&processes, replicas, &mut Vec::new(), &mut |s| {
                failure_sets.push(s.to_vec())
            });
            for failed in failure_sets.iter().filter(|f| f.len() < processes.len()) {
                let after = placement.without(|m| failed.contains(&process_of(m)));
                for t in (0..tasks).map(task) {
                    let to = process_of(after.owner(t).unwrap());
                    if process_of(placement.owner(t).unwrap()) != to {
                        prop_assert!(placement.standbys_of(to, replicas).contains(&t));
                    }
                }
            }
        }
    }
}
