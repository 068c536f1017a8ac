//! The small tables' rows and their checksums (from format 5 on).
//!
//! Every row of `members`, `removed`, `leases`, `lease_keys`, `alarms`, `auth` and `cluster`
//! stores its payload followed by a CRC-32C (4 bytes, little-endian) of the table's name, the
//! key's bytes (redb's encoding of the key) and the payload, and every read checks it: a
//! flipped bit in a row's key or payload is an error naming the table, the key and the
//! recovery, instead of a wrong member list, a lease that never expires or an alarm that
//! vanishes. Tables whose rows had no value (`removed`, `lease_keys`, `alarms`) now hold the
//! checksum alone; `leases` holds the TTL (8 bytes, little-endian) before it.
//!
//! `meta` keeps its type (`&str -> u64`), which the format check of every release reads
//! first; each of its rows `name` has a row `check:name` beside it, the CRC-32C of "meta", the
//! name and the value (little-endian). A value without its check, or a check without its
//! value, is damage too.
//!
//! The history rows carry checksums of their own ([`super::record`]).

use std::borrow::Borrow;
use std::cell::OnceCell;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use redb::{
    AccessGuard, Key, ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition,
    TableHandle, WriteTransaction,
};

use super::record::RECOVERY;

/// A sealed table's rows: payload, then its checksum.
pub(super) type Def<K> = TableDefinition<'static, K, &'static [u8]>;

/// The prefix of `meta`'s check rows.
const CHECK: &str = "check:";

fn check(table: &str, key: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(table.as_bytes());
    crc32c::crc32c_append(crc32c::crc32c_append(crc, key), payload)
}

fn damaged(table: &str, key: &dyn std::fmt::Debug, what: &str) -> redb::Error {
    redb::StorageError::Corrupted(format!("row {key:?} of table {table} {what}; {RECOVERY}")).into()
}

/// `payload` sealed as the row `key` (its bytes) of `table`.
fn seal(table: &str, key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 4);
    out.extend_from_slice(payload);
    out.extend_from_slice(&check(table, key, payload).to_le_bytes());
    out
}

/// The payload of row `key` of `table`, stored as `stored`, once its checksum holds.
fn unseal<K: Key + 'static>(
    table: &str,
    key: &K::SelfType<'_>,
    stored: &[u8],
) -> Result<Vec<u8>, redb::Error> {
    let Some(at) = stored.len().checked_sub(4) else {
        return Err(damaged(table, key, "is too short to hold its checksum"));
    };
    let (payload, sum) = stored.split_at(at);
    let sum = u32::from_le_bytes(sum.try_into().expect("4 bytes"));
    if check(table, K::as_bytes(key).as_ref(), payload) != sum {
        return Err(damaged(table, key, "fails its checksum"));
    }
    Ok(payload.to_vec())
}

/// A row read through [`Sealed`]: its key and its payload, checked.
pub(super) type Row<'a, K> = Result<(AccessGuard<'a, K>, Vec<u8>), redb::Error>;

/// A sealed table open for writing.
pub(super) type Writable<'t, K> = Sealed<K, Table<'t, K, &'static [u8]>>;

/// Rows taken out of a table: (the key's bytes, the payload).
type Taken = Vec<(Vec<u8>, Vec<u8>)>;

/// A table of sealed rows, through which every read is checked and every write sealed.
pub(super) struct Sealed<K, T> {
    table: T,
    name: String,
    key: PhantomData<fn() -> K>,
}

/// Opens `def` for reading.
pub(super) fn read<K: Key + 'static>(
    tx: &ReadTransaction,
    def: Def<K>,
) -> Result<Sealed<K, ReadOnlyTable<K, &'static [u8]>>, redb::Error> {
    Ok(Sealed {
        table: tx.open_table(def)?,
        name: def.name().to_string(),
        key: PhantomData,
    })
}

/// Opens `def` for writing (creating it).
pub(super) fn write<'t, K: Key + 'static>(
    tx: &'t WriteTransaction,
    def: Def<K>,
) -> Result<Writable<'t, K>, redb::Error> {
    Ok(Sealed {
        table: tx.open_table(def)?,
        name: def.name().to_string(),
        key: PhantomData,
    })
}

/// A sealed table of a write transaction, opened the first time it is used: most batches of
/// puts touch none of the small tables, and opening one (and closing it at the commit) costs
/// about 4,000 instructions, as much as a few puts' own work in `meta` (docs/benchmarks.md,
/// "Instructions per put").
pub(super) struct Lazy<'t, K: Key + 'static> {
    tx: &'t WriteTransaction,
    def: Def<K>,
    table: OnceCell<Writable<'t, K>>,
}

impl<'t, K: Key + 'static> Lazy<'t, K> {
    pub fn new(tx: &'t WriteTransaction, def: Def<K>) -> Self {
        Lazy {
            tx,
            def,
            table: OnceCell::new(),
        }
    }

    /// The table, opened if it was not yet.
    pub fn open(&self) -> Result<&Writable<'t, K>, redb::Error> {
        if let Some(table) = self.table.get() {
            return Ok(table);
        }
        let opened = write(self.tx, self.def)?;
        Ok(self.table.get_or_init(|| opened))
    }

    /// The table for writing, opened if it was not yet.
    pub fn open_mut(&mut self) -> Result<&mut Writable<'t, K>, redb::Error> {
        self.open()?;
        Ok(self
            .table
            .get_mut()
            .expect("the table was opened just above"))
    }
}

impl<K: Key + 'static, T: ReadableTable<K, &'static [u8]>> Sealed<K, T> {
    /// The payload of row `key`, checked.
    pub fn get<'k>(
        &self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<Vec<u8>>, redb::Error> {
        let key = key.borrow();
        let stored = self.table.get(key)?;
        stored
            .map(|s| unseal::<K>(&self.name, key, s.value()))
            .transpose()
    }

    /// The rows in `range`, in key order, each checked as it is read.
    pub fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<impl Iterator<Item = Row<'_, K>>, redb::Error>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let name = self.name.as_str();
        Ok(self.table.range(range)?.map(move |row| {
            let (k, v) = row?;
            let payload = unseal::<K>(name, &k.value(), v.value())?;
            Ok((k, payload))
        }))
    }

    /// Every row, in key order, each checked as it is read.
    pub fn iter(&self) -> Result<impl Iterator<Item = Row<'_, K>>, redb::Error> {
        self.range::<K::SelfType<'_>>(..)
    }

    pub fn is_empty(&self) -> Result<bool, redb::Error> {
        Ok(self.table.is_empty()?)
    }
}

impl<K: Key + 'static> Writable<'_, K> {
    /// Stores `payload` as row `key`; returns the payload it replaced, checked.
    pub fn insert<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        payload: &[u8],
    ) -> Result<Option<Vec<u8>>, redb::Error> {
        let key = key.borrow();
        let stored = seal(&self.name, K::as_bytes(key).as_ref(), payload);
        let old = self.table.insert(key, stored.as_slice())?;
        old.map(|o| unseal::<K>(&self.name, key, o.value()))
            .transpose()
    }

    /// Removes row `key`; returns its payload, checked.
    pub fn remove<'k>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<Vec<u8>>, redb::Error> {
        let key = key.borrow();
        let old = self.table.remove(key)?;
        old.map(|o| unseal::<K>(&self.name, key, o.value()))
            .transpose()
    }

    /// Removes every row.
    pub fn clear(&mut self) -> Result<(), redb::Error> {
        Ok(self.table.retain(|_, _| false)?)
    }
}

/// The `meta` check of row `name` holding `value`.
fn meta_check(name: &str, value: u64) -> u64 {
    u64::from(check("meta", name.as_bytes(), &value.to_le_bytes()))
}

/// Reads `meta` row `name`, checked (0 when unset).
pub(super) fn meta_get(
    meta: &impl ReadableTable<&'static str, u64>,
    name: &str,
) -> Result<u64, redb::Error> {
    let value = meta.get(name)?.map(|v| v.value());
    let sum = meta
        .get(format!("{CHECK}{name}").as_str())?
        .map(|v| v.value());
    match (value, sum) {
        (None, None) => Ok(0),
        (Some(v), Some(sum)) if meta_check(name, v) == sum => Ok(v),
        (Some(_), Some(_)) => Err(damaged("meta", &name, "fails its checksum")),
        (Some(_), None) => Err(damaged("meta", &name, "has lost its checksum")),
        (None, Some(_)) => Err(damaged("meta", &name, "is missing beside its checksum")),
    }
}

/// Writes `meta` row `name` with its check.
pub(super) fn meta_set(
    meta: &mut Table<'_, &'static str, u64>,
    name: &str,
    value: u64,
) -> Result<(), redb::Error> {
    meta.insert(name, value)?;
    meta.insert(format!("{CHECK}{name}").as_str(), meta_check(name, value))?;
    Ok(())
}

/// The file's format: read checked when the file says 5 or later, or has its check row (a
/// file from before has none).
pub(super) fn stored_format(
    meta: &impl ReadableTable<&'static str, u64>,
) -> Result<u64, redb::Error> {
    let raw = meta.get("format")?.map_or(0, |v| v.value());
    if raw >= 5 || meta.get(format!("{CHECK}format").as_str())?.is_some() {
        meta_get(meta, "format")
    } else {
        Ok(raw)
    }
}

/// The tables format 4 kept unsealed, with their types then.
pub(super) mod format4 {
    use redb::TableDefinition;
    pub const MEMBERS: TableDefinition<u64, &[u8]> = TableDefinition::new("members");
    pub const REMOVED: TableDefinition<u64, ()> = TableDefinition::new("removed");
    pub const LEASES: TableDefinition<i64, i64> = TableDefinition::new("leases");
    pub const LEASE_KEYS: TableDefinition<(i64, &[u8]), ()> = TableDefinition::new("lease_keys");
    pub const ALARMS: TableDefinition<(u64, i32), ()> = TableDefinition::new("alarms");
    pub const AUTH: TableDefinition<&str, &[u8]> = TableDefinition::new("auth");
    pub const CLUSTER: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster");
}

/// Takes every row of the format-4 table `old` out (deleting it), `payload` making each
/// row's payload from its value.
fn take<K: Key + 'static, V: redb::Value + 'static>(
    tx: &WriteTransaction,
    old: TableDefinition<K, V>,
    payload: impl Fn(V::SelfType<'_>) -> Vec<u8>,
) -> Result<Taken, redb::Error> {
    let mut rows = Vec::new();
    {
        let table = tx.open_table(old)?;
        for row in table.iter()? {
            let (k, v) = row?;
            rows.push((
                K::as_bytes(&k.value()).as_ref().to_vec(),
                payload(v.value()),
            ));
        }
    }
    tx.delete_table(old)?;
    Ok(rows)
}

/// Puts rows taken by [`take`] back into `new`, sealed.
fn put_back<K: Key + 'static>(
    tx: &WriteTransaction,
    new: Def<K>,
    rows: Taken,
) -> Result<(), redb::Error> {
    let mut table = write(tx, new)?;
    for (key, payload) in rows {
        let key = K::from_bytes(&key);
        table.insert(&key, &payload)?;
    }
    Ok(())
}

/// Seals what a file of format 4 or before holds, in `tx` (the upgrade to format 5).
pub(super) fn seal_all(tx: &WriteTransaction) -> Result<(), redb::Error> {
    let bytes = |v: &[u8]| v.to_vec();
    let none = |()| Vec::new();
    let members = take(tx, format4::MEMBERS, bytes)?;
    let removed = take(tx, format4::REMOVED, none)?;
    let leases = take(tx, format4::LEASES, |ttl: i64| ttl.to_le_bytes().to_vec())?;
    let lease_keys = take(tx, format4::LEASE_KEYS, none)?;
    let alarms = take(tx, format4::ALARMS, none)?;
    let auth = take(tx, format4::AUTH, bytes)?;
    let cluster = take(tx, format4::CLUSTER, bytes)?;
    put_back(tx, super::MEMBERS, members)?;
    put_back(tx, super::REMOVED, removed)?;
    put_back(tx, super::LEASES, leases)?;
    put_back(tx, super::LEASE_KEYS, lease_keys)?;
    put_back(tx, super::ALARMS, alarms)?;
    put_back(tx, super::AUTH, auth)?;
    put_back(tx, super::CLUSTER, cluster)?;
    let mut meta = tx.open_table(super::META)?;
    let rows = meta
        .iter()?
        .map(|row| {
            let (k, v) = row?;
            Ok((k.value().to_string(), v.value()))
        })
        .collect::<Result<Vec<_>, redb::Error>>()?;
    for (name, value) in rows {
        if !name.starts_with(CHECK) {
            meta_set(&mut meta, &name, value)?;
        }
    }
    Ok(())
}

/// A lease's TTL from its payload.
pub(super) fn ttl(id: i64, payload: &[u8]) -> Result<i64, redb::Error> {
    let bytes: [u8; 8] = payload
        .try_into()
        .map_err(|_| damaged("leases", &id, "holds no TTL"))?;
    Ok(i64::from_le_bytes(bytes))
}
