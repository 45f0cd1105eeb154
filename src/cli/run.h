/*
 * run.h — running one task's command: spawn, feed stdin, collect stdout and
 * the tail of stderr, without blocking the caller's other duties.
 */
#ifndef MUSTER_CLI_RUN_H
#define MUSTER_CLI_RUN_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#define RUN_TAIL_MAX 2048      /* bytes of stderr kept for the error */
#define RUN_OUT_MAX (8u << 20) /* bytes of stdout kept; more fails the task */

typedef struct {
  pid_t pid;         /* the guard (run_guard.c), leader of the command's process group */
  int pidfd;         /* readable once the child exits; -1 where unsupported */
  int in_fd;         /* our end of the child's stdin, -1 once closed */
  int out_fd;        /* our end of its stdout, -1 once closed */
  int err_fd;        /* our end of its stderr, -1 once closed */
  const char *input; /* bytes to write to stdin (the caller's; must outlive the run) */
  size_t input_len, input_off;
  char *out; /* stdout so far (NUL-terminated), at most RUN_OUT_MAX bytes */
  size_t out_len, out_cap;
  int out_overflow;            /* stdout went past RUN_OUT_MAX; the rest was dropped */
  char tail[2 * RUN_TAIL_MAX]; /* the latest stderr bytes; the last RUN_TAIL_MAX count */
  size_t tail_len;
  int exited; /* the child was reaped; `status` is its wait status */
  int status;
  pthread_mutex_t lock; /* orders run_signal (any thread) against reaping */
} run_proc_t;

/*
 * Checks that `file` can be exec'd the way run_start will: a name with a '/'
 * as it is, any other name through the directories of PATH (the system's
 * default path when PATH is unset), as execvp looks it up; the file must be a
 * regular file with execute permission.  Returns 0, or -1 with an
 * explanation a user can act on in `err` (`err_size` bytes).
 */
int run_resolve(const char *file, char *err, size_t err_size);

/*
 * Starts argv[0] (looked up in PATH, no shell) with environment `envp`, in its
 * own process group under a guard that kills the group if the worker dies,
 * with `input` to be written to its stdin.  Returns 0, or -1 with an
 * explanation in `err` (`err_size` bytes) when it cannot start.
 */
int run_start(run_proc_t *proc, char *const argv[], char *const envp[], const char *input,
              size_t input_len, char *err, size_t err_size);

/*
 * Moves data between the child and its buffers for up to `timeout_ms`.
 * Returns 1 once the child has exited and its output is collected, 0 when the
 * time ran out first.
 */
int run_pump(run_proc_t *proc, long timeout_ms);

/*
 * Forks the guard of one command (run_guard.c) from the calling thread, which
 * must wait for it to end: the command's stdin, stdout and stderr are
 * `stdio`.  Returns 0 with *pid once the command was exec'd, else the errno
 * value that prevented it (the command's exec, or the fork).
 */
int run_guard_start(pid_t *pid, char *const argv[], char *const envp[], const int stdio[3]);

/* Sends `sig` to the child's process group unless it was reaped; any thread. */
void run_signal(run_proc_t *proc, int sig);

/* The error text of a failed run: the stderr tail, or how the child ended. */
void run_error_text(const run_proc_t *proc, char *buf, size_t size);
/* How the child ended, into `buf`: "exit status 3" or "killed by signal 9". */
void run_status_text(const run_proc_t *proc, char *buf, size_t size);

/* Closes what is left and frees the buffers (the struct itself stays the caller's). */
void run_finish(run_proc_t *proc);

#endif
