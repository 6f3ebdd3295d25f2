//! Test-only fault injection (cargo feature `fault-injection`).
//!
//! `RCCL_FAULT_INJECT` is a comma-separated list of points. A name alone
//! makes that point panic, so that tests can check what callers see when
//! the engine panics: `launch` (every operation or group launch). A name
//! with `=MS` makes that point sleep MS milliseconds, so that tests can
//! make a rank slow where a race would show: `symmetric-read` (a rank of
//! a collective on symmetric windows, before it reads its peers' windows).

/// Panics if `RCCL_FAULT_INJECT` names `name`.
pub fn point(name: &str) {
    if let Some(points) = rccl_env::var("RCCL_FAULT_INJECT") {
        if points.split(',').any(|p| p.trim() == name) {
            panic!("fault injected at '{name}' (RCCL_FAULT_INJECT={points})");
        }
    }
}

/// Sleeps if `RCCL_FAULT_INJECT` names `name=MS`.
pub fn delay(name: &str) {
    let Some(points) = rccl_env::var("RCCL_FAULT_INJECT") else {
        return;
    };
    for point in points.split(',') {
        if let Some((point, ms)) = point.trim().split_once('=') {
            if point == name {
                let ms: u64 = ms.parse().unwrap_or_else(|_| {
                    panic!("RCCL_FAULT_INJECT={points}: '{ms}' is not a number of milliseconds")
                });
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
    }
}
