/*
 * worker_leftovers.c — what a dead worker left running, found and killed
 * before the agent reaps it (supervisor.c says when).
 *
 * A worker is a session leader (setsid at its start), and nothing else can
 * join its session, so every process whose session id is the dead worker's
 * pid came from it; while the worker is an unreaped zombie, that id is not
 * reused.  Every process group left in the session is killed with SIGKILL.
 *
 * Not every process found there outlived the worker, though.  Each command a
 * worker runs is led by a guard (src/cli/run_guard.c): a fork of the worker,
 * which never execs, leads the command's process group and kills that group
 * as soon as the worker dies (its PR_SET_PDEATHSIG).  The agent's scan runs
 * as soon as it sees the worker dead, which is often before a guard was
 * scheduled to do its kill: its group is still all there.  Such processes
 * are the guard's to end (the agent kills them too, which does no harm); only
 * what escaped the guard's reach (a process that left the command's group, a
 * background process of a command that had exited, whatever a plugin forked)
 * really outlived the worker, and only those are counted for the log line.
 *
 * So a process found is not counted when it is itself a guard (its command
 * line is the worker's: a guard, or the command's process between its fork
 * and its exec), when the leader of its group is a live guard of this session
 * (the guard will kill it), or when it is dying already (SIGKILL pending, to
 * it or its group, or exiting: a guard that has done its kill and gone, the
 * agent's own kill of an earlier pass).  The leader is looked at before the
 * process's own state, so that a guard that kills its group and dies between
 * the two looks leaves its group's processes with SIGKILL pending.
 */
#include "node/agent.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WLEFT_PASSES 5        /* scans until one finds nothing alive (each kills whole groups) */
#define WLEFT_GROUPS 256      /* groups one pass collects before it kills them */
#define WLEFT_PF_EXITING 0x4u /* the kernel's PF_EXITING, in /proc/PID/stat's flags */

/* What /proc says of one process. */
typedef struct {
  pid_t pgrp, session;
  bool exiting; /* in the kernel's exit path */
} wleft_proc_t;

/* Reads up to `size` - 1 bytes of /proc/PID/`file` into `buf`, NUL-ended;
 * the bytes read, or -1. */
static ssize_t wleft_read(pid_t pid, const char *file, char *buf, size_t size) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  buf[n > 0 ? n : 0] = '\0';
  return n;
}

/* Process `pid`'s group, session and exit state; false when it is gone or a
 * zombie.  The fields follow the command name, which is in parentheses and
 * may itself hold spaces and parentheses. */
static bool wleft_stat(pid_t pid, wleft_proc_t *p) {
  char text[512];
  if (wleft_read(pid, "stat", text, sizeof text) <= 0)
    return false;
  const char *rest = strrchr(text, ')');
  char state;
  int ppid, group, sid, tty, tpgid;
  unsigned flags;
  if (rest == NULL ||
      sscanf(rest + 1, " %c %d %d %d %d %d %u", &state, &ppid, &group, &sid, &tty, &tpgid,
             &flags) != 7 ||
      state == 'Z' || state == 'X')
    return false;
  *p = (wleft_proc_t){.pgrp = group, .session = sid, .exiting = flags & WLEFT_PF_EXITING};
  return true;
}

/* True when SIGKILL is pending for `pid`, sent to it or to its group. */
static bool wleft_kill_pending(pid_t pid) {
  char text[8192];
  if (wleft_read(pid, "status", text, sizeof text) <= 0)
    return false;
  const unsigned long long bit = 1ULL << (SIGKILL - 1);
  const char *keys[] = {"\nSigPnd:", "\nShdPnd:"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const char *at = strstr(text, keys[i]);
    if (at && strtoull(at + strlen(keys[i]), NULL, 16) & bit)
      return true;
  }
  return false;
}

/* True when `pid`'s command line is the worker's (a->worker_argv): a fork of
 * the worker that did not exec, which is what a guard is. */
static bool wleft_is_worker_copy(const node_agent_t *a, pid_t pid) {
  size_t want = 0;
  for (size_t i = 0; a->worker_argv && a->worker_argv[i]; i++)
    want += strlen(a->worker_argv[i]) + 1;
  if (want == 0)
    return false;
  char *have = malloc(want + 2);
  if (have == NULL)
    return false;
  ssize_t n = wleft_read(pid, "cmdline", have, want + 2);
  bool same = n == (ssize_t)want;
  for (size_t i = 0, at = 0; same && a->worker_argv[i]; i++) {
    size_t len = strlen(a->worker_argv[i]) + 1; /* with its NUL */
    same = memcmp(have + at, a->worker_argv[i], len) == 0;
    at += len;
  }
  free(have);
  return same;
}

/* True when process `pid` of session `session` is a guard that will kill its
 * group itself: its group's leader, alive, a copy of the worker. */
static bool wleft_is_live_guard(const node_agent_t *a, pid_t pid, pid_t session) {
  wleft_proc_t p;
  return wleft_stat(pid, &p) && !p.exiting && p.pgrp == pid && p.session == session &&
         wleft_is_worker_copy(a, pid);
}

/* How a process of the dead worker's session stands. */
typedef enum {
  WLEFT_DYING,   /* SIGKILL pending or exiting: nothing to do */
  WLEFT_GUARDED, /* alive, its guard's to end (or a guard) */
  WLEFT_OUTLIVED /* alive and beyond any guard's reach */
} wleft_kind_t;

/* Judges process `pid` of group `p` (see the top of this file). */
static wleft_kind_t wleft_judge(const node_agent_t *a, pid_t pid, const wleft_proc_t *p) {
  if (p->exiting)
    return WLEFT_DYING;
  bool guarded = wleft_is_worker_copy(a, pid) || wleft_is_live_guard(a, p->pgrp, p->session);
  wleft_proc_t now; /* looked at after its guard */
  if (!wleft_stat(pid, &now) || now.exiting || wleft_kill_pending(pid))
    return WLEFT_DYING;
  return guarded ? WLEFT_GUARDED : WLEFT_OUTLIVED;
}

/* Adds group `pgrp` to `groups` (*n of them) unless it is there; kills it at
 * once when the list is full.  The kills wait for the scan's end, so that a
 * group's processes are all judged before any has SIGKILL pending. */
static void wleft_note_group(pid_t *groups, int *n, pid_t pgrp) {
  for (int i = 0; i < *n; i++)
    if (groups[i] == pgrp)
      return;
  if (*n < WLEFT_GROUPS)
    groups[(*n)++] = pgrp;
  else
    killpg(pgrp, SIGKILL);
}

/* One scan of /proc for the live processes of session `session`: their
 * groups into `groups` (*ngroups), how many outlived the worker added to
 * *outlived.  False when /proc cannot be read. */
static bool wleft_scan(const node_agent_t *a, pid_t session, pid_t *groups, int *ngroups,
                       int *outlived) {
  DIR *proc = opendir("/proc");
  if (proc == NULL)
    return false;
  struct dirent *e;
  while ((e = readdir(proc)) != NULL) {
    wleft_proc_t p;
    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);
    if (!wleft_stat(pid, &p) || p.session != session || p.pgrp <= 1)
      continue;
    wleft_kind_t kind = wleft_judge(a, pid, &p);
    if (kind == WLEFT_DYING)
      continue;
    *outlived += kind == WLEFT_OUTLIVED;
    wleft_note_group(groups, ngroups, p.pgrp);
  }
  closedir(proc);
  return true;
}

int wleft_kill(const node_agent_t *a, pid_t worker_pid) {
  int outlived = 0;
  pid_t groups[WLEFT_GROUPS];
  for (int pass = 0; pass < WLEFT_PASSES; pass++) {
    int ngroups = 0, found = 0;
    if (!wleft_scan(a, worker_pid, groups, &ngroups, &found))
      break;
    for (int i = 0; i < ngroups; i++)
      killpg(groups[i], SIGKILL);
    outlived += found;
    /* A process could fork or leave its group between the scan and the kill:
     * the next scan finds it, alive (what was killed here is dying then). */
    if (ngroups == 0)
      break;
  }
  return outlived;
}
