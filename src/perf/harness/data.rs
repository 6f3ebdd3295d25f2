//! The measured operation's data: buffer positions, issuing the
//! collective on every rank, and filling and checking the buffers.

use super::books::grouped;
use super::worker::{Setup, Worker};
use super::Res;
use crate::perf::args::TestOp;
use crate::perf::coll::Pattern;
use crate::perf::format::engine_error;

impl Worker<'_> {
    /// Writes `bytes` at `dst` in this run's memory.
    fn write_mem(&self, dst: *mut u8, bytes: &[u8]) {
        match self.setup.device {
            // SAFETY: the callers pass a range inside one of the buffers,
            // with no work in flight on it.
            Some(device) => unsafe { device.copy(dst, bytes.as_ptr(), bytes.len()) }
                .expect("a copy inside a device buffer"),
            // SAFETY: as above.
            None => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) },
        }
    }

    /// Reads `len` bytes at `src` in this run's memory.
    fn read_mem(&self, src: *const u8, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        match self.setup.device {
            // SAFETY: the callers pass a range inside one of the buffers,
            // with no work in flight on it.
            Some(device) => unsafe { device.copy(out.as_mut_ptr(), src, len) }
                .expect("a copy inside a device buffer"),
            // SAFETY: as above.
            None => unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len) },
        }
        out
    }

    /// Send and receive pointers of rank `i` at buffer rotation `iter`.
    fn pointers(
        &mut self,
        i: usize,
        st: &Setup,
        in_place: bool,
        iter: usize,
    ) -> (*mut u8, *mut u8) {
        let elt = st.dtype.size();
        let shift = st.total_bytes() * (iter % st.steps) + self.args.unalign * elt;
        let rank = &mut self.ranks[i];
        let r = rank.comm.rank();
        // SAFETY: (all adds below) shift + the call's extent stays inside
        // the maxbytes (+ unalign) each buffer holds: steps * total <=
        // maxbytes, and the in-place offsets stay inside recv's total.
        unsafe {
            let recv = rank.recv.ptr().add(shift);
            if in_place {
                (
                    recv.add(st.counts.send_inplace_offset * elt * r),
                    recv.add(st.counts.recv_inplace_offset * elt * r),
                )
            } else {
                (rank.send.ptr().add(shift), recv)
            }
        }
    }

    /// One operation on every rank of this thread (nccl-tests' startColl).
    pub(super) fn start_coll(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
        iter: usize,
    ) -> Res<()> {
        let phases = self.coll.phases(self.nranks);
        let multi = self.ranks.len() > 1;
        let root = root.max(0) as usize;
        let coll = self.coll;
        let program = coll.program_name();
        for phase in 0..phases {
            grouped(multi, || {
                for i in 0..self.ranks.len() {
                    let (send, recv) = self.pointers(i, st, in_place, iter);
                    let comm = &self.ranks[i].comm;
                    let stream = self.ranks[i].stream.as_deref();
                    let red = op.unwrap_or(TestOp::Sum).red_op(st.dtype, comm.rank());
                    // SAFETY: pointers() keeps both inside this rank's
                    // buffers for the call's counts; they stay alive (self
                    // is borrowed) until the group ends.
                    unsafe {
                        coll.issue(
                            stream,
                            comm,
                            send,
                            recv,
                            st.counts.param,
                            st.dtype,
                            red,
                            root,
                            phase,
                        )?
                    };
                }
                Ok(())
            })
            .map_err(engine_error(program))?;
        }
        Ok(())
    }

    fn pattern(&self, st: &Setup, op: Option<TestOp>, seed: usize) -> Pattern {
        let op = if self.coll.reduces() { op } else { None };
        Pattern::new(st.dtype, op, self.nranks, seed)
    }

    /// Fills every rank's input and clears its output region.
    pub(super) fn init_data(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
        seed: usize,
    ) {
        let pat = self.pattern(st, op, seed);
        let elt = st.dtype.size();
        let root = root.max(0) as usize;
        for i in 0..self.ranks.len() {
            // recv and send are valid for their counts (pointers()); the
            // send region is written last (in place, it lies inside recv).
            let (send, recv) = self.pointers(i, st, in_place, 0);
            let r = self.ranks[i].comm.rank();
            self.write_mem(recv, &vec![0u8; st.counts.recv * elt]);
            if self.coll.sends(r, root) {
                let mut out = vec![0u8; st.counts.send * elt];
                for (j, chunk) in out.chunks_exact_mut(elt).enumerate() {
                    crate::perf::codec::encode(st.dtype, self.coll.input(&pat, r, j), chunk);
                }
                self.write_mem(send, &out);
            }
        }
    }

    /// Wrong elements over this thread's ranks.
    pub(super) fn check_data(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
        seed: usize,
    ) -> u64 {
        let pat = self.pattern(st, op, seed);
        let elt = st.dtype.size();
        let root = root.max(0) as usize;
        let mut wrong = 0;
        for i in 0..self.ranks.len() {
            let (_, recv) = self.pointers(i, st, in_place, 0);
            let r = self.ranks[i].comm.rank();
            if !self.coll.receives(r, root) {
                continue;
            }
            // recv is valid for counts.recv elements; the operation has
            // completed.
            let got = self.read_mem(recv, st.counts.recv * elt);
            for (j, chunk) in got.chunks_exact(elt).enumerate() {
                let want = self.coll.expected(&pat, r, root, st.counts.param.max(1), j);
                if !pat.matches(&want, chunk) {
                    wrong += 1;
                }
            }
        }
        wrong
    }

    /// The test fault: flips a high bit of one output element of the first
    /// checked rank.
    pub(super) fn corrupt_output(&mut self, st: &Setup, root: i32, in_place: bool) {
        let elt = st.dtype.size();
        let target = if self.coll.has_root() {
            root.max(0) as usize
        } else {
            0
        };
        for i in 0..self.ranks.len() {
            if self.ranks[i].comm.rank() == target && st.counts.recv > 0 {
                let (_, recv) = self.pointers(i, st, in_place, 0);
                // recv holds at least one element.
                let last = recv.wrapping_add(elt - 1);
                let mut byte = self.read_mem(last, 1);
                byte[0] ^= 0x40;
                self.write_mem(last, &byte);
            }
        }
    }
}
