//! Cells of the tables the subcommands print: times and fields of the API's JSON.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::Value;

/// `HH:MM:SS` (UTC) of unix seconds, or `-`.
pub(super) fn clock(value: &Value) -> String {
    value
        .as_f64()
        .map(|s| {
            let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs_f64(s.max(0.0)));
            // "Sun, 22 Nov 2026 06:12:03 GMT"
            date.get(17..25).unwrap_or(&date).to_owned()
        })
        .unwrap_or_else(|| "-".to_owned())
}

pub(super) fn date(value: &Value) -> String {
    value
        .as_f64()
        .map(|s| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs_f64(s.max(0.0))))
        .unwrap_or_else(|| "-".to_owned())
}

pub(super) fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn count(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// A time in unix milliseconds as an HTTP date, or `never`.
pub(super) fn millis_utc(v: &Value) -> String {
    v.as_i64().map_or_else(
        || "never".to_owned(),
        |ms| httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)),
    )
}
