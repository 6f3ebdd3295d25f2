/*
 * A C program on the emulated GPU (RCCL_DEVICE=emu), as a CUDA program
 * would use NCCL: device buffers from ncclMemAlloc, one stream per rank
 * (two ranks sharing one), ranks driven from one thread in groups, results
 * read back after a stream synchronize; send / recv in a ring; an event
 * ordering one stream after another; a call mixing host and device buffers
 * refused. Exit status 0 means it passed.
 */
#include <nccl.h>
#include <rcclrs_emu.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define N 4
#define COUNT 1000

int main(void) {
  ncclComm_t comms[N];
  cudaStream_t streams[N];
  float *send[N], *recv[N];
  float host[COUNT];
  CHECK(ncclCommInitAll(comms, N, NULL));
  CHECK(rcclrsEmuStreamCreate(&streams[0]));
  CHECK(rcclrsEmuStreamCreate(&streams[2]));
  streams[1] = streams[0]; /* ranks 0 and 1 share a stream */
  streams[3] = NULL;       /* rank 3 runs on the default stream */
  for (int r = 0; r < N; r++) {
    CHECK(ncclMemAlloc((void **)&send[r], COUNT * sizeof(float)));
    CHECK(ncclMemAlloc((void **)&recv[r], COUNT * sizeof(float)));
    for (int i = 0; i < COUNT; i++) host[i] = (float)(r + 1);
    CHECK(rcclrsEmuMemcpy(send[r], host, sizeof host));
  }

  /* An all-reduce over every rank from this one thread. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++)
    CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclFloat, ncclSum, comms[r], streams[r]));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++) CHECK(rcclrsEmuStreamSynchronize(streams[r]));
  for (int r = 0; r < N; r++) {
    CHECK(rcclrsEmuMemcpy(host, recv[r], sizeof host));
    for (int i = 0; i < COUNT; i++) EXPECT(host[i] == 10.0f);
  }

  /* Sends and receives in a ring. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    CHECK(ncclSend(send[r], COUNT, ncclFloat, (r + 1) % N, comms[r], streams[r]));
    CHECK(ncclRecv(recv[r], COUNT, ncclFloat, (r + N - 1) % N, comms[r], streams[r]));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++) CHECK(rcclrsEmuStreamSynchronize(streams[r]));
  for (int r = 0; r < N; r++) {
    CHECK(rcclrsEmuMemcpy(host, recv[r], sizeof host));
    for (int i = 0; i < COUNT; i++) EXPECT(host[i] == (float)((r + N - 1) % N + 1));
  }

  /* An event orders a copy on stream 2 after the all-reduce on stream 0. */
  rcclrsEmuEvent_t done;
  CHECK(rcclrsEmuEventCreate(&done));
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++)
    CHECK(ncclAllReduce(send[r], recv[r], COUNT, ncclFloat, ncclMax, comms[r], streams[r]));
  CHECK(ncclGroupEnd());
  CHECK(rcclrsEmuEventRecord(done, streams[0]));
  CHECK(rcclrsEmuStreamWaitEvent(streams[2], done));
  CHECK(rcclrsEmuMemcpyAsync(send[2], recv[0], COUNT * sizeof(float), streams[2]));
  CHECK(rcclrsEmuStreamSynchronize(streams[2]));
  int finished = 0;
  CHECK(rcclrsEmuEventQuery(done, &finished));
  EXPECT(finished == 1);
  CHECK(rcclrsEmuMemcpy(host, send[2], sizeof host));
  for (int i = 0; i < COUNT; i++) EXPECT(host[i] == 4.0f);
  CHECK(rcclrsEmuEventDestroy(done));

  /* Host and device buffers in one call. */
  ncclResult_t rc = ncclAllReduce(send[0], host, COUNT, ncclFloat, ncclSum, comms[0], streams[0]);
  EXPECT(rc == ncclInvalidArgument);
  const char *msg = ncclGetLastError(NULL);
  EXPECT(strstr(msg, "sendbuff") && strstr(msg, "device memory of emu device 0") &&
         strstr(msg, "recvbuff") && strstr(msg, "host memory"));
  printf("mixed buffers: %s\n", msg);

  for (int r = 0; r < N; r++) {
    CHECK(ncclMemFree(send[r]));
    CHECK(ncclMemFree(recv[r]));
    CHECK(ncclCommDestroy(comms[r]));
  }
  CHECK(rcclrsEmuStreamDestroy(streams[0]));
  CHECK(rcclrsEmuStreamDestroy(streams[2]));
  if (failures) {
    fprintf(stderr, "emu: %d failure(s)\n", failures);
    return 1;
  }
  printf("emu: ok\n");
  return 0;
}
