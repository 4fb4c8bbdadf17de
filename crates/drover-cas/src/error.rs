//! [`CasError`], the one error type of the cache, and a small helper to give
//! I/O errors their context.

use std::io;

use crate::Key;

/// A failure of a cache operation. Whatever the failure, the cache holds
/// nothing half-written: temporary files are removed and committed entries
/// are untouched (except a corrupt artifact found by a check, which is
/// removed).
#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// A file-system or stream operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path involved.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Content does not hash to the digest it was announced with (a blob, a
    /// file in a pack, or a tree).
    #[error("digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The announced digest.
        expected: Key,
        /// The digest of what was received.
        actual: Key,
    },
    /// Stored or received data is malformed (a truncated pack, a bad
    /// manifest, a file that changed on disk).
    #[error("corrupt: {0}")]
    Corrupt(String),
    /// A path or symlink that could escape the artifact, collide with another
    /// entry or is not representable (absolute, `..`, NUL, through a symlink,
    /// duplicate, not UTF-8, too long, special file).
    #[error("unsafe path: {0}")]
    UnsafePath(String),
    /// Something exceeds a limit (the cache size, the number of entries).
    #[error("{what} too large: {size} exceeds the limit of {max}")]
    TooLarge {
        /// What exceeded the limit.
        what: String,
        /// Its size (bytes or entries).
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The artifact is in use (an [`crate::ArtifactGuard`] is alive) and may
    /// not be removed or replaced now.
    #[error("artifact {0} is in use")]
    Pinned(Key),
    /// No such artifact in the cache.
    #[error("artifact {0} is not in the cache")]
    NotFound(Key),
}

impl CasError {
    /// Whether the error says the data itself is bad (as opposed to an I/O
    /// failure or a limit).
    pub fn is_corruption(&self) -> bool {
        matches!(self, CasError::Corrupt(_) | CasError::DigestMismatch { .. } | CasError::UnsafePath(_))
    }
}

/// Attaches a context to an I/O result.
pub(crate) trait IoContext<T> {
    /// Turns an `io::Error` into [`CasError::Io`] with the context `what()`.
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, CasError>;
}

impl<T> IoContext<T> for Result<T, io::Error> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, CasError> {
        self.map_err(|source| CasError::Io { context: what(), source })
    }
}
