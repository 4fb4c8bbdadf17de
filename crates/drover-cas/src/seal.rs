//! Sealed trees: how a committed artifact's files are kept from change, and
//! how a change is noticed anyway.
//!
//! Jobs read their dependencies' outputs where the cache keeps them, so a
//! job that wrote into one (`ranlib`, `sed -i`, `touch` on a file it was
//! given) would change a committed artifact for every later reader. When an
//! artifact is put in place, its tree is **sealed**: files read-only
//! (`0444`, `0555` if executable), directories `0555`, and every file and
//! directory given the same modification time, [`SEALED_MTIME`] (one second
//! after the epoch, as in the Nix store). Permissions stop a job that runs
//! as another user than the cache's owner, or as the owner without first
//! making the files writable again. Root ignores them; but any write
//! moves a file's modification time, and adding, removing or renaming an
//! entry moves its directory's, so [`first_change`] finds what a job did
//! by walking the tree once, with no record of its own to compare with.
//! (Symbolic links are left alone: replacing one moves its directory's
//! time.)

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The modification time of every file and directory of a sealed tree,
/// in seconds after the epoch.
pub(crate) const SEALED_MTIME: u64 = 1;

fn sealed_mtime() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(SEALED_MTIME)
}

/// Seals the tree at `root`: entries first, then the directories holding
/// them (a directory's time is set after its entries are done with).
pub(crate) fn seal(root: &Path) -> io::Result<()> {
    // Writable while it is worked on (a job may have left it read-only): a
    // hard-linked file's copy is made in it.
    let _ = fs::set_permissions(root, fs::Permissions::from_mode(0o755));
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        if kind.is_dir() {
            seal(&path)?;
        } else if kind.is_file() {
            // A file with other names (a job's `ln` of a file elsewhere, a
            // tool's hard-linked store) is copied first: sealing it in place
            // would make the other names read-only and old too.
            if entry.metadata()?.nlink() > 1 {
                let copy = root.join(format!(".{}.drover-copy", entry.file_name().to_string_lossy()));
                fs::copy(&path, &copy)?;
                fs::rename(&copy, &path)?;
            }
            let file = File::open(&path)?;
            let exec = file.metadata()?.permissions().mode() & 0o111 != 0;
            file.set_permissions(fs::Permissions::from_mode(if exec { 0o555 } else { 0o444 }))?;
            file.set_modified(sealed_mtime())?;
        }
    }
    let dir = File::open(root)?;
    dir.set_permissions(fs::Permissions::from_mode(0o555))?;
    dir.set_modified(sealed_mtime())
}

/// The first entry of the sealed tree at `root` (a path relative to it, `.`
/// for the root itself) whose modification time or permissions are not the
/// seal's, if any: a file written to or made writable, or a directory whose
/// entries changed.
pub(crate) fn first_change(root: &Path) -> io::Result<Option<String>> {
    if !sealed(&fs::symlink_metadata(root)?)? {
        return Ok(Some(".".into()));
    }
    changed_within(root, "")
}

/// Whether an entry still has a seal's time and permissions (a tree made
/// writable again is no longer sealed, though nothing in it changed yet).
fn sealed(meta: &fs::Metadata) -> io::Result<bool> {
    let mode = meta.permissions().mode() & 0o777;
    let mode_ok = if meta.is_dir() { mode == 0o555 } else { mode == 0o444 || mode == 0o555 };
    Ok(mode_ok && meta.modified()? == sealed_mtime())
}

fn changed_within(dir: &Path, rel: &str) -> io::Result<Option<String>> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_symlink() {
            continue;
        }
        let name = entry.file_name();
        let path = if rel.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{rel}/{}", name.to_string_lossy())
        };
        if !sealed(&meta)? {
            return Ok(Some(path));
        }
        if meta.is_dir()
            && let Some(changed) = changed_within(&entry.path(), &path)?
        {
            return Ok(Some(changed));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed tree is read-only with one time everywhere; writing a file,
    /// adding or removing one, each shows as a change at the right path.
    #[test]
    fn a_change_to_a_sealed_tree_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("lib/sub")).unwrap();
        fs::write(root.join("a.txt"), "a").unwrap();
        fs::write(root.join("lib/sub/b.txt"), "b").unwrap();
        fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
        seal(&root).unwrap();
        let mode = |p: &str| fs::symlink_metadata(root.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode("a.txt"), mode("run.sh"), mode("lib/sub"), mode(".")), (0o444, 0o555, 0o555, 0o555));
        assert_eq!(first_change(&root).unwrap(), None);

        // A file with another name outside is copied: the other stays as it was.
        let outside = dir.path().join("outside.txt");
        fs::write(&outside, "o").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        fs::hard_link(&outside, root.join("linked.txt")).unwrap();
        seal(&root).unwrap();
        assert_eq!(mode(&outside.to_string_lossy()), 0o644);
        assert_eq!(fs::read_to_string(root.join("linked.txt")).unwrap(), "o");
        assert_eq!(first_change(&root).unwrap(), None);

        // A file made writable is no longer sealed.
        let writable =
            |p: &str, mode| fs::set_permissions(root.join(p), fs::Permissions::from_mode(mode)).unwrap();
        writable("lib/sub/b.txt", 0o644);
        assert_eq!(first_change(&root).unwrap().as_deref(), Some("lib/sub/b.txt"));
        // Nor one written to, even read-only again (as root writes).
        seal(&root).unwrap();
        writable("lib/sub/b.txt", 0o644);
        fs::write(root.join("lib/sub/b.txt"), "changed").unwrap();
        writable("lib/sub/b.txt", 0o444);
        assert_eq!(first_change(&root).unwrap().as_deref(), Some("lib/sub/b.txt"));

        seal(&root).unwrap();
        writable("lib", 0o755);
        fs::write(root.join("lib/new.o"), "").unwrap();
        assert_eq!(first_change(&root).unwrap().as_deref(), Some("lib"));

        seal(&root).unwrap();
        writable(".", 0o755);
        fs::remove_file(root.join("a.txt")).unwrap();
        assert_eq!(first_change(&root).unwrap().as_deref(), Some("."));
    }
}
