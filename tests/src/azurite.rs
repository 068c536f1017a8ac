//! A real Azurite blob service on a free loopback port, one per test that needs it.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::Sha256;

/// Azurite's well-known development account.
pub const ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development key (public; documented by Microsoft).
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A running Azurite blob service. Stopped with SIGTERM on drop.
#[derive(Debug)]
pub struct Azurite {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// Where Azurite is: `$AZURITE_BLOB` or `node_modules/.bin/azurite-blob` in the workspace.
fn azurite_bin() -> PathBuf {
    if let Ok(p) = std::env::var("AZURITE_BLOB") {
        return PathBuf::from(p);
    }
    let p = crate::workspace_root().join("node_modules/.bin/azurite-blob");
    assert!(
        p.exists(),
        "Azurite is not installed at {}: run `npm ci` in the workspace root (the README's test command does), or set AZURITE_BLOB",
        p.display()
    );
    p
}

/// Starts Azurite on `port` with its data (and log, appended) in `dir`.
fn spawn(port: u16, dir: &std::path::Path) -> Child {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("azurite.log"))
        .expect("Azurite log");
    Command::new(azurite_bin())
        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
        .arg("--location")
        .arg(dir)
        .args(["--disableTelemetry", "--skipApiVersionCheck", "--loose"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start Azurite")
}

impl Azurite {
    /// Starts Azurite and waits until it accepts connections. If it exits at start-up (its port
    /// was taken meanwhile), tries again on another port.
    pub fn start() -> Azurite {
        for _ in 0..3 {
            if let Some(az) = Self::try_start() {
                return az;
            }
        }
        panic!("Azurite would not start on three different ports; see its log in the temp dir");
    }

    fn try_start() -> Option<Azurite> {
        let dir = tempfile::tempdir().expect("Azurite data dir");
        let port = crate::free_port();
        let child = spawn(port, dir.path());
        let mut az = Azurite { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // Ready means: something listens on the port AND our child is still alive (a
            // connection could reach another server that took the port first).
            let listening = TcpStream::connect(("127.0.0.1", port)).is_ok();
            if let Ok(Some(status)) = az.child.try_wait() {
                let log =
                    std::fs::read_to_string(az.dir.path().join("azurite.log")).unwrap_or_default();
                eprintln!("Azurite on port {port} exited at start-up ({status}): {log}");
                return None;
            }
            if listening {
                return Some(az);
            }
            assert!(
                Instant::now() < deadline,
                "Azurite did not listen on {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops Azurite cleanly (SIGTERM; it persists its data), for [`Azurite::restart`].
    pub fn stop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }

    /// Starts Azurite again after [`Azurite::stop`], on the same port and data.
    pub fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.child = spawn(self.port, self.dir.path());
            while Instant::now() < deadline {
                if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    return;
                }
                if let Ok(Some(_)) = self.child.try_wait() {
                    break; // (its port not free yet: try again)
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                Instant::now() < deadline,
                "Azurite did not start again on port {} within 60 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The account endpoint, path-style: `http://127.0.0.1:PORT/devstoreaccount1`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// Creates a container (idempotent).
    pub fn create_container(&self, container: &str) {
        let url = format!(
            "{}/{container}?restype=container&{}",
            self.endpoint(),
            account_sas()
        );
        let resp = reqwest::blocking::Client::new()
            .put(url)
            .header("Content-Length", "0")
            .send()
            .expect("create container request");
        let status = resp.status().as_u16();
        assert!(
            status == 201 || status == 409,
            "create container {container}: HTTP {status}"
        );
    }

    /// A blob SAS URI (raw, not escaped) for `container/blob`.
    pub fn blob_sas_uri(&self, container: &str, blob: &str) -> String {
        format!("{}/{container}/{blob}?{}", self.endpoint(), account_sas())
    }

    /// The bytes of a blob, `None` if it does not exist (blocking; call from a plain thread).
    pub fn get_blob(&self, container: &str, blob: &str) -> Option<Vec<u8>> {
        let resp = reqwest::blocking::get(self.blob_sas_uri(container, blob)).expect("GET blob");
        match resp.status().as_u16() {
            404 => None,
            200 => Some(resp.bytes().expect("blob body").to_vec()),
            other => panic!("GET {container}/{blob}: HTTP {other}"),
        }
    }

    /// Overwrites a blob unconditionally, behind the witness's back (blocking).
    pub fn put_blob(&self, container: &str, blob: &str, bytes: &[u8]) {
        let resp = reqwest::blocking::Client::new()
            .put(self.blob_sas_uri(container, blob))
            .header("x-ms-blob-type", "BlockBlob")
            .body(bytes.to_vec())
            .send()
            .expect("PUT blob");
        assert_eq!(resp.status().as_u16(), 201, "PUT {container}/{blob}");
    }

    /// The `witness:azblob?uri=...` URL for `container/blob`, creating the container.
    pub fn witness_url(&self, container: &str, blob: &str) -> String {
        self.create_container(container);
        format!(
            "witness:azblob?uri={}",
            utf8_percent_encode(&self.blob_sas_uri(container, blob), NON_ALPHANUMERIC)
        )
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        // SIGTERM, then wait: Azurite persists its metadata on a clean stop.
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        if crate::within(Duration::from_secs(20), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        }) {
            return;
        }
        eprintln!("Azurite did not stop within 20 s of SIGTERM; leaving it to the OS");
    }
}

/// An account SAS (service version 2019-12-12) for Azurite's development account: blob service,
/// service/container/object resources, read/write/delete/list/add/create, valid until 2099.
pub fn account_sas() -> String {
    account_sas_until("2099-01-01T00:00:00Z")
}

/// As [`account_sas`], expiring at `se` (UTC, `YYYY-MM-DDTHH:MM:SSZ`; see [`utc_in`]).
pub fn account_sas_until(se: &str) -> String {
    let (sv, ss, srt, sp) = ("2019-12-12", "b", "sco", "rwdlac");
    // StringToSign for an account SAS before version 2020-12-06:
    // account, permissions, services, resource types, start, expiry, IP, protocol, version.
    let string_to_sign = format!("{ACCOUNT}\n{sp}\n{ss}\n{srt}\n\n{se}\n\n\n{sv}\n");
    let key = base64::engine::general_purpose::STANDARD
        .decode(ACCOUNT_KEY)
        .expect("well-known key is base64");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(string_to_sign.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!(
        "sv={sv}&ss={ss}&srt={srt}&sp={sp}&se={}&sig={}",
        utf8_percent_encode(se, NON_ALPHANUMERIC),
        utf8_percent_encode(&sig, NON_ALPHANUMERIC)
    )
}

/// The UTC time `from_now` ahead, as a SAS expiry (`YYYY-MM-DDTHH:MM:SSZ`).
pub fn utc_in(from_now: Duration) -> String {
    let t = (std::time::SystemTime::now() + from_now)
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}
