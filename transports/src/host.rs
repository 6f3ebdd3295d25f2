//! This host's network interfaces and the choice of its address
//! (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`): where its bootstrap and
//! a net plug-in's listeners are reached.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why no address could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// A setting is malformed (`NCCL_SOCKET_FAMILY`).
    #[error("{0}")]
    InvalidArgument(String),
    /// The system could not list the interfaces, or none matches.
    #[error("{0}")]
    System(String),
}

type Result<T> = std::result::Result<T, HostError>;

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
            other => Err(HostError::InvalidArgument(format!(
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
        let err = crate::explain_fd_limit(std::io::Error::last_os_error());
        return Err(HostError::System(format!("getifaddrs: {err}")));
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

/// The setting `name`, unless unset or blank.
pub fn setting(name: &str) -> Option<String> {
    rccl_env::var(name).filter(|v| !v.trim().is_empty())
}

/// The family `NCCL_SOCKET_FAMILY` restricts addresses to, if it is set.
pub fn socket_family() -> Result<Option<Family>> {
    setting("NCCL_SOCKET_FAMILY")
        .map(|f| Family::parse(&f))
        .transpose()
}

/// This host's bootstrap address, honouring `NCCL_SOCKET_IFNAME` and
/// `NCCL_SOCKET_FAMILY` (see [`IfNameFilter`] and [`select_address`]).
pub fn host_address() -> Result<IpAddr> {
    let family = socket_family()?;
    let spec = setting("NCCL_SOCKET_IFNAME");
    let filter = spec.as_deref().map(IfNameFilter::parse);
    let ifaces = interfaces()?;
    select_address(&ifaces, filter.as_ref(), family).ok_or_else(|| {
        let names: Vec<String> = ifaces
            .iter()
            .map(|i| format!("{}={}{}", i.name, i.addr, if i.up { "" } else { "(down)" }))
            .collect();
        HostError::System(format!(
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
    fn lists_local_interfaces() {
        let ifaces = interfaces().unwrap();
        assert!(ifaces.iter().any(|i| i.addr.is_loopback()), "{ifaces:?}");
        host_address().unwrap();
    }
}
