//! Scenario scripts (being written).
