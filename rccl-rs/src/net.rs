//! This host: its name and its network devices (the NICs whose rails the
//! channels spread over). Its interfaces and the choice of its bootstrap
//! address are [`rccl_transports::host`]'s.

use std::net::IpAddr;

use rccl_transports::host::{interfaces, select_address, setting, socket_family};
use rccl_transports::host::{Family, IfNameFilter, Interface};
use rccl_transports::network::interface_speed;

use crate::error::{Error, Result};

/// This host's name ("unknown" if it cannot be read).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A network device of this host, as each rank publishes it at init: the
/// channels' traffic between hosts spreads over these (channel `c` on
/// NIC `c mod rails`). Room for more: a GPU's affinity to a NIC joins
/// this record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// The interface's name (`eth0`), or the address when it has none.
    pub name: String,
    /// This host's address on it.
    pub addr: IpAddr,
    /// Its speed in Mbit/s: `RCCL_NIC_SPEED`, else what sysfs says, else
    /// NCCL's 10 Gbit/s default.
    pub speed_mbps: u32,
}

/// The network devices among `ifaces`: every up interface the filter
/// accepts, one address each (IPv4 preferred, as for the bootstrap),
/// sorted by name so that the hosts of a cluster number their rails
/// alike. Without a filter, or when none of them holds `bootstrap` (the
/// address peers reach this rank at), that address alone: several NICs
/// are used only when `NCCL_SOCKET_IFNAME` names them, so that an
/// interface the peers cannot reach never carries a channel.
pub fn select_nics(
    ifaces: &[Interface],
    filter: Option<&IfNameFilter>,
    family: Option<Family>,
    bootstrap: IpAddr,
    speed: impl Fn(&str) -> u32,
) -> Vec<Nic> {
    let mut names: Vec<&str> = ifaces
        .iter()
        .filter(|i| i.up && filter.is_some_and(|f| f.accepts(&i.name)))
        .map(|i| i.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let nics: Vec<Nic> = names
        .into_iter()
        .filter_map(|name| {
            let own: Vec<Interface> = ifaces.iter().filter(|i| i.name == name).cloned().collect();
            let addr = select_address(
                &own,
                Some(&IfNameFilter::parse(&format!("={name}"))),
                family,
            )?;
            Some(Nic {
                name: name.to_string(),
                addr,
                speed_mbps: speed(name),
            })
        })
        .collect();
    if nics.iter().any(|n| n.addr == bootstrap) {
        return nics;
    }
    let name = ifaces
        .iter()
        .find(|i| i.addr == bootstrap)
        .map_or_else(|| bootstrap.to_string(), |i| i.name.clone());
    vec![Nic {
        speed_mbps: speed(&name),
        name,
        addr: bootstrap,
    }]
}

/// The speed of interface `name` in Mbit/s: from `override_spec`
/// (`RCCL_NIC_SPEED`: one figure for every NIC, or `name=figure` pairs
/// separated by commas, a bare figure serving the names not listed), else
/// what the Socket provider reads ([`interface_speed`]: sysfs, else NCCL's
/// default of 10 Gbit/s).
pub fn nic_speed(name: &str, override_spec: Option<&str>) -> Result<u32> {
    if let Some(spec) = override_spec {
        let mut fallback = None;
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (who, figure) = match part.split_once('=') {
                Some((who, figure)) => (Some(who.trim()), figure),
                None => (None, part),
            };
            let mbps = figure
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&m| m > 0)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "RCCL_NIC_SPEED={spec}: {part:?} is not a speed in Mbit/s \
                         (a positive whole number, alone or as NAME=SPEED)"
                    ))
                })?;
            match who {
                Some(who) if who == name => return Ok(mbps),
                Some(_) => {}
                None => fallback = Some(mbps),
            }
        }
        if let Some(mbps) = fallback {
            return Ok(mbps);
        }
    }
    Ok(interface_speed(name))
}

/// This host's NICs ([`select_nics`] under `NCCL_SOCKET_IFNAME`,
/// `NCCL_SOCKET_FAMILY` and `RCCL_NIC_SPEED`), given the address of this
/// rank's bootstrap.
pub fn host_nics(bootstrap: IpAddr) -> Result<Vec<Nic>> {
    let family = socket_family()?;
    let filter = setting("NCCL_SOCKET_IFNAME").map(|s| IfNameFilter::parse(&s));
    let speeds = setting("RCCL_NIC_SPEED");
    // A malformed override is an error even where no NIC is named in it.
    nic_speed("", speeds.as_deref())?;
    let ifaces = interfaces()?;
    Ok(select_nics(
        &ifaces,
        filter.as_ref(),
        family,
        bootstrap,
        |name| nic_speed(name, speeds.as_deref()).unwrap_or_else(|_| interface_speed(name)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, loopback: bool) -> Interface {
        Interface {
            name: name.into(),
            addr: addr.parse().unwrap(),
            up: true,
            loopback,
        }
    }

    fn sample() -> Vec<Interface> {
        vec![
            iface("lo", "127.0.0.1", true),
            iface("lo", "::1", true),
            iface("docker0", "172.17.0.1", false),
            iface("eth0", "fe80::1", false),
            iface("eth0", "2001:db8::5", false),
            iface("eth0", "10.0.0.5", false),
            iface("eth10", "10.1.0.5", false),
            iface("ib0", "192.168.1.5", false),
        ]
    }

    #[test]
    fn lists_nics_by_name_under_the_filter() {
        let speed = |name: &str| if name == "ib0" { 100_000 } else { 25_000 };
        let boot: IpAddr = "10.0.0.5".parse().unwrap();
        let names = |spec: Option<&str>, boot: IpAddr| -> Vec<(String, String, u32)> {
            let f = spec.map(IfNameFilter::parse);
            select_nics(&sample(), f.as_ref(), None, boot, speed)
                .into_iter()
                .map(|n| (n.name, n.addr.to_string(), n.speed_mbps))
                .collect()
        };
        let eth = |name: &str, addr: &str| (name.to_string(), addr.to_string(), 25_000);
        // A list of prefixes: every match, one address each (IPv4 first).
        assert_eq!(
            names(Some("eth"), boot),
            [eth("eth0", "10.0.0.5"), eth("eth10", "10.1.0.5")]
        );
        // `=`: exact names.
        assert_eq!(names(Some("=eth0,eth10"), boot), names(Some("eth"), boot));
        assert_eq!(names(Some("=eth0"), boot), [eth("eth0", "10.0.0.5")]);
        // `^`: all but those.
        assert_eq!(
            names(Some("^docker,lo"), boot),
            [
                eth("eth0", "10.0.0.5"),
                eth("eth10", "10.1.0.5"),
                ("ib0".to_string(), "192.168.1.5".to_string(), 100_000),
            ]
        );
        // Without a filter: the bootstrap's interface alone.
        assert_eq!(names(None, boot), [eth("eth0", "10.0.0.5")]);
        // The bootstrap's address on none of them: that address alone.
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            names(Some("eth"), lo),
            [("lo".to_string(), "127.0.0.1".to_string(), 25_000)]
        );
    }

    #[test]
    fn nic_speeds_can_be_overridden() {
        assert_eq!(nic_speed("tb0", Some("2000")).unwrap(), 2000);
        assert_eq!(nic_speed("tb1", Some("tb0=2000, tb1=1000")).unwrap(), 1000);
        assert_eq!(nic_speed("tb2", Some("tb0=2000,500")).unwrap(), 500);
        assert_eq!(nic_speed("no-such-nic", Some("tb0=2000")).unwrap(), 10_000);
        assert_eq!(nic_speed("no-such-nic", None).unwrap(), 10_000);
        for bad in ["fast", "0", "tb0=", "tb0=-5"] {
            let err = nic_speed("tb0", Some(bad)).unwrap_err().to_string();
            assert!(err.contains("RCCL_NIC_SPEED"), "{bad}: {err}");
        }
    }
}
