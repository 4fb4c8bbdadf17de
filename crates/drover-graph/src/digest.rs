//! [`Digest`]: a BLAKE3 hash, used for source contents and job IDs.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 32-byte BLAKE3 digest. Displays, parses and serializes as 64 lowercase
/// hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Digest(pub [u8; 32]);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// Why a string is not a [`Digest`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseDigestError {
    /// Not 64 characters long.
    #[error("a digest is 64 hex digits, got {0} characters")]
    Length(usize),
    /// A character that is not a hex digit.
    #[error("invalid hex digit {0:?} in digest")]
    Digit(char),
}

impl FromStr for Digest {
    type Err = ParseDigestError;

    /// Parses 64 hex digits (either case).
    fn from_str(s: &str) -> Result<Digest, ParseDigestError> {
        let chars: Vec<char> = s.chars().collect();
        if chars.len() != 64 {
            return Err(ParseDigestError::Length(chars.len()));
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(chars.chunks(2)) {
            let hi = pair[0].to_digit(16).ok_or(ParseDigestError::Digit(pair[0]))?;
            let lo = pair[1].to_digit(16).ok_or(ParseDigestError::Digit(pair[1]))?;
            // Two hex digits always fit in a byte.
            *byte = u8::try_from(hi * 16 + lo).map_err(|_| ParseDigestError::Digit(pair[0]))?;
        }
        Ok(Digest(bytes))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Digest, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl From<blake3::Hash> for Digest {
    fn from(hash: blake3::Hash) -> Digest {
        Digest(*hash.as_bytes())
    }
}

/// The BLAKE3 digest of `bytes`.
pub fn digest_bytes(bytes: &[u8]) -> Digest {
    blake3::hash(bytes).into()
}

/// The BLAKE3 digest of a file's contents.
pub fn digest_file(path: impl AsRef<Path>) -> io::Result<Digest> {
    digest_file_sized(path.as_ref()).map(|(digest, _)| digest)
}

/// The digest and the number of bytes hashed.
pub(crate) fn digest_file_sized(path: &Path) -> io::Result<(Digest, u64)> {
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(File::open(path)?)?;
    Ok((hasher.finalize().into(), hasher.count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let digest = digest_bytes(b"hello");
        let hex = digest.to_string();
        assert_eq!(hex.len(), 64);
        assert_eq!(hex, blake3::hash(b"hello").to_hex().as_str());
        assert_eq!(hex.parse::<Digest>(), Ok(digest));
        assert_eq!(hex.to_uppercase().parse::<Digest>(), Ok(digest));
        assert_eq!("abc".parse::<Digest>(), Err(ParseDigestError::Length(3)));
        let bad = format!("g{}", &hex[1..]);
        assert_eq!(bad.parse::<Digest>(), Err(ParseDigestError::Digit('g')));
    }
}
