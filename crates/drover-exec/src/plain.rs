//! Commands that need no shell.
//!
//! A job's command is shell text, run as `/bin/sh -c <command>`. Most build
//! commands are just a program and its arguments (`cc -c main.c -o
//! main.o`), and for those the shell only splits words and searches `PATH`,
//! at the cost of a process of its own: `/bin/sh` starts, forks and execs
//! the program, about 1.3 ms more per command on the reference machine. As
//! make does, the supervisor runs such a *plain* command itself: it splits
//! the words, searches the job's `PATH` the way the shell does, and starts
//! the program directly, with what the shell would have added to the
//! environment (`PWD`).
//!
//! A command is plain when it is made only of words of the characters
//! `A-Z a-z 0-9 _ - . / , : + @ % =` separated by spaces or tabs, and its
//! first word is neither an assignment (it contains `=`) nor a shell keyword
//! or builtin (`cd`, `echo`, `exit`, `test`, ...: builtins can differ from
//! the programs of the same name, and some change the shell itself). Any
//! quote, variable, glob, tilde, redirection, operator, comment or newline
//! leaves the command to the shell, so a plain command's words are exactly
//! what the shell would have passed, and its result the same:
//!
//! - a program found nowhere on `PATH` (or found there only as files that
//!   cannot be executed) ends the command with exit code 127, and a path
//!   (a name with `/`) that cannot be executed (no permission, a directory)
//!   with 126, each with a line on standard error, as dash counts them;
//! - an executable file that is not a binary or a `#!` script (the kernel
//!   says `ENOEXEC`) is left to the shell, which runs it as a script.
//!
//! What differs: a command killed by a signal is reported as killed by that
//! signal, where the shell would have turned it into exit code 128 + the
//! signal's number; and a shell that sets variables of its own (bash's
//! `SHLVL` and `_`) does not set them.

use std::path::{Path, PathBuf};

/// Shell keywords and builtins (dash's, POSIX's and bash's): a command
/// starting with one of these always goes to the shell. (`!`, `[` and `[[`
/// need no entry: their characters are not plain.)
const SHELL_WORDS: &[&str] = &[
    ".",
    ":",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "case",
    "cd",
    "chdir",
    "command",
    "compgen",
    "complete",
    "compopt",
    "continue",
    "coproc",
    "declare",
    "dirs",
    "disown",
    "do",
    "done",
    "echo",
    "elif",
    "else",
    "enable",
    "esac",
    "eval",
    "exec",
    "exit",
    "export",
    "false",
    "fc",
    "fg",
    "fi",
    "for",
    "function",
    "getopts",
    "hash",
    "help",
    "history",
    "if",
    "in",
    "jobs",
    "kill",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "printf",
    "pushd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "select",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "test",
    "then",
    "time",
    "times",
    "trap",
    "true",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "until",
    "wait",
    "while",
];

/// Whether `byte` may appear in a plain command's word.
fn plain_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"_-./,:+@%=".contains(&byte)
}

/// The words of `command` if it is plain (see the module doc), else `None`.
pub(crate) fn words(command: &str) -> Option<Vec<&str>> {
    if !command.bytes().all(|b| plain_byte(b) || b == b' ' || b == b'\t') {
        return None;
    }
    let words: Vec<&str> = command.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    if first.contains('=') || SHELL_WORDS.contains(&first) {
        return None;
    }
    Some(words)
}

/// Where the shell would look for `program`, in order: `program` itself if
/// it names a path (contains `/`), else each directory of `path` (an empty
/// entry is the working directory), skipping candidates that do not exist.
pub(crate) fn candidates(program: &str, path: &str) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    path.split(':')
        .map(|dir| if dir.is_empty() { Path::new(".").join(program) } else { Path::new(dir).join(program) })
        .filter(|candidate| candidate.symlink_metadata().is_ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_commands_split_into_their_words() {
        assert_eq!(words("cc -c main.c -o main.o"), Some(vec!["cc", "-c", "main.c", "-o", "main.o"]));
        assert_eq!(words("  sleep\t0.05 "), Some(vec!["sleep", "0.05"]));
        assert_eq!(words("make -j4 CC=gcc"), Some(vec!["make", "-j4", "CC=gcc"]), "= after the first word");
        assert_eq!(
            words("./build.sh --out=dist/a,b:c+d@e%f"),
            Some(vec!["./build.sh", "--out=dist/a,b:c+d@e%f"])
        );
    }

    #[test]
    fn anything_the_shell_would_interpret_goes_to_the_shell() {
        for command in [
            "echo hi",
            "true",
            "cd src",
            "exit 3",
            "test -f x",
            "[ -f x ]",
            "if",
            "CC=gcc make",
            "echo $HOME",
            "ls *.c",
            "ls ~",
            "cat a > b",
            "a && b",
            "a; b",
            "a | b",
            "a &",
            "printf 'x'",
            "say \"x\"",
            "say \\x",
            "say `x`",
            "say (x)",
            "say {a,b}",
            "say x # comment",
            "a\nb",
            "",
            "   ",
        ] {
            assert_eq!(words(command), None, "{command:?}");
        }
    }

    #[test]
    fn the_search_follows_path_and_skips_what_does_not_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).expect("mkdir a");
        std::fs::create_dir_all(&b).expect("mkdir b");
        std::fs::write(b.join("tool"), "").expect("write tool");
        let path = format!("{}:{}:/nonexistent", a.display(), b.display());
        assert_eq!(candidates("tool", &path), vec![b.join("tool")]);
        assert_eq!(candidates("missing", &path), Vec::<PathBuf>::new());
        assert_eq!(candidates("./tool", &path), vec![PathBuf::from("./tool")], "a path is not searched");
    }
}
