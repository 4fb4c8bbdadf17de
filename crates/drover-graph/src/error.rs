//! Errors: [`Diagnostic`] (one problem in a build file, with its place) and
//! [`GraphError`] (what [`crate::load`] and [`crate::parse_str`] return).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// One problem in a build file.
///
/// Displays as `drover.yaml:12: job "app": unknown dependency "compil-a" (did you
/// mean "compile-a"?)`; the line and job parts are left out when unknown.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Diagnostic {
    /// The build file, as given to [`crate::load`] or [`crate::parse_str`].
    pub file: PathBuf,
    /// 1-based line, when the problem has a place in the file.
    pub line: Option<usize>,
    /// The job the problem belongs to, if any.
    pub job: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        if let Some(job) = &self.job {
            write!(f, "job {job:?}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Why a build file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The file is invalid: every problem found, ordered by line.
    #[error("{}", DisplayAll(.0))]
    Invalid(Vec<Diagnostic>),
    /// Reading the build file or a source failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory that could not be read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl GraphError {
    /// The diagnostics of an [`GraphError::Invalid`] error (empty otherwise).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            GraphError::Invalid(diagnostics) => diagnostics,
            GraphError::Io { .. } => &[],
        }
    }
}

struct DisplayAll<'a>(&'a [Diagnostic]);

impl fmt::Display for DisplayAll<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

/// Collects diagnostics for one file.
#[derive(Debug)]
pub(crate) struct Diagnostics {
    file: PathBuf,
    list: Vec<Diagnostic>,
}

impl Diagnostics {
    pub(crate) fn new(file: PathBuf) -> Diagnostics {
        Diagnostics { file, list: Vec::new() }
    }

    pub(crate) fn push(&mut self, line: Option<usize>, job: Option<&str>, message: impl Into<String>) {
        self.list.push(Diagnostic {
            file: self.file.clone(),
            line,
            job: job.map(str::to_owned),
            message: message.into(),
        });
    }

    /// `Err(Invalid)` with the diagnostics ordered by line (file-wide ones
    /// last, otherwise in the order found), or `Ok(())` if there are none.
    pub(crate) fn finish(self) -> Result<(), GraphError> {
        if self.list.is_empty() { Ok(()) } else { Err(self.into_error()) }
    }

    /// [`GraphError::Invalid`] with the diagnostics ordered as by [`Diagnostics::finish`].
    pub(crate) fn into_error(mut self) -> GraphError {
        self.list.sort_by_key(|d| d.line.unwrap_or(usize::MAX));
        GraphError::Invalid(self.list)
    }
}

/// A key or name as a message shows it: the first 64 characters, then `…`
/// (a key of megabytes is not repeated whole).
pub(crate) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &text[..end]).into(),
        None => text.into(),
    }
}
