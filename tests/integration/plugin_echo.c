/*
 * plugin_echo.c — the worker plugin the node tests load (libplugin_echo.so).
 *
 * It logs every call to the file named by PLUGIN_LOG ("init PID DATA",
 * "update PID SEQ DATA", "run PID TASK", "fini PID"), and its result says
 * which process ran the task and which updates that process had applied, in
 * order: {"pid": P, "inits": 1, "updates": [1, 2], "payload": PAYLOAD}.
 * Payload "crash" aborts the process (a crashing worker); "fail" fails the
 * task with the error "asked to fail".
 */
#include "muster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ECHO_MAX_UPDATES 256

typedef struct {
  int inits;
  int64_t seqs[ECHO_MAX_UPDATES];
  int nseqs;
} echo_state_t;

static int echo_inits; /* per process: init must run exactly once */

static void echo_log(const char *fmt, const char *a, long long b) {
  const char *path = getenv("PLUGIN_LOG");
  if (path == NULL)
    return;
  FILE *f = fopen(path, "a");
  if (f == NULL)
    return;
  fprintf(f, "%s %d ", fmt, (int)getpid());
  if (b >= 0)
    fprintf(f, "%lld ", b);
  fprintf(f, "%s\n", a ? a : "");
  fclose(f);
}

static int echo_init(const char *init_data, void **state) {
  echo_state_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return -1;
  s->inits = ++echo_inits;
  *state = s;
  echo_log("init", init_data, -1);
  return 0;
}

static int echo_update(void *state, const muster_plugin_update_t *update) {
  echo_state_t *s = state;
  if (s->nseqs < ECHO_MAX_UPDATES)
    s->seqs[s->nseqs++] = update->seq;
  echo_log("update", update->data, (long long)update->seq);
  return 0;
}

static int echo_run(void *state, const muster_plugin_task_t *task, muster_plugin_result_t *out) {
  echo_state_t *s = state;
  echo_log("run", task->payload, (long long)task->id);
  if (strcmp(task->payload, "\"crash\"") == 0)
    abort();
  if (strcmp(task->payload, "\"fail\"") == 0) {
    out->error = strdup("asked to fail");
    return 1;
  }
  size_t size = strlen(task->payload) + 64 + 24 * (size_t)s->nseqs;
  char *text = malloc(size);
  if (text == NULL)
    return 1;
  size_t at = (size_t)snprintf(text, size, "{\"pid\": %d, \"inits\": %d, \"updates\": [",
                               (int)getpid(), s->inits);
  for (int i = 0; i < s->nseqs; i++)
    at += (size_t)snprintf(text + at, size - at, "%s%lld", i ? ", " : "", (long long)s->seqs[i]);
  snprintf(text + at, size - at, "], \"payload\": %s}", task->payload);
  out->result = text;
  return 0;
}

static void echo_fini(void *state) {
  echo_log("fini", NULL, -1);
  free(state);
}

static const muster_plugin_t echo_plugin = {
    .abi = MUSTER_PLUGIN_ABI,
    .name = "echo",
    .init = echo_init,
    .run = echo_run,
    .handle_update = echo_update,
    .fini = echo_fini,
};

const muster_plugin_t *muster_plugin(void) {
  return &echo_plugin;
}
