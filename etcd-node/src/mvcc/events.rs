//! Watch events: what each applied write changed (collected while applying, see
//! [`super::Mvcc::apply`]) and the same events replayed from the history for a key range and a
//! window of revisions (a watch that starts in the past, or one that fell behind).

use etcd_client::proto::{PbEvent, PbKeyValue};

use super::range::{HistoryTable, history_rows};
use super::record::{self, ValuesTable};

/// etcd's `mvccpb.Event.EventType`.
pub const PUT: i32 = 0;
pub const DELETE: i32 = 1;

/// The event of writing `kv` (a tombstone when its version is 0) over `prev` (the key's live
/// value before, if any).
pub(super) fn event(key: &[u8], kv: &PbKeyValue, prev: Option<&PbKeyValue>) -> PbEvent {
    let (kind, kv) = if kv.version == 0 {
        // etcd's delete event carries the key and the deleting revision only.
        let gone = PbKeyValue {
            key: key.to_vec(),
            mod_revision: kv.mod_revision,
            ..Default::default()
        };
        (DELETE, gone)
    } else {
        let mut kv = kv.clone();
        kv.key = key.to_vec();
        (PUT, kv)
    };
    PbEvent {
        r#type: kind,
        kv: Some(kv),
        prev_kv: prev.cloned(),
    }
}

/// The events of revisions `from..=to` on the keys of `[start, end)`, in revision order and
/// within a revision in the order the changes were made (as etcd; key order for rows that do
/// not know their sub-revision: `record`), each with the key's previous value when the history
/// still has it.
/// The caller makes sure `from` is above the compacted revision.
pub(super) fn replay(
    (history, values): (&impl HistoryTable, &impl ValuesTable),
    start: &[u8],
    end: &[u8],
    from: u64,
    to: u64,
) -> Result<Vec<PbEvent>, redb::Error> {
    let mut out = Vec::new();
    let Some(rows) = history_rows(history, start, end, to)? else {
        return Ok(Vec::new());
    };
    // The row before, without its value (read only if an event needs it) and its value's row.
    let mut prev: Option<(PbKeyValue, record::ValueRef)> = None;
    for row in rows {
        let (k, v) = row?;
        let (key, rev) = k.value();
        let (mut kv, at) = record::decode_meta(key, v.value())?;
        if (from..=to).contains(&rev) {
            let before = match prev.take() {
                Some((mut p, n)) if p.key == key && p.version != 0 => {
                    record::fill_value(values, &mut p, n)?;
                    Some(p)
                }
                _ => None,
            };
            record::fill_value(values, &mut kv, at)?;
            let sub = record::sub_revision(v.value()).unwrap_or(0);
            out.push(((rev, sub), event(key, &kv, before.as_ref())));
        }
        prev = Some((kv, at));
    }
    // (stable: rows without a sub-revision stay in key order)
    out.sort_by_key(|(at, _)| *at);
    Ok(out.into_iter().map(|(_, e)| e).collect())
}
