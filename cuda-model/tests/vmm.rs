//! cuMem virtual memory management: the granularity, access, release
//! while mapped, export to another process, dma-bufs.

#[macro_use]
mod common;

use std::os::fd::AsRawFd;
use std::process::Command;

use common::{
    alloc, context, cu, isolated, read, stream, AccessDesc, AllocationProp, Kernels,
    ILLEGAL_ADDRESS, INVALID_VALUE, NON_BLOCKING, NOT_FOUND, NOT_SUPPORTED, P,
};

const POSIX_FD: u32 = 1;

/// Pinned memory of device 0, exportable as a file descriptor.
fn shareable_prop() -> AllocationProp {
    AllocationProp {
        kind: 1,
        handle_types: POSIX_FD,
        location_type: 1,
        location_id: 0,
        win32_metadata: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

fn read_write_on_device_0() -> AccessDesc {
    AccessDesc {
        location_type: 1,
        location_id: 0,
        flags: 3,
    }
}

fn granularity() -> usize {
    let mut g = 0;
    ok!((cu().cuMemGetAllocationGranularity)(
        &mut g,
        &shareable_prop(),
        0
    ));
    g
}

/// A physical allocation of `size` bytes mapped at a fresh reservation,
/// access not set yet: (handle, address).
fn mapped(size: usize) -> (u64, u64) {
    let mut handle = 0;
    ok!((cu().cuMemCreate)(&mut handle, size, &shareable_prop(), 0));
    let mut ptr = 0;
    ok!((cu().cuMemAddressReserve)(&mut ptr, size, 0, 0, 0));
    ok!((cu().cuMemMap)(ptr, size, 0, handle, 0));
    (handle, ptr)
}

fn set_access(ptr: u64, size: usize) {
    ok!((cu().cuMemSetAccess)(
        ptr,
        size,
        &read_write_on_device_0(),
        1
    ));
}

fn write(ptr: u64, bytes: &[u8]) {
    ok!((cu().cuMemcpyHtoD_v2)(
        ptr,
        bytes.as_ptr().cast(),
        bytes.len()
    ));
}

#[test]
fn vmm_sizes_and_addresses_off_the_granularity_are_refused() {
    isolated(
        "vmm_sizes_and_addresses_off_the_granularity_are_refused",
        &[],
        || {
            context(0);
            let g = granularity();
            assert!(g > 4096, "a GPU's granularity, not the page size");
            let mut recommended = 0;
            ok!((cu().cuMemGetAllocationGranularity)(
                &mut recommended,
                &shareable_prop(),
                1
            ));
            assert_eq!(recommended % g, 0);
            let mut handle = 0;
            fails!(
                INVALID_VALUE,
                (cu().cuMemCreate)(&mut handle, g / 2, &shareable_prop(), 0)
            );
            fails!(
                INVALID_VALUE,
                (cu().cuMemCreate)(&mut handle, g + 4096, &shareable_prop(), 0)
            );
            ok!((cu().cuMemCreate)(&mut handle, g, &shareable_prop(), 0));
            // Reservations are in host pages, mappings in the granularity.
            let mut ptr = 0;
            fails!(
                INVALID_VALUE,
                (cu().cuMemAddressReserve)(&mut ptr, 100, 0, 0, 0)
            );
            ok!((cu().cuMemAddressReserve)(&mut ptr, 4096, 0, 0, 0));
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, 4096, 0, handle, 0));
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, g, 0, handle, 0));
            ok!((cu().cuMemAddressFree)(ptr, 4096));
            ok!((cu().cuMemAddressReserve)(&mut ptr, 2 * g, 0, 0, 0));
            assert_eq!(ptr % g as u64, 0);
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr + 4096, g, 0, handle, 0));
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, 4096, 0, handle, 0));
            // Larger than the allocation.
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, 2 * g, 0, handle, 0));
            ok!((cu().cuMemMap)(ptr + g as u64, g, 0, handle, 0));
            // A mapped reservation is not freed.
            fails!(INVALID_VALUE, (cu().cuMemAddressFree)(ptr, 2 * g));
            ok!((cu().cuMemUnmap)(ptr + g as u64, g));
            ok!((cu().cuMemAddressFree)(ptr, 2 * g));
            ok!((cu().cuMemRelease)(handle));
        },
    );
}

#[test]
fn vmm_memory_is_inaccessible_until_access_is_set() {
    isolated(
        "vmm_memory_is_inaccessible_until_access_is_set",
        &[],
        || {
            context(0);
            let g = granularity();
            let (_, ptr) = mapped(g);
            let bytes = [7u8; 64];
            fails!(
                INVALID_VALUE,
                (cu().cuMemcpyHtoD_v2)(ptr, bytes.as_ptr().cast(), 64)
            );
            let (mut base, mut size) = (0, 0);
            fails!(
                NOT_FOUND,
                (cu().cuMemGetAddressRange_v2)(&mut base, &mut size, ptr)
            );
            let k = Kernels::load();
            let s = stream(NON_BLOCKING);
            let other = alloc(64);
            k.copy(ptr, other, 64, s);
            fails!(ILLEGAL_ADDRESS, (cu().cuStreamSynchronize)(s));
        },
    );
}

#[test]
fn vmm_memory_with_access_set_is_device_memory() {
    isolated("vmm_memory_with_access_set_is_device_memory", &[], || {
        context(0);
        let g = granularity();
        let (_, ptr) = mapped(g);
        set_access(ptr, g);
        write(ptr + 100, &[7u8; 64]);
        assert_eq!(read(ptr + 100, 64), vec![7u8; 64]);
        let (mut base, mut size) = (0, 0);
        ok!((cu().cuMemGetAddressRange_v2)(
            &mut base,
            &mut size,
            ptr + 100
        ));
        assert_eq!((base, size), (ptr, g));
        let mut kind = 0u32;
        ok!((cu().cuPointerGetAttribute)(
            (&mut kind as *mut u32).cast(),
            2, // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
            ptr
        ));
        assert_eq!(kind, 2, "device memory");
        // Not cuMemAlloc memory.
        fails!(INVALID_VALUE, (cu().cuMemFree_v2)(ptr));
        let k = Kernels::load();
        let s = stream(NON_BLOCKING);
        let other = alloc(64);
        k.copy(other, ptr + 100, 64, s);
        ok!((cu().cuStreamSynchronize)(s));
        assert_eq!(read(other, 64), vec![7u8; 64]);
    });
}

#[test]
fn vmm_memory_released_while_mapped_lives_until_unmapped() {
    isolated(
        "vmm_memory_released_while_mapped_lives_until_unmapped",
        &[],
        || {
            context(0);
            let g = granularity();
            let (handle, ptr) = mapped(g);
            set_access(ptr, g);
            write(ptr, b"still here");
            ok!((cu().cuMemRelease)(handle));
            assert_eq!(read(ptr, 10), b"still here");
            // The handle itself is gone.
            fails!(INVALID_VALUE, (cu().cuMemRelease)(handle));
            let mut fd = -1i32;
            fails!(
                INVALID_VALUE,
                (cu().cuMemExportToShareableHandle)(
                    (&mut fd as *mut i32).cast(),
                    handle,
                    POSIX_FD,
                    0
                )
            );
            ok!((cu().cuMemUnmap)(ptr, g));
            // Back to a bare reservation.
            let mut out = [0u8; 10];
            fails!(
                INVALID_VALUE,
                (cu().cuMemcpyDtoH_v2)(out.as_mut_ptr().cast(), ptr, 10)
            );
            fails!(INVALID_VALUE, (cu().cuMemMap)(ptr, g, 0, handle, 0));
            ok!((cu().cuMemAddressFree)(ptr, g));
        },
    );
}

const IMPORT_TEST: &str = "vmm_memory_exported_to_another_process_shares_its_bytes";

/// The importing process: maps descriptor `fd`, checks what the exporter
/// wrote and answers.
fn import_and_answer(fd: i32) {
    context(0);
    let g = granularity();
    let mut handle = 0;
    // A new open of the exporter's descriptor is not the exported handle.
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let reopened = std::fs::File::open(format!("/proc/{parent}/fd/{fd}")).unwrap();
    fails!(
        INVALID_VALUE,
        (cu().cuMemImportFromShareableHandle)(
            &mut handle,
            reopened.as_raw_fd() as isize as P,
            POSIX_FD
        )
    );
    ok!((cu().cuMemImportFromShareableHandle)(
        &mut handle,
        fd as isize as P,
        POSIX_FD
    ));
    // SAFETY: the inherited descriptor; the driver holds its own.
    unsafe { libc::close(fd) };
    let mut ptr = 0;
    ok!((cu().cuMemAddressReserve)(&mut ptr, g, 0, 0, 0));
    ok!((cu().cuMemMap)(ptr, g, 0, handle, 0));
    set_access(ptr, g);
    assert_eq!(read(ptr, 8), b"exporter");
    write(ptr, b"importer");
    ok!((cu().cuMemUnmap)(ptr, g));
    ok!((cu().cuMemAddressFree)(ptr, g));
    ok!((cu().cuMemRelease)(handle));
}

#[test]
fn vmm_memory_exported_to_another_process_shares_its_bytes() {
    if let Ok(fd) = std::env::var("CUDA_MODEL_IMPORT_FD") {
        if std::env::var("CUDA_MODEL_RULE").as_deref() == Ok(IMPORT_TEST) {
            import_and_answer(fd.parse().unwrap());
            std::process::exit(0);
        }
    }
    isolated(IMPORT_TEST, &[], || {
        context(0);
        let g = granularity();
        let (handle, ptr) = mapped(g);
        set_access(ptr, g);
        write(ptr, b"exporter");
        ok!((cu().cuCtxSynchronize)());
        let mut fd = -1i32;
        fails!(
            INVALID_VALUE,
            (cu().cuMemExportToShareableHandle)((&mut fd as *mut i32).cast(), handle, 2, 0)
        );
        ok!((cu().cuMemExportToShareableHandle)(
            (&mut fd as *mut i32).cast(),
            handle,
            POSIX_FD,
            0
        ));
        // The child inherits the descriptor.
        // SAFETY: clears close-on-exec of the descriptor just exported.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
        let out = Command::new(std::env::current_exe().unwrap())
            .args([IMPORT_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env("CUDA_MODEL_RULE", IMPORT_TEST)
            .env("CUDA_MODEL_IMPORT_FD", fd.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the importer failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(read(ptr, 8), b"importer");
        // A descriptor that is no exported allocation is refused.
        let mut other = 0;
        fails!(
            INVALID_VALUE,
            (cu().cuMemImportFromShareableHandle)(&mut other, 2 as P, POSIX_FD)
        );
    });
}

#[test]
fn a_dma_buf_of_vmm_memory_starts_at_the_range() {
    isolated("a_dma_buf_of_vmm_memory_starts_at_the_range", &[], || {
        context(0);
        let g = granularity();
        let (_, ptr) = mapped(g);
        set_access(ptr, g);
        write(ptr, b"dma-buf");
        // The copy lands before the NIC reads.
        ok!((cu().cuCtxSynchronize)());
        let mut fd = -1i32;
        let handle = (&mut fd as *mut i32).cast();
        // Off the page.
        fails!(
            INVALID_VALUE,
            (cu().cuMemGetHandleForAddressRange)(handle, ptr + 8, 4096, 1, 0)
        );
        // Inside the mapping: the model exports whole mappings only.
        fails!(
            NOT_SUPPORTED,
            (cu().cuMemGetHandleForAddressRange)(handle, ptr + 4096, 4096, 1, 0)
        );
        ok!((cu().cuMemGetHandleForAddressRange)(handle, ptr, g, 1, 0));
        // SAFETY: a shared mapping of the dma-buf, read and unmapped here.
        let bytes = unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(at, libc::MAP_FAILED);
            let bytes = std::slice::from_raw_parts(at.cast::<u8>(), 7).to_vec();
            libc::munmap(at, 4096);
            bytes
        };
        assert_eq!(bytes, b"dma-buf");
    });
}
