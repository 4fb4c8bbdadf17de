//! Hostile pack streams, crafted by hand: path traversal, absolute paths,
//! duplicates, entries through symlinks, escaping symlink chains. Each is
//! refused with `UnsafePath`, commits nothing and writes nothing outside.

use std::fs;

use drover_cas::CasError;

use crate::util::{Craft, cas, find_named, key, listing, tmp_is_empty};

/// Unpacks a crafted stream into a fresh cache and checks it is refused as
/// unsafe, with no trace inside the cache and no `escaped` file anywhere in
/// the cache's parent directory.
fn assert_unsafe(what: &str, stream: Vec<u8>) {
    let (root, cas) = cas(1 << 20);
    let err = cas.unpack(&key(1), None, &mut stream.as_slice()).unwrap_err();
    assert!(matches!(err, CasError::UnsafePath(_)), "{what}: {err:?}");
    assert!(cas.artifacts().is_empty(), "{what}");
    assert!(tmp_is_empty(&cas), "{what}");
    assert!(find_named(root.path(), "escaped").is_empty(), "{what}: {:?}", listing(root.path()));
}

#[test]
fn a_well_formed_crafted_stream_is_accepted() {
    let (_root, cas) = cas(1 << 20);
    let stream = Craft::new()
        .dir("a")
        .file("a/f", false, b"content")
        .symlink("a/l", "../b/g")
        .dir("b")
        .file("b/g", true, b"#!")
        .finish();
    let info = cas.unpack(&key(1), None, &mut stream.as_slice()).unwrap();
    assert_eq!((info.files, info.size), (2, 9));
    let guard = cas.artifact(&key(1)).unwrap();
    assert_eq!(fs::read(guard.join("a/l")).unwrap(), b"#!");
}

#[test]
fn traversal_in_entry_paths() {
    let payload = b"pwned";
    assert_unsafe("../", Craft::new().file("../escaped", false, payload).finish());
    assert_unsafe("absolute", Craft::new().file("/tmp/escaped", false, payload).finish());
    assert_unsafe("absolute dir", Craft::new().dir("/etc").file("/etc/escaped", false, payload).finish());
    assert_unsafe("a/../../x", Craft::new().dir("a").file("a/../../escaped", false, payload).finish());
    assert_unsafe("a/./x", Craft::new().dir("a").file("a/./escaped", false, payload).finish());
    assert_unsafe("a//x", Craft::new().dir("a").file("a//escaped", false, payload).finish());
    assert_unsafe("trailing /", Craft::new().dir("a/").finish());
    assert_unsafe("empty path", Craft::new().file("", false, payload).finish());
    assert_unsafe("NUL", Craft::new().file("escaped\0.txt", false, payload).finish());
    assert_unsafe("long name", Craft::new().file(&"n".repeat(256), false, payload).finish());
    let deep = ["d"; 2049].join("/");
    assert_unsafe("long path", Craft::new().file(&deep, false, payload).finish());
}

#[test]
fn invalid_utf8_paths() {
    let mut stream = Craft::new().bytes;
    stream.push(2);
    stream.extend_from_slice(&2u32.to_le_bytes());
    stream.extend_from_slice(&[0xff, 0xfe]);
    assert_unsafe("not UTF-8", stream);
}

#[test]
fn duplicates_and_order() {
    assert_unsafe(
        "duplicate file",
        Craft::new().file("escaped", false, b"1").file("escaped", false, b"2").finish(),
    );
    assert_unsafe("dir then file", Craft::new().dir("escaped").file("escaped", false, b"x").finish());
    assert_unsafe("out of order", Craft::new().file("b", false, b"").file("a", false, b"").finish());
    assert_unsafe("child before parent", Craft::new().file("a/escaped", false, b"").dir("a").finish());
}

#[test]
fn entries_through_symlinks() {
    // A symlink pointing outside, then a file through it.
    assert_unsafe(
        "file through an escaping symlink",
        Craft::new().symlink("l", "../../..").file("l/escaped", false, b"x").finish(),
    );
    // Even a symlink pointing inside may not be written through.
    assert_unsafe(
        "file through an inner symlink",
        Craft::new().dir("d").symlink("l", "d").file("l/escaped", false, b"x").finish(),
    );
    // A file whose parent is a file.
    assert_unsafe(
        "file under a file",
        Craft::new().file("f", false, b"").file("f/escaped", false, b"").finish(),
    );
    // A file whose parent was never declared.
    assert_unsafe("undeclared parent", Craft::new().file("nodir/escaped", false, b"").finish());
}

#[test]
fn escaping_symlinks() {
    assert_unsafe("absolute target", Craft::new().symlink("escaped", "/etc/passwd").finish());
    assert_unsafe("up target", Craft::new().symlink("escaped", "../x").finish());
    assert_unsafe("nested up target", Craft::new().dir("a").symlink("a/escaped", "../../x").finish());
    assert_unsafe("empty target", Craft::new().symlink("escaped", "").finish());
    assert_unsafe("NUL target", Craft::new().symlink("escaped", "a\0b").finish());
    // Chains: each link is harmless alone, together they climb out.
    assert_unsafe("chain via .", Craft::new().symlink("s", ".").symlink("x", "s/..").finish());
    assert_unsafe(
        "chain via dir",
        Craft::new().dir("d").symlink("d/s", "..").symlink("x", "d/s/..").finish(),
    );
    assert_unsafe("escape next to a loop", Craft::new().symlink("a", "b/..").symlink("b", "..").finish());
}
