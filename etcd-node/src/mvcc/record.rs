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
//! A row written by this release also carries two checksums (CRC-32C), checked whenever the row
//! is read: field 102, of its value (rows with a value), and field 101, last, of the key and of
//! every byte of the row before it. A flipped bit in a row, its key or its value is then an
//! error naming the key, the revision and the recovery, instead of a wrong answer. Rows without
//! them (written by a release before them) are read unchecked; a release before them skips the
//! fields. A flip in field 101's own tag leaves a row that reads as one from before checksums
//! (2 of a row's 30-odd bytes).
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
/// The row's checksum: CRC-32C of the key, then of the row's bytes before this field (last).
const ROW_CHECK_FIELD: u32 = 101;
/// The value's checksum: CRC-32C of the value's bytes (rows with a value).
const VALUE_CHECK_FIELD: u32 = 102;

/// What to say after a checksum fails.
pub(super) const RECOVERY: &str = "the key-space file is damaged (a bit flipped on the disk?): replace \
     this member (remove it, add it again with an empty data directory: it receives a snapshot \
     from the leader), or restore it from a snapshot (docs/operations.md)";

/// Where a row's value is: its `values` row (0: none), and the value's checksum when the row
/// carries one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ValueRef {
    pub number: u64,
    check: Option<u32>,
}

/// The stored form of `kv` (its key and value left out) whose value is row `number`, with its
/// sub-revision when known and its checksums.
fn encode(key: &[u8], number: u64, kv: &PbKeyValue, sub: Option<u64>) -> Vec<u8> {
    let rest = PbKeyValue {
        key: Vec::new(),
        value: Vec::new(),
        ..*kv
    };
    let mut out = Vec::with_capacity(32 + rest.encoded_len());
    encode_varint(number, &mut out);
    rest.encode(&mut out)
        .expect("a Vec grows to take what is encoded");
    if let Some(sub) = sub {
        prost::encoding::uint64::encode(SUB_FIELD, &sub, &mut out);
    }
    if number != 0 {
        let check = crc32c::crc32c(&kv.value);
        prost::encoding::fixed32::encode(VALUE_CHECK_FIELD, &check, &mut out);
    }
    let check = crc32c::crc32c_append(crc32c::crc32c(key), &out);
    prost::encoding::fixed32::encode(ROW_CHECK_FIELD, &check, &mut out);
    out
}

/// Why a row's checksums cannot be read, or fail.
#[derive(Debug, thiserror::Error)]
enum BadRow {
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
    #[error("a checksum cut short")]
    CutShort,
    #[error("the row fails its checksum; {}", RECOVERY)]
    Mismatch,
}

/// Checks the row checksum of `stored` (the row of `key`) if it has one, and returns its
/// value's checksum if it has one.
fn checks(key: &[u8], stored: &[u8]) -> Result<Option<u32>, BadRow> {
    let mut bytes = stored;
    decode_varint(&mut bytes)?;
    let mut value_check = None;
    while !bytes.is_empty() {
        let start = stored.len() - bytes.len();
        let (tag, wire_type) = prost::encoding::decode_key(&mut bytes)?;
        let fixed = wire_type == prost::encoding::WireType::ThirtyTwoBit;
        if fixed && (tag == ROW_CHECK_FIELD || tag == VALUE_CHECK_FIELD) {
            let word: [u8; 4] = bytes
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or(BadRow::CutShort)?;
            bytes = &bytes[4..];
            let check = u32::from_le_bytes(word);
            if tag == VALUE_CHECK_FIELD {
                value_check = Some(check);
                continue;
            }
            if crc32c::crc32c_append(crc32c::crc32c(key), &stored[..start]) != check {
                return Err(BadRow::Mismatch);
            }
            return Ok(value_check);
        }
        prost::encoding::skip_field(wire_type, tag, &mut bytes, Default::default())?;
    }
    Ok(value_check)
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

/// A stored row back into its `KeyValue` without the value (set to `key`), and where its value
/// is. The row's checksum is checked.
pub(super) fn decode_meta(
    key: &[u8],
    stored: &[u8],
) -> Result<(PbKeyValue, ValueRef), redb::Error> {
    let mut bytes = stored;
    let damaged = |e: &dyn std::fmt::Display| corrupted(format!("record of key {key:?}: {e}"));
    let check = checks(key, stored).map_err(|e| damaged(&e))?;
    let number = decode_varint(&mut bytes).map_err(|e| damaged(&e))?;
    let mut kv = PbKeyValue::decode(bytes).map_err(|e| damaged(&e))?;
    kv.key = key.to_vec();
    Ok((kv, ValueRef { number, check }))
}

/// A stored row back into the full `KeyValue` of `key`, its value read from `values`.
pub(super) fn decode(
    values: &impl ValuesTable,
    key: &[u8],
    stored: &[u8],
) -> Result<PbKeyValue, redb::Error> {
    let (mut kv, at) = decode_meta(key, stored)?;
    fill_value(values, &mut kv, at)?;
    Ok(kv)
}

/// Reads into `kv` (as [`decode_meta`] gave it) its value, from `values` at `at`, checked
/// against the row's checksum of it.
pub(super) fn fill_value(
    values: &impl ValuesTable,
    kv: &mut PbKeyValue,
    at: ValueRef,
) -> Result<(), redb::Error> {
    let number = at.number;
    // (a value row is never empty: a value there is already read)
    if number != 0 && kv.value.is_empty() {
        let Some(value) = values.get(number)? else {
            return Err(corrupted(format!(
                "the value of key {:?} at revision {} (row {number}) is missing",
                kv.key, kv.mod_revision
            )));
        };
        let value = value.value();
        if at.check.is_some_and(|c| c != crc32c::crc32c(value)) {
            return Err(corrupted(format!(
                "the value of key {:?} at revision {} (row {number}) fails its checksum; \
                 {RECOVERY}",
                kv.key, kv.mod_revision
            )));
        }
        kv.value = value.to_vec();
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
            .insert((key, rev), encode(key, number, kv, sub).as_slice())?
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
        let (_, at) = decode_meta(key, stored)?;
        if at.number != 0 {
            self.values.remove(at.number)?;
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
            let stored = encode(b"k", 300, &kv, sub);
            let (back, at) = decode_meta(b"k", &stored).unwrap();
            assert_eq!(at.number, 300);
            assert_eq!(at.check, Some(crc32c::crc32c(b"v")));
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
    fn every_flipped_bit_of_a_row_or_its_key_fails_its_checksum() {
        let kv = PbKeyValue {
            key: b"key".to_vec(),
            create_revision: 3,
            mod_revision: 9,
            version: 4,
            value: b"value".to_vec(),
            lease: 77,
        };
        let stored = encode(b"key", 300, &kv, Some(2));
        // (the last 6 bytes are the row checksum: its 2-byte tag, then the CRC)
        let tag = stored.len() - 6..stored.len() - 4;
        for byte in (0..stored.len()).filter(|b| !tag.contains(b)) {
            for bit in 0..8 {
                let mut flipped = stored.clone();
                flipped[byte] ^= 1 << bit;
                let err = decode_meta(b"key", &flipped);
                assert!(err.is_err(), "byte {byte} bit {bit} went unnoticed");
            }
        }
        // The previous release reads the row as it always did (the checksums are fields it
        // does not know, which protobuf skips).
        let mut bytes = stored.as_slice();
        assert_eq!(decode_varint(&mut bytes).unwrap(), 300);
        let old_reading = PbKeyValue::decode(bytes).unwrap();
        assert_eq!(
            old_reading,
            PbKeyValue {
                key: Vec::new(),
                value: Vec::new(),
                ..kv.clone()
            }
        );
        let err = decode_meta(b"kez", &stored).unwrap_err().to_string();
        assert!(
            err.contains("fails its checksum") && err.contains("replace"),
            "{err}"
        );
        // A row from before checksums is read as it is.
        let mut old = Vec::new();
        encode_varint(300, &mut old);
        PbKeyValue {
            key: Vec::new(),
            value: Vec::new(),
            ..kv.clone()
        }
        .encode(&mut old)
        .unwrap();
        assert_eq!(decode_meta(b"key", &old).unwrap().1.check, None);
    }

    #[test]
    fn a_damaged_row_is_an_error_naming_its_key() {
        let err = decode_meta(b"k", &[0xff]).unwrap_err().to_string();
        assert!(err.contains("record of key"), "{err}");
    }
}
