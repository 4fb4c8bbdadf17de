//! Shared fixtures: a temporary build directory with real source files, and
//! helpers to parse a build file in it and look at the diagnostics.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use drover_graph::{Build, Digest, GraphError, Job, parse_str};
use tempfile::TempDir;

/// A temporary build directory.
pub(crate) struct Dir {
    temp: TempDir,
}

impl Dir {
    pub(crate) fn new() -> Dir {
        Dir { temp: tempfile::tempdir().expect("create a temporary directory") }
    }

    /// A directory holding `files` (path, contents).
    pub(crate) fn with(files: &[(&str, &str)]) -> Dir {
        let dir = Dir::new();
        for (path, contents) in files {
            dir.write(path, contents);
        }
        dir
    }

    pub(crate) fn path(&self) -> &Path {
        self.temp.path()
    }

    pub(crate) fn write(&self, path: &str, contents: &str) -> PathBuf {
        let full = self.path().join(path);
        fs::create_dir_all(full.parent().expect("a file has a parent")).expect("create directories");
        fs::write(&full, contents).expect("write a file");
        full
    }

    /// Parses `text` as `drover.yaml` (or another file name) in this directory.
    pub(crate) fn parse_as(&self, file: &str, text: &str) -> Result<Build, GraphError> {
        parse_str(Path::new(file), text, self.path())
    }

    pub(crate) fn parse(&self, yaml: &str) -> Build {
        self.parse_as("drover.yaml", yaml).unwrap_or_else(|error| panic!("expected a valid build:\n{error}"))
    }

    /// The diagnostics of an invalid `drover.yaml`, as `(line, job, message)`.
    pub(crate) fn errors(&self, yaml: &str) -> Vec<(Option<usize>, Option<String>, String)> {
        errors_of(self.parse_as("drover.yaml", yaml))
    }
}

pub(crate) fn errors_of(result: Result<Build, GraphError>) -> Vec<(Option<usize>, Option<String>, String)> {
    match result {
        Ok(build) => panic!("expected diagnostics, got a valid build: {build:#?}"),
        Err(GraphError::Invalid(diagnostics)) => {
            diagnostics.into_iter().map(|d| (d.line, d.job, d.message)).collect()
        }
        Err(error) => panic!("expected diagnostics, got {error}"),
    }
}

/// The one diagnostic of an invalid file.
pub(crate) fn only(
    mut errors: Vec<(Option<usize>, Option<String>, String)>,
) -> (Option<usize>, Option<String>, String) {
    assert_eq!(errors.len(), 1, "expected exactly one diagnostic, got {errors:#?}");
    errors.remove(0)
}

pub(crate) fn job<'a>(build: &'a Build, name: &str) -> &'a Job {
    build.jobs.iter().find(|job| job.name == name).unwrap_or_else(|| panic!("no job {name:?}"))
}

/// Job name → ID.
pub(crate) fn ids(build: &Build) -> BTreeMap<String, Digest> {
    build.jobs.iter().map(|job| (job.name.clone(), job.id)).collect()
}

/// `(line, job, message)` shorthand.
pub(crate) fn at(line: usize, job: Option<&str>, message: &str) -> (Option<usize>, Option<String>, String) {
    (Some(line), job.map(str::to_owned), message.to_owned())
}
