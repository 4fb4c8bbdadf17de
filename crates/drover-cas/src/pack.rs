//! The pack format: one artifact as a single byte stream, to move it between
//! machines. Written and read in one pass with bounded memory (file contents
//! go through a 256 KiB buffer), and verified while it is read.
//!
//! All integers are little-endian. A pack is:
//!
//! ```text
//! header:   magic b"DRVPACK\0" (8 bytes) | version u32 (= 1)
//! entries, in canonical order (see `manifest`), each one of:
//!   dir:     kind u8 = 2 | path_len u32 | path
//!   symlink: kind u8 = 3 | path_len u32 | path | target_len u32 | target
//!   file:    kind u8 = 1 | path_len u32 | path | exec u8 (0|1) | size u64
//!            | content (size bytes) | digest [32] (blake3 of the content)
//! trailer:  kind u8 = 0 | entry count u64 | total file size u64
//!           | tree digest [32]
//! ```
//!
//! Paths and targets are UTF-8, `/`-separated and relative. The file digest
//! follows the content so the packer can hash while it streams and stop
//! (leaving a truncated, hence rejected, stream) if the stored file no longer
//! matches its manifest.
//!
//! The reader enforces, before writing anything for an entry: the path rules
//! of `manifest` (no absolute path, no `.`/`..`, no NUL, length limits);
//! strictly increasing canonical order (so no duplicates); that the parent of
//! every entry is a directory entry seen earlier in the pack (so no entry is
//! created through a symlink, and files are created with `O_EXCL`); that
//! symlink targets are relative and do not climb out lexically; the limits
//! on the entry count and on the total bytes of paths and targets; and that
//! the running total of file sizes stays within the cache's `max_bytes`.
//! Each file's content is hashed as it is written and compared with its
//! digest. At the trailer: every symlink is resolved over the whole tree
//! (chains included), the count and size must match, and the tree digest
//! computed from the entries must equal the trailer's and the caller's
//! expected one. The reader never reads past the trailer, so a pack
//! can be embedded in a longer stream (give it a buffered reader).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::path::Path;

use crate::error::{CasError, IoContext};
use crate::fsutil::{WriteBehind, copy_stored_file, set_exec};
use crate::manifest::{
    CHUNK, Entry, MAX_ENTRIES, MAX_PATH, Manifest, TAG_DIR, TAG_END, TAG_FILE, TAG_SYMLINK, TreeHasher,
    check_link_target, check_links_resolve, check_rel_path, count_path_bytes, len32, parent, path_cmp,
    sync_dir,
};
use crate::{ArtifactInfo, Key};

/// The first bytes of every pack.
pub const PACK_MAGIC: &[u8; 8] = b"DRVPACK\0";
/// The pack format version this crate writes and reads.
pub const PACK_VERSION: u32 = 1;
/// Bytes before a pack's first entry tag: the magic and the version.
pub(crate) const HEAD_LEN: usize = 12;

/// Whether an entry tag ends the pack's entries.
pub(crate) fn is_end_tag(tag: u8) -> bool {
    tag == TAG_END
}

/// Writes the artifact whose files are under `root` as a pack.
pub(crate) fn write_pack(
    root: &Path,
    manifest: &Manifest,
    info: &ArtifactInfo,
    out: &mut dyn Write,
) -> Result<(), CasError> {
    let write_err = |source| CasError::Io { context: "write pack stream".into(), source };
    let mut w = BufWriter::with_capacity(CHUNK, out);
    let put = |w: &mut BufWriter<&mut dyn Write>, bytes: &[u8]| w.write_all(bytes).map_err(write_err);
    put(&mut w, PACK_MAGIC)?;
    put(&mut w, &PACK_VERSION.to_le_bytes())?;
    for entry in &manifest.entries {
        let (tag, path) = match entry {
            Entry::Dir { path } => (TAG_DIR, path),
            Entry::File { path, .. } => (TAG_FILE, path),
            Entry::Symlink { path, .. } => (TAG_SYMLINK, path),
        };
        put(&mut w, &[tag])?;
        put(&mut w, &len32(path).to_le_bytes())?;
        put(&mut w, path.as_bytes())?;
        match entry {
            Entry::Dir { .. } => {}
            Entry::Symlink { target, .. } => {
                put(&mut w, &len32(target).to_le_bytes())?;
                put(&mut w, target.as_bytes())?;
            }
            Entry::File { path, exec, size, digest } => {
                put(&mut w, &[u8::from(*exec)])?;
                put(&mut w, &size.to_le_bytes())?;
                copy_stored_file(&root.join(path), *size, digest, &mut w, &write_err).map_err(
                    |e| match e {
                        CasError::DigestMismatch { .. } => {
                            CasError::Corrupt(format!("stored file {path:?} no longer matches its manifest"))
                        }
                        other => other,
                    },
                )?;
                put(&mut w, digest.as_bytes())?;
            }
        }
    }
    put(&mut w, &[TAG_END])?;
    put(&mut w, &(manifest.entries.len() as u64).to_le_bytes())?;
    put(&mut w, &info.size.to_le_bytes())?;
    put(&mut w, info.tree.as_bytes())?;
    w.flush().map_err(write_err)
}

/// Reads exactly what it is asked for from the stream.
struct Input<'a> {
    input: &'a mut dyn Read,
}

impl Input<'_> {
    fn exact(&mut self, buf: &mut [u8]) -> Result<(), CasError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => CasError::Corrupt("pack stream truncated".into()),
            _ => CasError::Io { context: "read pack stream".into(), source: e },
        })
    }

    fn u8(&mut self) -> Result<u8, CasError> {
        let mut b = [0u8; 1];
        self.exact(&mut b)?;
        Ok(b[0])
    }

    fn u32(&mut self) -> Result<u32, CasError> {
        let mut b = [0u8; 4];
        self.exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, CasError> {
        let mut b = [0u8; 8];
        self.exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn key(&mut self) -> Result<Key, CasError> {
        let mut b = [0u8; 32];
        self.exact(&mut b)?;
        Ok(Key(b))
    }

    /// A length-prefixed UTF-8 string of at most [`MAX_PATH`] bytes.
    fn string(&mut self, what: &str) -> Result<String, CasError> {
        let len = self.u32()?;
        if usize::try_from(len).map_or(true, |l| l > MAX_PATH) {
            return Err(CasError::UnsafePath(format!("{what} of {len} bytes is too long")));
        }
        let mut buf = vec![0u8; len as usize];
        self.exact(&mut buf)?;
        String::from_utf8(buf).map_err(|e| {
            CasError::UnsafePath(format!("{what} is not UTF-8: {:?}", String::from_utf8_lossy(e.as_bytes())))
        })
    }
}

/// Reads a pack into the empty directory `root`, verifying everything (see
/// the module doc). On error, `root` may hold a partial tree: the caller
/// removes it.
pub(crate) fn read_pack(
    input: &mut dyn Read,
    root: &Path,
    max_bytes: u64,
    expected_tree: Option<&Key>,
    sync: bool,
) -> Result<(Manifest, ArtifactInfo), CasError> {
    let mut input = Input { input };
    let mut magic = [0u8; 8];
    input.exact(&mut magic)?;
    if &magic != PACK_MAGIC {
        return Err(CasError::Corrupt("not a drover pack (bad magic)".into()));
    }
    let version = input.u32()?;
    if version != PACK_VERSION {
        return Err(CasError::Corrupt(format!("unsupported pack version {version}")));
    }
    let mut tree = TreeHasher::new();
    let mut entries: Vec<Entry> = Vec::new();
    let mut dirs: BTreeSet<String> = BTreeSet::new();
    let mut total = 0u64;
    let mut path_bytes = 0u64;
    // Allocated at the first file: an empty pack or one of directories and
    // links needs no buffer.
    let mut buf = Vec::new();
    loop {
        let tag = input.u8()?;
        if tag == TAG_END {
            break;
        }
        if !matches!(tag, TAG_FILE | TAG_DIR | TAG_SYMLINK) {
            return Err(CasError::Corrupt(format!("unknown entry kind {tag}")));
        }
        let path = input.string("path")?;
        check_rel_path(&path)?;
        count_path_bytes(&mut path_bytes, path.len())?;
        if let Some(prev) = entries.last()
            && path_cmp(prev.path(), &path) != std::cmp::Ordering::Less
        {
            return Err(CasError::UnsafePath(format!(
                "entry {path:?} is a duplicate or out of order (after {:?})",
                prev.path()
            )));
        }
        if let Some(dir) = parent(&path)
            && !dirs.contains(dir)
        {
            return Err(CasError::UnsafePath(format!("parent of {path:?} is not a directory of the pack")));
        }
        if entries.len() as u64 >= MAX_ENTRIES {
            return Err(CasError::TooLarge {
                what: "pack entry count".into(),
                size: MAX_ENTRIES + 1,
                max: MAX_ENTRIES,
            });
        }
        let full = root.join(&path);
        let entry = match tag {
            TAG_DIR => {
                fs::create_dir(&full).ctx(|| format!("create directory {}", full.display()))?;
                dirs.insert(path.clone());
                Entry::Dir { path }
            }
            TAG_SYMLINK => {
                let target = input.string("symlink target")?;
                check_link_target(&path, &target)?;
                count_path_bytes(&mut path_bytes, target.len())?;
                std::os::unix::fs::symlink(&target, &full)
                    .ctx(|| format!("create symlink {}", full.display()))?;
                Entry::Symlink { path, target }
            }
            _ => {
                let exec = match input.u8()? {
                    0 => false,
                    1 => true,
                    other => return Err(CasError::Corrupt(format!("bad exec flag {other} for {path:?}"))),
                };
                let size = input.u64()?;
                total = total.saturating_add(size);
                if total > max_bytes {
                    return Err(CasError::TooLarge { what: "pack".into(), size: total, max: max_bytes });
                }
                if buf.is_empty() {
                    buf = vec![0u8; CHUNK];
                }
                let digest = read_file(&mut input, &full, size, exec, &mut buf, sync)?;
                Entry::File { path, exec, size, digest }
            }
        };
        tree.add(&entry);
        entries.push(entry);
    }
    check_links_resolve(&entries)?;
    let count = input.u64()?;
    let size = input.u64()?;
    let trailer_tree = input.key()?;
    let info = tree.finish();
    if count != entries.len() as u64 || size != info.size {
        return Err(CasError::Corrupt(format!(
            "trailer says {count} entries and {size} bytes; the pack held {} entries and {} bytes",
            entries.len(),
            info.size
        )));
    }
    if trailer_tree != info.tree {
        return Err(CasError::DigestMismatch { expected: trailer_tree, actual: info.tree });
    }
    if let Some(expected) = expected_tree
        && *expected != info.tree
    {
        return Err(CasError::DigestMismatch { expected: *expected, actual: info.tree });
    }
    if sync {
        for dir in dirs.iter().rev() {
            sync_dir(&root.join(dir))?;
        }
        // An empty pack created nothing under `root` (which need not exist).
        if !entries.is_empty() {
            sync_dir(root)?;
        }
    }
    Ok((Manifest { entries }, info))
}

/// Streams `size` bytes of content into a new file at `full`, then reads and
/// checks the digest that follows. Returns the digest.
fn read_file(
    input: &mut Input<'_>,
    full: &Path,
    size: u64,
    exec: bool,
    buf: &mut [u8],
    sync: bool,
) -> Result<Key, CasError> {
    let file = File::options()
        .write(true)
        .create_new(true)
        .open(full)
        .ctx(|| format!("create {}", full.display()))?;
    let mut out = BufWriter::with_capacity(CHUNK, WriteBehind::new(&file));
    let mut hasher = blake3::Hasher::new();
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match input.input.read(&mut buf[..want]) {
            Ok(0) => return Err(CasError::Corrupt("pack stream truncated".into())),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).ctx(|| "read pack stream".into()),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).ctx(|| format!("write {}", full.display()))?;
        left -= n as u64;
    }
    out.flush().ctx(|| format!("write {}", full.display()))?;
    drop(out);
    let expected = input.key()?;
    let actual = Key::from_hash(hasher.finalize());
    if actual != expected {
        return Err(CasError::DigestMismatch { expected, actual });
    }
    set_exec(&file, exec, full)?;
    if sync {
        file.sync_all().ctx(|| format!("fsync {}", full.display()))?;
    }
    Ok(actual)
}
