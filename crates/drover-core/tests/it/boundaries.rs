//! Dependency rules (being written).
