//! Connections between two ranks.

pub mod socket;
