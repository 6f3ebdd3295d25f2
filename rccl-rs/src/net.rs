//! This host: its name, the choice of its bootstrap address
//! (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`), and its network devices
//! (the NICs whose rails the channels spread over).

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rccl_transports::network::socket::interface_speed;

use crate::error::{Error, Result};

/// This host's name ("unknown" if it cannot be read).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// An address family restriction (`NCCL_SOCKET_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `AF_INET`
    V4,
    /// `AF_INET6`
    V6,
}

impl Family {
    /// Parses `AF_INET` / `AF_INET6` (also `4`, `6`, `ipv4`, `ipv6`).
    pub fn parse(s: &str) -> Result<Family> {
        match s.trim().to_ascii_lowercase().as_str() {
            "af_inet" | "inet" | "ipv4" | "4" => Ok(Family::V4),
            "af_inet6" | "inet6" | "ipv6" | "6" => Ok(Family::V6),
            other => Err(Error::InvalidArgument(format!(
                "NCCL_SOCKET_FAMILY={other} is not AF_INET or AF_INET6"
            ))),
        }
    }

    fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }
}

/// An `NCCL_SOCKET_IFNAME` filter: a comma list of interface-name prefixes;
/// a leading `^` excludes the listed interfaces instead of selecting them,
/// and a leading `=` (after any `^`) makes the names exact instead of
/// prefixes. E.g. `eth`, `^docker,lo`, `=eth0`, `^=docker0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfNameFilter {
    /// Exclude the matching interfaces (`^`).
    pub exclude: bool,
    /// Match names exactly (`=`), not as prefixes.
    pub exact: bool,
    /// The names or prefixes.
    pub names: Vec<String>,
}

impl IfNameFilter {
    /// Parses an `NCCL_SOCKET_IFNAME` value.
    pub fn parse(spec: &str) -> IfNameFilter {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        IfNameFilter {
            exclude,
            exact,
            names,
        }
    }

    /// Whether interface `name` passes the filter.
    pub fn accepts(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// One address of one network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Interface name (`eth0`).
    pub name: String,
    /// One of its addresses.
    pub addr: IpAddr,
    /// Whether the interface is up.
    pub up: bool,
    /// Whether it is a loopback interface.
    pub loopback: bool,
}

/// Picks the bootstrap address among `ifaces` (in system order).
///
/// With a filter, the first up interface it accepts (loopback included if
/// accepted); without one, the first up interface that is not loopback,
/// `docker*` or `virbr*`, falling back to loopback. Within those, IPv4 is
/// preferred unless `family` says otherwise; IPv6 link-local addresses are
/// skipped (they need a scope to be reachable).
pub fn select_address(
    ifaces: &[Interface],
    filter: Option<&IfNameFilter>,
    family: Option<Family>,
) -> Option<IpAddr> {
    let usable = |i: &&Interface| {
        i.up && !matches!(family, Some(f) if !f.matches(&i.addr))
            && !matches!(i.addr, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
    };
    let preferred = |c: Vec<&Interface>| {
        c.iter()
            .find(|i| i.addr.is_ipv4())
            .or_else(|| c.first())
            .map(|i| i.addr)
    };
    match filter {
        Some(f) => preferred(
            ifaces
                .iter()
                .filter(usable)
                .filter(|i| f.accepts(&i.name))
                .collect(),
        ),
        None => {
            let real = ifaces
                .iter()
                .filter(usable)
                .filter(|i| {
                    !i.loopback
                        && !i.addr.is_loopback()
                        && !i.name.starts_with("docker")
                        && !i.name.starts_with("virbr")
                })
                .collect();
            let loopback = match family {
                Some(Family::V6) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
            };
            preferred(real).or(Some(loopback))
        }
    }
}

/// This host's interfaces and their IPv4/IPv6 addresses, in system order.
pub fn interfaces() -> Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success getifaddrs stores a
    // list that we free exactly once below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned,
        // which stays valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr whose
        // family field is always readable.
        let family = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: for AF_INET the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: for AF_INET6 the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: `ifa_name` is a non-null, NUL-terminated C string owned by
        // the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        out.push(Interface {
            name,
            addr,
            up: flags & libc::IFF_UP as libc::c_uint != 0,
            loopback: flags & libc::IFF_LOOPBACK as libc::c_uint != 0,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // no reference into the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
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
    let family = env("NCCL_SOCKET_FAMILY")
        .map(|f| Family::parse(&f))
        .transpose()?;
    let filter = env("NCCL_SOCKET_IFNAME").map(|s| IfNameFilter::parse(&s));
    let speeds = env("RCCL_NIC_SPEED");
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

fn env(name: &str) -> Option<String> {
    rccl_env::var(name).filter(|v| !v.trim().is_empty())
}

/// This host's bootstrap address, honouring `NCCL_SOCKET_IFNAME` and
/// `NCCL_SOCKET_FAMILY` (see `IfNameFilter` and `select_address`).
pub fn host_address() -> Result<IpAddr> {
    let family = env("NCCL_SOCKET_FAMILY")
        .map(|f| Family::parse(&f))
        .transpose()?;
    let spec = env("NCCL_SOCKET_IFNAME");
    let filter = spec.as_deref().map(IfNameFilter::parse);
    let ifaces = interfaces()?;
    select_address(&ifaces, filter.as_ref(), family).ok_or_else(|| {
        let names: Vec<String> = ifaces
            .iter()
            .map(|i| format!("{}={}{}", i.name, i.addr, if i.up { "" } else { "(down)" }))
            .collect();
        Error::System(format!(
            "no network interface matches NCCL_SOCKET_IFNAME={}{}; interfaces: {}",
            spec.unwrap_or_default(),
            family
                .map(|f| format!(" NCCL_SOCKET_FAMILY={f:?}"))
                .unwrap_or_default(),
            names.join(", ")
        ))
    })
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

    fn pick(spec: Option<&str>, family: Option<Family>) -> Option<String> {
        let f = spec.map(IfNameFilter::parse);
        select_address(&sample(), f.as_ref(), family).map(|a| a.to_string())
    }

    #[test]
    fn parses_ifname_specs() {
        let f = IfNameFilter::parse("eth");
        assert!(!f.exclude && !f.exact && f.names == ["eth"]);
        assert!(f.accepts("eth0") && f.accepts("eth10") && !f.accepts("ib0"));
        let f = IfNameFilter::parse("^docker, lo");
        assert!(f.exclude && !f.exact && f.names == ["docker", "lo"]);
        assert!(!f.accepts("docker0") && !f.accepts("lo") && f.accepts("eth0"));
        let f = IfNameFilter::parse("=eth0");
        assert!(f.exact && f.accepts("eth0") && !f.accepts("eth10"));
        let f = IfNameFilter::parse("^=eth0,ib0");
        assert!(f.exclude && f.exact && !f.accepts("eth0") && f.accepts("eth10"));
        assert!(!f.accepts("ib0") && f.accepts("ib01"));
        assert!(IfNameFilter::parse("").names.is_empty());
    }

    #[test]
    fn selects_addresses() {
        assert_eq!(pick(None, None).unwrap(), "10.0.0.5");
        assert_eq!(pick(None, Some(Family::V6)).unwrap(), "2001:db8::5");
        assert_eq!(pick(Some("ib"), None).unwrap(), "192.168.1.5");
        assert_eq!(pick(Some("=eth10"), None).unwrap(), "10.1.0.5");
        assert_eq!(pick(Some("^eth,lo,docker"), None).unwrap(), "192.168.1.5");
        assert_eq!(pick(Some("lo"), None).unwrap(), "127.0.0.1");
        assert_eq!(pick(Some("lo"), Some(Family::V6)).unwrap(), "::1");
        assert_eq!(pick(Some("docker"), None).unwrap(), "172.17.0.1");
        assert_eq!(pick(Some("nothing"), None), None);
        // Only loopback and docker: fall back to loopback.
        let only = vec![
            iface("lo", "127.0.0.1", true),
            iface("docker0", "172.17.0.1", false),
        ];
        assert_eq!(
            select_address(&only, None, None).unwrap().to_string(),
            "127.0.0.1"
        );
        // Down interfaces are skipped.
        let mut down = sample();
        down[5].up = false;
        assert_eq!(
            select_address(&down, None, None).unwrap().to_string(),
            "10.1.0.5"
        );
        assert_eq!(Family::parse("AF_INET6").unwrap(), Family::V6);
        assert!(Family::parse("AF_UNIX").is_err());
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

    #[test]
    fn lists_local_interfaces() {
        let ifaces = interfaces().unwrap();
        assert!(ifaces.iter().any(|i| i.addr.is_loopback()), "{ifaces:?}");
        host_address().unwrap();
    }
}
