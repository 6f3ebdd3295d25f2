/*
 * rcclrs_emu.h: control calls of rccl-rs' emulated GPU (RCCL_DEVICE=emu),
 * for C programs and tests on machines without a GPU, in place of the
 * CUDA runtime calls they would make: device memory, copies, streams and
 * events. Include after nccl.h. Each call returns ncclSuccess or an
 * ncclResult_t with a message for ncclGetLastError(NULL); each selects the
 * emulated GPU if no device backend is active yet.
 *
 * Device memory is host memory that the library tracks: the host path of
 * the library refuses it, and calls on it run stream-ordered. A stream is
 * an ordered queue run by a worker thread of its own; NULL is the default
 * stream. Synchronize calls wait at most RCCL_TIMEOUT_MS (default 300 s).
 */
#ifndef RCCLRS_EMU_H_
#define RCCLRS_EMU_H_

#include <stddef.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rcclrsEmuEvent_st *rcclrsEmuEvent_t;

/* Device memory. */
ncclResult_t rcclrsEmuMalloc(void **ptr, size_t size);
ncclResult_t rcclrsEmuFree(void *ptr);
/* Synchronous copy, host or device memory either side; not ordered with
 * any stream. */
ncclResult_t rcclrsEmuMemcpy(void *dst, const void *src, size_t bytes);
ncclResult_t rcclrsEmuMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream);

/* Streams. */
ncclResult_t rcclrsEmuStreamCreate(cudaStream_t *stream);
ncclResult_t rcclrsEmuStreamDestroy(cudaStream_t stream);
ncclResult_t rcclrsEmuStreamSynchronize(cudaStream_t stream);
ncclResult_t rcclrsEmuStreamWaitEvent(cudaStream_t stream, rcclrsEmuEvent_t event);

/* Events. */
ncclResult_t rcclrsEmuEventCreate(rcclrsEmuEvent_t *event);
ncclResult_t rcclrsEmuEventDestroy(rcclrsEmuEvent_t event);
ncclResult_t rcclrsEmuEventRecord(rcclrsEmuEvent_t event, cudaStream_t stream);
/* *done = 1 when the latest record has completed (or none was made). */
ncclResult_t rcclrsEmuEventQuery(rcclrsEmuEvent_t event, int *done);
ncclResult_t rcclrsEmuEventSynchronize(rcclrsEmuEvent_t event);

#ifdef __cplusplus
}
#endif

#endif /* RCCLRS_EMU_H_ */
