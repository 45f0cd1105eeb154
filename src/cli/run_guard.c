/*
 * run_guard.c — the guard: a small process of ours between the worker and
 * each command it runs, so that the command dies with the worker, however
 * the worker dies (`kill -9` and the OOM killer included).
 *
 * Nothing runs in a process killed with SIGKILL, so this has to be arranged
 * beforehand, and the kernel's tool is PR_SET_PDEATHSIG: a signal to a child
 * when its parent dies.  It reaches only that one child, and a command is
 * often a shell with programs of its own, so the worker's direct child is not
 * the command but a guard: a forked copy of the worker that leads the
 * command's process group, asks for GUARD_WAKE_SIGNAL when the worker dies,
 * and then kills its whole group with SIGKILL (itself included).  That is the
 * reach of every other way muster stops a command (run_signal kills the
 * group); a process that leaves the group (setsid, setpgid) is beyond it.
 * The command itself gets SIGKILL should the guard die first.
 *
 * The worker is multi-threaded and the guard never calls exec, so the guard
 * calls only async-signal-safe functions, or thin system-call wrappers that
 * take no lock and allocate nothing (prctl, close_range, sigwaitinfo, and
 * execvpe, which glibc's own posix_spawnp runs in the same situation), for
 * the whole of its life; it ends with _exit, never exit.  Why not an exec'd
 * shim: exec'ing this binary costs milliseconds per task (it links some
 * forty libraries), a fork a fraction of one, and a forked guard keeps the
 * worker's command line in /proc, which commands may read.
 *
 * The guard passes the command's end on: it exits with the command's exit
 * status, or dies by the signal that killed it (without a core dump of its
 * own), so the worker sees what it saw without a guard.  It ignores the
 * signals sent to its group (the worker's SIGTERM is for the command); only
 * SIGKILL ends it early, which kills the command too.
 *
 * The guard is started with PR_SET_PDEATHSIG from the slot thread that runs
 * the command, and that thread waits for the guard to end: the signal fires
 * when the *thread* that forked exits, which then means the worker died.
 * The guard still checks getppid() on each wake-up, against the case where
 * the worker died before prctl took effect and against stray signals.
 */
#include "cli/run.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define GUARD_WAKE_SIGNAL SIGUSR1 /* the guard's PR_SET_PDEATHSIG */
#define GUARD_REPORT_FD 3         /* in the guard: the pipe the exec error goes back on */
#define GUARD_FD_MIN 10           /* the pipes are moved here first, clear of 0..3 */

/* Sends `err` (an errno value) back to run_guard_start. */
static void guard_report(int fd, int err) {
  ssize_t n = write(fd, &err, sizeof err);
  (void)n; /* nothing more to do if it cannot be said */
}

/*
 * In the guard: the command's pipes become 0, 1 and 2, the report pipe 3
 * (close-on-exec, so the command's exec closes it), and every other
 * descriptor is closed (another slot's pipes, the worker's connections).
 * Moving everything above GUARD_FD_MIN first means no dup2 overwrites a pipe
 * still to be moved, even when the worker was started with 0..2 closed.
 */
static int guard_setup_fds(const int stdio[3], int report_fd) {
  int high[4];
  const int from[4] = {stdio[0], stdio[1], stdio[2], report_fd};
  for (int i = 0; i < 4; i++)
    if ((high[i] = fcntl(from[i], F_DUPFD_CLOEXEC, GUARD_FD_MIN)) < 0)
      return -1;
  for (int i = 0; i < 4; i++) /* dup2 clears close-on-exec: right for 0..2 */
    if (dup2(high[i], i) < 0)
      return -1;
  if (fcntl(GUARD_REPORT_FD, F_SETFD, FD_CLOEXEC) < 0)
    return -1;
  close_range(GUARD_REPORT_FD + 1, ~0U, 0);
  return 0;
}

/* In the command's process, forked by the guard: exec the command, or report why not. */
static _Noreturn void guard_exec(pid_t guard, char *const argv[], char *const envp[]) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != guard)
    _exit(127); /* the guard is gone already */
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  for (int sig = 1; sig < NSIG; sig++) /* the worker ignores SIGPIPE, say; KILL, STOP fail */
    sigaction(sig, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execvpe(argv[0], argv, envp);
  guard_report(GUARD_REPORT_FD, errno);
  _exit(127);
}

/* Ends the guard the way the command ended (`status` from waitpid). */
static _Noreturn void guard_exit_as(int status) {
  if (!WIFSIGNALED(status))
    _exit(WEXITSTATUS(status));
  int sig = WTERMSIG(status);
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  sigaction(sig, &dfl, NULL);
  kill(getpid(), sig); /* pending while blocked; only this one is let through */
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  sigprocmask(SIG_UNBLOCK, &one, NULL);
  _exit(128 + sig); /* not reached but for a signal that does not kill */
}

/* Waits for the command; kills the group if the worker dies first. */
static _Noreturn void guard_wait(pid_t worker, pid_t command) {
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGCHLD);
  sigaddset(&wake, GUARD_WAKE_SIGNAL);
  for (;;) {
    int status = 0;
    pid_t got = waitpid(command, &status, WNOHANG);
    if (got == command)
      guard_exit_as(status);
    if (got < 0 && errno != EINTR)
      _exit(127);
    if (getppid() != worker)
      kill(0, SIGKILL);       /* the worker died: the whole group goes, the guard with it */
    sigwaitinfo(&wake, NULL); /* both are blocked, so neither is missed between checks */
  }
}

/* The guard's life, from fork to _exit; every signal is blocked on entry. */
static _Noreturn void guard_main(pid_t worker, char *const argv[], char *const envp[],
                                 const int stdio[3], int report_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, GUARD_WAKE_SIGNAL);
  if (getppid() != worker)
    _exit(127); /* the worker died before prctl took effect: start nothing */
  if (guard_setup_fds(stdio, report_fd) != 0) {
    guard_report(report_fd, errno);
    _exit(127);
  }
  pid_t guard = getpid();
  pid_t command = fork();
  if (command == 0)
    guard_exec(guard, argv, envp);
  if (command < 0) {
    guard_report(GUARD_REPORT_FD, errno);
    _exit(127);
  }
  close(GUARD_REPORT_FD);
  prctl(PR_SET_DUMPABLE, 0); /* a core dump of the guard would be a copy of the worker */
  guard_wait(worker, command);
}

int run_guard_start(pid_t *pid, char *const argv[], char *const envp[], const int stdio[3]) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0)
    return errno;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old); /* the guard starts with every signal blocked */
  pid_t worker = getpid();
  pid_t guard = fork();
  if (guard == 0)
    guard_main(worker, argv, envp, stdio, report[1]);
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  close(report[1]);
  if (guard < 0) {
    close(report[0]);
    return fork_errno;
  }
  setpgid(guard, guard); /* as the guard does, so the group exists whoever runs first */
  /* EOF: the command's exec closed the last copy; an int: why it failed.
   * Another slot's guard may hold a copy for the moment until its close_range. */
  int err = 0;
  ssize_t n;
  while ((n = read(report[0], &err, sizeof err)) < 0 && errno == EINTR)
    ;
  close(report[0]);
  if (n == (ssize_t)sizeof err && err != 0) {
    waitpid(guard, NULL, 0);
    return err;
  }
  *pid = guard;
  return 0;
}
