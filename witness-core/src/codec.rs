//! The framed witness record: `magic | format version | reserved | length | payload | crc32c`.
//!
//! Byte layout (all integers little-endian; specified in `docs/witness-format.md`):
//!
//! | offset | size | field                                            |
//! |--------|------|--------------------------------------------------|
//! | 0      | 4    | magic `b"WTNS"`                                  |
//! | 4      | 2    | format version, currently 1                      |
//! | 6      | 2    | reserved, must be 0                              |
//! | 8      | 4    | payload length `n` (at most [`MAX_PAYLOAD`])     |
//! | 12     | n    | payload: protobuf [`WitnessState`]               |
//! | 12+n   | 4    | CRC32C (Castagnoli) of bytes `0 .. 12+n`         |
//!
//! Invariants: a record is checked when it is written and again when it is read; any deviation
//! (bad magic, unknown version, truncation, trailing bytes, CRC mismatch, undecodable payload)
//! is a [`DecodeError`]. A reader never falls back to an older record on its own: an older
//! state could grant a vote the newer one forbids.

use prost::Message;

use crate::state::WitnessState;

/// The first four bytes of every witness record.
pub const MAGIC: [u8; 4] = *b"WTNS";
/// The record format this code writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Header size: magic, version, reserved, length.
pub const HEADER_LEN: usize = 12;
/// Trailer size: the CRC32C.
pub const TRAILER_LEN: usize = 4;
/// Largest payload accepted; a real state is well under 1 KiB.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// Why bytes are not a valid witness record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header and trailer need, or than the length field announces.
    #[error("witness record is truncated: {actual} bytes, expected {expected}")]
    Truncated { expected: usize, actual: usize },
    /// More bytes than the length field announces.
    #[error("witness record has {extra} unexpected trailing bytes")]
    TrailingBytes { extra: usize },
    /// The first bytes are not [`MAGIC`]: this is not a witness record.
    #[error("not a witness record: magic is {found:02x?}, expected {MAGIC:02x?}")]
    BadMagic { found: [u8; 4] },
    /// A record written by a newer (or unknown) format.
    #[error(
        "witness record format version {found} is not supported (this build reads version {FORMAT_VERSION}); upgrade etcd-node"
    )]
    UnsupportedVersion { found: u16 },
    /// The reserved header field is not zero.
    #[error("witness record reserved header field is {found}, expected 0")]
    Reserved { found: u16 },
    /// The announced payload is larger than any valid state.
    #[error("witness record payload length {length} exceeds the maximum {MAX_PAYLOAD}")]
    TooLarge { length: usize },
    /// The checksum does not match: the record was damaged.
    #[error("witness record checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    /// The payload is not a valid protobuf state.
    #[error("witness record payload does not decode: {reason}")]
    Payload { reason: String },
}

/// Encodes `state` as a framed record, and checks the result by decoding it again.
pub fn encode(state: &WitnessState) -> Vec<u8> {
    let payload_len = state.encoded_len();
    assert!(
        payload_len <= MAX_PAYLOAD,
        "witness state encodes to {payload_len} bytes, over the {MAX_PAYLOAD} byte limit"
    );
    let mut buf = Vec::with_capacity(HEADER_LEN + payload_len + TRAILER_LEN);
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf.extend_from_slice(&0u16.to_le_bytes());
    buf.extend_from_slice(&(payload_len as u32).to_le_bytes());
    state
        .encode(&mut buf)
        .expect("a Vec grows to hold any payload");
    let crc = crc32c::crc32c(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    // Check on write as well as on read: a record we cannot read back must never be stored.
    let decoded = decode(&buf).expect("a freshly encoded witness record decodes");
    assert!(
        decoded == *state,
        "witness record round trip changed the state"
    );
    buf
}

/// Decodes and validates a framed record.
pub fn decode(bytes: &[u8]) -> Result<WitnessState, DecodeError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(DecodeError::Truncated {
            expected: HEADER_LEN + TRAILER_LEN,
            actual: bytes.len(),
        });
    }
    let found: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
    if found != MAGIC {
        return Err(DecodeError::BadMagic { found });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion { found: version });
    }
    let reserved = u16::from_le_bytes([bytes[6], bytes[7]]);
    if reserved != 0 {
        return Err(DecodeError::Reserved { found: reserved });
    }
    let length = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    if length > MAX_PAYLOAD {
        return Err(DecodeError::TooLarge { length });
    }
    let expected = HEADER_LEN + length + TRAILER_LEN;
    if bytes.len() < expected {
        return Err(DecodeError::Truncated {
            expected,
            actual: bytes.len(),
        });
    }
    if bytes.len() > expected {
        return Err(DecodeError::TrailingBytes {
            extra: bytes.len() - expected,
        });
    }
    let body = &bytes[..HEADER_LEN + length];
    let stored = u32::from_le_bytes(bytes[HEADER_LEN + length..].try_into().expect("4 bytes"));
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(DecodeError::ChecksumMismatch { stored, computed });
    }
    WitnessState::decode(&body[HEADER_LEN..]).map_err(|e| DecodeError::Payload {
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> WitnessState {
        WitnessState {
            cluster_id: 0xdead_beef,
            member_id: 7,
            name: "infra2".into(),
            peer_url: "witness:mount?path=%2Fvar%2Fwitness".into(),
            term: 5,
            voted_for: 3,
            last_log_term: 4,
            last_log_subterm: 2,
            last_log_index: 99,
            replication_set: vec![3, 7],
            replication_set_outgoing: vec![],
            writer_nonce: 42,
            generation: 0x6e6e,
            previous_nonce: 41,
        }
    }

    #[test]
    fn round_trip() {
        let s = sample();
        assert_eq!(decode(&encode(&s)).unwrap(), s);
    }

    #[test]
    fn empty_state_round_trips() {
        let s = WitnessState::default();
        let bytes = encode(&s);
        assert_eq!(bytes.len(), HEADER_LEN + TRAILER_LEN);
        assert_eq!(decode(&bytes).unwrap(), s);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            let err = decode(&bytes[..len]).unwrap_err();
            assert!(
                matches!(err, DecodeError::Truncated { .. }),
                "len {len}: {err:?}"
            );
        }
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&sample());
        bytes.push(0);
        assert_eq!(
            decode(&bytes).unwrap_err(),
            DecodeError::TrailingBytes { extra: 1 }
        );
    }

    #[test]
    fn bad_magic_version_and_reserved_are_rejected() {
        let good = encode(&sample());
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(decode(&b), Err(DecodeError::BadMagic { .. })));
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(
            decode(&b).unwrap_err(),
            DecodeError::UnsupportedVersion { found: 2 }
        );
        let mut b = good.clone();
        b[6] = 1;
        assert_eq!(decode(&b).unwrap_err(), DecodeError::Reserved { found: 1 });
        let mut b = good;
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::TooLarge { .. })));
    }

    #[test]
    fn every_single_bit_flip_in_the_payload_or_crc_is_rejected() {
        let good = encode(&sample());
        for byte in HEADER_LEN..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[byte] ^= 1 << bit;
                assert!(
                    matches!(decode(&b), Err(DecodeError::ChecksumMismatch { .. })),
                    "flip byte {byte} bit {bit} was not detected"
                );
            }
        }
    }

    #[test]
    fn a_valid_crc_over_a_garbage_payload_is_a_payload_error() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf.extend_from_slice(&0u16.to_le_bytes());
        buf.extend_from_slice(&2u32.to_le_bytes());
        buf.extend_from_slice(&[0xff, 0xff]);
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&buf), Err(DecodeError::Payload { .. })));
    }

    proptest! {
        #[test]
        fn arbitrary_states_round_trip(
            cluster_id: u64, member_id: u64, name in "[a-z0-9-]{0,20}", term: u64, voted_for: u64,
            llt: u64, lls: u64, lli: u64, nonce: u64, generation: u64, previous_nonce: u64,
            rs in proptest::collection::vec(any::<u64>(), 0..5),
            rso in proptest::collection::vec(any::<u64>(), 0..5),
        ) {
            let s = WitnessState {
                cluster_id, member_id, name, peer_url: "witness:mount?path=%2Fw".into(), term, voted_for,
                last_log_term: llt, last_log_subterm: lls, last_log_index: lli,
                replication_set: rs, replication_set_outgoing: rso, writer_nonce: nonce,
                generation, previous_nonce,
            };
            prop_assert_eq!(decode(&encode(&s)).unwrap(), s);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
