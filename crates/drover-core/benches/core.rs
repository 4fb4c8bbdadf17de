//! Core benchmark (being written).
fn main() {}
