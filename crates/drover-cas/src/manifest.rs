//! An artifact's manifest, its tree digest, and the path rules.
//!
//! The **manifest** lists every entry of an artifact except its root: each
//! directory (empty ones included), regular file (executable bit, size, blake3
//! digest of the content) and symlink (target), by relative `/`-separated
//! UTF-8 path, in **canonical order**: lexicographic over the sequence of path
//! components, byte-wise (the order of a depth-first walk visiting siblings by
//! name), so a directory always comes before what it holds.
//!
//! The **tree digest** is blake3 over `b"drover-tree-v1\n"` followed by each
//! entry's record, in canonical order:
//!
//! ```text
//! kind u8 (1 file, 2 dir, 3 symlink) | path_len u32 LE | path
//! file:    exec u8 (0|1) | size u64 LE | digest [32]
//! symlink: target_len u32 LE | target
//! ```
//!
//! **Path rules** (checked on commit and on unpack): a path is non-empty, at
//! most [`MAX_PATH`] bytes, has no NUL, does not start with `/`, and every
//! component is non-empty, not `.` or `..`, and at most [`MAX_NAME`] bytes.
//! A symlink's target is relative, non-empty, NUL-free, at most [`MAX_PATH`]
//! bytes, and resolving it from the link's directory, following the
//! artifact's other symlinks the way the kernel would, never climbs above the
//! artifact's root before [`MAX_HOPS`] symlinks were followed (the kernel
//! gives up at 40, so loops are kept: nothing is reachable through them).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Key;
use crate::error::{CasError, IoContext};

/// The longest relative path (and symlink target), in bytes.
pub const MAX_PATH: usize = 4096;
/// The longest path component, in bytes.
pub const MAX_NAME: usize = 255;
/// The most entries (files, directories, symlinks) one artifact may have.
pub const MAX_ENTRIES: u64 = 1 << 20;
/// The most bytes of entry paths and symlink targets, all together, one
/// artifact may have: with [`MAX_ENTRIES`], this bounds the memory its
/// manifest takes.
pub const MAX_TOTAL_PATH_BYTES: u64 = 64 << 20;
/// The most symlinks followed while resolving one symlink's target (the
/// kernel's own limit is 40).
pub const MAX_HOPS: usize = 40;

pub(crate) const TAG_END: u8 = 0;
pub(crate) const TAG_FILE: u8 = 1;
pub(crate) const TAG_DIR: u8 = 2;
pub(crate) const TAG_SYMLINK: u8 = 3;

/// Size of the buffer used to stream file contents: large enough that the
/// system calls per byte are few, small enough that what was read is still
/// in the core's cache when it is hashed.
pub(crate) const CHUNK: usize = 256 * 1024;

/// What the cache knows about a committed artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactInfo {
    /// The tree digest: blake3 over the canonical manifest.
    pub tree: Key,
    /// Total size of the regular files' contents, in bytes.
    pub size: u64,
    /// Number of regular files.
    pub files: u64,
}

/// One entry of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum Entry {
    Dir { path: String },
    File { path: String, exec: bool, size: u64, digest: Key },
    Symlink { path: String, target: String },
}

impl Entry {
    pub(crate) fn path(&self) -> &str {
        match self {
            Entry::Dir { path } | Entry::File { path, .. } | Entry::Symlink { path, .. } => path,
        }
    }
}

/// An artifact's entries in canonical order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) entries: Vec<Entry>,
}

impl Manifest {
    /// The tree digest, size and file count.
    pub(crate) fn info(&self) -> ArtifactInfo {
        let mut hasher = TreeHasher::new();
        for entry in &self.entries {
            hasher.add(entry);
        }
        hasher.finish()
    }
}

/// Computes the tree digest incrementally, entry by entry.
pub(crate) struct TreeHasher {
    hasher: blake3::Hasher,
    size: u64,
    files: u64,
}

impl TreeHasher {
    pub(crate) fn new() -> TreeHasher {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"drover-tree-v1\n");
        TreeHasher { hasher, size: 0, files: 0 }
    }

    pub(crate) fn add(&mut self, entry: &Entry) {
        let h = &mut self.hasher;
        let mut path = |tag: u8, p: &str| {
            h.update(&[tag]);
            h.update(&len32(p).to_le_bytes());
            h.update(p.as_bytes());
        };
        match entry {
            Entry::Dir { path: p } => path(TAG_DIR, p),
            Entry::File { path: p, exec, size, digest } => {
                path(TAG_FILE, p);
                h.update(&[u8::from(*exec)]);
                h.update(&size.to_le_bytes());
                h.update(digest.as_bytes());
                self.size = self.size.saturating_add(*size);
                self.files += 1;
            }
            Entry::Symlink { path: p, target } => {
                path(TAG_SYMLINK, p);
                h.update(&len32(target).to_le_bytes());
                h.update(target.as_bytes());
            }
        }
    }

    pub(crate) fn finish(&self) -> ArtifactInfo {
        ArtifactInfo { tree: Key::from_hash(self.hasher.finalize()), size: self.size, files: self.files }
    }
}

/// Adds `len` bytes of path or target to the running `total`;
/// [`CasError::TooLarge`] past [`MAX_TOTAL_PATH_BYTES`].
pub(crate) fn count_path_bytes(total: &mut u64, len: usize) -> Result<(), CasError> {
    *total = total.saturating_add(u64::try_from(len).unwrap_or(u64::MAX));
    if *total > MAX_TOTAL_PATH_BYTES {
        return Err(CasError::TooLarge {
            what: "artifact paths and symlink targets".into(),
            size: *total,
            max: MAX_TOTAL_PATH_BYTES,
        });
    }
    Ok(())
}

/// The length of a checked path or target (at most [`MAX_PATH`]) as a u32.
pub(crate) fn len32(s: &str) -> u32 {
    u32::try_from(s.len()).unwrap_or(u32::MAX)
}

/// The parent of a relative path, `None` for a top-level entry.
pub(crate) fn parent(path: &str) -> Option<&str> {
    path.rfind('/').map(|i| &path[..i])
}

/// Canonical order: component-wise, byte-wise.
pub(crate) fn path_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.split('/').cmp(b.split('/'))
}

/// Checks a relative entry path against the path rules.
pub(crate) fn check_rel_path(path: &str) -> Result<(), CasError> {
    let unsafe_path = |why: &str| Err(CasError::UnsafePath(format!("{why}: {:?}", truncate(path))));
    if path.is_empty() {
        return unsafe_path("empty path");
    }
    if path.len() > MAX_PATH {
        return unsafe_path("path too long");
    }
    if path.contains('\0') {
        return unsafe_path("NUL in path");
    }
    if path.starts_with('/') {
        return unsafe_path("absolute path");
    }
    for component in path.split('/') {
        match component {
            "" => return unsafe_path("empty path component"),
            "." | ".." => return unsafe_path("`.` or `..` in path"),
            c if c.len() > MAX_NAME => return unsafe_path("path component too long"),
            _ => {}
        }
    }
    Ok(())
}

/// Checks a symlink's target on its own: relative, well-formed, and not
/// climbing above the root lexically (other symlinks are checked by
/// [`check_links_resolve`] once the whole tree is known).
pub(crate) fn check_link_target(link: &str, target: &str) -> Result<(), CasError> {
    let unsafe_target = |why: &str| {
        Err(CasError::UnsafePath(format!("symlink {:?} -> {:?}: {why}", truncate(link), truncate(target))))
    };
    if target.is_empty() {
        return unsafe_target("empty target");
    }
    if target.len() > MAX_PATH {
        return unsafe_target("target too long");
    }
    if target.contains('\0') {
        return unsafe_target("NUL in target");
    }
    if target.starts_with('/') {
        return unsafe_target("absolute target");
    }
    resolve_link(&BTreeMap::new(), link, target)
}

/// Checks that no symlink of the tree resolves outside it, following chains
/// of symlinks inside the tree.
pub(crate) fn check_links_resolve(entries: &[Entry]) -> Result<(), CasError> {
    let links: BTreeMap<&str, &str> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Symlink { path, target } => Some((path.as_str(), target.as_str())),
            _ => None,
        })
        .collect();
    for (link, target) in &links {
        resolve_link(&links, link, target)?;
    }
    Ok(())
}

/// Resolves `target` from the directory of `link` over the tree's `links`,
/// treating every other name as a directory (the strictest assumption).
fn resolve_link<'a>(
    links: &BTreeMap<&'a str, &'a str>,
    link: &'a str,
    target: &'a str,
) -> Result<(), CasError> {
    let fail = |why: &str| {
        Err(CasError::UnsafePath(format!("symlink {:?} -> {:?}: {why}", truncate(link), truncate(target))))
    };
    let mut at: Vec<&str> = match parent(link) {
        Some(p) => p.split('/').collect(),
        None => Vec::new(),
    };
    let mut pending: Vec<&str> = target.split('/').rev().collect();
    let mut hops = 0;
    while let Some(component) = pending.pop() {
        match component {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return fail("escapes the artifact");
                }
            }
            name => {
                at.push(name);
                if links.is_empty() {
                    continue;
                }
                if let Some(next) = links.get(at.join("/").as_str()) {
                    hops += 1;
                    if hops > MAX_HOPS {
                        // A loop (or a longer chain than the kernel follows):
                        // nothing can be reached through it.
                        return Ok(());
                    }
                    if next.starts_with('/') {
                        return fail("goes through an absolute symlink");
                    }
                    at.pop();
                    pending.extend(next.split('/').rev());
                }
            }
        }
    }
    Ok(())
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Walks the tree at `root` into a canonical manifest, hashing every file.
/// With `sync`, every file and directory is fsynced on the way (commit).
/// Fails on special files, non-UTF-8 names, rule-breaking symlinks, more than
/// [`MAX_ENTRIES`] entries or [`MAX_TOTAL_PATH_BYTES`] of paths, or more
/// than `max_bytes` of content.
pub(crate) fn scan_tree(root: &Path, sync: bool, max_bytes: u64) -> Result<Manifest, CasError> {
    // The root itself is never followed: a job that swapped its output
    // directory for a link would have a directory elsewhere read (and, on
    // commit, sealed) as its output.
    let meta = fs::symlink_metadata(root).ctx(|| format!("read {}", root.display()))?;
    if !meta.is_dir() {
        let what = if meta.is_symlink() { "a symbolic link" } else { "not a directory" };
        return Err(CasError::UnsafePath(format!(
            "the output directory itself is {what} (a job must write into {{{{out}}}}, not replace it)"
        )));
    }
    let mut scan =
        Scan { root, sync, max_bytes, size: 0, path_bytes: 0, entries: Vec::new(), buf: vec![0; CHUNK] };
    scan.dir("")?;
    if sync {
        sync_dir(root)?;
    }
    check_links_resolve(&scan.entries)?;
    Ok(Manifest { entries: scan.entries })
}

struct Scan<'a> {
    root: &'a Path,
    sync: bool,
    max_bytes: u64,
    size: u64,
    /// Bytes of paths and symlink targets so far.
    path_bytes: u64,
    entries: Vec<Entry>,
    buf: Vec<u8>,
}

impl Scan<'_> {
    fn dir(&mut self, rel: &str) -> Result<(), CasError> {
        let dir = if rel.is_empty() { self.root.to_path_buf() } else { self.root.join(rel) };
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).ctx(|| format!("read directory {}", dir.display()))? {
            let entry = entry.ctx(|| format!("read directory {}", dir.display()))?;
            let name = entry.file_name().into_string().map_err(|name| {
                CasError::UnsafePath(format!("name is not UTF-8: {:?} in {}", name, dir.display()))
            })?;
            names.push(name);
        }
        names.sort_unstable();
        for name in names {
            let path = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            check_rel_path(&path)?;
            count_path_bytes(&mut self.path_bytes, path.len())?;
            let full = self.root.join(&path);
            let meta = fs::symlink_metadata(&full).ctx(|| format!("stat {}", full.display()))?;
            let kind = meta.file_type();
            if u64::try_from(self.entries.len()).unwrap_or(u64::MAX) >= MAX_ENTRIES {
                return Err(CasError::TooLarge {
                    what: "artifact entry count".into(),
                    size: MAX_ENTRIES + 1,
                    max: MAX_ENTRIES,
                });
            }
            if kind.is_dir() {
                self.entries.push(Entry::Dir { path: path.clone() });
                self.dir(&path)?;
                if self.sync {
                    sync_dir(&full)?;
                }
            } else if kind.is_file() {
                let exec = meta.permissions().mode() & 0o111 != 0;
                let (digest, size) = self.hash_file(&full)?;
                self.size = self.size.saturating_add(size);
                if self.size > self.max_bytes {
                    return Err(CasError::TooLarge {
                        what: "artifact".into(),
                        size: self.size,
                        max: self.max_bytes,
                    });
                }
                self.entries.push(Entry::File { path, exec, size, digest });
            } else if kind.is_symlink() {
                let target = fs::read_link(&full).ctx(|| format!("read link {}", full.display()))?;
                let target = target.into_os_string().into_string().map_err(|t| {
                    CasError::UnsafePath(format!("symlink target is not UTF-8: {t:?} at {path:?}"))
                })?;
                check_link_target(&path, &target)?;
                count_path_bytes(&mut self.path_bytes, target.len())?;
                self.entries.push(Entry::Symlink { path, target });
            } else {
                return Err(CasError::UnsafePath(format!("not a file, directory or symlink: {path:?}")));
            }
        }
        Ok(())
    }

    fn hash_file(&mut self, path: &Path) -> Result<(Key, u64), CasError> {
        let mut file = File::open(path).ctx(|| format!("open {}", path.display()))?;
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        loop {
            let n = match file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).ctx(|| format!("read {}", path.display())),
            };
            hasher.update(&self.buf[..n]);
            size += n as u64;
        }
        if self.sync {
            file.sync_all().ctx(|| format!("fsync {}", path.display()))?;
        }
        Ok((Key::from_hash(hasher.finalize()), size))
    }
}

/// Fsyncs a directory (its entries).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CasError> {
    File::open(dir).and_then(|d| d.sync_all()).ctx(|| format!("fsync directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(path: &str, target: &str) -> Entry {
        Entry::Symlink { path: path.into(), target: target.into() }
    }

    #[test]
    fn path_rules() {
        for ok in ["a", "a/b", "a.b/c d/é", ".hidden", "a..b"] {
            check_rel_path(ok).unwrap();
        }
        for bad in ["", "/a", "a//b", "a/", "./a", "a/./b", "..", "a/../b", "a\0b", &"x".repeat(256)] {
            assert!(matches!(check_rel_path(bad), Err(CasError::UnsafePath(_))), "{bad:?}");
        }
        check_rel_path(&["y"; 2048].join("/")).unwrap();
        assert!(check_rel_path(&["y"; 2049].join("/")).is_err());
    }

    #[test]
    fn total_path_bytes_are_bounded() {
        let mut total = 0;
        count_path_bytes(&mut total, MAX_PATH).unwrap();
        count_path_bytes(&mut total, usize::try_from(MAX_TOTAL_PATH_BYTES).unwrap() - MAX_PATH).unwrap();
        assert!(matches!(count_path_bytes(&mut total, 1), Err(CasError::TooLarge { .. })));
    }

    #[test]
    fn canonical_order_puts_parents_first() {
        let mut paths = vec!["a.b", "a/b", "a", "b", "a/b/c", "a-"];
        paths.sort_by(|a, b| path_cmp(a, b));
        assert_eq!(paths, ["a", "a/b", "a/b/c", "a-", "a.b", "b"]);
    }

    #[test]
    fn lexical_link_checks() {
        check_link_target("l", "a/b").unwrap();
        check_link_target("d/l", "../a").unwrap();
        check_link_target("d/l", "./x/../../a").unwrap();
        for (l, t) in [("l", "../x"), ("d/l", "../../x"), ("l", "/etc"), ("l", ""), ("l", "a/../../b")] {
            assert!(check_link_target(l, t).is_err(), "{l} -> {t}");
        }
    }

    #[test]
    fn chained_links_cannot_escape() {
        // `s -> .` is harmless alone, but `x -> s/..` then climbs out.
        assert!(check_links_resolve(&[link("s", "."), link("x", "s/..")]).is_err());
        assert!(check_links_resolve(&[link("d/s", ".."), link("x", "d/s/..")]).is_err());
        check_links_resolve(&[link("s", "a/b"), link("x", "s/..")]).unwrap();
        // Loops lead nowhere, so they are kept.
        check_links_resolve(&[link("a", "b"), link("b", "a")]).unwrap();
        check_links_resolve(&[link("a", "a")]).unwrap();
        // Escaping inside a loop's reach is still caught.
        assert!(check_links_resolve(&[link("a", "b/.."), link("b", "..")]).is_err());
    }
}
