//! Values to and from columns: usage as integers, enums and JSON as text.

use rusqlite::Row;

use crate::store::Usage;

/// Usage as stored: counts as SQLite integers (saturating), cost as a nullable real.
pub(super) struct UsageCols {
    pub(super) input: i64,
    pub(super) output: i64,
    pub(super) cached: i64,
    pub(super) cost: Option<f64>,
    pub(super) unreported: i64,
}

impl From<&Usage> for UsageCols {
    fn from(u: &Usage) -> Self {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        UsageCols {
            input: int(u.input_tokens),
            output: int(u.output_tokens),
            cached: int(u.cached_tokens),
            cost: u.cost_usd,
            unreported: int(u.unreported),
        }
    }
}

/// Reads usage from five columns from `first` on: the input, output and cached tokens, the
/// cost and the calls that reported none.
pub(super) fn usage_from_row(row: &Row<'_>, first: usize) -> rusqlite::Result<Usage> {
    let count = |i: usize| -> rusqlite::Result<u64> {
        Ok(u64::try_from(row.get::<_, i64>(i)?).unwrap_or(0))
    };
    Ok(Usage {
        input_tokens: count(first)?,
        output_tokens: count(first + 1)?,
        cached_tokens: count(first + 2)?,
        cost_usd: row.get(first + 3)?,
        unreported: count(first + 4)?,
    })
}

/// Reads a text column through a parser, failing on a value this build does not know.
pub(super) fn parse_col<T>(
    row: &Row<'_>,
    i: usize,
    parse: fn(&str) -> Option<T>,
) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            format!("unknown value {text:?}").into(),
        )
    })
}

/// Reads a JSON text column.
pub(super) fn json_col<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    i: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(i)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}
