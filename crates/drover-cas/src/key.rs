//! [`Key`]: the 32-byte identifier of blobs (their blake3 digest), artifacts
//! (a job's content ID) and trees (the digest of an artifact's manifest).
//!
//! A key prints as 64 lowercase hex digits and parses from 64 hex digits of
//! either case. With serde it is that hex string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 32-byte identifier.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// The blake3 digest of `bytes`: the key of a blob with that content.
    pub fn digest(bytes: &[u8]) -> Key {
        Key(*blake3::hash(bytes).as_bytes())
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64-digit lowercase hex form (the same as `Display`).
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    pub(crate) fn from_hash(hash: blake3::Hash) -> Key {
        Key(*hash.as_bytes())
    }
}

impl From<[u8; 32]> for Key {
    fn from(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = HEX[usize::from(b >> 4)];
            out[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        // Only ASCII hex digits were written.
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// A string that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a key (64 hex digits): {0:?}")]
pub struct ParseKeyError(pub String);

impl FromStr for Key {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<Key, ParseKeyError> {
        let bad = || ParseKeyError(s.chars().take(80).collect());
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(bad());
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut key = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let (Some(hi), Some(lo)) = (nibble(pair[0]), nibble(pair[1])) else {
                return Err(bad());
            };
            key[i] = hi << 4 | lo;
        }
        Ok(Key(key))
    }
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let k = Key::digest(b"hello");
        let s = k.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(s, blake3::hash(b"hello").to_hex().as_str());
        assert_eq!(s.parse::<Key>().unwrap(), k);
        assert_eq!(s.to_uppercase().parse::<Key>().unwrap(), k);
        assert!("abc".parse::<Key>().is_err());
        assert!("g".repeat(64).parse::<Key>().is_err());
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, format!("\"{s}\""));
        assert_eq!(serde_json::from_str::<Key>(&json).unwrap(), k);
    }
}
