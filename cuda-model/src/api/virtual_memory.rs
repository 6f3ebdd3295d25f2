//! Virtual memory management (`cuMemCreate` and its family), as `cuda.h`
//! documents it.
//!
//! A physical allocation is a memfd; an address reservation is a
//! `PROT_NONE` mapping of the process; `cuMemMap` maps the memfd over the
//! reservation but leaves it `PROT_NONE` until `cuMemSetAccess`, so memory
//! touched before access is set faults (a kernel given such an address
//! fails with the context's sticky `CUDA_ERROR_ILLEGAL_ADDRESS`; a copy is
//! refused). A range with access set is an allocation of the model's
//! table (`Kind::Mapped`), so pointer queries, copies and kernels see it.
//! A POSIX file descriptor handle is an open file of its own on the
//! memfd, which another process imports; a dma-buf of a range is a
//! duplicate of the memfd, its offset 0 at the range's start.
//!
//! As on a GPU, only the exported open file itself imports: a descriptor
//! of it (`dup`, inherited, or passed over a Unix socket with
//! `SCM_RIGHTS`), never a new open of `/proc/<pid>/fd/<fd>`. The export
//! marks its open file with a file offset ([`EXPORT_MARK`]), which every
//! descriptor of that open file shares and a reopen does not; an import
//! of an unmarked descriptor fails with `CUDA_ERROR_INVALID_VALUE`.
//!
//! The granularity is 2 MiB, minimum and recommended, as on a GPU: a
//! caller that assumes the page size is refused (reservations are in host
//! pages, as documented; what is created and mapped, in the granularity).

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

use cudarc::driver::sys::{CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUresult};

use super::out;
use crate::state::{lock, Alloc, Kind, State};
use crate::vmm::{Mapping, Physical};
use crate::{call, report, Res};

use CUresult::*;

/// The allocation granularity, minimum and recommended.
const GRANULARITY: usize = 2 << 20;

/// Handles of physical allocations: a range of their own (see state.rs).
const PHYSICAL_BASE: u64 = 0x40_0000;

/// The file offset of an exported handle's open file: what tells the
/// exported open file from a reopen of the same memfd.
const EXPORT_MARK: libc::off_t = 0x6578_706f_7274;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const TYPE_PINNED: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_POSIX_FD: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const RANGE_DMA_BUF_FD: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ` and `_READWRITE` (`_NONE` is 0).
const ACCESS_READ: u32 = 1;
const ACCESS_READWRITE: u32 = 3;

/// `CUmemAllocationProp` with its enumerations as plain integers, so a
/// value outside them is refused rather than undefined behaviour.
#[repr(C)]
struct RawProp {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: c_int,
    win32_metadata: *mut c_void,
    alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`, as [`RawProp`].
#[repr(C)]
struct RawAccess {
    location_type: u32,
    location_id: c_int,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<RawProp>() == std::mem::size_of::<CUmemAllocationProp>());
const _: () = assert!(std::mem::size_of::<RawAccess>() == std::mem::size_of::<CUmemAccessDesc>());

fn granular(value: u64) -> bool {
    value.is_multiple_of(GRANULARITY as u64)
}

/// The device of an allocation property block: pinned memory on a device.
fn prop_device(st: &State, prop: *const CUmemAllocationProp) -> Res<(usize, u32)> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's property block, not null, of RawProp's layout.
    let prop = unsafe { &*prop.cast::<RawProp>() };
    if prop.kind != TYPE_PINNED || prop.location_type != LOCATION_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if prop.handle_types & !HANDLE_POSIX_FD != 0 {
        // Win32 and fabric handles are not modeled.
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok((st.device(prop.location_id)?, prop.handle_types))
}

fn os_error(call: &str) -> CUresult {
    report(format_args!(
        "{call}: {} (CUDA_ERROR_OUT_OF_MEMORY)",
        std::io::Error::last_os_error()
    ));
    CUDA_ERROR_OUT_OF_MEMORY
}

/// Duplicates `fd` (close-on-exec), as a handle given to the caller.
fn duplicate(fd: RawFd, call: &str) -> Res<c_int> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor; no memory is passed.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(os_error(call));
    }
    Ok(dup)
}

/// Replaces `[ptr, ptr + size)` with an inaccessible anonymous mapping:
/// the reservation again.
fn reserve_at(ptr: u64, size: usize) -> Res<()> {
    // SAFETY: the range is a reservation of the model (checked by the
    // callers): nothing of the process's own lives there.
    let at = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(os_error("cuMemUnmap"));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CUresult {
    call(|| {
        let st = lock();
        st.initialized()?;
        prop_device(&st, prop)?;
        // CU_MEM_ALLOC_GRANULARITY_MINIMUM or _RECOMMENDED.
        if option > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(granularity, GRANULARITY)
    })
}

#[no_mangle]
pub extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.current()?;
        let (dev, handle_types) = prop_device(&st, prop)?;
        if handle.is_null() || flags != 0 || size == 0 || !granular(size as u64) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The device is in the name, for the process that imports it.
        let name = std::ffi::CString::new(format!("rccl-cuda-model-device-{dev}"))
            .expect("no NUL in the name");
        // SAFETY: a NUL-terminated name; the new descriptor is owned below.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_error("cuMemCreate"));
        }
        // SAFETY: a fresh descriptor this call owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizes the memfd just made.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(os_error("cuMemCreate"));
        }
        let id = st.handle(PHYSICAL_BASE);
        st.vmm.physicals.insert(
            id,
            Physical {
                memfd,
                size,
                dev,
                handle_types,
                mappings: 0,
                released: false,
            },
        );
        out(handle, id)
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        st.vmm.live(handle)?;
        let physical = st.vmm.physicals.get_mut(&handle).expect("live");
        physical.released = true;
        if physical.mappings == 0 {
            st.vmm.physicals.remove(&handle);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        // Size and hint are in host pages (mappings in it, in the
        // granularity); the default alignment is the granularity.
        let page = 4096;
        if ptr.is_null()
            || flags != 0
            || size == 0
            || !size.is_multiple_of(page)
            || !addr.is_multiple_of(page as u64)
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let alignment = alignment.max(GRANULARITY);
        // `addr` is a hint only: the model takes whatever the system gives
        // and aligns it.
        let span = size + alignment;
        // SAFETY: a fresh inaccessible anonymous mapping; trimmed below.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(os_error("cuMemAddressReserve"));
        }
        let at = at as usize;
        let base = at.next_multiple_of(alignment);
        // SAFETY: unmaps the head and tail of the mapping made above,
        // outside the aligned reservation.
        unsafe {
            if base > at {
                libc::munmap(at as *mut c_void, base - at);
            }
            let tail = at + span - (base + size);
            if tail > 0 {
                libc::munmap((base + size) as *mut c_void, tail);
            }
        }
        st.vmm.reservations.insert(base as u64, size);
        out(ptr, base as u64)
    })
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        if st.vmm.reservations.get(&ptr) != Some(&size) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = ptr + size as u64;
        if st.vmm.mappings.range(ptr..end).next().is_some() {
            report(format_args!(
                "cuMemAddressFree of {ptr:#x} while mapped: unmap first (CUDA_ERROR_INVALID_VALUE)"
            ));
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.vmm.reservations.remove(&ptr);
        // SAFETY: the reservation made by cuMemAddressReserve, unmapped.
        unsafe { libc::munmap(ptr as *mut c_void, size) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        let physical = st.vmm.live(handle)?;
        // The offset "currently must be zero".
        if flags != 0
            || offset != 0
            || size == 0
            || !granular(ptr)
            || !granular(size as u64)
            || size > physical.size
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let end = ptr + size as u64;
        let in_reservation = st
            .vmm
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &len)| end <= base + len as u64);
        let overlaps = st
            .vmm
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&base, m)| base + m.size as u64 > ptr);
        if !in_reservation || overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a reservation of the model, not mapped (checked above):
        // the memfd replaces it, still inaccessible.
        let at = unsafe {
            libc::mmap(
                ptr as *mut c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                physical.memfd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(os_error("cuMemMap"));
        }
        st.vmm.physicals.get_mut(&handle).expect("live").mappings += 1;
        st.vmm.mappings.insert(ptr, Mapping { size, handle });
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.initialized()?;
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let bases = st.vmm.covering(ptr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's array of `count` descriptors, of RawAccess's
        // layout.
        let descs = unsafe { std::slice::from_raw_parts(desc.cast::<RawAccess>(), count) };
        let mut access = 0u64;
        let mut writable = false;
        for d in descs {
            if d.location_type != LOCATION_DEVICE
                || ![0, ACCESS_READ, ACCESS_READWRITE].contains(&d.flags)
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let dev = st.device(d.location_id)?;
            if d.flags != 0 {
                access |= 1 << dev;
            }
            writable |= d.flags == ACCESS_READWRITE;
        }
        let prot = match (access != 0, writable) {
            (false, _) => libc::PROT_NONE,
            (true, false) => libc::PROT_READ,
            (true, true) => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: mappings of the model (covering() checked them).
        if unsafe { libc::mprotect(ptr as *mut c_void, size, prot) } != 0 {
            return Err(os_error("cuMemSetAccess"));
        }
        for base in bases {
            let m = &st.vmm.mappings[&base];
            let (size, handle) = (m.size, m.handle);
            if access == 0 {
                st.allocs.remove(&base);
                continue;
            }
            let dev = st.vmm.physicals[&handle].dev;
            st.allocs.insert(
                base,
                Alloc {
                    size,
                    kind: Kind::Mapped { access },
                    dev,
                    id: handle,
                },
            );
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    call(|| {
        let mut st = lock();
        let dev = st.current()?;
        let bases = st.vmm.covering(ptr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        st.unsafe_call()?;
        // Unmapping is synchronous: the memsets and copies of the legacy
        // stream land first, and the kernels launched before it finish
        // (where allocation waits for kernels).
        let legacy = st.devices[dev].legacy;
        State::drain(&mut st, legacy)?;
        State::wait_kernels(&mut st, dev, "cuMemUnmap")?;
        reserve_at(ptr, size)?;
        for base in bases {
            st.allocs.remove(&base);
            let m = st.vmm.mappings.remove(&base).expect("covered");
            let physical = st.vmm.physicals.get_mut(&m.handle).expect("mapped");
            physical.mappings -= 1;
            if physical.released && physical.mappings == 0 {
                st.vmm.physicals.remove(&m.handle);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    handle_type: c_uint,
    flags: u64,
) -> CUresult {
    call(|| {
        let st = lock();
        st.initialized()?;
        let physical = st.vmm.live(handle)?;
        if flags != 0 || handle_type != HANDLE_POSIX_FD {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if physical.handle_types & HANDLE_POSIX_FD == 0 {
            report(format_args!(
                "cuMemExportToShareableHandle of a handle created without \
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (CUDA_ERROR_INVALID_VALUE)"
            ));
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if shareable.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let fd = open_marked(physical.memfd.as_raw_fd())?;
        out(shareable.cast::<c_int>(), fd)
    })
}

/// A new open file of `memfd`, marked as an export ([`EXPORT_MARK`]).
fn open_marked(memfd: RawFd) -> Res<c_int> {
    const CALL: &str = "cuMemExportToShareableHandle";
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{memfd}"))
        .map_err(|e| {
            report(format_args!("{CALL}: cannot open its memory file: {e}"));
            CUDA_ERROR_OUT_OF_MEMORY
        })?;
    // SAFETY: lseek on the descriptor just opened.
    if unsafe { libc::lseek(file.as_raw_fd(), EXPORT_MARK, libc::SEEK_SET) } != EXPORT_MARK {
        return Err(os_error(CALL));
    }
    Ok(OwnedFd::from(file).into_raw_fd())
}

/// Whether `fd` is a descriptor of an open file [`open_marked`] made.
fn marked(fd: RawFd) -> bool {
    // SAFETY: lseek reads the descriptor's offset; no memory is passed.
    unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) == EXPORT_MARK }
}

/// The device an exported memfd was created on, from its name.
fn device_of(fd: RawFd) -> Option<usize> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let name = link.to_str()?;
    let rest = name.strip_prefix("/memfd:rccl-cuda-model-device-")?;
    rest.split(' ').next()?.parse().ok()
}

#[no_mangle]
pub extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> CUresult {
    call(|| {
        let mut st = lock();
        st.current()?;
        if handle.is_null() || handle_type != HANDLE_POSIX_FD {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A POSIX handle travels as the descriptor's value in the pointer.
        let fd = RawFd::try_from(os_handle as isize).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let dev = device_of(fd)
            .filter(|&d| d < st.devices.len())
            .ok_or_else(|| {
                report(format_args!(
                    "cuMemImportFromShareableHandle: descriptor {fd} is not an exported \
                 allocation (CUDA_ERROR_INVALID_VALUE)"
                ));
                CUDA_ERROR_INVALID_VALUE
            })?;
        if !marked(fd) {
            report(format_args!(
                "cuMemImportFromShareableHandle: descriptor {fd} is a new open of an exported \
                 allocation's file, not the handle cuMemExportToShareableHandle made (a reopen \
                 through /proc/<pid>/fd is not the exported handle): the handle must be passed \
                 as the descriptor itself, e.g. over a Unix socket with SCM_RIGHTS \
                 (CUDA_ERROR_INVALID_VALUE)"
            ));
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: fstat into a zeroed stat buffer.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor and a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let size = stat.st_size as usize;
        if size == 0 || !granular(size as u64) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // The driver holds its own reference: the caller may close `fd`.
        let dup = duplicate(fd, "cuMemImportFromShareableHandle")?;
        // SAFETY: the duplicate made above, owned from here.
        let memfd = unsafe { OwnedFd::from_raw_fd(dup) };
        let id = st.handle(PHYSICAL_BASE);
        st.vmm.physicals.insert(
            id,
            Physical {
                memfd,
                size,
                dev,
                handle_types: HANDLE_POSIX_FD,
                mappings: 0,
                released: false,
            },
        );
        out(handle, id)
    })
}

#[no_mangle]
pub extern "C" fn cuMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: CUdeviceptr,
    size: usize,
    handle_type: c_uint,
    flags: u64,
) -> CUresult {
    call(|| {
        let st = lock();
        st.current()?;
        if handle.is_null() || handle_type != RANGE_DMA_BUF_FD {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if flags != 0 {
            // CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: no BAR1 here.
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let page = 4096;
        if size == 0 || !dptr.is_multiple_of(page) || !(size as u64).is_multiple_of(page) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (base, m) = st
            .vmm
            .mappings
            .range(..=dptr)
            .next_back()
            .filter(|(&base, m)| dptr + size as u64 <= base + m.size as u64)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if *base != dptr {
            // A dma-buf's offset 0 is the range's start: a duplicate of the
            // memfd is that only for a range at the mapping's start.
            report(format_args!(
                "cuMemGetHandleForAddressRange of {dptr:#x}, inside the mapping at \
                 {base:#x}: the model exports whole mappings only (CUDA_ERROR_NOT_SUPPORTED)"
            ));
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let fd = duplicate(
            st.vmm.physicals[&m.handle].memfd.as_raw_fd(),
            "cuMemGetHandleForAddressRange",
        )?;
        out(handle.cast::<c_int>(), fd)
    })
}
