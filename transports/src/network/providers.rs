//! Which network a communicator uses: the providers in order of
//! preference, and `NCCL_NET` choosing one by name.
//!
//! As in NCCL, the order is: the net plug-ins that `NCCL_NET_PLUGIN` names
//! (or `libnccl-net.so`), then the built-in networks (Socket last, since it
//! works everywhere). Providers added with [`register`] come first of all.
//! Without `NCCL_NET` the first provider that opens is used; with it, the
//! provider whose name matches (ignoring case), and a name that no provider
//! has, or whose provider does not open, is an error that lists the
//! networks there are. The choice and every provider passed over are
//! logged (`INIT` subsystem, as NCCL does), with the reasons.

use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

use super::plugin::{self, Plugin};
use super::socket::{Socket, SocketDevice};
use super::NetError;
use super::Network;
use crate::auth_tcp::Secret;
use crate::transport::Transport;

/// What a communicator gives the network it opens.
#[derive(Clone, Debug)]
pub struct NetInit {
    /// This rank (for logs).
    pub rank: usize,
    /// The interfaces this rank's channels use across hosts, one per rail
    /// (`NCCL_SOCKET_IFNAME`), the bootstrap's first.
    pub devices: Vec<SocketDevice>,
    /// The communicator's secret.
    pub secret: Secret,
}

/// Opens a provider for one communicator: its transport-table entry, or
/// why it cannot serve (no library, no device).
pub type Opener = dyn Fn(&NetInit) -> Result<Arc<dyn Transport>, String> + Send + Sync;

/// A network provider as the choice sees it: a name and a way to open it.
#[derive(Clone)]
pub struct Provider {
    name: String,
    open: Arc<Opener>,
}

impl Provider {
    /// A provider called `name` (what `NCCL_NET` matches) opened by `open`.
    pub fn new(
        name: impl Into<String>,
        open: impl Fn(&NetInit) -> Result<Arc<dyn Transport>, String> + Send + Sync + 'static,
    ) -> Provider {
        Provider {
            name: name.into(),
            open: Arc::new(open),
        }
    }

    /// A provider for `plugin`, named as the plug-in names itself.
    pub fn plugin(plugin: Arc<Plugin>) -> Provider {
        Provider::new(plugin.name(), move |init: &NetInit| {
            let net = plugin
                .open(plugin_comm_id(init))
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(Network::new(Arc::new(net))) as Arc<dyn Transport>)
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A hash of the communicator's secret: the `commId` a v11 or later
/// plug-in is initialized with (the same on every rank).
fn plugin_comm_id(init: &NetInit) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"rccl-rs net plug-in comm id")
        .chain_update(init.secret.0)
        .finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Provider({})", self.name)
    }
}

/// The network a communicator got, and the providers passed over.
pub struct Chosen {
    /// The transport-table entry (`NET/<name>`).
    pub transport: Arc<dyn Transport>,
    /// The provider's name.
    pub name: String,
    /// Providers tried first that did not open, each with why.
    pub skipped: Vec<(String, String)>,
}

/// Providers added at run time, ahead of every other.
static REGISTERED: RwLock<Vec<Provider>> = RwLock::new(Vec::new());

/// Adds `provider` ahead of every earlier one: it is tried first by every
/// communicator created from now on.
pub fn register(provider: Provider) {
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    registered.insert(0, provider);
}

/// The built-in networks, in order of preference.
fn builtin() -> Vec<Provider> {
    vec![
        Provider::new("IB", |init: &NetInit| {
            let ip = init.devices.first().ok_or("no network interface")?.ip;
            let ib = super::ib::Ib::from_env(ip, init.secret)?;
            Ok(Arc::new(Network::new(Arc::new(ib))) as Arc<dyn Transport>)
        }),
        Provider::new("Socket", |init: &NetInit| {
            let socket =
                Socket::new(init.devices.clone(), init.secret).map_err(|e| e.to_string())?;
            Ok(Arc::new(Network::new(Arc::new(socket))) as Arc<dyn Transport>)
        }),
    ]
}

/// Every provider, in order of preference: registered ones, the net
/// plug-ins that loaded (in `NCCL_NET_PLUGIN`'s order), the built-in
/// networks.
pub fn providers() -> Vec<Provider> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    registered
        .iter()
        .cloned()
        .chain(plugin::loaded().iter().cloned().map(Provider::plugin))
        .chain(builtin())
        .collect()
}

/// The network for a communicator: among [`providers`], the one `wanted`
/// names (`NCCL_NET`, any case) or else the first that opens. Logs the
/// choice and every provider passed over.
pub fn choose(init: &NetInit, wanted: Option<&str>) -> Result<Chosen, NetError> {
    let chosen = choose_from(&providers(), init, wanted);
    let rank = init.rank;
    match &chosen {
        Ok(chosen) => {
            for (name, why) in &chosen.skipped {
                tracing::info!(target: "INIT", "[{rank}] NET/{name} not used: {why}");
            }
            let how = match wanted {
                Some(wanted) => format!("NCCL_NET={wanted}"),
                None => "the first that opened".to_string(),
            };
            tracing::info!(target: "INIT", "[{rank}] Using network {} ({how})", chosen.name);
        }
        Err(e) => tracing::warn!(target: "INIT", "[{rank}] {e}"),
    }
    chosen
}

/// [`choose`] among `providers`, without logging.
pub fn choose_from(
    providers: &[Provider],
    init: &NetInit,
    wanted: Option<&str>,
) -> Result<Chosen, NetError> {
    let mut skipped = Vec::new();
    for provider in providers {
        if let Some(wanted) = wanted {
            if !provider.name.eq_ignore_ascii_case(wanted) {
                skipped.push((provider.name.clone(), format!("NCCL_NET={wanted}")));
                continue;
            }
        }
        match (provider.open)(init) {
            Ok(transport) => {
                return Ok(Chosen {
                    transport,
                    name: provider.name.clone(),
                    skipped,
                })
            }
            Err(why) => skipped.push((provider.name.clone(), why)),
        }
    }
    let mut known = String::new();
    for (name, why) in &skipped {
        let sep = if known.is_empty() { "" } else { "; " };
        let _ = write!(known, "{sep}{name}");
        if wanted.is_none_or(|w| name.eq_ignore_ascii_case(w)) {
            let _ = write!(known, " (unavailable: {why})");
        }
    }
    Err(NetError::InvalidArgument(match wanted {
        Some(wanted)
            if !providers
                .iter()
                .any(|p| p.name.eq_ignore_ascii_case(wanted)) =>
        {
            format!("NCCL_NET={wanted}: no network of that name; the networks here are: {known}")
        }
        Some(wanted) => format!("NCCL_NET={wanted}: that network cannot be used: {known}"),
        None => format!("no network could be opened: {known}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn init() -> NetInit {
        NetInit {
            rank: 0,
            devices: vec![SocketDevice {
                name: "lo".into(),
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            }],
            secret: Secret([1; 32]),
        }
    }

    fn unavailable(name: &str) -> Provider {
        Provider::new(name, |_: &NetInit| Err("no device".to_string()))
    }

    /// The built-in Socket behind an IB that never opens (the built-in IB
    /// opens wherever there is a device).
    fn list() -> Vec<Provider> {
        let mut list = vec![unavailable("IB")];
        list.extend(builtin().into_iter().filter(|p| p.name() == "Socket"));
        list
    }

    #[test]
    fn ib_comes_before_socket() {
        let names: Vec<_> = builtin().iter().map(|p| p.name().to_string()).collect();
        assert_eq!(names, ["IB", "Socket"]);
    }

    #[test]
    fn the_first_provider_that_opens_is_used_and_the_others_say_why_not() {
        let chosen = choose_from(&list(), &init(), None).unwrap();
        assert_eq!(chosen.name, "Socket");
        assert_eq!(chosen.transport.name(), "NET/Socket");
        assert_eq!(
            chosen.skipped,
            [("IB".to_string(), "no device".to_string())]
        );
    }

    #[test]
    fn nccl_net_chooses_by_name_ignoring_case() {
        let mut list = list();
        list.insert(
            0,
            Provider::new("Loop", |init: &NetInit| {
                let socket = Socket::new(init.devices.clone(), init.secret).unwrap();
                Ok(Arc::new(Network::new(Arc::new(socket))) as Arc<dyn Transport>)
            }),
        );
        assert_eq!(choose_from(&list, &init(), None).unwrap().name, "Loop");
        let chosen = choose_from(&list, &init(), Some("sOcKeT")).unwrap();
        assert_eq!(chosen.name, "Socket");
        assert_eq!(chosen.skipped.len(), 2);
        assert_eq!(chosen.skipped[0].1, "NCCL_NET=sOcKeT");
    }

    #[test]
    fn a_name_nobody_provides_is_an_error_naming_the_networks_there_are() {
        let err = choose_from(&list(), &init(), Some("Verbs")).err().unwrap();
        let text = err.to_string();
        assert!(matches!(err, NetError::InvalidArgument(_)), "{text}");
        assert!(
            text.contains("NCCL_NET=Verbs: no network of that name"),
            "{text}"
        );
        assert!(text.contains("IB") && text.contains("Socket"), "{text}");
        // A network that exists but does not open says why.
        let err = choose_from(&list(), &init(), Some("ib")).err().unwrap();
        assert!(
            err.to_string().contains("IB (unavailable: no device)"),
            "{err}"
        );
    }
}
