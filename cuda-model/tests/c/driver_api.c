/* A program built against CUDA's own cuda.h, linked with -lcuda, run on
 * the model: the names cuda.h's macros map to must be the model's, and a
 * short sequence (context, memory, a captured host node replayed, pointer
 * attributes, events) must behave as the Driver API says. Exits 0 when it
 * did; otherwise prints the failed call. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                     \
  do {                                                                  \
    CUresult r_ = (call);                                               \
    if (r_ != CUDA_SUCCESS) {                                           \
      const char* name_ = 0;                                            \
      cuGetErrorName(r_, &name_);                                       \
      fprintf(stderr, "%s failed: %s (%d)\n", #call, name_ ? name_ : "?", (int)r_); \
      return 1;                                                         \
    }                                                                   \
  } while (0)

static void CUDA_CB count(void* arg) { ++*(int*)arg; }

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr buf;
  CUstream stream;
  CUgraph graph;
  CUgraphExec exec;
  CUevent start, end;
  unsigned int kind = 0;
  unsigned char host[16];
  float ms = -1;
  int calls = 0, i;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 1));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuMemAlloc(&buf, sizeof host));
  CHECK(cuPointerGetAttribute(&kind, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, buf));
  if (kind != CU_MEMORYTYPE_DEVICE) return fprintf(stderr, "memory type %u\n", kind), 1;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
  CHECK(cuEventCreate(&end, CU_EVENT_DEFAULT));
  CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuMemsetD8Async(buf, 7, sizeof host, stream));
  CHECK(cuLaunchHostFunc(stream, count, &calls));
  CHECK(cuStreamEndCapture(stream, &graph));
  CHECK(cuGraphInstantiate(&exec, graph, 0));
  CHECK(cuEventRecord(start, stream));
  for (i = 0; i < 3; ++i) CHECK(cuGraphLaunch(exec, stream));
  CHECK(cuEventRecord(end, stream));
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuEventElapsedTime(&ms, start, end));
  CHECK(cuMemcpyDtoH(host, buf, sizeof host));
  if (calls != 3 || host[0] != 7 || ms < 0) {
    fprintf(stderr, "calls %d, byte %d, %f ms\n", calls, host[0], ms);
    return 1;
  }
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(buf));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
