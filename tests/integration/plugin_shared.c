/*
 * plugin_shared.c — a worker plugin of ABI 2 that uses the shared data its
 * tasks require (libplugin_shared.so, loaded by test_node_cache_workers.py).
 *
 * It keeps what it loaded between tasks, as a model would: the text of the
 * first required level, reloaded only when a task requires another level.
 * Its result: {"pid": P, "level": L, "data": "TEXT", "loads": N, "path": PATH},
 * where `loads` counts the loads this process made so far.
 */
#include "muster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char scope[160], name[160];
  int64_t level; /* of what `data` holds; 0: nothing loaded */
  char data[4096];
  int loads;
} shared_state_t;

static int sp_init(const char *init_data, void **state) {
  *state = calloc(1, sizeof(shared_state_t));
  return *state ? 0 : -1;
}

/* Loads `sh` into the state unless it holds that level already; 0 or -1. */
static int sp_load(shared_state_t *s, const muster_plugin_shared_t *sh) {
  if (s->level == sh->level && strcmp(s->scope, sh->scope) == 0 && strcmp(s->name, sh->name) == 0)
    return 0;
  FILE *f = fopen(sh->path, "rb");
  if (f == NULL)
    return -1;
  size_t n = fread(s->data, 1, sizeof s->data - 1, f);
  fclose(f);
  s->data[n] = '\0';
  snprintf(s->scope, sizeof s->scope, "%s", sh->scope);
  snprintf(s->name, sizeof s->name, "%s", sh->name);
  s->level = sh->level;
  s->loads++;
  return 0;
}

static int sp_run(void *state, const muster_plugin_task_t *task, muster_plugin_result_t *out) {
  shared_state_t *s = state;
  if (task->shared_count < 1 || sp_load(s, &task->shared[0]) != 0) {
    out->error = strdup(task->shared_count < 1 ? "no shared data" : "cannot read the level");
    out->permanent = 1;
    return 1;
  }
  size_t size = strlen(s->data) + strlen(task->shared[0].path) + 128;
  out->result = malloc(size);
  if (out->result == NULL)
    return 1;
  /* The test's data is plain text without quotes or backslashes. */
  snprintf(out->result, size,
           "{\"pid\": %d, \"level\": %lld, \"data\": \"%s\", \"loads\": %d, \"path\": \"%s\"}",
           (int)getpid(), (long long)s->level, s->data, s->loads, task->shared[0].path);
  return 0;
}

static void sp_fini(void *state) {
  free(state);
}

static const muster_plugin_t plugin = {.abi = MUSTER_PLUGIN_ABI,
                                       .name = "shared",
                                       .init = sp_init,
                                       .run = sp_run,
                                       .handle_update = NULL,
                                       .fini = sp_fini};

const muster_plugin_t *muster_plugin(void) {
  return &plugin;
}
