//! An opened device: its protection domain, the fatal events read from
//! it, memory registration (host memory and dma-bufs), and the queues and
//! queue pairs it creates.

use super::*;

#[derive(Default)]
pub(super) struct Events {
    pub(super) device: Option<String>,
    pub(super) qps: Vec<(usize, String)>,
}

pub(super) struct RealDevice {
    pub(super) lib: Arc<Lib>,
    pub(super) ctx: *mut c_void,
    pub(super) pd: *mut c_void,
    /// Fatal events read so far (shared with the queue pairs).
    pub(super) events: Arc<Mutex<Events>>,
    /// Whether the kernel takes dma-bufs, once probed.
    pub(super) dmabuf: std::sync::OnceLock<bool>,
}

// SAFETY: libibverbs' contexts, protection domains and their objects may
// be used from any thread.
unsafe impl Send for RealDevice {}
// SAFETY: as above.
unsafe impl Sync for RealDevice {}

impl Drop for RealDevice {
    fn drop(&mut self) {
        // SAFETY: every region, queue pair and queue holds an Arc of the
        // device, so none is left; the PD and context are freed once.
        unsafe {
            (self.lib.dealloc_pd)(self.pd);
            (self.lib.close_device)(self.ctx);
        }
    }
}

impl RealDevice {
    pub(super) fn probe_dmabuf(&self) -> bool {
        let Some(reg) = self.lib.reg_dmabuf_mr else {
            return false;
        };
        // As NCCL probes it: a registration of no file fails with
        // EOPNOTSUPP or EPROTONOSUPPORT where the kernel takes no dma-buf,
        // with another error (EBADF) where it does.
        // SAFETY: `pd` is open; a descriptor of -1 registers nothing.
        let mr = unsafe { reg(self.pd, 0, 0, 0, -1, 0) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if !mr.is_null() {
            // SAFETY: a region this call just made.
            unsafe { (self.lib.dereg_mr)(mr) };
            return true;
        }
        !matches!(errno, Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT))
    }

    /// Reads the pending asynchronous events, keeping the fatal ones.
    pub(super) fn read_events(&self) {
        let mut events = self.events.lock();
        loop {
            let mut event = ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: the async fd is non-blocking, so this returns at
            // once; the event is acknowledged below.
            if unsafe { (self.lib.get_async_event)(self.ctx, &mut event) } != 0 {
                return;
            }
            // SAFETY: a static string for any event type.
            let what = unsafe { CStr::from_ptr((self.lib.event_type_str)(event.event_type)) }
                .to_string_lossy()
                .into_owned();
            match event.event_type {
                // QP fatal, request and access errors.
                1..=3 => events.qps.push((event.element as usize, what)),
                // CQ error, device fatal, port error.
                0 | 8 | 10 => events.device = Some(what),
                _ => tracing::info!(target: "NET", "NET/IB: asynchronous event: {what}"),
            }
            // SAFETY: the event was returned by ibv_get_async_event.
            unsafe { (self.lib.ack_async_event)(&mut event) };
        }
    }
}

impl Device for RealDevice {
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        // SAFETY: the caller keeps the bytes valid while registered.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr.cast(), len, access as c_int) };
        if mr.is_null() {
            return Err(errno_error("ibv_reg_mr"));
        }
        Ok(Box::new(RealMr {
            lib: self.lib.clone(),
            mr,
        }))
    }

    unsafe fn reg_dmabuf_mr(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        let Some(reg) = self.lib.reg_dmabuf_mr else {
            return Err(VerbsError::new(
                "ibv_reg_dmabuf_mr",
                "this libibverbs is older than rdma-core 34",
            ));
        };
        // SAFETY: the caller keeps the dma-buf's bytes valid while
        // registered; `pd` is open.
        let mr = unsafe { reg(self.pd, offset, len, iova, fd, access as c_int) };
        if mr.is_null() {
            return Err(errno_error("ibv_reg_dmabuf_mr"));
        }
        Ok(Box::new(RealMr {
            lib: self.lib.clone(),
            mr,
        }))
    }

    fn registers_dmabuf(&self) -> bool {
        *self.dmabuf.get_or_init(|| self.probe_dmabuf())
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>, VerbsError> {
        // SAFETY: an open context.
        let channel = unsafe { (self.lib.create_comp_channel)(self.ctx) };
        if channel.is_null() {
            return Err(errno_error("ibv_create_comp_channel"));
        }
        // SAFETY: offset of fd in struct ibv_comp_channel; its events are
        // read without waiting.
        let event_fd: c_int = unsafe {
            let fd = field(channel, COMP_CHANNEL_FD);
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            fd
        };
        // SAFETY: an open context and its channel; no vector.
        let cq = unsafe {
            (self.lib.create_cq)(self.ctx, depth as c_int, std::ptr::null_mut(), channel, 0)
        };
        if cq.is_null() {
            let err = errno_error("ibv_create_cq");
            // SAFETY: the channel made above, used by nothing.
            unsafe { (self.lib.destroy_comp_channel)(channel) };
            return Err(err);
        }
        // SAFETY: cq->context is the first field; its ops table holds
        // poll_cq and req_notify_cq at these offsets (checked by the
        // layout test).
        let (poll, notify) = unsafe {
            let ctx = field::<*mut c_void>(cq, 0);
            (
                field::<PollCq>(ctx, OPS_POLL_CQ),
                field::<ReqNotifyCq>(ctx, OPS_REQ_NOTIFY_CQ),
            )
        };
        Ok(Arc::new(RealCq {
            lib: self.lib.clone(),
            cq,
            channel,
            event_fd,
            poll,
            notify,
        }))
    }

    fn create_qp(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Box<dyn QueuePair>, VerbsError> {
        let raw_cq = cq
            .as_any()
            .downcast_ref::<RealCq>()
            .ok_or_else(|| VerbsError::new("ibv_create_qp", "not a libibverbs completion queue"))?
            .cq;
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: raw_cq,
            recv_cq: raw_cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: caps.max_inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a valid PD and init attributes.
        let qp = unsafe { (self.lib.create_qp)(self.pd, &mut attr) };
        if qp.is_null() {
            return Err(errno_error("ibv_create_qp"));
        }
        // SAFETY: offsets of struct ibv_qp and the ops table (checked by
        // the layout test).
        let (qpn, post_send, post_recv) = unsafe {
            let ctx: *mut c_void = field(qp, 0);
            (
                field::<u32>(qp, QP_NUM),
                field::<PostSend>(ctx, OPS_POST_SEND),
                field::<PostRecv>(ctx, OPS_POST_RECV),
            )
        };
        Ok(Box::new(RealQp {
            lib: self.lib.clone(),
            qp,
            qpn,
            post_send_fn: post_send,
            post_recv_fn: post_recv,
            _cq: cq.clone(),
            events: self.events.clone(),
        }))
    }

    fn async_error(&self) -> Option<String> {
        self.read_events();
        self.events.lock().device.clone()
    }
}

pub(super) struct RealMr {
    pub(super) lib: Arc<Lib>,
    pub(super) mr: *mut c_void,
}

// SAFETY: a registration is plain data once made.
unsafe impl Send for RealMr {}
// SAFETY: as above.
unsafe impl Sync for RealMr {}

impl MemoryRegion for RealMr {
    fn lkey(&self) -> u32 {
        // SAFETY: offset of lkey in struct ibv_mr.
        unsafe { field(self.mr, MR_LKEY) }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: offset of rkey in struct ibv_mr.
        unsafe { field(self.mr, MR_RKEY) }
    }
}

impl Drop for RealMr {
    fn drop(&mut self) {
        // SAFETY: deregisters once.
        unsafe { (self.lib.dereg_mr)(self.mr) };
    }
}
