//! Versions and cluster features: what a member announces to its peers, which peer protocols
//! it speaks, and the cluster's parameters (version and features) that the leader decides from
//! what the members announce and records through Raft.
//!
//! - Every member announces, on each frame of its peer streams, its binary version
//!   ([`BINARY`]), its peer protocol ([`PROTOCOL`]) and the cluster features its
//!   `--feature-gates` turns on. A member refuses frames of a protocol outside
//!   [`MIN_PROTOCOL`]..=[`PROTOCOL`]; the sender logs why, shows it in Status `errors`, and keeps
//!   retrying (the seed's rule: a member that cannot talk to the cluster yet waits for it).
//! - The leader decides the cluster's parameters ([`decide`]): the lowest binary version of the
//!   regular members, and the features every regular member turns on; it proposes them when
//!   they change, and every member applies them to its key space (`mvcc`'s `cluster` table).
//!   A feature is used only once the cluster's parameters say it is on, so a cluster with one
//!   member that does not know it (an older binary) keeps it off.

use std::collections::BTreeSet;
use std::fmt;

/// This binary's version.
pub const BINARY: &str = env!("CARGO_PKG_VERSION");

/// The etcd version whose API a member serves, as Status reports it (a macro, so that
/// `etcd-node --version` can print it in etcd's own words: see [`LONG_VERSION`]).
#[macro_export]
macro_rules! etcd_api_version {
    () => {
        "3.5.17"
    };
}

/// The etcd version Status reports: etcd clients check it (this API matches etcd 3.5's).
pub const ETCD_VERSION: &str = etcd_api_version!();
/// The etcd cluster version `/version` and `etcd_cluster_version` report: the etcd API every
/// member serves (etcd reports major.minor.0 there).
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";

/// What `etcd-node --version` prints after its name: this binary's version, then the etcd
/// version it answers as, in etcd's own line (`etcd Version: X`), which scripts and etcd's test
/// framework read to pick the flags they pass.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\netcd Version: ",
    etcd_api_version!()
);

/// The peer protocol this binary speaks: 1 was every release before protocols were announced
/// (their frames carry 0); 2 adds the announcements and compressed snapshot chunks.
pub const PROTOCOL: u32 = 2;

/// The oldest peer protocol this binary still speaks.
pub const MIN_PROTOCOL: u32 = 1;

/// The protocol this member announces: [`PROTOCOL`] (tests make it announce another through
/// the failpoint `peer-protocol`, `return(<n>)`).
pub fn own_protocol() -> u32 {
    fail::fail_point!("peer-protocol", |v| v
        .and_then(|s| s.parse().ok())
        .unwrap_or(PROTOCOL));
    PROTOCOL
}

/// This member's attributes, with the features its `--feature-gates` turns on.
pub fn own_attributes(features: &BTreeSet<String>) -> Attributes {
    Attributes {
        version: BINARY.to_string(),
        protocol: own_protocol(),
        features: features.clone(),
    }
}

/// The protocol a frame announces: 0 is a member from before announcements (protocol 1).
pub fn announced_protocol(p: u32) -> u32 {
    p.max(1)
}

/// The version every release before announcements carried: a member that announces none is
/// taken to be this one (and to turn on no cluster feature).
pub const BEFORE_ANNOUNCEMENTS: &str = "0.1.0";

/// The version a frame announces: empty is a member from before announcements.
pub fn announced_version(v: String) -> String {
    if v.is_empty() {
        BEFORE_ANNOUNCEMENTS.to_string()
    } else {
        v
    }
}

/// The peer protocols this member speaks: [`MIN_PROTOCOL`]..=[`PROTOCOL`]; a member made to
/// announce another one (the failpoint) plays a release that speaks only that one.
pub fn spoken() -> std::ops::RangeInclusive<u32> {
    match own_protocol() {
        PROTOCOL => MIN_PROTOCOL..=PROTOCOL,
        other => other..=other,
    }
}

/// Can this member talk to a member that speaks `protocol`?
pub fn speaks(protocol: u32) -> bool {
    spoken().contains(&announced_protocol(protocol))
}

/// A cluster feature: on only when the leader, from what every regular member announced,
/// records it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    /// Alpha, Beta or GA, as Kubernetes' and etcd's gates say.
    pub stage: &'static str,
    pub doc: &'static str,
}

/// Leaders send snapshot chunks deflate-compressed. A member from before it would write the
/// compressed bytes as the snapshot and refuse it on its checksum, so it must stay off until
/// every member knows it.
pub const SNAPSHOT_COMPRESSION: &str = "SnapshotCompression";

/// Every cluster feature this binary knows.
pub const FEATURES: &[Feature] = &[Feature {
    name: SNAPSHOT_COMPRESSION,
    stage: "Alpha",
    doc: "snapshots sent to other members are deflate-compressed, chunk by chunk",
}];

/// A `--feature-gates` value that cannot be used; the message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadGate {
    #[error("--feature-gates: {item:?} is not Name=true or Name=false (known: {known})")]
    NotAssignment { item: String, known: String },
    #[error("--feature-gates: unknown feature {name:?} (known: {known})")]
    Unknown { name: String, known: String },
    #[error("--feature-gates: {name}={value}: the value is true or false")]
    Value { name: String, value: String },
}

/// `--feature-gates`: `Name=true,Other=false` (etcd's and Kubernetes' syntax); the features it
/// turns on. Every name must be a known feature.
pub fn parse_gates(flag: &str) -> Result<(BTreeSet<String>, Vec<String>), BadGate> {
    let mut on = BTreeSet::new();
    let mut etcds = Vec::new();
    for item in flag.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let known = FEATURES
            .iter()
            .map(|f| f.name)
            .collect::<Vec<_>>()
            .join(", ");
        let Some((name, value)) = item.split_once('=') else {
            return Err(BadGate::NotAssignment {
                item: item.to_string(),
                known,
            });
        };
        let name = name.trim();
        if ETCD_GATES.contains(&name) {
            etcds.push(item.to_string());
            continue;
        }
        if !FEATURES.iter().any(|f| f.name == name) {
            return Err(BadGate::Unknown {
                name: name.to_string(),
                known,
            });
        }
        match value.trim() {
            "true" => on.insert(name.to_string()),
            "false" => on.remove(name),
            other => {
                return Err(BadGate::Value {
                    name: name.to_string(),
                    value: other.to_string(),
                });
            }
        };
    }
    Ok((on, etcds))
}

/// etcd 3.6's server feature gates: accepted (kubeadm 1.37 passes `InitialCorruptCheck=true`)
/// with no effect here, named in the start's WARN line of etcd keys without an effect.
const ETCD_GATES: &[&str] = &[
    "CompactHashCheck",
    "InitialCorruptCheck",
    "LeaseCheckpoint",
    "LeaseCheckpointPersist",
    "SetMemberLocalAddr",
    "StopGRPCServiceOnDefrag",
    "TxnModeWriteWithSharedBuffer",
];

/// A version `major.minor.patch` (a suffix after `-` is ignored when comparing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Semver {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Semver {
    pub fn parse(s: &str) -> Option<Semver> {
        let core = s.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
        let v = Semver {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(v)
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What a member announces about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    /// Its binary version (empty: from before announcements).
    pub version: String,
    pub protocol: u32,
    /// The cluster features its `--feature-gates` turns on.
    pub features: BTreeSet<String>,
}

/// The cluster's parameters, as the leader decided them and Raft recorded them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterParams {
    /// The lowest binary version among the regular members.
    pub version: String,
    /// The cluster features on.
    pub features: BTreeSet<String>,
}

/// The parameters the regular members' announcements give: the lowest version, and the
/// features every one of them turns on. None while one has not been heard from, or announced a
/// version that does not parse (the recorded parameters then stay as they are). A member from
/// before announcements counts as [`BEFORE_ANNOUNCEMENTS`] with no feature on
/// ([`announced_version`]), so it keeps every feature off until it is upgraded.
pub fn decide<'a>(
    members: impl IntoIterator<Item = Option<&'a Attributes>>,
) -> Option<ClusterParams> {
    let mut lowest: Option<Semver> = None;
    let mut features: Option<BTreeSet<String>> = None;
    for a in members {
        let a = a?;
        let v = Semver::parse(&a.version)?;
        lowest = Some(lowest.map_or(v, |l| l.min(v)));
        let known: BTreeSet<String> = a
            .features
            .iter()
            .filter(|f| FEATURES.iter().any(|k| k.name == f.as_str()))
            .cloned()
            .collect();
        features = Some(match features {
            None => known,
            Some(f) => f.intersection(&known).cloned().collect(),
        });
    }
    Some(ClusterParams {
        version: lowest?.to_string(),
        features: features.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(version: &str, features: &[&str]) -> Attributes {
        Attributes {
            version: version.into(),
            protocol: PROTOCOL,
            features: features.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn gates_parse_as_etcds_and_name_what_is_wrong() {
        let (on, etcds) = parse_gates("SnapshotCompression=true").unwrap();
        assert!(on.contains(SNAPSHOT_COMPRESSION) && etcds.is_empty());
        assert!(
            parse_gates("SnapshotCompression=true,SnapshotCompression=false")
                .unwrap()
                .0
                .is_empty()
        );
        assert!(parse_gates("").unwrap().0.is_empty());
        // etcd 3.6's own gates (kubeadm's) are taken and named, with no effect
        let (on, etcds) = parse_gates("InitialCorruptCheck=true").unwrap();
        assert!(on.is_empty() && etcds == ["InitialCorruptCheck=true"]);
        let err = parse_gates("Nope=true").unwrap_err().to_string();
        assert!(err.contains("unknown feature \"Nope\"") && err.contains("SnapshotCompression"));
        assert!(
            parse_gates("SnapshotCompression")
                .unwrap_err()
                .to_string()
                .contains("Name=true")
        );
        assert!(
            parse_gates("SnapshotCompression=yes")
                .unwrap_err()
                .to_string()
                .contains("true or false")
        );
    }

    #[test]
    fn the_cluster_takes_the_lowest_version_and_the_features_every_member_turns_on() {
        let (a, b) = (attrs("0.2.0", &[SNAPSHOT_COMPRESSION]), attrs("0.1.5", &[]));
        let p = decide([Some(&a), Some(&b)]).unwrap();
        assert_eq!(p.version, "0.1.5");
        assert!(p.features.is_empty(), "one member does not turn it on");
        let b = attrs("0.2.0", &[SNAPSHOT_COMPRESSION, "FromTheFuture"]);
        let p = decide([Some(&a), Some(&b)]).unwrap();
        assert_eq!(p.version, "0.2.0");
        assert_eq!(p.features, [SNAPSHOT_COMPRESSION.to_string()].into());
        assert_eq!(decide([Some(&a), None]), None, "a member not heard from");
        let old = Attributes {
            version: announced_version(String::new()),
            ..Attributes::default()
        };
        let p = decide([Some(&a), Some(&old)]).unwrap();
        assert_eq!(p.version, BEFORE_ANNOUNCEMENTS, "a member from before");
        assert!(p.features.is_empty());
        let garbled = attrs("next", &[SNAPSHOT_COMPRESSION]);
        assert_eq!(decide([Some(&a), Some(&garbled)]), None);
    }

    #[test]
    fn protocols_and_versions() {
        assert!(speaks(0) && speaks(1) && speaks(PROTOCOL) && !speaks(PROTOCOL + 1));
        assert!(Semver::parse("0.10.0").unwrap() > Semver::parse("0.9.7").unwrap());
        assert_eq!(Semver::parse("1.2.3-rc.1").unwrap().to_string(), "1.2.3");
        assert_eq!(Semver::parse("1.2"), None);
        assert!(Semver::parse(BINARY).is_some());
    }
}
