use std::time::Duration;

use e2e_tests::pki::{Ca, Files};
use tokio_stream::StreamExt as _;

use super::*;

fn side(name: &'static str, prefix: &'static str, f: &Files, cert_auth: bool) -> Side {
    Side {
        name,
        prefix,
        cert_file: Some(f.cert.clone()),
        key_file: Some(f.key.clone()),
        trusted_ca_file: Some(f.ca.clone()),
        client_cert_auth: cert_auth,
        ..Side::default()
    }
}

/// Starts a TLS listener; returns its address and the connections it accepted.
async fn listen(tls: ServerTls) -> (SocketAddr, ReceiverStream<Result<TlsConn, io::Error>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    (addr, incoming(l, Arc::new(tls)))
}

/// Connects as `client` (its certificate presented, the server verified with its CA): the
/// server certificate's CommonName, or the handshake's error.
async fn handshake(addr: SocketAddr, client: &Side) -> Result<String, String> {
    let dialer = Dialer::new(client, &Policy::default(), RECHECK).unwrap();
    let config = dialer.config.unwrap().current();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    // (TLS 1.3: a refused client certificate shows at the first read)
    use tokio::io::AsyncReadExt as _;
    let mut byte = [0u8; 1];
    let first = tokio::time::timeout(Duration::from_millis(300), tls.read(&mut byte)).await;
    if let Ok(Err(e)) = first {
        return Err(e.to_string());
    }
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    Ok(common_name(&leaf).unwrap())
}

#[tokio::test]
async fn a_client_certificate_is_verified_and_its_common_name_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = ca.write(
        dir.path(),
        "server",
        "member-1",
        &["localhost", "127.0.0.1"],
    );
    let alice = ca.write(dir.path(), "alice", "alice", &[]);
    let tls = ServerTls::new(
        &side("client", "", &server, true),
        &Policy::default(),
        &[b"h2"],
        RECHECK,
    )
    .unwrap();
    let (addr, mut accepted) = listen(tls).await;
    assert_eq!(
        handshake(addr, &side("client", "", &alice, false)).await,
        Ok("member-1".to_string())
    );
    let conn = accepted.next().await.unwrap().unwrap();
    assert_eq!(conn.connect_info().common_name.as_deref(), Some("alice"));

    // A certificate from another CA, and none at all, are refused.
    let other = Ca::new("other CA").write(&dir.path().join("o"), "mallory", "alice", &[]);
    let mut mallory = side("client", "", &other, false);
    mallory.trusted_ca_file = Some(server.ca.clone());
    assert!(handshake(addr, &mallory).await.is_err());
    let mut anonymous = mallory.clone();
    (anonymous.cert_file, anonymous.key_file) = (None, None);
    assert!(handshake(addr, &anonymous).await.is_err());
}

#[tokio::test]
async fn a_peer_outside_the_allowed_common_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("peer CA");
    let server = ca.write(dir.path(), "m1", "etcd-peer", &["localhost"]);
    let good = ca.write(dir.path(), "m2", "etcd-peer", &["localhost"]);
    let bad = ca.write(dir.path(), "m3", "someone-else", &["localhost"]);
    let mut s = side("peer", "peer-", &server, true);
    s.allowed_cn = Some("etcd-peer".into());
    let tls = ServerTls::new(&s, &Policy::default(), &[b"h2"], RECHECK).unwrap();
    let (addr, mut accepted) = listen(tls).await;
    // The handshake completes, then the connection is dropped without being served.
    let _ = handshake(addr, &side("peer", "peer-", &bad, false)).await;
    assert!(
        handshake(addr, &side("peer", "peer-", &good, false))
            .await
            .is_ok()
    );
    let first = accepted.next().await.unwrap().unwrap();
    assert_eq!(
        first.connect_info().common_name.as_deref(),
        Some("etcd-peer"),
        "only the allowed peer's connection reaches the server"
    );
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = ca.write(dir.path(), "server", "before", &["localhost"]);
    let client = ca.write(dir.path(), "client", "client", &[]);
    let tls = ServerTls::new(
        &side("client", "", &server, false),
        &Policy::default(),
        &[b"h2"],
        Duration::ZERO,
    )
    .unwrap();
    let (addr, _accepted) = listen(tls).await;
    let me = side("client", "", &client, false);
    assert_eq!(handshake(addr, &me).await, Ok("before".into()));
    // A half-written replacement keeps the old certificate in use...
    std::fs::write(&server.cert, "-----BEGIN CERTIFICATE-----\nAAAA").unwrap();
    assert_eq!(handshake(addr, &me).await, Ok("before".into()));
    // ...and the finished one is used from the next connection on.
    ca.write(dir.path(), "server", "after", &["localhost"]);
    assert_eq!(handshake(addr, &me).await, Ok("after".into()));
}

#[test]
fn bad_files_and_flags_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let a = ca.write(dir.path(), "a", "a", &["localhost"]);
    let b = ca.write(dir.path(), "b", "b", &["localhost"]);
    let new = |s: &Side| ServerTls::new(s, &Policy::default(), &[b"h2"], RECHECK).map(|_| ());
    let mut mismatched = side("client", "", &a, false);
    mismatched.key_file = Some(b.key.clone());
    let e = new(&mismatched).unwrap_err().to_string();
    assert!(e.contains("--cert-file") && e.contains("--key-file"), "{e}");
    let mut missing = side("peer", "peer-", &a, false);
    missing.cert_file = Some(dir.path().join("nope.crt"));
    let e = new(&missing).unwrap_err().to_string();
    assert!(
        e.contains("--peer-cert-file") && e.contains("nope.crt"),
        "{e}"
    );
    let mut not_a_ca = side("client", "", &a, true);
    not_a_ca.trusted_ca_file = Some(a.key.clone());
    let e = new(&not_a_ca).unwrap_err().to_string();
    assert!(e.contains("--trusted-ca-file"), "{e}");
    let no_ca = Side {
        trusted_ca_file: None,
        ..side("client", "", &a, true)
    };
    assert!(
        new(&no_ca)
            .unwrap_err()
            .to_string()
            .contains("needs --trusted-ca-file")
    );
    let no_cert = Side {
        name: "client",
        ..Side::default()
    };
    assert!(
        new(&no_cert)
            .unwrap_err()
            .to_string()
            .contains("--cert-file and --key-file")
    );

    assert!(
        Policy::new(&[], "TLS1.1", "")
            .unwrap_err()
            .to_string()
            .contains("--tls-min-version")
    );
    assert!(Policy::new(&[], "TLS1.3", "TLS1.2").is_err());
    let e = Policy::new(&["TLS_RSA_WITH_RC4_128_SHA".into()], "", "")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--cipher-suites") && e.contains("TLS_ECDHE"),
        "{e}"
    );
    assert!(Policy::new(&["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()], "", "").is_ok());
}

#[tokio::test]
async fn an_https_url_is_never_dialed_in_plain_text() {
    let plain = Dialer::plain("peer");
    let endpoint = Endpoint::from_static("https://127.0.0.1:1");
    let e = plain.connect(endpoint).await.unwrap_err().to_string();
    assert!(e.contains("--peer-trusted-ca-file"), "{e}");
}

#[test]
fn auto_tls_keeps_the_certificate_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let (cert, key) = self_signed(dir.path(), &hosts, 1).unwrap();
    let first = std::fs::read(&cert).unwrap();
    assert_eq!(
        self_signed(dir.path(), &hosts, 1).unwrap(),
        (cert.clone(), key.clone())
    );
    assert_eq!(
        std::fs::read(&cert).unwrap(),
        first,
        "reused, not made again"
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let auto = Side {
        name: "peer",
        prefix: "peer-",
        cert_file: Some(cert),
        key_file: Some(key),
        auto_tls: true,
        ..Side::default()
    };
    assert!(ServerTls::new(&auto, &Policy::default(), &[b"h2"], RECHECK).is_ok());
}
