//! Property tests (being written).
