//! The plug-in host's loading and choice: a plug-in whose `init` fails is
//! passed over with the warning it logged, a library without the
//! plug-in's symbols is refused, and `NCCL_NET` picks a plug-in by the
//! name it gives itself.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use rccl_transports::auth_tcp::Secret;
use rccl_transports::network::Plugin;
use rccl_transports::network::SocketDevice;
use rccl_transports::network::{choose_from, NetInit, Provider};

fn init() -> NetInit {
    NetInit {
        rank: 0,
        devices: vec![SocketDevice {
            name: "lo".into(),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        }],
        secret: Secret::random(),
    }
}

fn load(path: &std::path::Path) -> std::sync::Arc<Plugin> {
    Plugin::load(Some(path.to_str().unwrap())).unwrap()
}

#[test]
fn a_plugin_whose_init_fails_is_passed_over_with_its_warning() {
    let failing = load(&common::failing_c_plugin());
    let working = load(&common::c_plugin());
    assert_eq!((failing.name(), failing.version()), ("Loopback", 8));
    let list = [Provider::plugin(failing), Provider::plugin(working)];
    let chosen = choose_from(&list, &init(), None).unwrap();
    assert_eq!(chosen.transport.name(), "NET/Loopback");
    assert_eq!(chosen.skipped.len(), 1);
    let why = &chosen.skipped[0].1;
    assert!(
        why.contains("init failed (ncclSystemError)")
            && why.contains("no loopback device here (built to fail)"),
        "{why}"
    );
}

#[test]
fn nccl_net_picks_a_plugin_by_its_own_name() {
    let list = [
        Provider::plugin(load(&common::exported_plugin())),
        Provider::plugin(load(&common::c_plugin())),
    ];
    let chosen = choose_from(&list, &init(), Some("LOOPBACK")).unwrap();
    assert_eq!(chosen.transport.name(), "NET/Loopback");
    let chosen = choose_from(&list, &init(), None).unwrap();
    assert_eq!(chosen.transport.name(), "NET/rcclrs");
    let err = choose_from(&list, &init(), Some("IB")).err().unwrap();
    assert!(
        err.to_string().contains(
            "NCCL_NET=IB: no network of that name; the networks here are: rcclrs; Loopback"
        ),
        "{err}"
    );
}

#[test]
fn a_library_without_the_plugin_symbols_is_refused() {
    let err = Plugin::load(Some("libm.so.6")).unwrap_err();
    assert!(
        err.contains("exports none of ncclNetPlugin_v12 .. ncclNetPlugin_v8"),
        "{err}"
    );
}
