//! Integration tests of drover-cas: blobs, artifacts, eviction, the pack
//! format (round trips, corruption, crafted hostile streams), threads racing
//! on one cache, and properties.

mod artifacts;
mod attacks;
mod blobs;
mod concurrency;
mod eviction;
mod properties;
mod transfer;
mod util;
