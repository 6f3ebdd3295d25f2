//! Test-only fault injection (cargo feature `fault-injection`).
//!
//! `RCCL_FAULT_INJECT=launch` (a comma-separated list of point names) makes
//! the named points panic, so that tests can check what callers see when
//! the engine panics. Points: `launch` (every operation or group launch).

/// Panics if `RCCL_FAULT_INJECT` names `name`.
pub fn point(name: &str) {
    if let Some(points) = rccl_env::var("RCCL_FAULT_INJECT") {
        if points.split(',').any(|p| p.trim() == name) {
            panic!("fault injected at '{name}' (RCCL_FAULT_INJECT={points})");
        }
    }
}
