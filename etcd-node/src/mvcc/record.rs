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
//! From format 6 a value of at least [`COMPRESS_FROM`] bytes is stored LZ4-compressed (block
//! format) when that saves an eighth of it or more, and its row then holds the value's length
//! before compression as field 103, before the checksums; the value checksum (field 102) is of
//! the bytes stored, so damage is found before decompressing. A release of format 5 or earlier
//! would skip field 103 and read the compressed bytes as the value: it refuses a file of format
//! 6 (`meta`'s `format`) instead. Values that do not compress (random bytes) are stored as
//! they are.
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
/// The value's checksum: CRC-32C of the bytes of its `values` row (rows with a value).
const VALUE_CHECK_FIELD: u32 = 102;
/// The value's length before compression, when its `values` row holds it LZ4-compressed.
const RAW_LEN_FIELD: u32 = 103;

/// Values shorter than this are stored as they are: below it LZ4 seldom saves an eighth.
const COMPRESS_FROM: usize = 64;
/// The longest value a row may say it decompresses to (etcd's requests are far smaller): a
/// damaged length is refused before anything is allocated for it.
const RAW_LEN_MAX: u64 = 1 << 31;

/// What to say after a checksum fails.
pub(super) const RECOVERY: &str = "the key-space file is damaged (a bit flipped on the disk?): replace \
     this member (remove it, add it again with an empty data directory: it receives a snapshot \
     from the leader), or restore it from a snapshot (docs/operations.md)";

/// Where a row's value is: its `values` row (0: none), the value's checksum when the row
/// carries one, and its length before compression when the row holds it compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ValueRef {
    pub number: u64,
    check: Option<u32>,
    raw_len: Option<u64>,
}

/// A value as its `values` row holds it: compressed (with its length before) when that saves
/// an eighth or more, else as it is.
fn stored_value(value: &[u8]) -> (std::borrow::Cow<'_, [u8]>, Option<u64>) {
    if value.len() >= COMPRESS_FROM {
        let packed = lz4_flex::block::compress(value);
        if packed.len() <= value.len() - value.len() / 8 {
            return (packed.into(), Some(value.len() as u64));
        }
    }
    (value.into(), None)
}

/// The stored form of `kv` (its key and value left out) whose value is row `number`, holding
/// `value` (the row's bytes and the length before compression, for a number other than 0),
/// with its sub-revision when known and its checksums.
fn encode(
    key: &[u8],
    number: u64,
    kv: &PbKeyValue,
    sub: Option<u64>,
    value: (&[u8], Option<u64>),
) -> Vec<u8> {
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
        let (bytes, raw_len) = value;
        if let Some(raw_len) = raw_len {
            prost::encoding::uint64::encode(RAW_LEN_FIELD, &raw_len, &mut out);
        }
        let check = crc32c::crc32c(bytes);
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
/// value's checksum and its length before compression, each if it has one.
fn checks(key: &[u8], stored: &[u8]) -> Result<(Option<u32>, Option<u64>), BadRow> {
    let mut bytes = stored;
    decode_varint(&mut bytes)?;
    let (mut value_check, mut raw_len) = (None, None);
    while !bytes.is_empty() {
        let start = stored.len() - bytes.len();
        let (tag, wire_type) = prost::encoding::decode_key(&mut bytes)?;
        if tag == RAW_LEN_FIELD && wire_type == prost::encoding::WireType::Varint {
            raw_len = Some(decode_varint(&mut bytes)?);
            continue;
        }
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
            return Ok((value_check, raw_len));
        }
        prost::encoding::skip_field(wire_type, tag, &mut bytes, Default::default())?;
    }
    // (only a row with its checksum can hold a compressed value: one without is damaged)
    match raw_len {
        Some(_) => Err(BadRow::Mismatch),
        None => Ok((value_check, None)),
    }
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
    let (check, raw_len) = checks(key, stored).map_err(|e| damaged(&e))?;
    let number = decode_varint(&mut bytes).map_err(|e| damaged(&e))?;
    let mut kv = PbKeyValue::decode(bytes).map_err(|e| damaged(&e))?;
    kv.key = key.to_vec();
    Ok((
        kv,
        ValueRef {
            number,
            check,
            raw_len,
        },
    ))
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
/// against the row's checksum of it, and decompressed when stored compressed.
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
        kv.value = match at.raw_len {
            None => value.to_vec(),
            Some(len) => unpack(value, len).map_err(|e| {
                corrupted(format!(
                    "the value of key {:?} at revision {} (row {number}) cannot be \
                     decompressed ({e}); {RECOVERY}",
                    kv.key, kv.mod_revision
                ))
            })?,
        };
    }
    Ok(())
}

/// The value `packed` holds, of `len` bytes before compression.
fn unpack(packed: &[u8], len: u64) -> Result<Vec<u8>, String> {
    if len > RAW_LEN_MAX {
        return Err(format!("it says it holds {len} bytes"));
    }
    let value = lz4_flex::block::decompress(packed, len as usize).map_err(|e| e.to_string())?;
    if value.len() as u64 != len {
        return Err(format!("{} bytes where it says {len}", value.len()));
    }
    Ok(value)
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
        let (value, raw_len) = stored_value(&kv.value);
        let number = if kv.value.is_empty() {
            0
        } else {
            self.last += 1;
            self.values.insert(self.last, &*value)?;
            self.last
        };
        let row = encode(key, number, kv, sub, (&value, raw_len));
        let replaced = self
            .history
            .insert((key, rev), row.as_slice())?
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
            let stored = encode(b"k", 300, &kv, sub, (b"v", None));
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
        let stored = encode(b"key", 300, &kv, Some(2), (b"value", None));
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
    fn a_value_is_compressed_only_when_that_saves_an_eighth() {
        let text = b"the quick brown fox jumps over the lazy dog; ".repeat(4);
        let (packed, raw_len) = stored_value(&text);
        assert_eq!(raw_len, Some(text.len() as u64));
        assert!(packed.len() < text.len() * 7 / 8);
        assert_eq!(unpack(&packed, text.len() as u64).unwrap(), text);
        let mut x = 1u32;
        let noise: Vec<u8> = (0..300)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (x >> 16) as u8
            })
            .collect();
        assert_eq!(stored_value(&noise), (noise.as_slice().into(), None));
        let short = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(stored_value(short), (short.as_slice().into(), None));
        assert!(
            unpack(&packed, text.len() as u64 + 1).is_err(),
            "a wrong length"
        );
        assert!(
            unpack(&packed, RAW_LEN_MAX + 1).is_err(),
            "no allocation for a wild length"
        );
    }

    #[test]
    fn every_flipped_bit_of_a_row_holding_a_compressed_value_fails() {
        let value = b"abcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcd".to_vec();
        let kv = PbKeyValue {
            key: b"key".to_vec(),
            create_revision: 3,
            mod_revision: 9,
            version: 4,
            value: value.clone(),
            lease: 0,
        };
        let (packed, raw_len) = stored_value(&value);
        let stored = encode(b"key", 300, &kv, Some(2), (&packed, raw_len));
        let (_, at) = decode_meta(b"key", &stored).unwrap();
        assert_eq!(
            (at.raw_len, at.check),
            (raw_len, Some(crc32c::crc32c(&packed)))
        );
        let tag = stored.len() - 6..stored.len() - 4;
        for byte in (0..stored.len()).filter(|b| !tag.contains(b)) {
            for bit in 0..8 {
                let mut flipped = stored.clone();
                flipped[byte] ^= 1 << bit;
                assert!(
                    decode_meta(b"key", &flipped).is_err(),
                    "byte {byte} bit {bit} went unnoticed"
                );
            }
        }
        // A row that says its value is compressed but has no checksum is damaged.
        let bare = stored[..stored.len() - 6].to_vec();
        assert!(decode_meta(b"key", &bare).is_err());
    }

    #[test]
    fn a_damaged_row_is_an_error_naming_its_key() {
        let err = decode_meta(b"k", &[0xff]).unwrap_err().to_string();
        assert!(err.contains("record of key"), "{err}");
    }
}
