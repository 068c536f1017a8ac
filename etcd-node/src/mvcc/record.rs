//! How a history row is stored (from format 3 on): the key's `KeyValue` at that revision without its
//! key and value, after the number of the `values` row holding the value.
//!
//! Values are most of the bytes and are kept in a table of their own, keyed by a sequence
//! number that only grows (`meta` `values`: the last one used). Each new value is then the
//! greatest key of its table, which redb appends to a full page instead of splitting one in
//! half; `history`, keyed by (key, revision), takes inserts all over its range and runs its
//! pages at about two thirds full, which before format 3 held the values too (the key-space
//! file was 1.7-2.4x etcd's, docs/benchmarks.md). A row with no value (a tombstone, an empty
//! value) has number 0 and no `values` row.
//!
//! A row written by this release also holds its change's place within its revision (the
//! sub-revision: a transaction's changes count up from 0 in the order it made them, a
//! delete-range's keys in key order), as field 100 after the `KeyValue`'s own fields: watch
//! events replayed from the history come in that order, as etcd's (which keys its history by
//! main and sub revision). A release before it skips the field (an unknown protobuf field);
//! rows without it (written by such a release) replay in key order within their revision.
//!
//! The logical record, `KeyValue` without its key and with its value, is what HashKV hashes
//! and what snapshot dumps carry, as formats 1 and 2 stored it: members of different formats
//! answer the same hash and read each other's snapshots.

use etcd_client::proto::PbKeyValue;
use prost::Message;
use prost::encoding::{decode_varint, encode_varint};
use redb::{ReadableTable, Table, TableDefinition};

/// Value number -> value bytes.
pub(super) const VALUES: TableDefinition<u64, &[u8]> = TableDefinition::new("values");

pub(super) trait ValuesTable: ReadableTable<u64, &'static [u8]> {}
impl<T: ReadableTable<u64, &'static [u8]>> ValuesTable for T {}

fn corrupted(what: String) -> redb::Error {
    redb::StorageError::Corrupted(what).into()
}

/// The protobuf field that holds a row's sub-revision, after the `KeyValue`'s (1-6).
const SUB_FIELD: u32 = 100;

/// The stored form of `kv` (its key and value left out) whose value is row `number`, with its
/// sub-revision when known.
fn encode(number: u64, kv: &PbKeyValue, sub: Option<u64>) -> Vec<u8> {
    let rest = PbKeyValue {
        key: Vec::new(),
        value: Vec::new(),
        ..*kv
    };
    let mut out = Vec::with_capacity(20 + rest.encoded_len());
    encode_varint(number, &mut out);
    rest.encode(&mut out)
        .expect("a Vec grows to take what is encoded");
    if let Some(sub) = sub {
        prost::encoding::uint64::encode(SUB_FIELD, &sub, &mut out);
    }
    out
}

/// The sub-revision a stored row holds (None: written by a release before them, or restored
/// from a source without them).
pub(super) fn sub_revision(stored: &[u8]) -> Option<u64> {
    let mut bytes = stored;
    decode_varint(&mut bytes).ok()?;
    while !bytes.is_empty() {
        let (tag, wire_type) = prost::encoding::decode_key(&mut bytes).ok()?;
        if tag == SUB_FIELD && wire_type == prost::encoding::WireType::Varint {
            return decode_varint(&mut bytes).ok();
        }
        prost::encoding::skip_field(wire_type, tag, &mut bytes, Default::default()).ok()?;
    }
    None
}

/// A stored row back into its `KeyValue` without the value (set to `key`), and the number of
/// the row holding the value (0: none).
pub(super) fn decode_meta(key: &[u8], stored: &[u8]) -> Result<(PbKeyValue, u64), redb::Error> {
    let mut bytes = stored;
    let damaged = |e: &dyn std::fmt::Display| corrupted(format!("record of key {key:?}: {e}"));
    let number = decode_varint(&mut bytes).map_err(|e| damaged(&e))?;
    let mut kv = PbKeyValue::decode(bytes).map_err(|e| damaged(&e))?;
    kv.key = key.to_vec();
    Ok((kv, number))
}

/// A stored row back into the full `KeyValue` of `key`, its value read from `values`.
pub(super) fn decode(
    values: &impl ValuesTable,
    key: &[u8],
    stored: &[u8],
) -> Result<PbKeyValue, redb::Error> {
    let (mut kv, number) = decode_meta(key, stored)?;
    fill_value(values, &mut kv, number)?;
    Ok(kv)
}

/// Reads into `kv` (as [`decode_meta`] gave it) its value, row `number` of `values`.
pub(super) fn fill_value(
    values: &impl ValuesTable,
    kv: &mut PbKeyValue,
    number: u64,
) -> Result<(), redb::Error> {
    // (a value row is never empty: a value there is already read)
    if number != 0 && kv.value.is_empty() {
        let Some(value) = values.get(number)? else {
            return Err(corrupted(format!(
                "the value of key {:?} at revision {} (row {number}) is missing",
                kv.key, kv.mod_revision
            )));
        };
        kv.value = value.value().to_vec();
    }
    Ok(())
}

/// The logical record of a stored row: its `KeyValue` without the key, with the value.
pub(super) fn logical(
    values: &impl ValuesTable,
    key: &[u8],
    stored: &[u8],
) -> Result<Vec<u8>, redb::Error> {
    let mut kv = decode(values, key, stored)?;
    kv.key.clear();
    Ok(kv.encode_to_vec())
}

/// Is the stored row a tombstone (version 0)?
pub(super) fn is_tombstone(key: &[u8], stored: &[u8]) -> Result<bool, redb::Error> {
    Ok(decode_meta(key, stored)?.0.version == 0)
}

/// The write side: `history` and `values`, and the last value number used.
pub(super) struct Rows<'t> {
    pub history: Table<'t, (&'static [u8], u64), &'static [u8]>,
    pub values: Table<'t, u64, &'static [u8]>,
    pub last: u64,
}

impl Rows<'_> {
    /// Stores `kv` (its key field ignored) as the row of `key` at `rev` (sub-revision `sub`
    /// when known), its value appended to `values`. A row already there is replaced and its
    /// value removed.
    pub fn put(
        &mut self,
        key: &[u8],
        (rev, sub): (u64, Option<u64>),
        kv: &PbKeyValue,
    ) -> Result<(), redb::Error> {
        let number = if kv.value.is_empty() {
            0
        } else {
            self.last += 1;
            self.values.insert(self.last, kv.value.as_slice())?;
            self.last
        };
        let replaced = self
            .history
            .insert((key, rev), encode(number, kv, sub).as_slice())?
            .map(|old| old.value().to_vec());
        if let Some(old) = replaced {
            self.forget_value(key, &old)?;
        }
        Ok(())
    }

    /// Removes the row of `key` at `rev` and its value.
    pub fn remove(&mut self, key: &[u8], rev: u64) -> Result<(), redb::Error> {
        let removed = self
            .history
            .remove((key, rev))?
            .map(|old| old.value().to_vec());
        if let Some(old) = removed {
            self.forget_value(key, &old)?;
        }
        Ok(())
    }

    fn forget_value(&mut self, key: &[u8], stored: &[u8]) -> Result<(), redb::Error> {
        let (_, number) = decode_meta(key, stored)?;
        if number != 0 {
            self.values.remove(number)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_row_keeps_everything_but_key_and_value() {
        let kv = PbKeyValue {
            key: b"k".to_vec(),
            create_revision: 3,
            mod_revision: 9,
            version: 4,
            value: b"v".to_vec(),
            lease: 77,
        };
        for sub in [None, Some(0), Some(5)] {
            let stored = encode(300, &kv, sub);
            let (back, number) = decode_meta(b"k", &stored).unwrap();
            assert_eq!(number, 300);
            assert_eq!(
                back,
                PbKeyValue {
                    value: Vec::new(),
                    ..kv.clone()
                }
            );
            assert_eq!(sub_revision(&stored), sub);
        }
    }

    #[test]
    fn a_damaged_row_is_an_error_naming_its_key() {
        let err = decode_meta(b"k", &[0xff]).unwrap_err().to_string();
        assert!(err.contains("record of key"), "{err}");
    }
}
