/*
 * A minimal NCCL environment plug-in for the tests, written from the
 * ncclEnv interface: it supplies NCCL_ALGO (the value of TEST_ENV_ALGO)
 * and nothing else. Built with -DENV_V1 it exports ncclEnvPlugin_v1;
 * otherwise ncclEnvPlugin_v2, whose init also gets a logger.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

#define NCCL_LOG_INFO 3
#define NCCL_ENV 0x80

static int initialized;

static ncclResult_t finalize(void) { return 0; }

static const char *get_env(const char *name) {
  if (!initialized || strcmp(name, "NCCL_ALGO") != 0) return NULL;
  return getenv("TEST_ENV_ALGO");
}

#ifdef ENV_V1
static ncclResult_t init_v1(uint8_t major, uint8_t minor, uint8_t patch, const char *suffix) {
  (void)suffix;
  if (major != 2 || minor < 19) return 5;
  (void)patch;
  initialized = 1;
  return 0;
}

typedef struct {
  const char *name;
  ncclResult_t (*init)(uint8_t, uint8_t, uint8_t, const char *);
  ncclResult_t (*finalize)(void);
  const char *(*getEnv)(const char *);
} ncclEnv_v1_t;

const ncclEnv_v1_t ncclEnvPlugin_v1 = {"test-env-v1", init_v1, finalize, get_env};
#else
static ncclResult_t init_v2(uint8_t major, uint8_t minor, uint8_t patch, const char *suffix,
                            ncclDebugLogger_t log) {
  (void)suffix;
  if (major != 2 || minor < 19) return 5;
  log(NCCL_LOG_INFO, NCCL_ENV, __FILE__, __LINE__, "test env plug-in for NCCL %d.%d.%d", major,
      minor, patch);
  initialized = 1;
  return 0;
}

typedef struct {
  const char *name;
  ncclResult_t (*init)(uint8_t, uint8_t, uint8_t, const char *, ncclDebugLogger_t);
  ncclResult_t (*finalize)(void);
  const char *(*getEnv)(const char *);
} ncclEnv_v2_t;

const ncclEnv_v2_t ncclEnvPlugin_v2 = {"test-env-v2", init_v2, finalize, get_env};
#endif
