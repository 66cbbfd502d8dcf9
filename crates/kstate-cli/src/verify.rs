//! `kstate verify`: does a store hold exactly its changelog up to its stored offset?

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use kstate_core::KeyValueStore;
use serde::Serialize;

use crate::Outcome;
use crate::changelog::KafkaArgs;
use crate::format::{KeyFormat, hex, show_key};
use crate::store_dir;

/// Folds the changelog up to the stored offset (read_committed, as restore reads) and compares it
/// with the store; prints how many keys are missing, extra and different, and the first few of
/// each. Exit 1 on any difference.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  kstate verify /var/lib/counter/counter/3/counts --bootstrap-servers broker:9092 --key-format utf8"
)]
pub(crate) struct Args {
    /// The store's directory.
    dir: PathBuf,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// How keys are shown.
    #[arg(long, value_enum, default_value = "hex")]
    key_format: KeyFormat,
    /// How many keys of each kind of difference to show.
    #[arg(long, default_value_t = 5)]
    show: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What two key-value maps disagree on.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Differences {
    /// Keys the reference has and the store lacks.
    pub(crate) missing: u64,
    /// Keys the store has and the reference lacks.
    pub(crate) extra: u64,
    /// Keys both have with different values.
    pub(crate) different: u64,
    pub(crate) first_missing: Vec<String>,
    pub(crate) first_extra: Vec<String>,
    pub(crate) first_different: Vec<Difference>,
}

/// One key with two values.
#[derive(Debug, Serialize)]
pub(crate) struct Difference {
    pub(crate) key: String,
    pub(crate) expected: String,
    pub(crate) actual: String,
}

impl Differences {
    pub(crate) fn any(&self) -> bool {
        self.missing + self.extra + self.different > 0
    }

    /// Compares two sorted streams of entries: `expected` (the reference) with `actual`.
    pub(crate) fn of(
        expected: impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>>,
        actual: impl Iterator<Item = Result<(Vec<u8>, Vec<u8>)>>,
        key_format: KeyFormat,
        show: usize,
    ) -> Result<Self> {
        let mut d = Differences::default();
        let (mut expected, mut actual) = (expected, actual);
        let mut want = expected.next().transpose()?;
        let mut got = actual.next().transpose()?;
        loop {
            match (&want, &got) {
                (None, None) => break,
                (Some((wk, wv)), Some((gk, gv))) if wk == gk => {
                    if wv != gv {
                        d.different += 1;
                        if d.first_different.len() < show {
                            d.first_different.push(Difference {
                                key: show_key(wk, key_format),
                                expected: hex(wv),
                                actual: hex(gv),
                            });
                        }
                    }
                    want = expected.next().transpose()?;
                    got = actual.next().transpose()?;
                }
                (Some((wk, _)), Some((gk, _))) if wk < gk => {
                    d.missing += 1;
                    if d.first_missing.len() < show {
                        d.first_missing.push(show_key(wk, key_format));
                    }
                    want = expected.next().transpose()?;
                }
                (Some((wk, _)), None) => {
                    d.missing += 1;
                    if d.first_missing.len() < show {
                        d.first_missing.push(show_key(wk, key_format));
                    }
                    want = expected.next().transpose()?;
                }
                (_, Some((gk, _))) => {
                    d.extra += 1;
                    if d.first_extra.len() < show {
                        d.first_extra.push(show_key(gk, key_format));
                    }
                    got = actual.next().transpose()?;
                }
            }
        }
        Ok(d)
    }

    /// Prints the counts and the first keys of each kind, with `reference` and `store` naming
    /// the two sides.
    pub(crate) fn print(&self, reference: &str, store: &str) {
        println!(
            "{} missing (in {reference}, not in {store}), {} extra (in {store}, not in {reference}), {} different",
            self.missing, self.extra, self.different
        );
        for key in &self.first_missing {
            println!("  missing    {key}");
        }
        for key in &self.first_extra {
            println!("  extra      {key}");
        }
        for d in &self.first_different {
            println!(
                "  different  {}: {reference} {}, {store} {}",
                d.key, d.expected, d.actual
            );
        }
    }
}

#[derive(Debug, Serialize)]
struct Verification<'a> {
    path: String,
    topic: &'a str,
    partition: i32,
    offset: i64,
    keys: u64,
    agrees: bool,
    #[serde(flatten)]
    differences: &'a Differences,
}

pub(crate) fn run(args: Args) -> Result<Outcome> {
    args.kafka.client()?;
    let store = store_dir::open_existing(&args.dir)?;
    let position = store_dir::position(&store, &args.dir)?;
    let folded: BTreeMap<Vec<u8>, Vec<u8>> =
        args.kafka
            .fold(&position.topic, position.partition, position.offset + 1)?;
    let keys = folded.len() as u64;
    let differences = Differences::of(
        folded.into_iter().map(Ok),
        store.all()?.map(|e| e.map_err(anyhow::Error::from)),
        args.key_format,
        args.show,
    )?;
    store.close()?;
    let changelog = format!(
        "the changelog {}/{} up to offset {}",
        position.topic, position.partition, position.offset
    );
    if args.json {
        let v = Verification {
            path: args.dir.display().to_string(),
            topic: &position.topic,
            partition: position.partition,
            offset: position.offset,
            keys,
            agrees: !differences.any(),
            differences: &differences,
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if differences.any() {
        println!("{} DIFFERS from {changelog}:", args.dir.display());
        differences.print("the changelog", "the store");
    } else {
        println!(
            "{} agrees with {changelog} ({keys} keys)",
            args.dir.display()
        );
    }
    Ok(if differences.any() {
        Outcome::Differs
    } else {
        Outcome::Done
    })
}
