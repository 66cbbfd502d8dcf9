//! [`Durability`]: when a write counts as safe, chosen per store and switchable at runtime.
//!
//! The three answers to the trade-off the project's seeds measured:
//!
//! | mode | a put returns | a crash can lose | seed |
//! |---|---|---|---|
//! | `async` | at once; safe once the caller's `commit()` returns | writes the broker had not acknowledged | SAMZA-543: the changelog, not the WAL, is the durability |
//! | `group:<dur>` | at once; the store commits itself at least every `<dur>` (default 10ms) | about the last `<dur>` of writes | group commit (ScoriaDB) |
//! | `sync` | after the broker acknowledged it (acks=all); concurrent writers share round trips | nothing acknowledged | Redis `WAIT` |
//!
//! Parsed from text for config files and command lines. Invalid text is an error that lists the
//! accepted forms, and a store's mode is left as it was (Pika answers `config set disablewal
//! asdfs` with `ERR Invalid parameter` and keeps its setting).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The shortest `group` interval accepted from text.
pub const MIN_GROUP_INTERVAL: Duration = Duration::from_micros(100);

/// The default interval of `group` mode.
pub const DEFAULT_GROUP_INTERVAL: Duration = Duration::from_millis(10);

/// When a write counts as safe. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Writes are sent at once; the caller commits.
    Async,
    /// The store commits itself at least this often.
    Group(Duration),
    /// Each write returns once the broker acknowledged it.
    Sync,
}

impl Default for Durability {
    fn default() -> Self {
        Durability::Group(DEFAULT_GROUP_INTERVAL)
    }
}

/// Text that is not a durability mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid durability mode {text:?}: {problem}; accepted: \"async\", \"sync\", \"group\" \
     (every 10ms) or \"group:<duration>\" with a duration of at least 100us in us, ms, s or m, e.g. \"group:10ms\""
)]
pub struct ParseDurabilityError {
    /// The text given.
    pub text: String,
    /// What was wrong with it.
    pub problem: &'static str,
}

impl FromStr for Durability {
    type Err = ParseDurabilityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |problem| ParseDurabilityError {
            text: text.to_string(),
            problem,
        };
        match text {
            "async" => Ok(Durability::Async),
            "sync" => Ok(Durability::Sync),
            "group" => Ok(Durability::Group(DEFAULT_GROUP_INTERVAL)),
            _ => {
                let Some(duration) = text.strip_prefix("group:") else {
                    return Err(err("unknown mode"));
                };
                parse_duration(duration).map(Durability::Group).map_err(err)
            }
        }
    }
}

fn parse_duration(text: &str) -> Result<Duration, &'static str> {
    if text.is_empty() {
        return Err("group: needs a duration");
    }
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err("the duration must start with a whole number");
    }
    let n: u64 = number.parse().map_err(|_| "the duration is too large")?;
    let duration = match unit {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or("the duration is too large")?),
        "" => return Err("the duration needs a unit"),
        _ => return Err("unknown duration unit"),
    };
    if duration.is_zero() {
        return Err("the duration must be positive");
    }
    if duration < MIN_GROUP_INTERVAL {
        return Err(
            "the duration must be at least 100us (shorter intervals only spin the commit thread)",
        );
    }
    Ok(duration)
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Durability::Async => f.write_str("async"),
            Durability::Sync => f.write_str("sync"),
            Durability::Group(d) if d.subsec_nanos() % 1_000_000 == 0 => {
                write!(f, "group:{}ms", d.as_millis())
            }
            Durability::Group(d) if d.subsec_nanos() % 1_000 == 0 => {
                write!(f, "group:{}us", d.as_micros())
            }
            Durability::Group(d) => write!(f, "group:{}ns", d.as_nanos()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms_parse_and_print_back() {
        for (text, mode) in [
            ("async", Durability::Async),
            ("sync", Durability::Sync),
            ("group", Durability::Group(Duration::from_millis(10))),
            ("group:10ms", Durability::Group(Duration::from_millis(10))),
            ("group:250us", Durability::Group(Duration::from_micros(250))),
            ("group:2s", Durability::Group(Duration::from_secs(2))),
            ("group:1m", Durability::Group(Duration::from_secs(60))),
        ] {
            assert_eq!(text.parse::<Durability>(), Ok(mode), "{text}");
            assert_eq!(mode.to_string().parse::<Durability>(), Ok(mode));
        }
    }

    #[test]
    fn invalid_text_lists_the_accepted_forms() {
        for text in [
            "asdfs",
            "group:",
            "group:-5ms",
            "sync extra",
            "group:0ms",
            "group:1ns",
            "group:10",
            "group:10h",
            "",
            "ASYNC",
        ] {
            let err = text.parse::<Durability>().unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains("accepted: \"async\", \"sync\""),
                "{text}: {message}"
            );
            assert_eq!(err.text, text);
        }
    }
}
