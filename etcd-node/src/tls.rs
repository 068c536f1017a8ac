//! TLS as etcd does it, on rustls: the client and peer listeners ([`ServerTls`]), the
//! connections a member opens to other members ([`Dialer`]), and the certificates
//! `--auto-tls`/`--peer-auto-tls` make ([`self_signed`]).
//!
//! Certificate, key, CA and revocation files are read again when they change (checked at most
//! once per [`RECHECK`] when a connection is accepted or opened), so a rotated certificate is
//! served without a restart, as etcd does. Files that changed but cannot be used (half written,
//! a key that does not match) leave the previous ones in use, with a warning.
//!
//! What a listener verifies: with a trusted CA, a client certificate signed by it (required
//! with `--client-cert-auth`/`--peer-client-cert-auth`, optional otherwise), not revoked by the
//! CRL file; on the peer side also `--peer-cert-allowed-cn`/`--peer-cert-allowed-hostname`. A
//! refused connection is logged with the reason. A dialer verifies the server's certificate
//! against the trusted CA and its URL's host, except with auto-TLS and no CA: etcd then
//! encrypts without verifying, and so does this.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme, SupportedProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint};

/// A TLS failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// The flags, or the certificate, key or CA files they name, cannot be used: the message
    /// names the flag and the fix. It stops a member at start; after a change of the files
    /// at run time the previous ones stay in use.
    #[error("{0}")]
    Setting(String),
    /// One connection refused: its handshake failed, or the other end is not the one allowed
    /// (that connection ends; the listener goes on).
    #[error("{0}")]
    Connection(String),
}

impl From<String> for TlsError {
    fn from(message: String) -> Self {
        TlsError::Setting(message)
    }
}

impl From<&str> for TlsError {
    fn from(message: &str) -> Self {
        TlsError::Setting(message.to_string())
    }
}

/// How often, at most, the files are checked for a change.
pub const RECHECK: Duration = Duration::from_secs(1);
/// How long a client has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// One side's (client or peer) TLS flags, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Side {
    /// "client" or "peer" (for log lines).
    pub name: &'static str,
    /// The flags' prefix: "" or "peer-" (for messages).
    pub prefix: &'static str,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub trusted_ca_file: Option<PathBuf>,
    pub crl_file: Option<PathBuf>,
    pub client_cert_auth: bool,
    pub auto_tls: bool,
    /// Peer side only: the CommonName every peer certificate must have.
    pub allowed_cn: Option<String>,
    /// Peer side only: a DNS name every peer certificate must hold.
    pub allowed_hostname: Option<String>,
}

impl Side {
    /// Whether this side can serve TLS (a certificate given, or one to be made).
    pub fn serves_tls(&self) -> bool {
        self.cert_file.is_some() || self.auto_tls
    }

    /// Checks the combination of flags (not the files, which [`ServerTls::new`] reads).
    pub fn check(&self) -> Result<(), TlsError> {
        let p = self.prefix;
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => return Err(format!("--{p}cert-file needs --{p}key-file").into()),
            (None, Some(_)) => return Err(format!("--{p}key-file needs --{p}cert-file").into()),
            _ => {}
        }
        if self.client_cert_auth && self.trusted_ca_file.is_none() {
            return Err(format!(
                "--{p}client-cert-auth needs --{p}trusted-ca-file (the CA that signs the certificates to accept)"
            ).into());
        }
        if self.crl_file.is_some() && self.trusted_ca_file.is_none() {
            return Err(format!(
                "--{}crl-file needs --{p}trusted-ca-file (revocation applies to the certificates it signs)",
                if p.is_empty() { "client-" } else { p }
            ).into());
        }
        if self.allowed_cn.is_some() && self.allowed_hostname.is_some() {
            return Err(
                "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive; give one"
                    .into(),
            );
        }
        if (self.allowed_cn.is_some() || self.allowed_hostname.is_some()) && !self.client_cert_auth
        {
            return Err("--peer-cert-allowed-cn/--peer-cert-allowed-hostname need --peer-client-cert-auth (without it a peer need not present a certificate)".into());
        }
        Ok(())
    }
}

/// The TLS versions and TLS 1.2 cipher suites (`--tls-min-version`, `--tls-max-version`,
/// `--cipher-suites`), for both sides.
#[derive(Debug, Clone)]
pub struct Policy {
    provider: Arc<CryptoProvider>,
    versions: Vec<&'static SupportedProtocolVersion>,
}

impl Policy {
    pub fn new(cipher_suites: &[String], min: &str, max: &str) -> Result<Self, TlsError> {
        let version = |flag: &str, v: &str, default: u8| -> Result<u8, TlsError> {
            match v {
            "" => Ok(default),
            "TLS1.2" => Ok(2),
            "TLS1.3" => Ok(3),
            "TLS1.0" | "TLS1.1" => Err(format!(
                "--{flag}: {v} is not supported (it is insecure, and rustls does not speak it); use TLS1.2 or TLS1.3"
            ).into()),
            other => Err(format!(
                "--{flag}: {other:?} is not a TLS version; write TLS1.2 or TLS1.3"
            ).into()),
            }
        };
        let (min, max) = (
            version("tls-min-version", min, 2)?,
            version("tls-max-version", max, 3)?,
        );
        if min > max {
            return Err("--tls-min-version is above --tls-max-version".into());
        }
        let versions: Vec<&'static SupportedProtocolVersion> =
            [(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)]
                .into_iter()
                .filter(|(v, _)| (min..=max).contains(v))
                .map(|(_, p)| p)
                .collect();
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        if !cipher_suites.is_empty() {
            let known: Vec<String> = provider
                .cipher_suites
                .iter()
                .filter(|s| s.tls13().is_none())
                .map(|s| format!("{:?}", s.suite()))
                .collect();
            if let Some(bad) = cipher_suites.iter().find(|c| !known.contains(c)) {
                return Err(format!(
                    "--cipher-suites: {bad:?} is not a supported TLS 1.2 cipher suite; supported: {}",
                    known.join(",")
                ).into());
            }
            // (as in etcd, the list applies to TLS 1.2; TLS 1.3's suites are all kept)
            provider.cipher_suites.retain(|s| {
                s.tls13().is_some() || cipher_suites.contains(&format!("{:?}", s.suite()))
            });
        }
        Ok(Policy {
            provider: Arc::new(provider),
            versions,
        })
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new(&[], "", "").expect("the defaults are valid")
    }
}

fn read_certs(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad =
        |e: &dyn std::fmt::Display| TlsError::Setting(format!("--{flag} {}: {e}", path.display()));
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if certs.is_empty() {
        return Err(bad(
            &"holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

fn read_key(flag: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        TlsError::Setting(format!(
            "--{flag} {}: {e} (a PEM private key: PKCS#8, PKCS#1 or SEC1)",
            path.display()
        ))
    })
}

fn read_roots(flag: &str, path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(flag, path)? {
        roots
            .add(c)
            .map_err(|e| format!("--{flag} {}: {e}", path.display()))?;
    }
    Ok(Arc::new(roots))
}

/// A value built from files, built again when one of them changes.
struct Reloading<T> {
    what: String,
    paths: Vec<PathBuf>,
    recheck: Duration,
    build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    state: Mutex<Loaded<T>>,
}

struct Loaded<T> {
    stamps: Vec<Option<(SystemTime, u64)>>,
    checked: Instant,
    value: Arc<T>,
}

fn stamps(paths: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

impl<T> Reloading<T> {
    fn new(
        what: String,
        paths: Vec<PathBuf>,
        recheck: Duration,
        build: impl Fn() -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let stamps = stamps(&paths);
        let value = Arc::new(build()?);
        Ok(Reloading {
            what,
            paths,
            recheck,
            build: Box::new(build),
            state: Mutex::new(Loaded {
                stamps,
                checked: Instant::now(),
                value,
            }),
        })
    }

    fn current(&self) -> Arc<T> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.checked.elapsed() >= self.recheck {
            s.checked = Instant::now();
            let now = stamps(&self.paths);
            if now != s.stamps {
                s.stamps = now;
                match (self.build)() {
                    Ok(v) => {
                        tracing::info!(what = %self.what, "certificate files changed: using the new ones");
                        s.value = Arc::new(v);
                    }
                    Err(e) => tracing::warn!(
                        what = %self.what,
                        error = %e,
                        "certificate files changed but cannot be used; still using the previous ones"
                    ),
                }
            }
        }
        s.value.clone()
    }
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

/// The files a side's certificates come from, present ones only.
fn side_paths(side: &Side) -> Vec<PathBuf> {
    [
        &side.cert_file,
        &side.key_file,
        &side.trusted_ca_file,
        &side.crl_file,
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect()
}

/// A TLS listener's configuration and its checks of the other end.
#[derive(Debug)]
pub struct ServerTls {
    side: Side,
    config: Reloading<rustls::ServerConfig>,
}

impl ServerTls {
    /// Reads the side's files; an error names the flag. `alpn`: the protocols offered (the
    /// client listeners also speak HTTP/1.1 for `/health` and `/metrics`).
    pub fn new(
        side: &Side,
        policy: &Policy,
        alpn: &[&[u8]],
        recheck: Duration,
    ) -> Result<Self, TlsError> {
        side.check()?;
        let p = side.prefix;
        let (Some(cert), Some(key)) = (side.cert_file.clone(), side.key_file.clone()) else {
            return Err(format!(
                "an https:// {} URL needs --{p}cert-file and --{p}key-file (or --{p}auto-tls)",
                side.name
            )
            .into());
        };
        let (s, policy) = (side.clone(), policy.clone());
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|a| a.to_vec()).collect();
        let build = move || {
            let builder = rustls::ServerConfig::builder_with_provider(policy.provider.clone())
                .with_protocol_versions(&policy.versions)
                .map_err(|e| format!("--tls-min-version/--tls-max-version: {e}"))?;
            let builder = match &s.trusted_ca_file {
                Some(ca) => {
                    let roots = read_roots(&format!("{p}trusted-ca-file"), ca)?;
                    let mut v =
                        WebPkiClientVerifier::builder_with_provider(roots, policy.provider.clone());
                    if let Some(crl) = &s.crl_file {
                        let flag = if p.is_empty() { "client-" } else { p };
                        let crls = CertificateRevocationListDer::pem_file_iter(crl)
                            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                            .map_err(|e| format!("--{flag}crl-file {}: {e}", crl.display()))?;
                        v = v.with_crls(crls);
                    }
                    if !s.client_cert_auth {
                        v = v.allow_unauthenticated();
                    }
                    let v = v
                        .build()
                        .map_err(|e| format!("--{p}trusted-ca-file {}: {e}", ca.display()))?;
                    builder.with_client_cert_verifier(v)
                }
                None => builder.with_no_client_auth(),
            };
            let chain = read_certs(&format!("{p}cert-file"), &cert)?;
            let key_der = read_key(&format!("{p}key-file"), &key)?;
            let mut config = builder.with_single_cert(chain, key_der).map_err(|e| {
                format!(
                    "--{p}cert-file {} with --{p}key-file {}: {e} (is the key the certificate's?)",
                    cert.display(),
                    key.display()
                )
            })?;
            config.alpn_protocols = alpn.clone();
            Ok(config)
        };
        let what = format!("{} TLS", side.name);
        Ok(ServerTls {
            side: side.clone(),
            config: Reloading::new(what, side_paths(side), recheck, build)?,
        })
    }

    /// Completes the handshake of an accepted connection and checks the other end.
    async fn accept(&self, tcp: TcpStream, remote: SocketAddr) -> Result<TlsConn, TlsError> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.current());
        let stream = acceptor
            .accept(tcp)
            .await
            .map_err(|e| TlsError::Connection(e.to_string()))?;
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec());
        let common_name = leaf.as_deref().and_then(common_name);
        if let Some(allowed) = &self.side.allowed_cn
            && common_name.as_deref() != Some(allowed.as_str())
        {
            return Err(TlsError::Connection(format!(
                "its certificate's CommonName is {common_name:?}, --peer-cert-allowed-cn is {allowed:?}"
            )));
        }
        if let Some(allowed) = &self.side.allowed_hostname {
            let names = leaf.as_deref().map(dns_names).unwrap_or_default();
            if !names.iter().any(|n| n.eq_ignore_ascii_case(allowed)) {
                return Err(TlsError::Connection(format!(
                    "its certificate names {names:?}, not --peer-cert-allowed-hostname {allowed:?}"
                )));
            }
        }
        Ok(TlsConn {
            stream,
            info: ConnInfo {
                remote: Some(remote),
                // (a CommonName is an identity only where a verified certificate is required)
                common_name: common_name
                    .filter(|_| self.side.client_cert_auth)
                    .map(Arc::from),
            },
        })
    }
}

fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

fn dns_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect()
}

/// Who is at the other end of an accepted TLS connection (in each request's extensions).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// The verified client certificate's CommonName, where client certificates are required
    /// (etcd's rule: with auth on, it is the user of requests that carry no token).
    pub common_name: Option<Arc<str>>,
}

/// An accepted connection after its handshake.
#[derive(Debug)]
pub struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: ConnInfo,
}

impl Connected for TlsConn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, b)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections of a TLS listener, each after its handshake (done concurrently, so a slow
/// client does not hold up the others). Refused handshakes are logged and dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
) -> ReceiverStream<Result<TlsConn, io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = tokio::select! {
                () = tx.closed() => return, // the server stopped
                r = listener.accept() => match r {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE, tls.accept(tcp, remote)).await {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(why)) => tracing::warn!(
                        side = tls.side.name,
                        %remote,
                        %why,
                        "refused a TLS connection"
                    ),
                    Err(_) => tracing::debug!(%remote, "a TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Opens connections to other members: plain for `http://` URLs, TLS for `https://` ones
/// (never plain for those).
#[derive(Debug, Clone)]
pub struct Dialer {
    what: &'static str,
    config: Option<Arc<Reloading<rustls::ClientConfig>>>,
}

impl Dialer {
    /// A dialer that only speaks plain HTTP/2 (for `https://` it fails with `why`).
    pub fn plain(what: &'static str) -> Self {
        Dialer { what, config: None }
    }

    /// The side's dialer: presents the side's certificate (peer listeners that require one
    /// accept it); verifies servers with the side's trusted CA, or not at all with auto-TLS
    /// and no CA (etcd's rule). Without either, it cannot dial `https://` URLs.
    pub fn new(side: &Side, policy: &Policy, recheck: Duration) -> Result<Self, TlsError> {
        let what = match side.name {
            "peer" => "peer",
            _ => "client",
        };
        if side.trusted_ca_file.is_none() && !side.auto_tls {
            return Ok(Dialer::plain(what));
        }
        let (s, policy) = (side.clone(), policy.clone());
        let p = side.prefix;
        let build = move || {
            let builder = rustls::ClientConfig::builder_with_provider(policy.provider.clone())
                .with_protocol_versions(&policy.versions)
                .map_err(|e| format!("--tls-min-version/--tls-max-version: {e}"))?;
            let builder = match &s.trusted_ca_file {
                Some(ca) => {
                    builder.with_root_certificates(read_roots(&format!("{p}trusted-ca-file"), ca)?)
                }
                None => builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Unverified(
                        policy.provider.clone(),
                    ))),
            };
            let mut config = match (&s.cert_file, &s.key_file) {
                (Some(cert), Some(key)) => builder
                    .with_client_auth_cert(
                        read_certs(&format!("{p}cert-file"), cert)?,
                        read_key(&format!("{p}key-file"), key)?,
                    )
                    .map_err(|e| format!("--{p}cert-file {}: {e}", cert.display()))?,
                _ => builder.with_no_client_auth(),
            };
            config.alpn_protocols = vec![b"h2".to_vec()];
            Ok(config)
        };
        let reloading = Reloading::new(
            format!("{what} TLS (dialing)"),
            side_paths(side),
            recheck,
            build,
        )?;
        Ok(Dialer {
            what,
            config: Some(Arc::new(reloading)),
        })
    }

    /// Connects `endpoint` (whose URL decides plain or TLS).
    pub async fn connect(&self, endpoint: Endpoint) -> Result<Channel, TlsError> {
        if endpoint.uri().scheme_str() != Some("https") {
            return endpoint
                .connect()
                .await
                .map_err(|e| TlsError::Connection(e.to_string()));
        }
        let Some(config) = self.config.clone() else {
            return Err(TlsError::Setting(format!(
                "{} is an https:// URL, but this member has no CA to verify it: give --{}trusted-ca-file",
                endpoint.uri(),
                if self.what == "peer" { "peer-" } else { "" }
            )));
        };
        let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
            let config = config.current();
            async move {
                let host = uri
                    .host()
                    .ok_or_else(|| io::Error::other("a URL without a host"))?
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string();
                let port = uri.port_u16().unwrap_or(443);
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from(host)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                Ok::<_, io::Error>(TokioIo::new(tls))
            }
        });
        endpoint
            .connect_with_connector(connector)
            .await
            .map_err(|e| {
                use std::error::Error as _;
                TlsError::Connection(match e.source() {
                    Some(s) => format!("{e}: {s}"),
                    None => e.to_string(),
                })
            })
    }
}

/// Accepts any server certificate (with valid handshake signatures): etcd's auto-TLS peers
/// encrypt without authenticating each other.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The certificate and key `--auto-tls`/`--peer-auto-tls` use, in `dir`: made (self-signed,
/// for `hosts`, valid `years`) unless a usable pair is there already, as etcd keeps its own.
pub fn self_signed(
    dir: &Path,
    hosts: &[String],
    years: u32,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    if read_certs("auto-tls", &cert).is_ok() && read_key("auto-tls", &key).is_ok() {
        return Ok((cert, key));
    }
    let bad = |e: &dyn std::fmt::Display| format!("auto-TLS in {}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| bad(&e))?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec()).map_err(|e| bad(&e))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "etcd-node");
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365 * i64::from(years.max(1)));
    let key_pair = rcgen::KeyPair::generate().map_err(|e| bad(&e))?;
    let made = params.self_signed(&key_pair).map_err(|e| bad(&e))?;
    write_private(&key, key_pair.serialize_pem().as_bytes()).map_err(|e| bad(&e))?;
    std::fs::write(&cert, made.pem()).map_err(|e| bad(&e))?;
    Ok((cert, key))
}

/// Writes a file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests;
