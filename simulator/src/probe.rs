//! A machine's copy and reduction rates in each of the model's regimes
//! (every cache level, memory, streaming), as the `probe_local` example
//! measures them with every core busy.
//!
//! A cluster whose host rates were fitted beside such a probe records it
//! ([`ClusterSpec::probe`](crate::ClusterSpec::probe)); a probe taken
//! beside a later measurement then scales those rates to the machine's
//! speed at that time ([`ClusterSpec::calibrate`](crate::ClusterSpec::calibrate)).
//! On a shared or virtual machine the same code runs up to 2x apart from
//! one hour to the next, and a model fitted at one speed cannot match
//! both.

use serde::{Deserialize, Serialize};

/// One regime's rates, GB/s of output per thread, every core busy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rates {
    /// Copy throughput.
    pub copy_gbs: f64,
    /// Float32 sum throughput (two inputs, one output).
    pub reduce_gbs: f64,
}

impl Rates {
    /// The faster of each rate of `self` and `other`.
    pub fn max(self, other: Rates) -> Rates {
        Rates {
            copy_gbs: self.copy_gbs.max(other.copy_gbs),
            reduce_gbs: self.reduce_gbs.max(other.reduce_gbs),
        }
    }
}

/// The rates of every regime of a host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// Working sets that fit a thread's share of each cache level,
    /// smallest level first (as [`ClusterSpec::caches`](crate::ClusterSpec::caches)).
    pub caches: Vec<Rates>,
    /// Working sets beyond the caches, ordinary stores.
    pub memory: Rates,
    /// Working sets beyond the caches, non-temporal stores.
    pub streaming: Rates,
    /// Two threads on two cores handing each other pieces through a FIFO
    /// each way (each copies its data in, the other copies it out), GB/s
    /// per thread: the rate of a shared-memory transfer between ranks.
    pub handoff_gbs: f64,
}

impl Probe {
    /// Parses a probe's JSON.
    pub fn from_json(text: &str) -> Result<Probe, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The probe as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain numbers serialize")
    }

    /// The median of each rate over `probes` (an even count takes the
    /// mean of the middle two), `None` for no probes or probes of
    /// different cache counts. Over the rounds of a measurement, each
    /// round's probe its fastest of a few samples: the fastest of all
    /// rounds follows the VM's rare fast moments more than the
    /// collectives' fastest rounds do.
    pub fn median<'a>(probes: impl IntoIterator<Item = &'a Probe>) -> Option<Probe> {
        let probes: Vec<&Probe> = probes.into_iter().collect();
        let levels = probes.first()?.caches.len();
        if probes.iter().any(|p| p.caches.len() != levels) {
            return None;
        }
        let median = |rate: &dyn Fn(&Probe) -> f64| {
            median(probes.iter().map(|p| rate(p))).expect("at least one probe")
        };
        let rates = |of: &dyn Fn(&Probe) -> Rates| Rates {
            copy_gbs: median(&|p| of(p).copy_gbs),
            reduce_gbs: median(&|p| of(p).reduce_gbs),
        };
        Some(Probe {
            caches: (0..levels).map(|i| rates(&|p| p.caches[i])).collect(),
            memory: rates(&|p| p.memory),
            streaming: rates(&|p| p.streaming),
            handoff_gbs: median(&|p| p.handoff_gbs),
        })
    }

    /// Every rate, in a fixed order (caches, memory, streaming; copy then
    /// reduce; the hand-off).
    pub(crate) fn all_rates(&self) -> impl Iterator<Item = f64> + '_ {
        self.caches
            .iter()
            .chain([&self.memory, &self.streaming])
            .flat_map(|r| [r.copy_gbs, r.reduce_gbs])
            .chain([self.handoff_gbs])
    }
}

/// The median of `values` (an even count takes the mean of the middle
/// two), `None` for none.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[mid]),
        _ => Some((v[mid - 1] + v[mid]) / 2.0),
    }
}
