//! Windows of the CUDA backend's device memory over the CUDA driver model
//! (cuda-model/): a put is a device copy on the caller's stream into the
//! peer's window, then the signal raised by a host task on that stream; a
//! wait holds the stream. Between threads of one process (peers' own
//! pointers) and between processes (each maps its peers' exported
//! allocations, `ncclMemAlloc`'s cuMem memory), the data checked.

#[path = "common/children.rs"]
mod children;
#[path = "common/device_windows.rs"]
mod device_windows;
#[path = "common/driver_model.rs"]
mod driver_model;

use std::time::Duration;

use device_windows::{device_ring, Alloc};
use driver_model::{driver_folder, over_the_model};
use rccl::{Communicator, Config};

fn config() -> Config {
    Config {
        rma_signals: 2,
        timeout: Duration::from_secs(30),
        ..Config::default()
    }
}

#[test]
fn device_windows_between_threads() {
    over_the_model("device_windows_between_threads", &[], || {
        assert_eq!(rccl::device::active().unwrap().backend(), "cuda");
        for n in [2, 4] {
            let comms = Communicator::init_all_config(n, config()).unwrap();
            std::thread::scope(|s| {
                for comm in &comms {
                    s.spawn(move || device_ring(comm, 50, 3000, Alloc::Plain));
                }
            });
        }
    });
}

const CHILD: &str = "RCCL_CUDA_WINDOWS_CHILD";

/// One rank of [`device_windows_between_processes`]; does nothing when
/// run directly.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    assert_eq!(rccl::device::active().unwrap().backend(), "cuda");
    let comm = Communicator::from_env_config(config()).unwrap();
    device_ring(&comm, 50, 3000, Alloc::Shareable);
}

#[test]
fn device_windows_between_processes() {
    for n in [2, 4] {
        let folder = driver_folder("device_windows_between_processes", false);
        let path = match std::env::var("LD_LIBRARY_PATH") {
            Ok(p) if !p.is_empty() => format!("{}:{p}", folder.display()),
            _ => folder.display().to_string(),
        };
        let mut ranks = children::spawn_ranks("child_rank", n, |_| {
            [
                (CHILD, "1"),
                ("RCCL_DEVICE", "cuda"),
                ("LD_LIBRARY_PATH", &path),
                ("RCCL_CUDA_MODEL_DEADLINE_MS", "10000"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec()
        });
        let ok = ranks.wait_all(Duration::from_secs(60));
        let _ = std::fs::remove_dir_all(&folder);
        assert!(ok.iter().all(|&ok| ok), "{n} processes: {ok:?}");
    }
}
