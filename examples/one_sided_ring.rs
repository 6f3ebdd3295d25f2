//! A one-sided pipeline: an all-gather around a ring by `put_signal`.
//!
//! Every rank owns a block of floats. In each of `n - 1` steps it passes
//! on the block it got last (its own at first) to the next rank, in
//! chunks, by writing them into that rank's window and raising a signal;
//! the next rank never posts a receive. A window holds two chunk slots:
//! the writer reuses a slot once the reader has acknowledged the chunk in
//! it (`signal` back on a second signal index), so writing chunk `k + 1`
//! overlaps reading chunk `k`. At the end every rank holds every block,
//! checked here.
//!
//! ```sh
//! cargo run --release --example one_sided_ring -- 4
//! ```

use rccl::{Communicator, Config, WaitDesc};

const BLOCK: usize = 1 << 16; // floats per rank
const CHUNK: usize = 1 << 12; // floats per put
const DATA: usize = 0;
const ACK: usize = 1;

fn value(owner: usize, i: usize) -> f32 {
    (owner * BLOCK + i) as f32
}

fn one(peer: usize, sig: usize) -> [WaitDesc; 1] {
    [WaitDesc {
        peer,
        sig,
        ctx: 0,
        count: 1,
    }]
}

fn rank_main(comm: &Communicator) -> rccl::Result<()> {
    let (rank, n) = (comm.rank(), comm.count());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let slot_bytes = CHUNK * 4;
    let base = rccl::alloc_shareable_host(2 * slot_bytes)?;
    // SAFETY: the memory outlives the window (deregistered below).
    let window = unsafe { comm.register_window(base, 2 * slot_bytes, 0)? };
    let slots = base.cast::<f32>();

    let mut all = vec![0f32; n * BLOCK];
    for i in 0..BLOCK {
        all[rank * BLOCK + i] = value(rank, i);
    }
    let mut put = 0usize; // chunks written to `next` so far
    let mut got = 0usize; // chunks read from `prev` so far
    for step in 0..n - 1 {
        let (send_block, recv_block) = ((rank + n - step) % n, (rank + n - step - 1) % n);
        for c in 0..BLOCK / CHUNK {
            // The slot about to be written was read two chunks ago.
            if put >= 2 {
                comm.wait_signal(&one(next, ACK))?;
            }
            let chunk = &all[send_block * BLOCK + c * CHUNK..][..CHUNK];
            comm.put_signal(chunk, next, window, (put % 2) * slot_bytes, DATA, 0)?;
            put += 1;
            comm.wait_signal(&one(prev, DATA))?;
            let into = &mut all[recv_block * BLOCK + c * CHUNK..][..CHUNK];
            // SAFETY: the slot holds CHUNK floats the signal waited for
            // made visible; `prev` writes it again only after our
            // acknowledgement below.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    slots.add((got % 2) * CHUNK),
                    into.as_mut_ptr(),
                    CHUNK,
                )
            };
            got += 1;
            comm.signal(prev, ACK, 0)?;
        }
    }
    for _ in 0..put.min(2) {
        comm.wait_signal(&one(next, ACK))?;
    }
    comm.deregister_window(window)?;
    rccl::free_shareable_host(base)?;
    for owner in 0..n {
        for i in 0..BLOCK {
            assert_eq!(
                all[owner * BLOCK + i],
                value(owner, i),
                "rank {rank}: block {owner}"
            );
        }
    }
    Ok(())
}

fn main() -> rccl::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("a rank count"))
        .unwrap_or(4);
    let config = Config {
        rma_signals: 2,
        ..Config::from_env()?
    };
    let comms = Communicator::init_all_config(n, config)?;
    std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || rank_main(c)))
            .collect();
        ranks
            .into_iter()
            .try_for_each(|r| r.join().expect("a rank panicked"))
    })?;
    println!("one_sided_ring: {n} ranks each hold all {n} blocks of {BLOCK} floats");
    Ok(())
}
