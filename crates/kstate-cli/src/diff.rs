//! `kstate diff`: what two store directories disagree on (a standby against its active, a
//! backup against a restore).

use std::path::PathBuf;

use anyhow::Result;
use kstate_core::KeyValueStore;
use serde::Serialize;

use crate::Outcome;
use crate::format::KeyFormat;
use crate::store_dir;
use crate::verify::Differences;

/// Compares two stores key by key; prints how many keys only A has, only B has, and both have
/// with different values, and the first few of each. Exit 1 on any difference.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  kstate diff /var/lib/counter/counter/3/counts /standby/3/counts --key-format utf8"
)]
pub(crate) struct Args {
    /// The first store's directory (A).
    dir_a: PathBuf,
    /// The second store's directory (B).
    dir_b: PathBuf,
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

#[derive(Debug, Serialize)]
struct Comparison<'a> {
    a: String,
    b: String,
    same: bool,
    /// `missing`: only in A; `extra`: only in B.
    #[serde(flatten)]
    differences: &'a Differences,
}

pub(crate) fn run(args: Args) -> Result<Outcome> {
    let a = store_dir::open_existing(&args.dir_a)?;
    let b = store_dir::open_existing(&args.dir_b)?;
    let differences = Differences::of(
        a.all()?.map(|e| e.map_err(anyhow::Error::from)),
        b.all()?.map(|e| e.map_err(anyhow::Error::from)),
        args.key_format,
        args.show,
    )?;
    a.close()?;
    b.close()?;
    if args.json {
        let c = Comparison {
            a: args.dir_a.display().to_string(),
            b: args.dir_b.display().to_string(),
            same: !differences.any(),
            differences: &differences,
        };
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else if differences.any() {
        println!(
            "{} and {} differ:",
            args.dir_a.display(),
            args.dir_b.display()
        );
        differences.print("A", "B");
    } else {
        println!(
            "{} and {} hold the same entries",
            args.dir_a.display(),
            args.dir_b.display()
        );
    }
    Ok(if differences.any() {
        Outcome::Differs
    } else {
        Outcome::Done
    })
}
