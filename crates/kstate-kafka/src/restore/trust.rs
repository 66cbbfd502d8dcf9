//! Whether a store's stored position can be trusted, and what to do when it cannot.
//!
//! The rules (DESIGN.md, "Restore", step 3), in the order they are asked:
//!
//! | the store holds | the changelog | plan |
//! |---|---|---|
//! | nothing | anything | replay from the low watermark (bulk) |
//! | data, no position | anything | refuse: not a changelog store ([`LostChangelog`] opts in) |
//! | a position of another topic/partition | anything | refuse ([`LostChangelog`] opts in) |
//! | a position | missing (not created: the store holds data) | refuse: lost |
//! | a position | no record, and the position is not at its end | refuse: lost ([`LostChangelog`] opts in) |
//! | a position at or past the end | has records | refuse: recreated or truncated ([`LostChangelog`] opts in) |
//! | a position below the low watermark - 1 | has records | rebuild: truncated past it |
//! | a position older than `delete.retention.ms` | records after it | rebuild: tombstones may be gone |
//! | a position | otherwise | resume right after it |
//!
//! | an unfinished reseed | anything | reseed again from the current end |
//!
//! A refusal changes nothing: when the changelog cannot continue a store, the store may be the
//! only copy of the state left (a deleted topic, a typo, the wrong cluster, a truncated log).
//! Rebuilds that the rules choose on their own are the cases where the changelog is known to hold
//! the newer truth: records deleted on purpose below the log start (`compact,delete` topics), or
//! tombstones that may be gone.

use std::path::Path;
use std::time::Duration;

use crate::config::{ChangelogConfig, LostChangelog};
use crate::error::ChangelogError;
use crate::position::ChangelogPosition;
use crate::restore::end::Watermarks;

/// What a restore does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Replay from `from` onto what the store holds.
    Resume {
        /// The first offset to read.
        from: i64,
    },
    /// Replay everything from the low watermark into an empty store; `wipe` says why the store
    /// must be wiped first, if it must.
    FromStart {
        /// Why the local contents are discarded.
        wipe: Option<String>,
    },
    /// Write the local contents into the empty changelog partition.
    Reseed {
        /// Why.
        reason: String,
    },
}

/// What the decision looks at.
pub(crate) struct Facts<'a> {
    pub(crate) path: &'a Path,
    pub(crate) config: &'a ChangelogConfig,
    pub(crate) position: Option<&'a ChangelogPosition>,
    /// The store holds at least one entry.
    pub(crate) has_data: bool,
    /// `None`: the topic does not exist (and was not created, the store holding a position).
    pub(crate) watermarks: Option<Watermarks>,
    /// The topic's `delete.retention.ms`.
    pub(crate) delete_retention: Option<Duration>,
    /// A reseed of this store began and did not finish.
    pub(crate) reseed_pending: bool,
}

/// Decides the plan, or refuses with the error that says why and what to do.
pub(crate) fn decide(facts: &Facts<'_>) -> Result<Plan, ChangelogError> {
    let Facts {
        path,
        config,
        position,
        has_data,
        watermarks,
        delete_retention,
        reseed_pending: _,
    } = *facts;
    let (topic, partition) = (config.topic.as_str(), config.partition);
    if facts.reseed_pending {
        // A reseed was interrupted: the partition holds a prefix of the local contents. Sending
        // them all again (compaction keeps the newest of each key) finishes it.
        return Ok(Plan::Reseed {
            reason: "an earlier reseed of this store did not finish".into(),
        });
    }
    let Some(p) = position else {
        if !has_data {
            return Ok(Plan::FromStart { wipe: None });
        }
        return opt_in(
            facts,
            ChangelogError::NotAChangelogStore {
                path: path.to_path_buf(),
                topic: topic.to_string(),
            },
            "the store has data but no changelog position".into(),
        );
    };
    if p.topic != topic || p.partition != partition {
        return opt_in(
            facts,
            ChangelogError::PositionMismatch {
                path: path.to_path_buf(),
                stored_topic: p.topic.clone(),
                stored_partition: p.partition,
                topic: topic.to_string(),
                partition,
            },
            format!(
                "the store holds changelog {}/{}, not {topic}/{partition}",
                p.topic, p.partition
            ),
        );
    }
    let Some(watermarks) = watermarks else {
        return Err(topic_missing(path, facts.config, p.offset));
    };
    let Watermarks { low, high } = watermarks;
    if watermarks.is_empty() && p.offset + 1 != high {
        let found = if high == 0 {
            "is empty (was the topic deleted and created again?)".to_string()
        } else {
            format!("holds no record: every offset below {high} was deleted")
        };
        return opt_in(
            facts,
            ChangelogError::ChangelogLost {
                path: path.to_path_buf(),
                topic: topic.to_string(),
                partition,
                stored_offset: p.offset,
                found: found.clone(),
            },
            format!("the changelog {found}"),
        );
    }
    if p.offset >= high {
        // Recreated and written again, or truncated by the broker (an unclean leader election):
        // either way the local store holds records the changelog no longer has.
        let found = format!(
            "ends at offset {high}, before the stored offset (was the topic deleted and \
             recreated, or truncated by the broker?)"
        );
        return opt_in(
            facts,
            ChangelogError::ChangelogLost {
                path: path.to_path_buf(),
                topic: topic.to_string(),
                partition,
                stored_offset: p.offset,
                found: found.clone(),
            },
            format!("the changelog {found}"),
        );
    }
    if p.offset + 1 < low {
        return Ok(Plan::FromStart {
            wipe: Some(format!(
                "the log starts at {low}, after the stored offset {} + 1: records were deleted \
                 before they were restored",
                p.offset
            )),
        });
    }
    if let (Some(age), Some(retention)) = (p.age(), delete_retention)
        && p.offset + 1 < high
        && age > retention
    {
        return Ok(Plan::FromStart {
            wipe: Some(format!(
                "the stored position is {age:.0?} old, older than the topic's \
                 delete.retention.ms ({retention:?}): compaction may have removed tombstones \
                 written after it"
            )),
        });
    }
    Ok(Plan::Resume { from: p.offset + 1 })
}

/// The refusal of a store whose changelog topic does not exist (and was not created, since the
/// store holds a position).
pub(crate) fn topic_missing(
    path: &Path,
    config: &ChangelogConfig,
    stored_offset: i64,
) -> ChangelogError {
    ChangelogError::ChangelogLost {
        path: path.to_path_buf(),
        topic: config.topic.clone(),
        partition: config.partition,
        stored_offset,
        found: "does not exist".into(),
    }
}

/// `refusal` unless the configuration opts in to rebuilding or reseeding.
fn opt_in(
    facts: &Facts<'_>,
    refusal: ChangelogError,
    reason: String,
) -> Result<Plan, ChangelogError> {
    match facts.config.lost_changelog {
        LostChangelog::Refuse => Err(refusal),
        LostChangelog::Rebuild => Ok(Plan::FromStart { wipe: Some(reason) }),
        LostChangelog::Reseed => match facts.watermarks {
            Some(w) if w.is_empty() => Ok(Plan::Reseed { reason }),
            Some(w) => Err(ChangelogError::InvalidConfig {
                topic: facts.config.topic.clone(),
                message: format!(
                    "LostChangelog::Reseed writes the local store into an empty changelog, but \
                     partition {} holds offsets {} to {}; {refusal}",
                    facts.config.partition,
                    w.low,
                    w.high - 1
                ),
            }),
            // A missing topic is created before the plan when an opt-in is set.
            None => Err(refusal),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn config(choice: LostChangelog) -> ChangelogConfig {
        ChangelogConfig::new("unused:9092", "t", 0).lost_changelog(choice)
    }

    fn position(topic: &str, offset: i64, age: Duration) -> ChangelogPosition {
        ChangelogPosition {
            topic: topic.into(),
            partition: 0,
            offset,
            written_at: Some(SystemTime::now() - age),
        }
    }

    fn decide_for(
        choice: LostChangelog,
        position: Option<&ChangelogPosition>,
        has_data: bool,
        (low, high): (i64, i64),
    ) -> Result<Plan, ChangelogError> {
        decide_with(
            choice,
            position,
            has_data,
            Some(Watermarks { low, high }),
            false,
        )
    }

    /// [`decide`]; `watermarks` `None`: the topic is missing.
    fn decide_with(
        choice: LostChangelog,
        position: Option<&ChangelogPosition>,
        has_data: bool,
        watermarks: Option<Watermarks>,
        reseed_pending: bool,
    ) -> Result<Plan, ChangelogError> {
        let config = config(choice);
        decide(&Facts {
            path: Path::new("/stores/t-0"),
            config: &config,
            position,
            has_data,
            watermarks,
            delete_retention: Some(Duration::from_secs(3600)),
            reseed_pending,
        })
    }

    #[test]
    fn a_fresh_store_replays_from_the_start() {
        let plan = decide_for(LostChangelog::Refuse, None, false, (5, 10));
        assert_eq!(plan.unwrap(), Plan::FromStart { wipe: None });
    }

    #[test]
    fn a_trusted_position_resumes_right_after_it() {
        let p = position("t", 6, Duration::ZERO);
        let plan = decide_for(LostChangelog::Refuse, Some(&p), true, (0, 10));
        assert_eq!(plan.unwrap(), Plan::Resume { from: 7 });
    }

    #[test]
    fn an_empty_changelog_under_a_position_is_refused_unless_opted_in() {
        let p = position("t", 6, Duration::ZERO);
        let refused = decide_for(LostChangelog::Refuse, Some(&p), true, (0, 0));
        assert!(matches!(
            refused,
            Err(ChangelogError::ChangelogLost {
                stored_offset: 6,
                ..
            })
        ));
        let rebuilt = decide_for(LostChangelog::Rebuild, Some(&p), true, (0, 0)).unwrap();
        assert!(matches!(rebuilt, Plan::FromStart { wipe: Some(_) }));
        let reseeded = decide_for(LostChangelog::Reseed, Some(&p), true, (0, 0)).unwrap();
        assert!(matches!(reseeded, Plan::Reseed { .. }));
    }

    #[test]
    fn a_position_at_the_end_of_a_log_with_nothing_left_resumes() {
        // Every record was applied, then deleted from the log: nothing is missing.
        let p = position("t", 9, Duration::ZERO);
        let plan = decide_for(LostChangelog::Refuse, Some(&p), true, (10, 10));
        assert_eq!(plan.unwrap(), Plan::Resume { from: 10 });
    }

    #[test]
    fn another_topic_is_refused_and_reseed_needs_an_empty_partition() {
        let p = position("other", 3, Duration::ZERO);
        let refused = decide_for(LostChangelog::Refuse, Some(&p), true, (0, 10));
        assert!(matches!(
            refused,
            Err(ChangelogError::PositionMismatch { .. })
        ));
        let reseed = decide_for(LostChangelog::Reseed, Some(&p), true, (0, 10));
        assert!(matches!(reseed, Err(ChangelogError::InvalidConfig { .. })));
    }

    #[test]
    fn a_missing_topic_under_a_position_is_refused_and_a_mismatch_named_first() {
        let p = position("t", 3, Duration::ZERO);
        let lost = decide_with(LostChangelog::Refuse, Some(&p), true, None, false);
        assert!(matches!(lost, Err(ChangelogError::ChangelogLost { .. })));
        let other = position("other", 3, Duration::ZERO);
        let mismatch = decide_with(LostChangelog::Refuse, Some(&other), true, None, false);
        assert!(matches!(
            mismatch,
            Err(ChangelogError::PositionMismatch { .. })
        ));
    }

    #[test]
    fn an_unfinished_reseed_is_finished_whatever_the_changelog_holds() {
        let p = position("t", 40, Duration::ZERO);
        let watermarks = Some(Watermarks { low: 0, high: 7 });
        let plan = decide_with(LostChangelog::Refuse, Some(&p), true, watermarks, true);
        assert!(matches!(plan, Ok(Plan::Reseed { .. })), "{plan:?}");
    }

    #[test]
    fn data_without_a_position_is_not_wiped() {
        let refused = decide_for(LostChangelog::Refuse, None, true, (0, 10));
        assert!(matches!(
            refused,
            Err(ChangelogError::NotAChangelogStore { .. })
        ));
    }

    #[test]
    fn an_old_position_rebuilds_only_when_records_follow_it() {
        let old = position("t", 6, Duration::from_secs(7200));
        let plan = decide_for(LostChangelog::Refuse, Some(&old), true, (0, 10)).unwrap();
        assert!(
            matches!(plan, Plan::FromStart { wipe: Some(r) } if r.contains("delete.retention.ms"))
        );
        let at_end = decide_for(LostChangelog::Refuse, Some(&old), true, (0, 7)).unwrap();
        assert_eq!(at_end, Plan::Resume { from: 7 });
    }

    #[test]
    fn a_truncated_log_rebuilds_and_a_recreated_one_is_refused() {
        let p = position("t", 6, Duration::ZERO);
        let truncated = decide_for(LostChangelog::Refuse, Some(&p), true, (20, 30)).unwrap();
        assert!(matches!(truncated, Plan::FromStart { wipe: Some(r) } if r.contains("deleted")));
        let recreated = decide_for(LostChangelog::Refuse, Some(&p), true, (0, 3));
        assert!(matches!(
            recreated,
            Err(ChangelogError::ChangelogLost { .. })
        ));
        let rebuilt = decide_for(LostChangelog::Rebuild, Some(&p), true, (0, 3)).unwrap();
        assert!(matches!(rebuilt, Plan::FromStart { wipe: Some(r) } if r.contains("recreated")));
    }
}
