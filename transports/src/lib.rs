//! Connections between two ranks.
