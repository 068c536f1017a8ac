//! Maps operating-system errors on the witness directory to witness-core's typed errors.

use std::io;
use std::path::Path;

use witness_core::Error;

/// Turns an I/O error while doing `op` on `path` into the matching typed error.
pub(crate) fn io_error(op: &'static str, path: &Path, e: io::Error) -> Error {
    let location = path.display().to_string();
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => Error::PermissionDenied { op, location },
        Some(libc::ENOSPC | libc::EDQUOT) => Error::NoSpace { op, location },
        Some(libc::EROFS) => Error::ReadOnly { op, location },
        Some(libc::ENOTDIR) => Error::NotADirectory { location },
        _ => Error::Io {
            op,
            location,
            source: e,
        },
    }
}
