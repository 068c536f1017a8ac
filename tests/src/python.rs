//! A Python virtual environment with the pinned etcd v3 client of `tests/python/` (created in
//! `target/python-venv` on first use, from PyPI; recreated when `requirements.txt` changes).

use std::path::PathBuf;
use std::process::Command;

use crate::workspace_root;

/// The venv's `python`, with `tests/python/requirements.txt` installed. Panics with the
/// command's output (and how to fix it) when the venv cannot be made.
pub fn python_with_client() -> PathBuf {
    let root = workspace_root();
    let requirements = root.join("tests/python/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("tests/python/requirements.txt");
    let venv = root.join("target/python-venv");
    let stamp = venv.join("installed-requirements.txt");
    let python = venv.join("bin/python");
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&wanted) {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv (Debian: apt-get install python3-venv)",
    );
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&requirements),
        "pip install -r tests/python/requirements.txt (needs PyPI)",
    );
    std::fs::write(&stamp, wanted).expect("write the venv's stamp");
    python
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
