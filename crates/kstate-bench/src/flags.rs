//! `--name value` command lines: a flag followed by another flag (or nothing) is a switch.

use std::collections::HashMap;
use std::str::FromStr;

use crate::BenchError;

/// Parsed `--name value` pairs.
#[derive(Debug, Default)]
pub struct Flags(HashMap<String, String>);

impl Flags {
    /// Parses `args` (without the program name and subcommand).
    pub fn parse(args: impl Iterator<Item = String>) -> Result<Self, BenchError> {
        let mut map = HashMap::new();
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--") else {
                return Err(BenchError::Flag {
                    flag: arg.clone(),
                    message: "unexpected argument (flags start with --)".into(),
                });
            };
            let value = match args.peek() {
                Some(v) if !v.starts_with("--") => args.next().unwrap_or_default(),
                _ => "true".into(),
            };
            map.insert(name.to_string(), value);
        }
        Ok(Flags(map))
    }

    /// The value of a required flag.
    pub fn get(&self, name: &str) -> Result<String, BenchError> {
        self.0.get(name).cloned().ok_or_else(|| BenchError::Flag {
            flag: name.into(),
            message: "is required".into(),
        })
    }

    /// The value of an optional flag.
    pub fn optional(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Whether a switch was given.
    pub fn switch(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// A number; `default` when the flag is absent (`None`: the flag is required). Underscores
    /// are allowed as digit separators (`4_000_000`).
    pub fn number<T: FromStr>(&self, name: &str, default: Option<T>) -> Result<T, BenchError> {
        match (self.0.get(name), default) {
            (Some(v), _) => v.replace('_', "").parse().map_err(|_| BenchError::Flag {
                flag: name.into(),
                message: format!("{v} is not a number"),
            }),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(BenchError::Flag {
                flag: name.into(),
                message: "is required".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        Flags::parse(args.iter().map(|s| s.to_string())).unwrap_or_default()
    }

    #[test]
    fn values_switches_and_numbers() {
        let f = flags(&["--rows", "4_000", "--coalesce", "--input", "in"]);
        assert_eq!(f.number::<u64>("rows", None).ok(), Some(4000));
        assert!(f.switch("coalesce"));
        assert_eq!(f.get("input").ok().as_deref(), Some("in"));
        assert_eq!(f.number::<u32>("threads", Some(1)).ok(), Some(1));
    }

    #[test]
    fn missing_and_bad_values_name_the_flag() {
        let f = flags(&["--rows", "many"]);
        let bad = f.number::<u64>("rows", None).err().map(|e| e.to_string());
        assert_eq!(bad.as_deref(), Some("--rows: many is not a number"));
        let missing = f.get("input").err().map(|e| e.to_string());
        assert_eq!(missing.as_deref(), Some("--input: is required"));
        assert!(Flags::parse(["stray".to_string()].into_iter()).is_err());
    }
}
