//! `kstate dump`: a store's entries in key order.

use std::io::Write;
use std::ops::Bound;
use std::path::PathBuf;

use anyhow::{Result, bail};
use kstate_core::{KeyRange, KeyValueStore, Order};

use crate::Outcome;
use crate::format::{KeyFormat, ValueFormat, parse_key, show_key, show_value, value_json};
use crate::store_dir;

/// Entries in key order, one per line (`key<TAB>value`), or JSON lines with --json.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  kstate dump /var/lib/counter/counter/3/counts --key-format utf8 --value-format bincode-u64 --prefix user- --limit 10"
)]
pub(crate) struct Args {
    /// The store's directory.
    dir: PathBuf,
    /// Only keys starting with this (in --key-format).
    #[arg(long, conflicts_with_all = ["from", "to"])]
    prefix: Option<String>,
    /// From this key on, inclusive (in --key-format).
    #[arg(long)]
    from: Option<String>,
    /// Up to this key, exclusive (in --key-format).
    #[arg(long)]
    to: Option<String>,
    /// At most this many entries.
    #[arg(long)]
    limit: Option<u64>,
    /// How keys are shown and --prefix/--from/--to are read.
    #[arg(long, value_enum, default_value = "hex")]
    key_format: KeyFormat,
    /// How values are shown.
    #[arg(long, value_enum, default_value = "hex")]
    value_format: ValueFormat,
    /// One JSON object per line: {"key": ..., "value": ...}.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> Result<Outcome> {
    let range = match (&args.prefix, &args.from, &args.to) {
        (Some(prefix), _, _) => KeyRange::prefix(&parse_key(prefix, args.key_format)?),
        (None, from, to) => {
            let from = from
                .as_deref()
                .map(|k| parse_key(k, args.key_format))
                .transpose()?;
            let to = to
                .as_deref()
                .map(|k| parse_key(k, args.key_format))
                .transpose()?;
            if let (Some(f), Some(t)) = (&from, &to)
                && f > t
            {
                bail!("--from is after --to: nothing to dump");
            }
            KeyRange::new(
                from.as_deref().map_or(Bound::Unbounded, Bound::Included),
                to.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
            )
        }
    };
    let store = store_dir::open_existing(&args.dir)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let entries = store
        .scan(&range, Order::Forward)?
        .take(args.limit.map_or(usize::MAX, |n| n as usize));
    for entry in entries {
        let (key, value) = entry?;
        let written = if args.json {
            let line = serde_json::json!({
                "key": show_key(&key, args.key_format),
                "value": value_json(&value, args.value_format),
            });
            writeln!(out, "{line}")
        } else {
            writeln!(
                out,
                "{}\t{}",
                show_key(&key, args.key_format),
                show_value(&value, args.value_format)
            )
        };
        if let Err(e) = written {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                break; // `| head`: the reader has seen enough
            }
            return Err(e.into());
        }
    }
    if let Err(e) = out.flush()
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e.into());
    }
    drop(out);
    store.close()?;
    Ok(Outcome::Done)
}
