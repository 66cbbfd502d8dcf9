//! Results for machines: one pretty-printed JSON document per run (`--json PATH`).

use std::path::Path;

use crate::BenchError;

/// Writes `value` to `path` as pretty JSON.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(value).map_err(|source| BenchError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text).map_err(|source| BenchError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// `n` units over `ms` milliseconds, per second (0 for an empty interval).
pub fn per_second(n: u64, ms: f64) -> f64 {
    if ms > 0.0 { n as f64 / (ms / 1e3) } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_names_the_path_on_failure() {
        let dir = std::env::temp_dir().join(format!("kstate-bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok();
        let file = dir.join("r.json");
        assert!(write_json(&file, &serde_json::json!({"rows": 3})).is_ok());
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(text.contains("\"rows\": 3"), "{text}");
        let missing = dir.join("no-such-dir").join("r.json");
        let err = write_json(&missing, &1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("no-such-dir"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(per_second(500, 250.0), 2000.0);
        assert_eq!(per_second(5, 0.0), 0.0);
    }
}
