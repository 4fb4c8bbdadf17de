//! Source files: expanding the `sources` globs against the build directory,
//! selecting a job's `inputs` among them, and hashing them.
//!
//! The walk only descends into directories a pattern can still match, and
//! follows a symbolic link (to a file or a directory) only when its target
//! is inside the build directory: the files under a linked directory are
//! sources at the link's path (`src/inc -> ../include` gives
//! `src/inc/a.h`), as a compiler given `-Isrc/inc` reads them. A link to a
//! directory it is already in (a loop), one leading outside the build
//! directory, and one into the directory the walk must not enter (even
//! through another link) are passed over.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Diagnostics, GraphError};
use crate::glob::{Pattern, States};
use crate::schema::Located;
use crate::{SourceFile, digest};

/// Expands every `sources` pattern under `root`: the sorted, deduplicated
/// relative paths of the files matched, never entering the directory
/// `excluded` (relative to `root`). A pattern that is invalid or matches
/// no file is a diagnostic; an unreadable directory is an error.
pub(crate) fn expand(
    root: &Path,
    patterns: &[Located<String>],
    excluded: Option<&str>,
    diags: &mut Diagnostics,
) -> Result<Vec<String>, GraphError> {
    let mut walker = Walker {
        root,
        excluded,
        canonical_root: None,
        canonical_excluded: None,
        entered: Vec::new(),
        found: Vec::new(),
        problems: Vec::new(),
    };
    let mut all = Vec::new();
    let mut walked = std::collections::BTreeSet::new();
    for located in patterns {
        // A pattern given again matches the same files: one walk is enough.
        if !walked.insert(located.value.as_str()) {
            continue;
        }
        let pattern = match Pattern::parse(&located.value) {
            Ok(pattern) => pattern,
            Err(error) => {
                diags.push(Some(located.line), None, format!("source pattern {:?} {error}", located.value));
                continue;
            }
        };
        walker.walk(&pattern, root, "", &pattern.start())?;
        for problem in walker.problems.drain(..) {
            diags.push(Some(located.line), None, problem);
        }
        if walker.found.is_empty() {
            let hint = match pattern.literal_path() {
                Some(path) if leads_outside(root, &root.join(&path)) => {
                    " (it is a symbolic link to a directory outside the build directory, and those are not \
                     followed)"
                        .to_owned()
                }
                Some(path) if root.join(&path).is_dir() => format!(" (it is a directory: use \"{path}/**\")"),
                _ => String::new(),
            };
            diags.push(
                Some(located.line),
                None,
                format!("source pattern {:?} matches no file{hint}", located.value),
            );
        }
        all.append(&mut walker.found);
    }
    all.sort_unstable();
    all.dedup();
    Ok(all)
}

struct Walker<'a> {
    root: &'a Path,
    /// A directory not to enter, relative to the root.
    excluded: Option<&'a str>,
    canonical_root: Option<PathBuf>,
    /// The excluded directory's own path, once needed (links may lead
    /// into it).
    canonical_excluded: Option<Option<PathBuf>>,
    /// The directories the walk entered through links, down to where it
    /// is (their own paths): a link to one of them, or to a directory
    /// holding one, is a loop.
    entered: Vec<PathBuf>,
    /// Files matched by the current pattern.
    found: Vec<String>,
    /// Problems met while matching the current pattern.
    problems: Vec<String>,
}

impl Walker<'_> {
    fn walk(&mut self, pattern: &Pattern, dir: &Path, rel: &str, states: &States) -> Result<(), GraphError> {
        let io_error = |source| GraphError::Io { path: dir.to_owned(), source };
        let mut entries =
            fs::read_dir(dir).and_then(Iterator::collect::<io::Result<Vec<_>>>).map_err(io_error)?;
        entries.sort_by_key(fs::DirEntry::file_name);
        for entry in entries {
            let file_name = entry.file_name();
            let lossy = file_name.to_string_lossy();
            let next = pattern.step(states, &lossy);
            if next.is_dead() {
                continue;
            }
            let rel_path = if rel.is_empty() { lossy.to_string() } else { format!("{rel}/{lossy}") };
            if file_name.to_str().is_none() {
                self.problems.push(format!("source path {rel_path:?} is not valid UTF-8"));
                continue;
            }
            let path = entry.path();
            let file_type =
                entry.file_type().map_err(|source| GraphError::Io { path: path.clone(), source })?;
            if file_type.is_dir() {
                // Under a followed link, a directory's path says nothing
                // of where it is: the excluded one is known by its own.
                let excluded = self.excluded == Some(rel_path.as_str())
                    || (!self.entered.is_empty()
                        && fs::canonicalize(&path).is_ok_and(|t| self.is_excluded(&t)));
                if !excluded {
                    self.walk(pattern, &path, &rel_path, &next)?;
                }
            } else if file_type.is_symlink() && path.is_dir() {
                self.linked_dir(pattern, &path, &rel_path, &next)?;
            } else if !pattern.accepts(&next) {
                continue;
            } else if file_type.is_file() {
                self.found.push(rel_path);
            } else if file_type.is_symlink() {
                self.symlink(&path, rel_path)?;
            }
        }
        Ok(())
    }

    /// A link to a directory the pattern may match under: walked at the
    /// link's path if it leads inside the root (but for a loop, or into
    /// the excluded directory), passed over otherwise (a pattern naming
    /// it alone says why it matched nothing).
    fn linked_dir(
        &mut self,
        pattern: &Pattern,
        path: &Path,
        rel_path: &str,
        states: &States,
    ) -> Result<(), GraphError> {
        let Ok(target) = fs::canonicalize(path) else { return Ok(()) };
        if !target.starts_with(self.canonical_root()?) {
            return Ok(());
        }
        if self.is_excluded(&target) {
            return Ok(());
        }
        // A link to a directory it is in (a loop) is passed over: walked,
        // it would lead back without end.
        let within = path.parent().and_then(|p| fs::canonicalize(p).ok());
        if within.is_some_and(|w| w.starts_with(&target))
            || self.entered.iter().any(|e| e.starts_with(&target))
        {
            return Ok(());
        }
        self.entered.push(target);
        let walked = self.walk(pattern, path, rel_path, states);
        self.entered.pop();
        walked
    }

    /// Whether `target` (a path resolved) is in the excluded directory.
    fn is_excluded(&mut self, target: &Path) -> bool {
        let excluded = match &self.canonical_excluded {
            Some(excluded) => excluded,
            None => {
                let excluded = self.excluded.and_then(|e| fs::canonicalize(self.root.join(e)).ok());
                self.canonical_excluded.insert(excluded)
            }
        };
        excluded.as_ref().is_some_and(|e| target.starts_with(e))
    }

    fn canonical_root(&mut self) -> Result<&Path, GraphError> {
        if self.canonical_root.is_none() {
            let root = fs::canonicalize(self.root)
                .map_err(|source| GraphError::Io { path: self.root.to_owned(), source })?;
            self.canonical_root = Some(root);
        }
        Ok(self.canonical_root.as_deref().expect("set above"))
    }

    /// A matched symbolic link that does not lead to a directory: kept if
    /// it leads to a file inside the root.
    fn symlink(&mut self, path: &Path, rel_path: String) -> Result<(), GraphError> {
        let target = match fs::canonicalize(path) {
            Ok(target) => target,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                self.problems.push(format!("source {rel_path:?} is a dangling symbolic link"));
                return Ok(());
            }
            Err(error) => {
                // A loop of links (ELOOP), a link through a file, ...: a
                // problem of this source, reported with the others.
                self.problems
                    .push(format!("source {rel_path:?} is a symbolic link that cannot be followed: {error}"));
                return Ok(());
            }
        };
        if !target.starts_with(self.canonical_root()?) {
            self.problems.push(format!(
                "source {rel_path:?} is a symbolic link to {}, outside the build directory",
                target.display()
            ));
        } else if target.is_file() {
            self.found.push(rel_path);
        }
        Ok(())
    }
}

/// Whether `path` is a symbolic link to a directory outside `root`.
fn leads_outside(root: &Path, path: &Path) -> bool {
    let link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let target = fs::canonicalize(path).ok().filter(|t| t.is_dir());
    link && target.is_some_and(|t| fs::canonicalize(root).is_ok_and(|root| !t.starts_with(root)))
}

/// The sources matched by each of a job's `inputs` patterns (sorted, without
/// repeats). Each pattern must be valid and match at least one source; one
/// that does not says why when it can: the build has no `sources`, or the
/// file it names is in `root` but no `sources` pattern takes it in.
pub(crate) fn select(
    root: &Path,
    sources: &[String],
    inputs: &[Located<String>],
    job: Option<&str>,
    diags: &mut Diagnostics,
) -> Vec<String> {
    let mut selected = Vec::new();
    for located in inputs {
        match Pattern::parse(&located.value) {
            Err(error) => {
                diags.push(Some(located.line), job, format!("inputs pattern {:?} {error}", located.value))
            }
            Ok(pattern) => {
                let before = selected.len();
                selected.extend(sources.iter().filter(|path| pattern.matches(path)).cloned());
                if selected.len() == before {
                    let why = if sources.is_empty() {
                        " (the build file's `sources` names no file: `inputs` picks among those it names)"
                    } else if pattern.literal_path().is_some_and(|p| root.join(p).is_file()) {
                        " (the file exists, but no `sources` pattern takes it in)"
                    } else {
                        ""
                    };
                    diags.push(
                        Some(located.line),
                        job,
                        format!("inputs pattern {:?} matches no source{why}", located.value),
                    );
                }
            }
        }
    }
    selected.sort_unstable();
    selected.dedup();
    selected
}

/// Hashes each source file (relative to `root`).
pub(crate) fn hash(root: &Path, paths: Vec<String>) -> Result<Vec<SourceFile>, GraphError> {
    paths
        .into_iter()
        .map(|path| {
            let full = root.join(&path);
            let io_error = |source| GraphError::Io { path: full.clone(), source };
            let (digest, size) = digest::digest_file_sized(&full).map_err(io_error)?;
            let metadata = fs::metadata(&full).map_err(io_error)?;
            Ok(SourceFile { path, digest, size, executable: is_executable(&metadata) })
        })
        .collect()
}

#[cfg(unix)]
fn is_executable(metadata: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    metadata.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_metadata: &fs::Metadata) -> bool {
    false
}
