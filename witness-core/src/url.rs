//! `witness:` URLs: where a witness's state lives.
//!
//! - `witness:mount?path=<percent-escaped absolute path>`: a directory on a mount (NFS, SMB, local);
//! - `witness:azblob?uri=<percent-escaped blob SAS URI>`: one Azure blob, reached with its SAS URI.
//!
//! Invariants: parsing is strict (one kind, exactly its one parameter, absolute path, https or a
//! loopback http blob endpoint, a SAS signature present); `parse(format(u)) == u`; the SAS
//! signature never appears in `Display`, `Debug` or error messages.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::error::{Error, Result};

/// Everything but RFC 3986 unreserved characters is escaped in a parameter value.
const VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
const REDACTED: &str = "REDACTED";

/// What is wrong with a `witness:` URL, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlProblem {
    #[error("it must start with `witness:`, e.g. witness:mount?path=%2Fvar%2Fwitness")]
    NotWitnessScheme,
    #[error("unknown witness kind {0:?}: use `mount` or `azblob`")]
    UnknownKind(String),
    #[error("write `witness:{0}?...` without `//`")]
    Authority(String),
    #[error("a fragment (`#...`) is not allowed; percent-escape `#` as %23")]
    Fragment,
    #[error("missing parameter `{0}`")]
    MissingParameter(&'static str),
    #[error("unexpected parameter {0:?}; a {1} witness takes only `{2}`")]
    UnexpectedParameter(String, &'static str, &'static str),
    #[error("parameter `{0}` is given more than once")]
    DuplicateParameter(&'static str),
    #[error("parameter `{0}` is empty")]
    EmptyParameter(&'static str),
    #[error("parameter `{0}` is not valid percent-escaped UTF-8")]
    BadEscape(&'static str),
    #[error(
        "path {0:?} is not absolute; give the mount point's absolute path, escaped, e.g. %2Fvar%2Fwitness"
    )]
    RelativePath(String),
    #[error("path contains a NUL byte")]
    NulInPath,
    #[error("blob URI does not parse: {0}")]
    BadBlobUri(String),
    #[error(
        "blob URI scheme must be https (http only for a loopback endpoint such as Azurite), not {0:?}"
    )]
    InsecureBlobUri(String),
    #[error(
        "blob URI must name an account, a container and a blob: https://ACCOUNT.blob.core.windows.net/CONTAINER/BLOB?SAS or http://127.0.0.1:10000/ACCOUNT/CONTAINER/BLOB?SAS"
    )]
    IncompleteBlobUri,
    #[error(
        "blob URI has no SAS token (`sig=` query parameter); create a SAS with read and write permission on the blob"
    )]
    MissingSas,
}

/// A parsed blob SAS URI. `Display` and `Debug` redact the signature.
#[derive(Clone, PartialEq, Eq)]
pub struct BlobSasUri {
    uri: url::Url,
    account: String,
    container: String,
    blob: String,
    /// Path-style (`http://host:port/account/...`, loopback emulators) instead of host-style.
    path_style: bool,
}

impl BlobSasUri {
    /// Parses and checks a blob SAS URI.
    pub fn parse(s: &str) -> Result<Self, UrlProblem> {
        let uri = url::Url::parse(s).map_err(|e| UrlProblem::BadBlobUri(e.to_string()))?;
        let host = uri
            .host_str()
            .ok_or(UrlProblem::IncompleteBlobUri)?
            .to_string();
        let loopback = is_loopback(&host);
        match uri.scheme() {
            "https" => {}
            "http" if loopback => {}
            other => return Err(UrlProblem::InsecureBlobUri(other.to_string())),
        }
        if uri.fragment().is_some() {
            return Err(UrlProblem::Fragment);
        }
        let path_style = loopback || host.parse::<IpAddr>().is_ok();
        let mut segments: Vec<String> = uri
            .path_segments()
            .ok_or(UrlProblem::IncompleteBlobUri)?
            .map(|seg| percent_decode_str(seg).decode_utf8_lossy().into_owned())
            .collect();
        let account = if path_style {
            if segments.is_empty() {
                return Err(UrlProblem::IncompleteBlobUri);
            }
            segments.remove(0)
        } else {
            host.split('.').next().unwrap_or_default().to_string()
        };
        if segments.len() < 2 || segments.iter().any(String::is_empty) || account.is_empty() {
            return Err(UrlProblem::IncompleteBlobUri);
        }
        let container = segments.remove(0);
        let blob = segments.join("/");
        if !uri.query_pairs().any(|(k, v)| k == "sig" && !v.is_empty()) {
            return Err(UrlProblem::MissingSas);
        }
        Ok(BlobSasUri {
            uri,
            account,
            container,
            blob,
            path_style,
        })
    }

    pub fn account(&self) -> &str {
        &self.account
    }

    pub fn container(&self) -> &str {
        &self.container
    }

    /// The blob's name within its container.
    pub fn blob(&self) -> &str {
        &self.blob
    }

    /// True for path-style endpoints (`http://127.0.0.1:10000/account/...`).
    pub fn is_path_style(&self) -> bool {
        self.path_style
    }

    /// The service endpoint: `https://account.blob.core.windows.net` or, path-style,
    /// `http://127.0.0.1:10000/account`.
    pub fn endpoint(&self) -> String {
        let mut base = self.uri.origin().ascii_serialization();
        if self.path_style {
            base.push('/');
            base.push_str(&self.account);
        }
        base
    }

    /// The SAS query pairs: the credential. Never log these.
    pub fn sas_pairs(&self) -> Vec<(String, String)> {
        self.uri
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    /// Do both name the same blob (whatever their SAS tokens)?
    pub fn same_blob(&self, other: &BlobSasUri) -> bool {
        (self.endpoint(), &self.container, &self.blob)
            == (other.endpoint(), &other.container, &other.blob)
    }

    /// Is the signature the placeholder [`BlobSasUri::redacted`] writes (a URL as stored in a
    /// member list, which holds no secret)?
    pub fn has_redacted_signature(&self) -> bool {
        self.uri
            .query_pairs()
            .any(|(k, v)| k == "sig" && v == REDACTED)
    }

    /// The same blob with another SAS token (a query string, with or without its `?`), checked
    /// as [`BlobSasUri::parse`] checks.
    pub fn with_sas(&self, sas: &str) -> Result<BlobSasUri, UrlProblem> {
        let mut u = self.uri.clone();
        u.set_query(Some(sas.trim().trim_start_matches('?')));
        BlobSasUri::parse(u.as_str())
    }

    /// The SAS token: the query string, signature included. Never log this.
    pub fn sas_query(&self) -> &str {
        self.uri.query().unwrap_or_default()
    }

    /// The full URI including the SAS signature. Never log this.
    pub fn expose_secret(&self) -> &str {
        self.uri.as_str()
    }

    /// The URI with the signature replaced by `REDACTED`, safe to log.
    pub fn redacted(&self) -> String {
        let mut u = self.uri.clone();
        let pairs: Vec<(String, String)> = self
            .uri
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "sig" {
                    REDACTED.to_string()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
        u.to_string()
    }
}

impl fmt::Display for BlobSasUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for BlobSasUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobSasUri({})", self.redacted())
    }
}

/// Where a witness's state lives.
#[derive(Clone, PartialEq, Eq)]
pub enum WitnessUrl {
    /// A directory on a mounted file system.
    Mount { path: PathBuf },
    /// One Azure blob.
    AzBlob { uri: BlobSasUri },
}

impl WitnessUrl {
    /// True if `s` uses the `witness:` scheme (whether or not it is valid).
    pub fn is_witness(s: &str) -> bool {
        s.get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("witness:"))
    }

    /// Parses a `witness:` URL strictly.
    pub fn parse(s: &str) -> Result<Self> {
        parse(s).map_err(|problem| Error::InvalidUrl {
            url: redact(s),
            problem,
        })
    }

    /// A mount witness at `path` (must be absolute).
    pub fn mount(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let u = WitnessUrl::Mount { path };
        // Validate through the same code path as parsing.
        WitnessUrl::parse(&u.to_url_string())
    }

    /// The URL string, including any SAS signature: for configuration, never for logs.
    pub fn to_url_string(&self) -> String {
        match self {
            WitnessUrl::Mount { path } => format!(
                "witness:mount?path={}",
                utf8_percent_encode(&path.to_string_lossy(), VALUE)
            ),
            WitnessUrl::AzBlob { uri } => format!(
                "witness:azblob?uri={}",
                utf8_percent_encode(uri.expose_secret(), VALUE)
            ),
        }
    }

    /// The form a cluster's member list stores of witness URL `s`: a blob's SAS signature
    /// replaced by `REDACTED` (the member list is replicated, so it is in every snapshot; each
    /// member keeps the token itself); a mount URL as written. A URL that does not parse is
    /// returned redacted as text.
    pub fn member_list_form(s: &str) -> String {
        match WitnessUrl::parse(s) {
            Ok(WitnessUrl::AzBlob { uri }) => format!(
                "witness:azblob?uri={}",
                utf8_percent_encode(&uri.redacted(), VALUE)
            ),
            Ok(WitnessUrl::Mount { .. }) => s.to_string(),
            Err(_) => redact(s),
        }
    }

    /// What a witness member's id hashes for witness URL `s`: the storage it names and nothing
    /// of a SAS token (members given different tokens for the same blob agree on the id); a
    /// mount URL as written (as etcd hashes peer URLs).
    pub fn identity(s: &str) -> String {
        match WitnessUrl::parse(s) {
            Ok(WitnessUrl::AzBlob { uri }) => format!(
                "witness:azblob?uri={}",
                utf8_percent_encode(
                    &format!("{}/{}/{}", uri.endpoint(), uri.container(), uri.blob()),
                    VALUE
                )
            ),
            _ => s.to_string(),
        }
    }

    /// The kind, as written in the URL.
    pub fn kind(&self) -> &'static str {
        match self {
            WitnessUrl::Mount { .. } => "mount",
            WitnessUrl::AzBlob { .. } => "azblob",
        }
    }
}

impl fmt::Display for WitnessUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WitnessUrl::Mount { .. } => f.write_str(&self.to_url_string()),
            WitnessUrl::AzBlob { uri } => write!(
                f,
                "witness:azblob?uri={}",
                utf8_percent_encode(&uri.redacted(), VALUE)
            ),
        }
    }
}

impl fmt::Debug for WitnessUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WitnessUrl({self})")
    }
}

impl std::str::FromStr for WitnessUrl {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        WitnessUrl::parse(s)
    }
}

fn parse(s: &str) -> Result<WitnessUrl, UrlProblem> {
    if !WitnessUrl::is_witness(s) {
        return Err(UrlProblem::NotWitnessScheme);
    }
    let rest = &s[8..];
    if rest.contains('#') {
        return Err(UrlProblem::Fragment);
    }
    let (kind, query) = rest.split_once('?').unwrap_or((rest, ""));
    if let Some(k) = kind.strip_prefix("//") {
        return Err(UrlProblem::Authority(k.to_string()));
    }
    let (param, kind_name) = match kind {
        "mount" => ("path", "mount"),
        "azblob" => ("uri", "azblob"),
        other => return Err(UrlProblem::UnknownKind(other.to_string())),
    };
    let mut value: Option<String> = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != param {
            return Err(UrlProblem::UnexpectedParameter(redact(k), kind_name, param));
        }
        if value.is_some() {
            return Err(UrlProblem::DuplicateParameter(param));
        }
        let decoded = percent_decode_str(v)
            .decode_utf8()
            .map_err(|_| UrlProblem::BadEscape(param))?;
        value = Some(decoded.into_owned());
    }
    let value = value.ok_or(UrlProblem::MissingParameter(param))?;
    if value.is_empty() {
        return Err(UrlProblem::EmptyParameter(param));
    }
    match kind {
        "mount" => {
            if value.contains('\0') {
                return Err(UrlProblem::NulInPath);
            }
            if !Path::new(&value).is_absolute() {
                return Err(UrlProblem::RelativePath(value));
            }
            Ok(WitnessUrl::Mount {
                path: PathBuf::from(value),
            })
        }
        _ => Ok(WitnessUrl::AzBlob {
            uri: BlobSasUri::parse(&value)?,
        }),
    }
}

/// Replaces the value of any `sig` parameter, escaped or not, with `REDACTED`.
pub fn redact(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    // `sig=` inside a raw URI, or `sig%3D` inside an escaped one (case-insensitive escape).
    loop {
        let lower = rest.to_ascii_lowercase();
        let found = [("sig=", "&"), ("sig%3d", "%26")]
            .iter()
            .filter_map(|(key, sep)| lower.find(key).map(|at| (at, key.len(), *sep)))
            .min_by_key(|(at, _, _)| *at);
        let Some((at, key_len, sep)) = found else {
            out.push_str(rest);
            return out;
        };
        let value_start = at + key_len;
        out.push_str(&rest[..value_start]);
        out.push_str(REDACTED);
        let tail_lower = &lower[value_start..];
        let end = [tail_lower.find(sep), tail_lower.find('&')]
            .into_iter()
            .flatten()
            .min()
            .map_or(rest.len(), |e| value_start + e);
        rest = &rest[end..];
    }
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const AZURITE: &str = "http://127.0.0.1:10000/devstoreaccount1/witness/state?sv=2019-12-12&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00%3A00%3A00Z&spr=http&sig=SECRETSIG%2Babc%3D";
    const AZURE: &str = "https://acct.blob.core.windows.net/cont/dir/witness.st?sv=2022-11-02&sr=b&sp=rw&sig=TOPSECRET";

    fn problem(s: &str) -> UrlProblem {
        match WitnessUrl::parse(s) {
            Err(Error::InvalidUrl { problem, url }) => {
                assert!(!url.contains("SECRET"), "error leaks the signature: {url}");
                problem
            }
            other => panic!("{s}: expected InvalidUrl, got {other:?}"),
        }
    }

    #[test]
    fn a_stored_redacted_uri_takes_a_new_sas_for_the_same_blob() {
        let full = BlobSasUri::parse(AZURE).unwrap();
        let stored = BlobSasUri::parse(&full.redacted()).unwrap();
        assert!(stored.has_redacted_signature() && !full.has_redacted_signature());
        assert!(stored.same_blob(&full));
        let rotated = stored
            .with_sas("?sv=2022-11-02&sr=b&sp=rw&sig=NEWSIG")
            .unwrap();
        assert!(rotated.same_blob(&full));
        assert_eq!(rotated.sas_query(), "sv=2022-11-02&sr=b&sp=rw&sig=NEWSIG");
        assert_eq!(stored.with_sas("sv=1").unwrap_err(), UrlProblem::MissingSas);
        let other = BlobSasUri::parse(AZURITE).unwrap();
        assert!(!other.same_blob(&full));
    }

    #[test]
    fn member_list_form_and_identity_keep_no_secret_and_ignore_the_token() {
        let a = WitnessUrl::AzBlob {
            uri: BlobSasUri::parse(AZURE).unwrap(),
        }
        .to_url_string();
        let other_token = a
            .replace("TOPSECRET", "OTHER")
            .replace("sp%3Drw", "sp%3Drwc");
        let listed = WitnessUrl::member_list_form(&a);
        assert!(
            !listed.contains("TOPSECRET") && listed.contains("REDACTED"),
            "{listed}"
        );
        assert_eq!(WitnessUrl::member_list_form(&listed), listed, "idempotent");
        assert_eq!(WitnessUrl::identity(&a), WitnessUrl::identity(&other_token));
        assert_eq!(WitnessUrl::identity(&a), WitnessUrl::identity(&listed));
        assert!(!WitnessUrl::identity(&a).contains("TOPSECRET"));
        let mount = "witness:mount?path=%2Fsrv%2Fsig%3D1";
        assert_eq!(
            WitnessUrl::member_list_form(mount),
            mount,
            "a mount path is kept"
        );
        assert_eq!(WitnessUrl::identity(mount), mount);
    }

    #[test]
    fn seed_mount_url_parses() {
        let u = WitnessUrl::parse("witness:mount?path=%2Fvar%2Fwitness").unwrap();
        assert_eq!(
            u,
            WitnessUrl::Mount {
                path: "/var/witness".into()
            }
        );
        assert_eq!(u.to_url_string(), "witness:mount?path=%2Fvar%2Fwitness");
        assert_eq!(u.kind(), "mount");
    }

    #[test]
    fn unescaped_absolute_path_is_accepted() {
        let u = WitnessUrl::parse("witness:mount?path=/var/witness").unwrap();
        assert_eq!(
            u,
            WitnessUrl::Mount {
                path: "/var/witness".into()
            }
        );
    }

    #[test]
    fn azurite_blob_url_parses() {
        let s = format!("witness:azblob?uri={}", utf8_percent_encode(AZURITE, VALUE));
        let WitnessUrl::AzBlob { uri } = WitnessUrl::parse(&s).unwrap() else {
            panic!()
        };
        assert_eq!(uri.account(), "devstoreaccount1");
        assert_eq!(uri.container(), "witness");
        assert_eq!(uri.blob(), "state");
        assert!(uri.is_path_style());
        assert_eq!(uri.endpoint(), "http://127.0.0.1:10000/devstoreaccount1");
        assert!(
            uri.sas_pairs()
                .contains(&("sig".into(), "SECRETSIG+abc=".into()))
        );
    }

    #[test]
    fn azure_blob_url_parses_host_style() {
        let s = format!("witness:azblob?uri={}", utf8_percent_encode(AZURE, VALUE));
        let WitnessUrl::AzBlob { uri } = WitnessUrl::parse(&s).unwrap() else {
            panic!()
        };
        assert_eq!(uri.account(), "acct");
        assert_eq!(uri.container(), "cont");
        assert_eq!(uri.blob(), "dir/witness.st");
        assert!(!uri.is_path_style());
        assert_eq!(uri.endpoint(), "https://acct.blob.core.windows.net");
    }

    #[test]
    fn signature_never_shown() {
        let s = format!("witness:azblob?uri={}", utf8_percent_encode(AZURE, VALUE));
        let u = WitnessUrl::parse(&s).unwrap();
        for shown in [format!("{u}"), format!("{u:?}")] {
            assert!(!shown.contains("TOPSECRET"), "{shown}");
            assert!(shown.contains(REDACTED), "{shown}");
        }
        assert!(u.to_url_string().contains("TOPSECRET"));
        let WitnessUrl::AzBlob { uri } = u else {
            panic!()
        };
        assert!(!format!("{uri:?}").contains("TOPSECRET"));
        assert!(!uri.redacted().contains("TOPSECRET"));
    }

    #[test]
    fn redact_handles_raw_and_escaped_forms() {
        assert_eq!(redact("a?sig=XYZ&b=1"), "a?sig=REDACTED&b=1");
        assert_eq!(
            redact("uri=a%3Fsig%3DXYZ%26b%3D1"),
            "uri=a%3Fsig%3DREDACTED%26b%3D1"
        );
        assert_eq!(redact("a?SIG=XYZ"), "a?SIG=REDACTED");
        assert_eq!(redact("nothing here"), "nothing here");
    }

    #[test]
    fn malformed_urls_are_clear_errors() {
        let cases: &[(&str, UrlProblem)] = &[
            ("http://10.0.0.1:2380", UrlProblem::NotWitnessScheme),
            (
                "witness:nfs?path=%2Fx",
                UrlProblem::UnknownKind("nfs".into()),
            ),
            (
                "witness://mount?path=%2Fx",
                UrlProblem::Authority("mount".into()),
            ),
            ("witness:mount", UrlProblem::MissingParameter("path")),
            ("witness:mount?", UrlProblem::MissingParameter("path")),
            ("witness:mount?path=", UrlProblem::EmptyParameter("path")),
            (
                "witness:mount?path=var%2Fw",
                UrlProblem::RelativePath("var/w".into()),
            ),
            (
                "witness:mount?path=%2Fa&path=%2Fb",
                UrlProblem::DuplicateParameter("path"),
            ),
            (
                "witness:mount?path=%2Fa&x=1",
                UrlProblem::UnexpectedParameter("x".into(), "mount", "path"),
            ),
            ("witness:mount?path=%2Fa%00b", UrlProblem::NulInPath),
            ("witness:mount?path=%2Fa%FF", UrlProblem::BadEscape("path")),
            ("witness:mount?path=%2Fa#frag", UrlProblem::Fragment),
            (
                "witness:azblob?path=%2Fa",
                UrlProblem::UnexpectedParameter("path".into(), "azblob", "uri"),
            ),
            (
                "witness:azblob?uri=http%3A%2F%2Facct.blob.core.windows.net%2Fc%2Fb%3Fsig%3Dx",
                UrlProblem::InsecureBlobUri("http".into()),
            ),
            (
                "witness:azblob?uri=ftp%3A%2F%2F127.0.0.1%2Fa%2Fc%2Fb%3Fsig%3Dx",
                UrlProblem::InsecureBlobUri("ftp".into()),
            ),
            (
                "witness:azblob?uri=https%3A%2F%2Facct.blob.core.windows.net%2Fc%3Fsig%3Dx",
                UrlProblem::IncompleteBlobUri,
            ),
            (
                "witness:azblob?uri=http%3A%2F%2F127.0.0.1%3A10000%2Facct%2Fc%3Fsig%3Dx",
                UrlProblem::IncompleteBlobUri,
            ),
            (
                "witness:azblob?uri=https%3A%2F%2Facct.blob.core.windows.net%2Fc%2Fb%3Fsv%3D1",
                UrlProblem::MissingSas,
            ),
            (
                "witness:azblob?uri=not%20a%20url",
                UrlProblem::BadBlobUri("relative URL without a base".into()),
            ),
        ];
        for (s, want) in cases {
            assert_eq!(&problem(s), want, "{s}");
            // The message names the URL and says what to do.
            let msg = WitnessUrl::parse(s).unwrap_err().to_string();
            assert!(msg.starts_with("invalid witness URL"), "{msg}");
        }
    }

    #[test]
    fn malformed_blob_url_error_does_not_leak_signature() {
        let s = "witness:azblob?uri=http%3A%2F%2Facct.example.com%2Fc%2Fb%3Fsig%3DSECRET";
        let msg = WitnessUrl::parse(s).unwrap_err().to_string();
        assert!(!msg.contains("SECRET"), "{msg}");
    }

    proptest! {
        #[test]
        fn mount_urls_round_trip(segments in proptest::collection::vec("[^/\u{0}]{1,12}", 1..5)) {
            let path = PathBuf::from(format!("/{}", segments.join("/")));
            let u = WitnessUrl::Mount { path };
            let s = u.to_url_string();
            prop_assert_eq!(WitnessUrl::parse(&s).unwrap(), u.clone());
            prop_assert_eq!(WitnessUrl::parse(&s).unwrap().to_url_string(), s);
        }

        #[test]
        fn blob_urls_round_trip(
            container in "[a-z0-9]{3,12}", blob in "[A-Za-z0-9][A-Za-z0-9._-]{0,19}",
            sig in "[A-Za-z0-9+/=]{4,44}", port in 1u16..,
        ) {
            let raw = format!(
                "http://127.0.0.1:{port}/devstoreaccount1/{container}/{blob}?sv=2019-12-12&sig={}",
                utf8_percent_encode(&sig, VALUE)
            );
            let s = format!("witness:azblob?uri={}", utf8_percent_encode(&raw, VALUE));
            let u = WitnessUrl::parse(&s).unwrap();
            prop_assert_eq!(WitnessUrl::parse(&u.to_url_string()).unwrap(), u.clone());
            let WitnessUrl::AzBlob { uri } = &u else { panic!() };
            prop_assert_eq!(uri.blob(), blob.as_str());
            prop_assert!(uri.sas_pairs().contains(&("sig".to_string(), sig.clone())));
        }

        #[test]
        fn arbitrary_input_never_panics(s in "witness:[a-z]{0,8}\\?[ -~]{0,40}") {
            let _ = WitnessUrl::parse(&s);
        }
    }
}
