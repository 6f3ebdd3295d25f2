//! The settings: devices and ports, GIDs, and their defaults.

use std::net::Ipv4Addr;

use super::*;
use crate::verbs::model::DEVICE_NAME;
use crate::verbs::*;

#[test]
fn hca_filter_follows_nccl_syntax() {
    let f = HcaFilter::parse("mlx5").unwrap();
    assert!(f.admits("mlx5_0", 1) && f.admits("mlx5_10", 2) && !f.admits("bnxt_re0", 1));
    let f = HcaFilter::parse("=mlx5_1").unwrap();
    assert!(f.admits("mlx5_1", 1) && !f.admits("mlx5_10", 1));
    let f = HcaFilter::parse("mlx5_0:1,mlx5_1").unwrap();
    assert!(f.admits("mlx5_0", 1) && !f.admits("mlx5_0", 2) && f.admits("mlx5_1", 2));
    let f = HcaFilter::parse("^mlx5_0").unwrap();
    assert!(!f.admits("mlx5_0", 1) && !f.admits("mlx5_01", 1) && f.admits("mlx5_1", 1));
    let f = HcaFilter::parse("^=mlx5_0:2").unwrap();
    assert!(f.admits("mlx5_0", 1) && !f.admits("mlx5_0", 2) && f.admits("mlx5_01", 2));
    assert!(HcaFilter::parse("mlx5_0:x").is_err());
    assert!(HcaFilter::parse("^").is_err());
}

fn roce_port() -> PortInfo {
    let mut mapped = [0u8; 16];
    mapped[10..12].copy_from_slice(&[0xff, 0xff]);
    mapped[12..].copy_from_slice(&[10, 0, 0, 1]);
    let mut local = [0u8; 16];
    local[..2].copy_from_slice(&[0xfe, 0x80]);
    local[15] = 1;
    let gids = [(local, 1), (local, 2), (mapped, 1), (mapped, 2)]
        .iter()
        .enumerate()
        .map(|(i, &(gid, v))| GidEntry {
            index: i as u8,
            gid,
            roce_version: Some(v),
        })
        .collect();
    PortInfo {
        port: 1,
        active: true,
        link_layer: LinkLayer::Ethernet,
        lid: 0,
        mtu: 5,
        speed_mbps: 100_000,
        gids,
    }
}

#[test]
fn gid_choice_prefers_roce_v2_ipv4_unless_told() {
    let port = roce_port();
    assert_eq!(choose_gid(&port, None, 2).unwrap().index, 3);
    assert_eq!(choose_gid(&port, None, 1).unwrap().index, 2);
    assert_eq!(choose_gid(&port, Some(1), 2).unwrap().index, 1);
    assert!(choose_gid(&port, Some(9), 2).is_none());
    let ib = PortInfo {
        link_layer: LinkLayer::InfiniBand,
        ..roce_port()
    };
    assert_eq!(choose_gid(&ib, None, 2).unwrap().index, 0);
}

#[test]
fn settings_have_nccl_defaults_and_refuse_bad_values() {
    let config = IbConfig::from_lookup(|_| None).unwrap();
    assert_eq!(config, IbConfig::default());
    assert_eq!(
        (config.timeout, config.retry_cnt, config.qps_per_connection),
        (20, 7, 1)
    );
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let config = IbConfig::from_lookup(env(&[
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_QPS_PER_CONNECTION", "4"),
        ("NCCL_IB_TC", "106"),
        ("NCCL_IB_SL", "3"),
        ("NCCL_IB_HCA", "=mlx5_0:1"),
    ]))
    .unwrap();
    assert_eq!(config.gid_index, Some(3));
    assert_eq!(config.qps_per_connection, 4);
    assert_eq!((config.traffic_class, config.sl), (106, 3));
    assert!(config.hca.unwrap().admits("mlx5_0", 1));
    for bad in [
        ("NCCL_IB_QPS_PER_CONNECTION", "0"),
        ("NCCL_IB_TIMEOUT", "40"),
        ("NCCL_IB_RETRY_CNT", "x"),
        ("NCCL_IB_ROCE_VERSION_NUM", "3"),
    ] {
        let lookup = move |name: &str| (name == bad.0).then(|| bad.1.to_string());
        let err = IbConfig::from_lookup(lookup).unwrap_err();
        assert!(err.contains(bad.0), "{err}");
    }
}

#[test]
fn no_usable_port_says_why() {
    let model = Arc::new(Model::new(Ipv4Addr::new(127, 0, 0, 1)).unwrap());
    let config = IbConfig {
        hca: Some(HcaFilter::parse("mlx5").unwrap()),
        ..IbConfig::default()
    };
    let err = Ib::new(
        model,
        config,
        "127.0.0.1".parse().unwrap(),
        Secret::random(),
    )
    .unwrap_err();
    assert!(
        err.contains("NCCL_IB_HCA") && err.contains(DEVICE_NAME),
        "{err}"
    );
}
