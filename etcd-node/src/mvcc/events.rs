//! Watch events: what each applied write changed (collected while applying, see
//! [`super::Mvcc::apply`]) and the same events replayed from the history for a key range and a
//! window of revisions (a watch that starts in the past, or one that fell behind).

use etcd_client::proto::{PbEvent, PbKeyValue};

use super::decode_kv;
use super::range::{HistoryTable, history_rows};

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

/// The events of revisions `from..=to` on the keys of `[start, end)`, in revision order (key
/// order within a revision), each with the key's previous value when the history still has it.
/// The caller makes sure `from` is above the compacted revision.
pub(super) fn replay(
    history: &impl HistoryTable,
    start: &[u8],
    end: &[u8],
    from: u64,
    to: u64,
) -> Result<Vec<PbEvent>, redb::Error> {
    let mut out = Vec::new();
    let Some(rows) = history_rows(history, start, end, to)? else {
        return Ok(out);
    };
    let mut prev: Option<PbKeyValue> = None;
    for row in rows {
        let (k, v) = row?;
        let (key, rev) = k.value();
        let kv = decode_kv(key, v.value())?;
        let same_key = prev.as_ref().is_some_and(|p| p.key == key);
        if (from..=to).contains(&rev) {
            let before = prev.as_ref().filter(|p| same_key && p.version != 0);
            out.push(event(key, &kv, before));
        }
        prev = Some(kv);
    }
    out.sort_by_key(|e| e.kv.as_ref().map_or(0, |kv| kv.mod_revision));
    Ok(out)
}
