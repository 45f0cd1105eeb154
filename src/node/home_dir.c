/*
 * home_dir.c — the agent's default home, /var/tmp/muster-node-NAME, checked
 * before its cache and state are kept there.
 *
 * /var/tmp is writable by every local user, so any of them can make
 * /var/tmp/muster-node-NAME before the agent first runs (the node name is
 * the hostname by default: easy to guess).  An agent that took such a
 * directory kept its node cache and its iterations.db in a directory another
 * user owns, who may rename anything in it and put files of their own in its
 * place: the cached levels that workers open by path (GET /v1/node/cache/...),
 * the database of node-local iterations.  So the agent takes the directory
 * only when it is one (not a link), its own user's (or root's, whom nothing
 * protects against), and writable by no one else; else it does not start,
 * saying why.  Directories given with --cache-dir and --state-dir are the
 * operator's choice and are not checked.
 */
#include "node/agent.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What is wrong with directory `path` as the agent's home, in `why`; 0 when
 * nothing is. */
static int home_dir_problem(const char *path, char *why, size_t size) {
  struct stat st;
  if (lstat(path, &st) != 0)
    snprintf(why, size, "cannot be looked at: %s", strerror(errno));
  else if (!S_ISDIR(st.st_mode))
    snprintf(why, size, "is not a directory (a link, or a file)");
  else if (st.st_uid != geteuid() && st.st_uid != 0)
    snprintf(why, size, "belongs to another user (uid %u), who could replace what is kept in it",
             (unsigned)st.st_uid);
  else if (st.st_mode & (S_IWGRP | S_IWOTH))
    snprintf(why, size,
             "is writable by other users (mode %03o), who could replace what is kept in it",
             (unsigned)(st.st_mode & 0777));
  else
    return 0;
  return -1;
}

int home_dir_check(node_agent_t *a) {
  const node_config_t *cfg = a->cfg;
  if (cfg->cache_dir && cfg->state_dir)
    return 0; /* both given: nothing is kept in the default home */
  char path[300], why[200];
  snprintf(path, sizeof path, "/var/tmp/muster-node-%s", a->name);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    agent_log(a, "cannot create %s: %s", path, strerror(errno));
    return -1;
  }
  if (home_dir_problem(path, why, sizeof why) == 0)
    return 0;
  agent_log(a,
            "%s, where the agent keeps its cache and state unless told otherwise, %s: remove it "
            "(the agent makes it anew), or give --cache-dir and --state-dir",
            path, why);
  return -1;
}
