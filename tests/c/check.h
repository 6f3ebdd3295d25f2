/*
 * The C test programs' checks. CHECK(call) ends the program when an NCCL
 * call fails, naming the call, its code and both error texts; EXPECT(cond)
 * prints a failed condition and counts it in `failures` (atomically: ranks
 * may be threads), so one run reports every failure. A program fails when
 * `failures` is not zero where it reports its result.
 */
#ifndef RCCLRS_TESTS_CHECK_H
#define RCCLRS_TESTS_CHECK_H

#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>

static int failures;

#define CHECK(call)                                                              \
  do {                                                                           \
    ncclResult_t rc_ = (call);                                                   \
    if (rc_ != ncclSuccess) {                                                    \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__,    \
              #call, (int)rc_, ncclGetErrorString(rc_), ncclGetLastError(NULL)); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);                 \
    }                                                                     \
  } while (0)

#endif
