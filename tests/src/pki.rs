//! Throwaway certificates for tests, made at run time: a CA and the certificates it signs
//! (nothing is checked in).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pub pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// Where a certificate, its key and the CA that signed it were written.
#[derive(Debug, Clone)]
pub struct Files {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("a CA certificate");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate with CommonName `cn` for `hosts` (DNS names or IP addresses), good for
    /// serving and as a client certificate: (certificate PEM, key PEM).
    pub fn issue(&self, cn: &str, hosts: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("a key");
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        let mut params = CertificateParams::new(hosts).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// Issues a certificate and writes it, its key and this CA to `dir/<name>.{crt,key}` and
    /// `dir/ca.crt`.
    pub fn write(&self, dir: &Path, name: &str, cn: &str, hosts: &[&str]) -> Files {
        let (cert, key) = self.issue(cn, hosts);
        let files = Files {
            ca: dir.join("ca.crt"),
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::create_dir_all(dir).expect("a directory");
        std::fs::write(&files.ca, &self.pem).expect("writing the CA");
        std::fs::write(&files.cert, cert).expect("writing a certificate");
        std::fs::write(&files.key, key).expect("writing a key");
        files
    }
}
