//! What a run reports besides its rows: the device list, the JSON file's
//! configuration, and the tuner's choice for each row.

use rccl::{CollCall, CollKind, DataType, RedOp};
use serde_json::{Map, Value};

use super::books::grouped;
use super::worker::{lock, Setup, Worker};
use super::Res;
use crate::perf::coll::Coll;
use crate::perf::format::{engine_error, hostname};
use crate::perf::json;

impl Worker<'_> {
    /// "# Using devices": every rank's pid, host and device, gathered
    /// through the communicator to rank 0.
    pub(super) fn device_report(&mut self) -> Res<()> {
        const REC: usize = 64;
        let n = self.nranks;
        let host = hostname();
        let mut sends: Vec<[u8; REC]> = Vec::new();
        for (i, _) in self.ranks.iter().enumerate() {
            let mut rec = [0u8; REC];
            rec[..4].copy_from_slice(&std::process::id().to_le_bytes());
            rec[4..8].copy_from_slice(&((self.device_base + i) as u32).to_le_bytes());
            let hb = host.as_bytes();
            let len = hb.len().min(REC - 9);
            rec[8..8 + len].copy_from_slice(&hb[..len]);
            sends.push(rec);
        }
        let mut recvs = vec![vec![0u8; REC * n]; self.ranks.len()];
        let multi = self.ranks.len() > 1;
        grouped(multi, || {
            for ((rank, s), r) in self.ranks.iter().zip(&sends).zip(recvs.iter_mut()) {
                // SAFETY: s holds REC bytes and r holds REC * n bytes, both
                // alive until the group ends below.
                unsafe {
                    rank.books.collective_raw(
                        CollCall {
                            kind: CollKind::AllGather,
                            count: REC,
                            dtype: DataType::Uint8,
                            op: RedOp::Sum,
                            root: 0,
                        },
                        s.as_ptr(),
                        r.as_mut_ptr(),
                    )?
                };
            }
            Ok(())
        })
        .map_err(engine_error("ncclAllGather"))?;
        let mut text = String::from("# Using devices\n");
        let (where_, what) = match self.setup.device {
            None => ("[cpu]".to_string(), "host memory"),
            Some(device) => (device.label(), "device memory"),
        };
        let mut devices = Vec::new();
        let mut all_ranks = Vec::new();
        for (rank, rec) in recvs[0].chunks(REC).enumerate() {
            let pid = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
            let dev = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
            let end = rec[8..].iter().position(|&b| b == 0).map_or(REC, |p| 8 + p);
            let host = String::from_utf8_lossy(&rec[8..end]);
            text += &format!("#  Rank {rank:>2} Group {:>2} Pid {pid:>6} on {host:>10} device {dev:>2} {where_} {what}\n", 0);
            // nccl-tests lists one device per process: its first rank's.
            let entry = serde_json::json!({
                "rank": rank, "group": 0, "pid": pid, "hostname": host,
                "device": dev, "device_hex": where_, "device_info": what,
            });
            if rank % self.setup.ranks_per_proc == 0 {
                devices.push(entry.clone());
            }
            all_ranks.push(entry);
        }
        self.print(&text);
        if let Some(doc) = self.json {
            let config = self.json_config(devices, all_ranks);
            lock(doc).set_config(config);
        }
        Ok(())
    }

    /// nccl-tests' `config` object, with rccl-rs' additions under `rccl`.
    fn json_config(&self, devices: Vec<Value>, all_ranks: Vec<Value>) -> Value {
        let a = self.args;
        let mut c = Map::new();
        c.insert("nthreads".into(), a.nthreads.into());
        c.insert("ngpus".into(), a.ngpus.into());
        c.insert("minimum_bytes".into(), a.minbytes.into());
        c.insert("maximum_bytes".into(), a.maxbytes.into());
        if a.stepfactor > 1 {
            c.insert("step_factor".into(), a.stepfactor.into());
        } else {
            c.insert("step_bytes".into(), a.stepbytes.into());
        }
        c.insert("warmup_iters".into(), a.warmup_iters.into());
        c.insert("iterations".into(), a.iters.into());
        c.insert("aggregated_iterations".into(), a.agg_iters.into());
        c.insert("validation".into(), a.check.into());
        c.insert("graph".into(), a.cudagraph.into());
        c.insert(
            "blocking_collectives".into(),
            json::bool_str(a.blocking != 0),
        );
        c.insert(
            "per_iter_timing".into(),
            json::bool_str(self.setup.per_iter),
        );
        c.insert("per_iter_skip".into(), self.setup.skip.into());
        c.insert("parallel_init".into(), json::bool_str(a.parallel_init != 0));
        c.insert("devices".into(), Value::Array(devices));
        let config = self.ranks.first().map(|r| r.comm.config());
        c.insert(
            "rccl".into(),
            serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "revision": env!("RCCL_BUILD_REVISION"),
                "memory": if self.setup.device.is_some() { "device" } else { "host" },
                "launch": self.setup.launch,
                "nranks": self.nranks,
                "ranks_per_process": self.setup.ranks_per_proc,
                "min_channels": config.map(|c| c.min_channels),
                "max_channels": config.map(|c| c.max_channels),
                // The measured communicator's own setting, whichever of
                // --deterministic and NCCL_DETERMINISTIC set it.
                "deterministic": config.map(|c| c.deterministic),
                "ranks": all_ranks,
            }),
        );
        Value::Object(c)
    }

    /// What the tuner picks for this call on the first rank of this
    /// thread: algorithm, protocol and channels, out-of-place and in-place
    /// (the tuner may pick differently for an in-place call).
    pub(super) fn tuning_json(&self, st: &Setup, root: i32) -> Value {
        let Some(first) = self.ranks.first() else {
            return Value::Null;
        };
        let comm = &first.comm;
        let elt = st.dtype.size();
        let kind = match self.coll {
            Coll::AllReduce => Some(CollKind::AllReduce),
            Coll::AllGather => Some(CollKind::AllGather),
            Coll::Broadcast => Some(CollKind::Broadcast),
            Coll::Reduce => Some(CollKind::Reduce),
            Coll::ReduceScatter => Some(CollKind::ReduceScatter),
            Coll::AllToAll => Some(CollKind::AllToAll),
            Coll::Gather => Some(CollKind::Gather),
            Coll::Scatter => Some(CollKind::Scatter),
            Coll::SendRecv | Coll::HyperCube => None,
        };
        let pick = |in_place: bool| -> Value {
            let (algorithm, protocol, channels) = match kind {
                Some(kind) => {
                    match comm.tuning_choice(
                        kind,
                        st.counts.param,
                        elt,
                        root.max(0) as usize,
                        in_place,
                    ) {
                        Ok(c) => (c.algorithm.name(), c.protocol.name(), c.params.nchannels),
                        Err(e) => return serde_json::json!({ "error": e.to_string() }),
                    }
                }
                None => {
                    // Sends and receives: the largest message of one call.
                    let largest = match self.coll {
                        Coll::HyperCube => st.counts.param * (self.nranks / 2).max(1),
                        _ => st.counts.param,
                    };
                    let (channels, protocol) =
                        rccl::tuning::p2p_choice(comm.config(), largest * elt, comm.rails());
                    ("p2p", protocol.name(), channels)
                }
            };
            serde_json::json!({
                "algorithm": algorithm,
                "protocol": protocol,
                "channels": channels,
            })
        };
        let (out, inp) = (pick(false), pick(true));
        let mut m = Map::new();
        if let Value::Object(o) = &out {
            m.extend(o.clone());
        }
        if inp != out {
            m.insert("in_place_choice".into(), inp);
        }
        Value::Object(m)
    }
}
