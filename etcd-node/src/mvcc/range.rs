//! Range: the keys of `[key, range_end)` at a revision, with etcd's limit, sort, filter and
//! count rules (etcd 3.4 `applierV3backend.Range`).

use std::cmp::Ordering;
use std::ops::Bound;

use etcd_client::proto::{PbKeyValue, PbRangeRequest};
use redb::ReadableTable;

use super::record::{self, ValuesTable};
use super::request::check_range;
use crate::errors::EtcdError;

/// The answer to a Range (the server adds the header with the store's revision).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RangeOutput {
    pub kvs: Vec<PbKeyValue>,
    pub more: bool,
    /// Keys in the range at the revision, before limit and filters.
    pub count: i64,
    /// The store's newest revision when the range was read (the response header's).
    pub revision: u64,
}

pub(super) trait HistoryTable: ReadableTable<(&'static [u8], u64), &'static [u8]> {}
impl<T: ReadableTable<(&'static [u8], u64), &'static [u8]>> HistoryTable for T {}
/// The stored row of `key`'s newest revision at or below `at`, unless it is a tombstone (or
/// there is none): the key's state at `at`.
pub(super) fn row_at(
    history: &impl HistoryTable,
    key: &[u8],
    at: u64,
) -> Result<Option<Vec<u8>>, redb::Error> {
    let newest = history
        .range::<(&[u8], u64)>((key, 0)..=(key, at))?
        .next_back();
    let Some(row) = newest else {
        return Ok(None);
    };
    let (_, v) = row?;
    Ok(if record::is_tombstone(key, v.value())? {
        None
    } else {
        Some(v.value().to_vec())
    })
}

/// Rows of one key read in order before [`scan_history`] seeks instead: past it, the key's
/// state is found from the end of its rows and the scan goes on after its last one. Keys
/// with a few rows (a compacted key space) are read in order, which costs less than two
/// seeks; a key written 100,000 times and never compacted costs two seeks, not 100,000 rows.
const ROWS_BEFORE_SEEK: usize = 16;

/// Calls `f` with each live key of `[start, end)` at revision `at` and its stored row, in key
/// order, until it returns false.
fn scan_history(
    history: &impl HistoryTable,
    start: &[u8],
    end: &[u8],
    at: u64,
    mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, redb::Error>,
) -> Result<(), redb::Error> {
    if end.is_empty() {
        // (one key: its newest row at `at`, found from the end, not after all its older ones)
        if let Some(stored) = row_at(history, start, at)? {
            f(start, &stored)?;
        }
        return Ok(());
    }
    let Some(mut rows) = history_rows(history, start, end, at)? else {
        return Ok(());
    };
    // Rows come by key, then revision: the last row of a key at or below `at` is its state,
    // visited (unless a tombstone) once the next key's rows begin. (One buffer for all.)
    let (mut key_buf, mut row_buf, mut pending) = (Vec::new(), Vec::new(), false);
    // The key whose rows are being read, and how many of them were.
    let (mut current, mut run) = (Vec::new(), 0usize);
    let mut visit = |key: &[u8], stored: &[u8]| -> Result<bool, redb::Error> {
        Ok(record::is_tombstone(key, stored)? || f(key, stored)?)
    };
    while let Some(row) = rows.next() {
        let (k, v) = row?;
        let (key, rev) = k.value();
        if pending && key_buf.as_slice() != key {
            pending = false;
            if !visit(&key_buf, &row_buf)? {
                return Ok(());
            }
        }
        if current.as_slice() != key {
            current.clear();
            current.extend_from_slice(key);
            run = 0;
        }
        run += 1;
        if rev <= at {
            if !pending {
                key_buf.clear();
                key_buf.extend_from_slice(key);
            }
            row_buf.clear();
            row_buf.extend_from_slice(v.value());
            pending = true;
        }
        if run == ROWS_BEFORE_SEEK {
            // A long history: its state from the end, then on after its last row.
            if let Some(newest) = history
                .range::<(&[u8], u64)>((current.as_slice(), 0)..=(current.as_slice(), at))?
                .next_back()
            {
                key_buf.clone_from(&current);
                row_buf.clear();
                row_buf.extend_from_slice(newest?.1.value());
                pending = true;
            }
            let after = Bound::Excluded((current.as_slice(), u64::MAX));
            rows = match end {
                [0] => history.range::<(&[u8], u64)>((after, Bound::Unbounded))?,
                _ => history.range::<(&[u8], u64)>((after, Bound::Excluded((end, 0))))?,
            };
        }
    }
    if pending {
        visit(&key_buf, &row_buf)?;
    }
    Ok(())
}

/// History rows in (key, revision) order.
pub(super) type HistoryRows<'a> = redb::Range<'a, (&'static [u8], u64), &'static [u8]>;

/// The history rows of the keys in `[start, end)` (etcd's range rules), by key then revision;
/// for a single key, only up to revision `at`. None: the range is empty.
pub(super) fn history_rows<'a, H: HistoryTable>(
    history: &'a H,
    start: &[u8],
    end: &[u8],
    at: u64,
) -> Result<Option<HistoryRows<'a>>, redb::Error> {
    Ok(Some(match end {
        [] => history.range::<(&[u8], u64)>((start, 0)..=(start, at))?,
        [0] => history.range::<(&[u8], u64)>((start, 0)..)?,
        _ if end <= start => return Ok(None),
        _ => history.range::<(&[u8], u64)>((start, 0)..(end, 0))?,
    }))
}

/// Calls `f` with the live keys of `[start, end)` at revision `at` (None: the newest) and
/// their stored rows, in key order, until it returns false. A key's rows are read in order up
/// to [`ROWS_BEFORE_SEEK`], then its state is sought from the end: the newest at or below `at`.
pub(super) fn scan(
    history: &impl HistoryTable,
    start: &[u8],
    end: &[u8],
    at: Option<u64>,
    f: impl FnMut(&[u8], &[u8]) -> Result<bool, redb::Error>,
) -> Result<(), redb::Error> {
    scan_history(history, start, end, at.unwrap_or(u64::MAX), f)
}

/// Serves `req` against a store whose newest revision is `revision` and compacted one
/// `compacted`.
pub(super) fn range(
    (history, values): (&impl HistoryTable, &impl ValuesTable),
    revision: u64,
    compacted: u64,
    req: &PbRangeRequest,
) -> Result<Result<RangeOutput, EtcdError>, redb::Error> {
    if let Err(e) = check_range(req) {
        return Ok(Err(e));
    }
    let asked = u64::try_from(req.revision).unwrap_or(0);
    if asked > revision {
        return Ok(Err(EtcdError::FUTURE_REV));
    }
    if asked != 0 && asked < compacted {
        return Ok(Err(EtcdError::COMPACTED));
    }
    let at = (asked != 0 && asked != revision).then_some(asked);
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let sorted = req.sort_order != 0 || req.sort_target != 0;
    let limit = usize::try_from(req.limit).unwrap_or(0);
    // Decode only what can be returned: everything when sorting or filtering, else limit + 1.
    let keep = if req.count_only {
        0
    } else if limit == 0 || sorted || filtered {
        usize::MAX
    } else {
        limit + 1
    };
    let mut out = RangeOutput {
        revision,
        ..Default::default()
    };
    scan(history, &req.key, &req.range_end, at, |k, record| {
        out.count += 1;
        if out.kvs.len() < keep {
            // (keys only, unless sorted by value: the values are not read)
            out.kvs.push(if req.keys_only && req.sort_target != 4 {
                record::decode_meta(k, record)?.0
            } else {
                record::decode(values, k, record)?
            });
        }
        Ok(true)
    })?;
    out.kvs.retain(|kv| {
        (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
    });
    // etcd sorts ascending by default when the target is not the key.
    let order = if req.sort_order == 0 && req.sort_target != 0 {
        1
    } else {
        req.sort_order
    };
    if order != 0 {
        let by = |a: &PbKeyValue, b: &PbKeyValue| -> Ordering {
            match req.sort_target {
                1 => a.version.cmp(&b.version),
                2 => a.create_revision.cmp(&b.create_revision),
                3 => a.mod_revision.cmp(&b.mod_revision),
                4 => a.value.cmp(&b.value),
                _ => a.key.cmp(&b.key),
            }
        };
        // Stable, as Go's sort.Sort is not: ties keep key order, which etcd's users see too
        // with small results.
        out.kvs.sort_by(|a, b| {
            let o = by(a, b);
            if order == 2 { o.reverse() } else { o }
        });
    }
    if limit > 0 && out.kvs.len() > limit {
        out.kvs.truncate(limit);
        out.more = true;
    }
    if req.keys_only {
        for kv in &mut out.kvs {
            kv.value.clear();
        }
    }
    Ok(Ok(out))
}
