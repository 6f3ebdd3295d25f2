/*
 * Ranks as processes for the C test programs. fork_ranks(n, setup, main,
 * arg) forks n children; each runs setup(rank, arg) if given (what must
 * hold before the unique id exists: environment, encryption), then rank 0
 * makes the id and passes it to the others through pipes, then each runs
 * main(rank, n, id, arg) and exits 0 when `failures` is 0. The parent
 * waits at most RANKS_DEADLINE_S for all of them, kills any left, and
 * counts every rank that failed, died or hung in `failures`.
 *
 * Ranks that the C suite starts as processes of their own meet through
 * id_through_file(rank, var): rank 0 makes the unique id and writes it to
 * the file the variable `var` names; the others wait for it (30 s). A program
 * including it asks for POSIX (`_POSIX_C_SOURCE` 200809L or more).
 */
#ifndef RCCLRS_TESTS_RANKS_H
#define RCCLRS_TESTS_RANKS_H

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define RANKS_MAX 16
#define RANKS_DEADLINE_S 120

typedef void (*rank_setup_fn)(int rank, void *arg);
typedef void (*rank_main_fn)(int rank, int n, ncclUniqueId id, void *arg);

static inline void fork_ranks(int n, rank_setup_fn setup, rank_main_fn rank_main, void *arg) {
  if (n < 1 || n > RANKS_MAX) abort();
  int fds[RANKS_MAX][2];
  pid_t pids[RANKS_MAX];
  for (int r = 0; r < n; r++)
    if (pipe(fds[r])) abort();
  fflush(stdout); /* or the children print what the parent buffered */
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) abort();
    if (pids[r] != 0) continue;
    failures = 0; /* the parent's count is not this rank's */
    if (setup) setup(r, arg);
    ncclUniqueId id;
    if (r == 0) {
      CHECK(ncclGetUniqueId(&id));
      for (int p = 1; p < n; p++)
        if (write(fds[p][1], &id, sizeof id) != sizeof id) abort();
    } else if (read(fds[r][0], &id, sizeof id) != sizeof id) {
      abort();
    }
    rank_main(r, n, id, arg);
    fflush(stdout);
    _exit(failures ? 1 : 0);
  }
  for (int r = 0; r < n; r++) {
    close(fds[r][0]);
    close(fds[r][1]);
  }
  time_t deadline = time(NULL) + RANKS_DEADLINE_S;
  int left = n;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (time(NULL) > deadline) break;
      nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
      continue;
    }
    if (pid < 0) break;
    for (int r = 0; r < n; r++) {
      if (pids[r] != pid) continue;
      pids[r] = 0;
      left--;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "rank %d (pid %d) failed: status %d\n", r, (int)pid, status);
        failures++;
      }
    }
  }
  for (int r = 0; r < n; r++) {
    if (pids[r] == 0) continue;
    fprintf(stderr, "rank %d (pid %d) still ran after %d s: killed\n", r, (int)pids[r],
            RANKS_DEADLINE_S);
    kill(pids[r], SIGKILL);
    waitpid(pids[r], NULL, 0);
    failures++;
  }
}

static inline ncclUniqueId id_through_file(int rank, const char *var) {
  ncclUniqueId id;
  const char *path = getenv(var);
  char tmp[512];
  if (path == NULL) exit(2);
  if (rank == 0) {
    CHECK(ncclGetUniqueId(&id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) exit(2);
  } else {
    FILE *f;
    for (int tries = 0; (f = fopen(path, "rb")) == NULL; tries++) {
      if (tries > 3000) exit(2);
      nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    if (fread(&id, sizeof id, 1, f) != 1) exit(2);
    fclose(f);
  }
  return id;
}

#endif
