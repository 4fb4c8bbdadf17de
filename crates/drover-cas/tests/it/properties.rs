//! Property: any small tree survives commit, pack, unpack and export
//! unchanged, with equal tree digests on both sides.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use proptest::prelude::*;

use crate::util::{cas, key, listing, write};

#[derive(Debug, Clone)]
enum Kind {
    File { exec: bool, content: Vec<u8> },
    Dir,
    Link(&'static str),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        4 => (any::<bool>(), proptest::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(exec, content)| Kind::File { exec, content }),
        2 => Just(Kind::Dir),
        1 => prop_oneof![Just("a"), Just("b.c/d"), Just("missing"), Just("./a")].prop_map(Kind::Link),
    ]
}

fn name() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("a"), Just("b.c"), Just("B"), Just("d-e"), Just("é")]
}

/// Creates each entry whose parents can be directories and whose path is
/// free; skips the others.
fn materialize(root: &Path, entries: &[(Vec<&'static str>, Kind)]) {
    'entries: for (components, kind) in entries {
        let mut dir = root.to_path_buf();
        for c in &components[..components.len() - 1] {
            dir.push(c);
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => continue 'entries,
                Err(_) => fs::create_dir(&dir).unwrap(),
            }
        }
        let path = dir.join(components[components.len() - 1]);
        if fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        match kind {
            Kind::File { exec, content } => write(&path, content, *exec),
            Kind::Dir => fs::create_dir(&path).unwrap(),
            Kind::Link(target) => symlink(target, &path).unwrap(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn pack_unpack_round_trip(
        entries in proptest::collection::vec((proptest::collection::vec(name(), 1..4), kind()), 0..12)
    ) {
        let (_a_root, a) = cas(1 << 20);
        let (b_root, b) = cas(1 << 20);
        let writer = a.begin_artifact(&key(1)).unwrap();
        materialize(writer.dir(), &entries);
        let original = listing(writer.dir());
        let info = writer.commit().unwrap();
        let mut stream = Vec::new();
        prop_assert_eq!(a.pack(&key(1), &mut stream).unwrap(), info);
        prop_assert_eq!(b.unpack(&key(1), Some(&info.tree), &mut stream.as_slice()).unwrap(), info);
        prop_assert_eq!(&listing(&b.artifact(&key(1)).unwrap()), &original);
        let out = b_root.path().join("out");
        drover_cas::unpack_to_dir(&mut stream.as_slice(), &out, Some(&info.tree)).unwrap();
        prop_assert_eq!(&listing(&out), &original);
        // Re-committing the exported tree gives the same digest.
        let writer = b.begin_artifact(&key(2)).unwrap();
        materialize(writer.dir(), &entries);
        prop_assert_eq!(writer.commit().unwrap(), info);
    }
}
