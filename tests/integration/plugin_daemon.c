/*
 * plugin_daemon.c — a worker plugin (libplugin_daemon.so) whose constructor
 * forks a daemon that keeps every descriptor it inherited, as a driver's
 * helper process may, for the start check of test_cli_messages.py: the check
 * must end when the loading process exits, not when the daemon lets go of
 * the check's pipe.
 *
 * The constructor appends the daemon's pid to the file named by
 * PLUGIN_DAEMON_PIDS (the test kills it) before it returns, so the pid is
 * there once the load has ended.  The daemon waits for a signal, and ends by
 * itself after 10 minutes should the test not kill it.  With
 * PLUGIN_DAEMON_NO_RUN set, the plugin has no run() and cannot be loaded by
 * a worker: the check must then say so.  Its tasks complete with their
 * payload.
 */
#include "muster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DAEMON_LIFETIME_S 600

__attribute__((constructor)) static void daemon_constructor(void) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(DAEMON_LIFETIME_S); /* a daemon the test did not kill ends by itself */
    for (;;)
      pause();
  }
  const char *path = getenv("PLUGIN_DAEMON_PIDS");
  FILE *f = path && pid > 0 ? fopen(path, "a") : NULL;
  if (f) {
    fprintf(f, "%d\n", (int)pid);
    fclose(f);
  }
}

static int daemon_init(const char *init_data, void **state) {
  (void)init_data;
  *state = NULL;
  return 0;
}

static int daemon_run(void *state, const muster_plugin_task_t *task, muster_plugin_result_t *out) {
  (void)state;
  out->result = strdup(task->payload);
  return out->result ? 0 : 1;
}

static muster_plugin_t daemon_plugin = {
    .abi = MUSTER_PLUGIN_ABI,
    .name = "daemon",
    .init = daemon_init,
    .run = daemon_run,
};

const muster_plugin_t *muster_plugin(void) {
  if (getenv("PLUGIN_DAEMON_NO_RUN") != NULL)
    daemon_plugin.run = NULL;
  return &daemon_plugin;
}
