//! How keys and values are shown and typed: raw bytes as hex or UTF-8, keys as the typed layer's
//! order-preserving integers, values as JSON text or decoded with the typed layer's default codec
//! (bincode).

use anyhow::{Context, Result, bail};
use kstate_core::{Bincode, Codec, OrderedKey};
use serde_json::Value;

/// How keys are shown, and how `--prefix`, `--from` and `--to` are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KeyFormat {
    /// Hexadecimal bytes.
    Hex,
    /// UTF-8 text (shown as hex when a key is not UTF-8).
    Utf8,
    /// An unsigned 64-bit integer as the typed layer orders it (8 bytes, big-endian).
    U64,
    /// A signed 64-bit integer as the typed layer orders it (8 bytes, sign bit flipped).
    I64,
}

/// How values are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ValueFormat {
    /// Hexadecimal bytes.
    Hex,
    /// UTF-8 text (shown as hex when a value is not UTF-8).
    Utf8,
    /// JSON text, shown as JSON (shown as hex when a value is not JSON).
    Json,
    /// An unsigned integer encoded by the typed layer's default codec (bincode), e.g. counts.
    BincodeU64,
    /// A signed integer encoded by bincode.
    BincodeI64,
    /// A string encoded by bincode.
    BincodeString,
}

/// Parses `text` given in `format` into key bytes.
pub(crate) fn parse_key(text: &str, format: KeyFormat) -> Result<Vec<u8>> {
    Ok(match format {
        KeyFormat::Hex => parse_hex(text)?,
        KeyFormat::Utf8 => text.as_bytes().to_vec(),
        KeyFormat::U64 => encode_key(
            &text
                .parse::<u64>()
                .with_context(|| format!("{text:?} is not a u64"))?,
        ),
        KeyFormat::I64 => encode_key(
            &text
                .parse::<i64>()
                .with_context(|| format!("{text:?} is not an i64"))?,
        ),
    })
}

fn encode_key<K: OrderedKey>(key: &K) -> Vec<u8> {
    let mut out = Vec::new();
    key.encode_key(&mut out);
    out
}

fn parse_hex(text: &str) -> Result<Vec<u8>> {
    let text = text.strip_prefix("0x").unwrap_or(text);
    if !text.len().is_multiple_of(2) {
        bail!("{text:?} is not hex: an odd number of digits");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&text[i..i + 2], 16).with_context(|| format!("{text:?} is not hex"))
        })
        .collect()
}

/// `bytes` as hex, whole, with the `0x` that tells it from text.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 + 2 * bytes.len());
    out.push_str("0x");
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A key as text in `format` (hex, with `0x`, where it does not fit the format).
pub(crate) fn show_key(bytes: &[u8], format: KeyFormat) -> String {
    let shown = match format {
        KeyFormat::Hex => None,
        KeyFormat::Utf8 => std::str::from_utf8(bytes).ok().map(str::to_string),
        KeyFormat::U64 => u64::decode_key(bytes).ok().map(|k| k.to_string()),
        KeyFormat::I64 => i64::decode_key(bytes).ok().map(|k| k.to_string()),
    };
    shown.unwrap_or_else(|| hex(bytes))
}

/// A value as JSON in `format` (a hex string, with `0x`, where it does not fit the format).
pub(crate) fn value_json(bytes: &[u8], format: ValueFormat) -> Value {
    let decoded = match format {
        ValueFormat::Hex => None,
        ValueFormat::Utf8 => std::str::from_utf8(bytes)
            .ok()
            .map(|s| Value::String(s.to_string())),
        ValueFormat::Json => serde_json::from_slice(bytes).ok(),
        ValueFormat::BincodeU64 => Codec::<u64>::decode(&Bincode, bytes).ok().map(Value::from),
        ValueFormat::BincodeI64 => Codec::<i64>::decode(&Bincode, bytes).ok().map(Value::from),
        ValueFormat::BincodeString => Codec::<String>::decode(&Bincode, bytes)
            .ok()
            .map(Value::String),
    };
    decoded.unwrap_or_else(|| Value::String(hex(bytes)))
}

/// A value as text in `format`: strings bare, everything else as JSON.
pub(crate) fn show_value(bytes: &[u8], format: ValueFormat) -> String {
    match value_json(bytes, format) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_in_a_format_show_the_same_way() -> Result<()> {
        for (text, format) in [
            ("0x00ff10", KeyFormat::Hex),
            ("user-7", KeyFormat::Utf8),
            ("42", KeyFormat::U64),
            ("-42", KeyFormat::I64),
        ] {
            let bytes = parse_key(text, format)?;
            assert_eq!(show_key(&bytes, format), text);
        }
        assert!(parse_key("0xabc", KeyFormat::Hex).is_err());
        assert!(parse_key("x", KeyFormat::U64).is_err());
        Ok(())
    }

    #[test]
    fn values_that_do_not_fit_their_format_show_as_hex() -> Result<()> {
        let mut count = Vec::new();
        Codec::<u64>::encode(&Bincode, &300, &mut count).map_err(|e| anyhow::anyhow!(e))?;
        assert_eq!(show_value(&count, ValueFormat::BincodeU64), "300");
        assert_eq!(show_value(b"{\"a\":1}", ValueFormat::Json), "{\"a\":1}");
        assert_eq!(show_value(&[0xff, 0xfe], ValueFormat::Utf8), "0xfffe");
        assert_eq!(
            show_value(b"not json", ValueFormat::Json),
            "0x6e6f74206a736f6e"
        );
        Ok(())
    }
}
