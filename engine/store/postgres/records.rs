//! The attempts' records in the PostgreSQL store (table `artifacts`): what people read of
//! each attempt (its prompt, raw answer, output, feedback, a unit's stdout and stderr tails),
//! so that `logs`, `export` and the monitor show them from any machine that reaches the
//! database, whichever worker coordinated the run.
//!
//! - Keyed by `(run, path)` (`path` in the `C` collation, so that an attempt's records,
//!   `SCOPE/STAGE/attempt-N/...`, are one range of the key): a run's or an attempt's records
//!   are read without a scan, and a run's are deleted with `DELETE FROM artifacts WHERE
//!   run = $1` (retention).
//! - Written in the transaction of the executor's commit that settles what they belong to
//!   ([`write`], called by `write_all`): one statement for all the records of a commit.
//! - The text is `BYTEA`: a program's output may hold a NUL, which `TEXT` refuses.

use ::postgres::{Statement, Transaction};

use super::{PgStore, pg};
use crate::store::{ArtifactRecord, Result};

/// The statement of [`write`] (prepared once a connection, as the commit's others are).
pub(super) const INSERT: &str = "INSERT INTO artifacts (run, path, text) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) \
     ON CONFLICT (run, path) DO UPDATE SET text = EXCLUDED.text";

/// Inserts a commit's records (masked by the caller), a later record of a path replacing an
/// earlier one, in one statement (`insert`: [`INSERT`] prepared).
pub(super) fn write(
    tx: &mut Transaction<'_>,
    insert: &Statement,
    records: &[ArtifactRecord],
) -> std::result::Result<(), ::postgres::Error> {
    if records.is_empty() {
        return Ok(());
    }
    // One row a key in a statement (`ON CONFLICT DO UPDATE` refuses to touch a row twice):
    // the last record of each path.
    let mut last: std::collections::HashMap<(&str, &str), usize> =
        std::collections::HashMap::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        last.insert((r.run.as_str(), r.path.as_str()), i);
    }
    let mut keep: Vec<usize> = last.into_values().collect();
    keep.sort_unstable();
    let runs: Vec<&str> = keep.iter().map(|&i| records[i].run.as_str()).collect();
    let paths: Vec<&str> = keep.iter().map(|&i| records[i].path.as_str()).collect();
    let texts: Vec<&[u8]> = keep.iter().map(|&i| records[i].text.as_bytes()).collect();
    tx.execute(insert, &[&runs, &paths, &texts])?;
    Ok(())
}

/// The first key after every path that starts with `prefix` (`None`: no bound, for `""`).
/// In the `C` collation keys compare as bytes: the prefix with its last character's
/// successor is past all of them.
fn past(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(c) = chars.pop() {
        // The next scalar value (skipping the surrogates, which are no chars).
        let next = (u32::from(c) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

impl PgStore {
    /// [`crate::store::Store::records`]: a run's records under a path prefix, by path.
    pub(super) fn read_records(
        &self,
        run: &str,
        under: &str,
    ) -> Result<Option<Vec<(String, String)>>> {
        let (run, under) = (run.to_string(), under.to_string());
        self.call(move |c| {
            let fail = |e| pg("cannot read the attempts' records", e);
            let rows = match past(&under) {
                Some(end) => c.query(
                    "SELECT path, text FROM artifacts \
                     WHERE run = $1 AND path >= $2 AND path < $3 ORDER BY path",
                    &[&run, &under, &end],
                ),
                None => c.query(
                    "SELECT path, text FROM artifacts WHERE run = $1 ORDER BY path",
                    &[&run],
                ),
            }
            .map_err(fail)?;
            let records: Vec<(String, String)> = rows
                .iter()
                .map(|r| {
                    let text: Vec<u8> = r.get(1);
                    let path: String = r.get(0);
                    (path, String::from_utf8_lossy(&text).into_owned())
                })
                .filter(|(path, _)| path.starts_with(&under))
                .collect();
            if !records.is_empty() {
                return Ok(Some(records));
            }
            // None under the prefix: a run with records elsewhere has none there; a run
            // without any was written before the store kept them (or kept none).
            let any = c
                .query_opt("SELECT 1 FROM artifacts WHERE run = $1 LIMIT 1", &[&run])
                .map_err(fail)?
                .is_some();
            Ok(any.then_some(records))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::past;

    #[test]
    fn the_bound_past_a_prefix_is_its_last_character_s_successor() {
        assert_eq!(past("s/attempt-1/").as_deref(), Some("s/attempt-10"));
        assert_eq!(past(""), None);
        assert_eq!(past("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
        assert_eq!(past("a\u{10ffff}").as_deref(), Some("b"));
        let p = past("l#1/s/attempt-2/").unwrap_or_default();
        for inside in ["l#1/s/attempt-2/prompt.md", "l#1/s/attempt-2/\u{10ffff}"] {
            assert!(inside.as_bytes() < p.as_bytes(), "{inside}");
        }
        assert!("l#1/s/attempt-20/x".as_bytes() >= p.as_bytes());
    }
}
