//! Range: the keys of `[key, range_end)` at a revision, with etcd's limit, sort, filter and
//! count rules (etcd 3.4 `applierV3backend.Range`).

use std::cmp::Ordering;

use etcd_client::proto::{PbKeyValue, PbRangeRequest};
use redb::ReadableTable;

use super::ApiError;
use super::record::{self, ValuesTable};
use super::request::check_range;

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
pub(super) trait LiveTable: ReadableTable<&'static [u8], u64> {}
impl<T: ReadableTable<&'static [u8], u64>> LiveTable for T {}

/// The history record of a live key whose newest revision is `rev` (the `live` table says
/// which; its history row is never compacted away, so a missing one is damage).
pub(super) fn live_record<'h>(
    history: &'h impl HistoryTable,
    key: &[u8],
    rev: u64,
) -> Result<redb::AccessGuard<'h, &'static [u8]>, redb::Error> {
    match history.get((key, rev))? {
        Some(v) => Ok(v),
        None => Err(redb::StorageError::Corrupted(format!(
            "key {key:?} is live at revision {rev} but its history has no row there"
        ))
        .into()),
    }
}

/// Calls `f` with each live key of `[start, end)` at the newest revision, in key order, until
/// it returns false. `f` gets the key and its stored record.
pub(super) fn scan_current(
    live: &impl LiveTable,
    history: &impl HistoryTable,
    start: &[u8],
    end: &[u8],
    mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, redb::Error>,
) -> Result<(), redb::Error> {
    let rows = match end {
        [] => {
            if let Some(rev) = live.get(start)? {
                f(start, live_record(history, start, rev.value())?.value())?;
            }
            return Ok(());
        }
        [0] => live.range::<&[u8]>(start..)?,
        _ if end <= start => return Ok(()),
        _ => live.range::<&[u8]>(start..end)?,
    };
    for row in rows {
        let (k, rev) = row?;
        let key = k.value();
        if !f(key, live_record(history, key, rev.value())?.value())? {
            break;
        }
    }
    Ok(())
}

/// A visitor of (key, stored record) pairs; returning false stops the scan.
type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, redb::Error> + 'a;

/// Visits the row a scan of the history kept for one key, unless it is a tombstone.
fn emit(pending: Option<(Vec<u8>, Vec<u8>)>, f: &mut Visit<'_>) -> Result<bool, redb::Error> {
    match pending {
        Some((k, record)) if !record::is_tombstone(&k, &record)? => f(&k, &record),
        _ => Ok(true),
    }
}

/// As [`scan_current`] at an older revision `at`, from the history.
fn scan_history(
    history: &impl HistoryTable,
    start: &[u8],
    end: &[u8],
    at: u64,
    mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, redb::Error>,
) -> Result<(), redb::Error> {
    let Some(rows) = history_rows(history, start, end, at)? else {
        return Ok(());
    };
    // Rows come by key, then revision: the last row of a key at or below `at` is its state.
    let mut pending: Option<(Vec<u8>, Vec<u8>)> = None;
    for row in rows {
        let (k, v) = row?;
        let (key, rev) = k.value();
        if pending.as_ref().is_some_and(|(pk, _)| pk.as_slice() != key)
            && !emit(pending.take(), &mut f)?
        {
            return Ok(());
        }
        if rev <= at {
            pending = Some((key.to_vec(), v.value().to_vec()));
        }
    }
    emit(pending, &mut f)?;
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

/// Calls `f` with the live keys of `[start, end)` at revision `at` (None: the newest).
pub(super) fn scan(
    history: &impl HistoryTable,
    live: &impl LiveTable,
    start: &[u8],
    end: &[u8],
    at: Option<u64>,
    f: impl FnMut(&[u8], &[u8]) -> Result<bool, redb::Error>,
) -> Result<(), redb::Error> {
    match at {
        None => scan_current(live, history, start, end, f),
        Some(at) => scan_history(history, start, end, at, f),
    }
}

/// Serves `req` against a store whose newest revision is `revision` and compacted one
/// `compacted`.
pub(super) fn range(
    (history, values, live): (&impl HistoryTable, &impl ValuesTable, &impl LiveTable),
    revision: u64,
    compacted: u64,
    req: &PbRangeRequest,
) -> Result<Result<RangeOutput, ApiError>, redb::Error> {
    if let Err(e) = check_range(req) {
        return Ok(Err(e));
    }
    let asked = u64::try_from(req.revision).unwrap_or(0);
    if asked > revision {
        return Ok(Err(ApiError::future_rev()));
    }
    if asked != 0 && asked < compacted {
        return Ok(Err(ApiError::compacted()));
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
    scan(history, live, &req.key, &req.range_end, at, |k, record| {
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
