//! Pack and unpack: round trips between two caches, corrupted and truncated
//! streams, expected tree digests, size limits, large files.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, Write};

use drover_cas::{CasError, Key};

use crate::util::{Craft, build, cas, key, listing, sample_tree, tmp_is_empty, unseal, write};

#[test]
fn round_trip_between_two_caches() {
    let (_a_root, a) = cas(1 << 20);
    let (_b_root, b) = cas(1 << 20);
    let id = key(7);
    let info = build(&a, &id, sample_tree);
    let mut stream = Vec::new();
    assert_eq!(a.pack(&id, &mut stream).unwrap(), info);
    assert!(stream.starts_with(b"DRVPACK\0"));
    let got = b.unpack(&id, Some(&info.tree), &mut stream.as_slice()).unwrap();
    assert_eq!(got, info);
    assert_eq!(b.artifact_info(&id), Some(info));
    assert_eq!(listing(&b.artifact(&id).unwrap()), listing(&a.artifact(&id).unwrap()));
    assert!(b.verify_artifact(&id).unwrap());
    assert!(tmp_is_empty(&b));
    // Packing the copy gives the same bytes.
    let mut again = Vec::new();
    b.pack(&id, &mut again).unwrap();
    assert_eq!(again, stream);
    // Unpacking what is already present is a verified no-op.
    assert_eq!(b.unpack(&id, None, &mut stream.as_slice()).unwrap(), info);
    assert!(tmp_is_empty(&b));
}

#[test]
fn the_documented_format_is_what_is_written() {
    let (_root, cas) = cas(1 << 20);
    let info = build(&cas, &key(1), |d| {
        write(&d.join("a/x"), b"xx", true);
        fs::create_dir(d.join("e")).unwrap();
        std::os::unix::fs::symlink("a/x", d.join("l")).unwrap();
    });
    let craft = Craft::new().dir("a").file("a/x", true, b"xx").dir("e").symlink("l", "a/x");
    assert_eq!(craft.tree(), info.tree);
    let mut stream = Vec::new();
    cas.pack(&key(1), &mut stream).unwrap();
    assert_eq!(stream, craft.finish());
}

#[test]
fn an_empty_artifact_round_trips() {
    let (_a_root, a) = cas(1 << 20);
    let (_b_root, b) = cas(1 << 20);
    let info = build(&a, &key(1), |_| {});
    assert_eq!((info.size, info.files), (0, 0));
    let mut stream = Vec::new();
    a.pack(&key(1), &mut stream).unwrap();
    assert_eq!(b.unpack(&key(1), Some(&info.tree), &mut stream.as_slice()).unwrap(), info);
}

/// An empty pack takes a shorter way in (no directory to unpack into) but
/// is verified the same: a lying trailer, a truncated one or another tree
/// than the one asked for is refused, and nothing past it is read.
#[test]
fn an_empty_pack_is_verified_like_any_other() {
    let (_a_root, a) = cas(1 << 20);
    let info = build(&a, &key(1), |_| {});
    let mut stream = Vec::new();
    a.pack(&key(1), &mut stream).unwrap();
    for at in [stream.len() - 1, stream.len() - 33, stream.len() - 41] {
        let mut flipped = stream.clone();
        flipped[at] ^= 0x01;
        assert!(refused(&flipped, None).is_corruption(), "byte {at} flipped");
    }
    for len in [13, stream.len() - 1] {
        assert!(matches!(refused(&stream[..len], None), CasError::Corrupt(_)), "{len} bytes");
    }
    let wrong = Key::digest(b"another tree");
    assert!(matches!(refused(&stream, Some(&wrong)), CasError::DigestMismatch { .. }));
    let mut followed = stream.clone();
    followed.extend_from_slice(b"NEXT");
    let (_b_root, b) = cas(1 << 20);
    let mut input = followed.as_slice();
    assert_eq!(b.unpack(&key(2), Some(&info.tree), &mut input).unwrap(), info);
    assert_eq!(input, b"NEXT");
    assert_eq!(b.artifacts(), vec![key(2)]);
    assert!(tmp_is_empty(&b));
}

/// Unpacking `stream` fails and leaves the receiving cache as it was.
fn refused(stream: &[u8], expected_tree: Option<&Key>) -> CasError {
    let (_root, b) = cas(1 << 20);
    let err = b.unpack(&key(7), expected_tree, &mut &stream[..]).unwrap_err();
    assert!(b.artifacts().is_empty());
    assert_eq!(b.used_bytes(), 0);
    assert!(tmp_is_empty(&b), "leftovers after {err:?}");
    assert!(fs::read_dir(b.dir().join("artifacts")).unwrap().next().is_none());
    err
}

#[test]
fn corrupted_streams_are_refused() {
    let (_root, a) = cas(1 << 20);
    let info = build(&a, &key(7), sample_tree);
    let mut stream = Vec::new();
    a.pack(&key(7), &mut stream).unwrap();

    // A flipped byte inside file content.
    let at = stream.windows(6).position(|w| w == b"hello\n").unwrap() + 1;
    let mut flipped = stream.clone();
    flipped[at] ^= 0x20;
    assert!(matches!(refused(&flipped, None), CasError::DigestMismatch { .. }));

    // A flipped byte anywhere else.
    for at in [0, 9, 13, 20, stream.len() - 40, stream.len() - 1] {
        let mut flipped = stream.clone();
        flipped[at] ^= 0x01;
        let err = refused(&flipped, None);
        assert!(err.is_corruption() || matches!(err, CasError::TooLarge { .. }), "{at}: {err:?}");
    }

    // Truncated anywhere.
    for len in [0, 5, 12, 30, stream.len() / 2, stream.len() - 33, stream.len() - 1] {
        let err = refused(&stream[..len], None);
        assert!(matches!(err, CasError::Corrupt(_)), "{len}: {err:?}");
    }

    // A valid stream but not the tree that was asked for.
    let wrong = Key::digest(b"another tree");
    match refused(&stream, Some(&wrong)) {
        CasError::DigestMismatch { expected, actual } => {
            assert_eq!(expected, wrong);
            assert_eq!(actual, info.tree);
        }
        other => panic!("unexpected {other:?}"),
    }

    // A trailer that lies about the tree.
    let mut lying = stream.clone();
    let n = lying.len();
    lying[n - 1] ^= 0xff;
    assert!(matches!(refused(&lying, None), CasError::DigestMismatch { .. }));
}

#[test]
fn unpack_enforces_the_size_limit() {
    let (_root, a) = cas(1 << 20);
    build(&a, &key(1), |d| {
        write(&d.join("a"), &[1u8; 60], false);
        write(&d.join("b"), &[2u8; 60], false);
    });
    let mut stream = Vec::new();
    a.pack(&key(1), &mut stream).unwrap();
    let (_b_root, b) = cas(100);
    let err = b.unpack(&key(1), None, &mut stream.as_slice()).unwrap_err();
    assert!(matches!(err, CasError::TooLarge { size: 120, max: 100, .. }), "{err:?}");
    assert!(b.artifacts().is_empty());
    assert!(tmp_is_empty(&b));
    // A header claiming a huge file is refused before anything is read.
    let craft = Craft::new().file("big", false, b"");
    let mut bytes = craft.bytes;
    let size_at = bytes.len() - 32 - 8;
    bytes[size_at..size_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(b.unpack(&key(2), None, &mut bytes.as_slice()), Err(CasError::TooLarge { .. })));
}

#[test]
fn unpack_reads_nothing_past_the_trailer() {
    let (_root, a) = cas(1 << 20);
    build(&a, &key(1), sample_tree);
    let mut stream = Vec::new();
    a.pack(&key(1), &mut stream).unwrap();
    stream.extend_from_slice(b"NEXT MESSAGE");
    let (_b_root, b) = cas(1 << 20);
    let mut input = stream.as_slice();
    b.unpack(&key(1), None, &mut input).unwrap();
    assert_eq!(input, b"NEXT MESSAGE");
}

#[test]
fn pack_of_a_damaged_artifact_stops_short_and_drops_it() {
    let (_root, a) = cas(1 << 20);
    build(&a, &key(1), sample_tree);
    let tool = a.artifact(&key(1)).unwrap().join("bin/tool");
    unseal(&tool);
    fs::write(&tool, b"#!/bin/sh\necho HI\n").unwrap();
    let mut stream = Vec::new();
    assert!(matches!(a.pack(&key(1), &mut stream), Err(CasError::Corrupt(_))));
    assert!(a.artifacts().is_empty());
    assert_eq!(a.take_evicted(), vec![key(1)]);
    assert!(matches!(refused(&stream, None), CasError::Corrupt(_)));
    assert!(matches!(a.pack(&key(1), &mut stream), Err(CasError::NotFound(_))));
}

/// A reader of `left` deterministic pseudo-random bytes, generated on the
/// fly (each byte depends only on its position).
struct Generated {
    left: u64,
    pos: u64,
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let mut word = [0u8; 8];
        for (i, byte) in buf[..n].iter_mut().enumerate() {
            if i == 0 || self.pos.is_multiple_of(8) {
                let mut z = (self.pos / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                word = (z ^ (z >> 31)).to_le_bytes();
            }
            *byte = word[(self.pos % 8) as usize];
            self.pos += 1;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[test]
fn a_large_file_streams_through() {
    const SIZE: u64 = 16 << 20;
    let (root, a) = cas(1 << 30);
    let info = build(&a, &key(1), |d| {
        let mut out = BufWriter::new(File::create(d.join("large.bin")).unwrap());
        std::io::copy(&mut Generated { left: SIZE, pos: 0 }, &mut out).unwrap();
        out.flush().unwrap();
        write(&d.join("small"), b"small", false);
    });
    assert_eq!(info.size, SIZE + 5);
    let pack_path = root.path().join("artifact.pack");
    let mut pack_file = File::create_new(&pack_path).unwrap();
    a.pack(&key(1), &mut pack_file).unwrap();
    pack_file.flush().unwrap();
    assert!(pack_file.stream_position().unwrap() > SIZE);
    let (_b_root, b) = cas(1 << 30);
    let mut input = BufReader::new(File::open(&pack_path).unwrap());
    assert_eq!(b.unpack(&key(1), Some(&info.tree), &mut input).unwrap(), info);
    let copy = b.artifact(&key(1)).unwrap().join("large.bin");
    assert_eq!(fs::metadata(&copy).unwrap().len(), SIZE);
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(File::open(&copy).unwrap()).unwrap();
    let mut expected = blake3::Hasher::new();
    expected.update_reader(Generated { left: SIZE, pos: 0 }).unwrap();
    assert_eq!(hasher.finalize(), expected.finalize());
}
