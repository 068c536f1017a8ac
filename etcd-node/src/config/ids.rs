//! Member and cluster ids, derived as etcd derives them, so a member (the witness included) has
//! the same id on every node and across restarts.
//!
//! - member id: the first 8 bytes (big-endian) of SHA-1 over the member's peer URLs, sorted and
//!   concatenated, followed by the cluster token;
//! - cluster id: the first 8 bytes of SHA-1 over the sorted member ids, each as 8 big-endian bytes.

use sha1::{Digest, Sha1};

fn first_u64(bytes: &[u8]) -> u64 {
    let digest = Sha1::digest(bytes);
    u64::from_be_bytes(digest[..8].try_into().expect("SHA-1 has 20 bytes"))
}

/// The id of a member with `peer_urls` in a cluster created with `token`.
pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
    urls.sort_unstable();
    let mut bytes = urls.concat().into_bytes();
    bytes.extend_from_slice(token.as_bytes());
    first_u64(&bytes)
}

/// The id of a cluster of `members`.
pub fn cluster_id(members: &[u64]) -> u64 {
    let mut ids = members.to_vec();
    ids.sort_unstable();
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_be_bytes()).collect();
    first_u64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_do_not_depend_on_url_order_and_change_with_the_token() {
        let a = member_id(&["http://b:2380".into(), "http://a:2380".into()], "t");
        let b = member_id(&["http://a:2380".into(), "http://b:2380".into()], "t");
        assert_eq!(a, b);
        assert_ne!(a, member_id(&["http://a:2380".into()], "t"));
        assert_ne!(
            a,
            member_id(&["http://a:2380".into(), "http://b:2380".into()], "u")
        );
        assert_eq!(cluster_id(&[1, 2, 3]), cluster_id(&[3, 1, 2]));
        assert_ne!(cluster_id(&[1, 2, 3]), cluster_id(&[1, 2]));
    }

    #[test]
    fn matches_etcd_for_its_default_single_member() {
        // Debian's etcd 3.4.23 started with no flags reports exactly these (etcdctl member list).
        let m = member_id(&["http://localhost:2380".into()], "etcd-cluster");
        assert_eq!(format!("{m:x}"), "8e9e05c52164694d");
        assert_eq!(format!("{:x}", cluster_id(&[m])), "cdf818194e3a8c32");
    }
}
