/*
 * plugin_loads.c — a worker plugin (libplugin_loads.so) whose constructor
 * says where it is loaded and may hang, for the start checks of
 * test_node_plugin.py.
 *
 * Its constructor appends "load COMMAND PID" to the file named by
 * PLUGIN_LOADS, COMMAND being the muster command of the loading process
 * (`head` or `node` for a start check, `worker` for a worker), and then,
 * when PLUGIN_HANG is set, blocks for ever, as a constructor waiting on a
 * driver that never answers would.  Its tasks complete with their payload.
 */
#include "muster.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The second word of this process's command line ("head", "worker"). */
static void loads_command(char *out, size_t size) {
  char line[256] = "";
  int fd = open("/proc/self/cmdline", O_RDONLY);
  ssize_t n = fd >= 0 ? read(fd, line, sizeof line - 1) : -1;
  if (fd >= 0)
    close(fd);
  line[n > 0 ? n : 0] = '\0';
  size_t first = strlen(line) + 1;
  snprintf(out, size, "%s", n > 0 && first < (size_t)n ? line + first : "?");
}

__attribute__((constructor)) static void loads_constructor(void) {
  const char *path = getenv("PLUGIN_LOADS");
  char command[64];
  loads_command(command, sizeof command);
  FILE *f = path ? fopen(path, "a") : NULL;
  if (f) {
    fprintf(f, "load %s %d\n", command, (int)getpid());
    fclose(f);
  }
  while (getenv("PLUGIN_HANG") != NULL)
    pause();
}

static int loads_init(const char *init_data, void **state) {
  (void)init_data;
  *state = NULL;
  return 0;
}

static int loads_run(void *state, const muster_plugin_task_t *task, muster_plugin_result_t *out) {
  (void)state;
  out->result = strdup(task->payload);
  return out->result ? 0 : 1;
}

static const muster_plugin_t loads_plugin = {
    .abi = MUSTER_PLUGIN_ABI,
    .name = "loads",
    .init = loads_init,
    .run = loads_run,
};

const muster_plugin_t *muster_plugin(void) {
  return &loads_plugin;
}
