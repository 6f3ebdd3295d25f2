//! The settings the IB network reads from the environment, as NCCL's.

use super::*;

/// The environment variables the provider reads, with NCCL's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbConfig {
    /// `NCCL_IB_HCA`.
    pub hca: Option<HcaFilter>,
    /// `NCCL_IB_GID_INDEX` (`None`: chosen by RoCE version and family).
    pub gid_index: Option<u8>,
    /// `NCCL_IB_ROCE_VERSION_NUM` (2).
    pub roce_version: u8,
    /// `NCCL_IB_TC` (0).
    pub traffic_class: u8,
    /// `NCCL_IB_SL` (0).
    pub sl: u8,
    /// `NCCL_IB_TIMEOUT` (20: 4.096 us x 2^20, about 4.3 s).
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT` (7).
    pub retry_cnt: u8,
    /// `NCCL_IB_QPS_PER_CONNECTION` (1).
    pub qps_per_connection: usize,
}

impl Default for IbConfig {
    fn default() -> IbConfig {
        IbConfig {
            hca: None,
            gid_index: None,
            roce_version: 2,
            traffic_class: 0,
            sl: 0,
            timeout: 20,
            retry_cnt: 7,
            qps_per_connection: 1,
        }
    }
}

impl IbConfig {
    /// The settings from the environment.
    pub fn from_env() -> Result<IbConfig, String> {
        IbConfig::from_lookup(rccl_env::var)
    }

    /// The settings from `lookup` (a variable's value by name).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<IbConfig, String> {
        fn number<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
            lookup: &dyn Fn(&str) -> Option<String>,
            name: &str,
            default: T,
            range: std::ops::RangeInclusive<T>,
        ) -> Result<T, String> {
            match lookup(name) {
                None => Ok(default),
                Some(text) => match text.trim().parse::<T>() {
                    Ok(value) if range.contains(&value) => Ok(value),
                    _ => Err(format!(
                        "{name}={text}: expected a number from {} to {}",
                        range.start(),
                        range.end()
                    )),
                },
            }
        }
        let defaults = IbConfig::default();
        let gid_index: i32 = number(&lookup, "NCCL_IB_GID_INDEX", -1, -1..=255)?;
        Ok(IbConfig {
            hca: lookup("NCCL_IB_HCA")
                .filter(|text| !text.trim().is_empty())
                .map(|text| HcaFilter::parse(&text))
                .transpose()?,
            gid_index: u8::try_from(gid_index).ok(),
            roce_version: number(
                &lookup,
                "NCCL_IB_ROCE_VERSION_NUM",
                defaults.roce_version,
                1..=2,
            )?,
            traffic_class: number(&lookup, "NCCL_IB_TC", defaults.traffic_class, 0..=255)?,
            sl: number(&lookup, "NCCL_IB_SL", defaults.sl, 0..=15)?,
            timeout: number(&lookup, "NCCL_IB_TIMEOUT", defaults.timeout, 1..=31)?,
            retry_cnt: number(&lookup, "NCCL_IB_RETRY_CNT", defaults.retry_cnt, 0..=7)?,
            qps_per_connection: number(
                &lookup,
                "NCCL_IB_QPS_PER_CONNECTION",
                defaults.qps_per_connection,
                1..=MAX_QPS,
            )?,
        })
    }
}

/// `NCCL_IB_HCA`: which devices and ports to use, in NCCL's syntax: a
/// comma-separated list of `name[:port]`, names matched as prefixes unless
/// the list starts with `=`, the whole list excluded if it starts with `^`
/// (`^=mlx5_1` excludes exactly `mlx5_1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    /// Parses `NCCL_IB_HCA`'s value.
    pub fn parse(text: &str) -> Result<HcaFilter, String> {
        let mut rest = text.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let entries = rest
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| match entry.split_once(':') {
                None => Ok((entry.to_string(), None)),
                Some((name, port)) => port
                    .parse::<u8>()
                    .map(|port| (name.to_string(), Some(port)))
                    .map_err(|_| format!("NCCL_IB_HCA={text}: bad port in {entry:?}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if entries.is_empty() {
            return Err(format!("NCCL_IB_HCA={text}: names no device"));
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether port `port` of device `name` is to be used.
    pub fn admits(&self, name: &str, port: u8) -> bool {
        let listed = self.entries.iter().any(|(entry, entry_port)| {
            let name_matches = if self.exact {
                name == entry
            } else {
                name.starts_with(entry.as_str())
            };
            name_matches && entry_port.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }
}

/// The GID a port uses: `NCCL_IB_GID_INDEX` if set; on Ethernet otherwise
/// the first IPv4-mapped GID of RoCE version `roce_version`, else the first
/// of that version, else the first set; on InfiniBand, index 0.
pub fn choose_gid(port: &PortInfo, gid_index: Option<u8>, roce_version: u8) -> Option<GidEntry> {
    if let Some(index) = gid_index {
        return port.gids.iter().find(|g| g.index == index).copied();
    }
    if port.link_layer == LinkLayer::InfiniBand {
        return port.gids.iter().find(|g| g.index == 0).copied();
    }
    let set = || port.gids.iter().filter(|g| !g.is_empty());
    set()
        .find(|g| g.roce_version == Some(roce_version) && g.is_ipv4())
        .or_else(|| set().find(|g| g.roce_version == Some(roce_version)))
        .or_else(|| set().next())
        .copied()
}
