//! The one place the engine reads its settings (`NCCL_*`, `RCCL_*`) from
//! the environment.

/// The value of the setting `name`, if set.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
