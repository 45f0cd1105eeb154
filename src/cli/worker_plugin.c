/*
 * worker_plugin.c — `muster worker --plugin PATH`: tasks run by a loaded
 * shared object instead of a command (the ABI is in include/muster.h, "worker
 * plugin ABI", and docs/node.md).
 *
 * A plugin worker has one slot, and every plugin call (init, handle_update,
 * run, fini) is made on that slot's thread, so a plugin may keep thread-bound
 * state such as a CUDA context.  Because run() blocks that thread, the lease is
 * extended by the heartbeat thread (worker_plugin_keep_lease) while a task
 * runs.  A plugin that crashes takes the worker process with it; under a node
 * agent the process is restarted and the crash is reported, so the task's
 * attempt counts.
 */
#include "cli/worker.h"

#include <dlfcn.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *worker_plugin_open(const char *path, const muster_plugin_t **plugin, char *why, size_t size) {
  *plugin = NULL;
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(why, size, "cannot load plugin %s: %s", path, dlerror());
    return NULL;
  }
  muster_plugin_entry_t entry;
  *(void **)&entry = dlsym(lib, MUSTER_PLUGIN_SYMBOL);
  const muster_plugin_t *found = entry ? entry() : NULL;
  int bad_abi = found && (found->abi < MUSTER_PLUGIN_ABI_MIN || found->abi > MUSTER_PLUGIN_ABI);
  const char *problem = entry == NULL   ? "it does not export " MUSTER_PLUGIN_SYMBOL "()"
                        : found == NULL ? MUSTER_PLUGIN_SYMBOL "() returned NULL"
                        : bad_abi       ? "its ABI version is not one this runner loads"
                        : found->run == NULL || found->init == NULL ? "it has no init or run"
                                                                    : NULL;
  if (problem != NULL) {
    char abi[80] = ""; /* the versions, where they are the problem */
    if (bad_abi)
      snprintf(abi, sizeof abi, " (plugin ABI %u, runner ABI %d to %d)", found->abi,
               MUSTER_PLUGIN_ABI_MIN, MUSTER_PLUGIN_ABI);
    snprintf(why, size, "plugin %s: %s%s", path, problem, abi);
    dlclose(lib);
    return NULL;
  }
  *plugin = found;
  return lib;
}

int worker_plugin_load(worker_t *w) {
  char why[1200];
  w->plugin_lib = worker_plugin_open(w->plugin_path, &w->plugin, why, sizeof why);
  if (w->plugin_lib == NULL) {
    fprintf(stderr, "muster worker: %s; nothing was leased\n", why);
    return -1;
  }
  return 0;
}

int worker_plugin_init(worker_t *w) {
  const char *data = w->init_data ? w->init_data : "null";
  if (w->plugin->init(data, &w->plugin_state) != 0) {
    fprintf(stderr, "muster worker: plugin %s: init failed\n",
            w->plugin->name ? w->plugin->name : w->plugin_path);
    return -1;
  }
  w->plugin_ready = 1;
  return 0;
}

void worker_plugin_update(worker_t *w, int64_t seq, const char *data, const char *session) {
  if (w->plugin->handle_update == NULL)
    return;
  muster_plugin_update_t update = {
      .seq = seq, .data = data, .data_len = strlen(data), .queue = w->queue, .session = session};
  if (w->plugin->handle_update(w->plugin_state, &update) != 0)
    fprintf(stderr, "muster worker: plugin: handle_update of update %lld failed\n", (long long)seq);
}

/* Publishes the running task for the heartbeat thread (0: none). */
static void plugin_set_task(worker_slot_t *slot, const muster_lease_t *lease) {
  worker_t *w = slot->worker;
  pthread_mutex_lock(&w->lock);
  atomic_store(&w->plugin_token, lease ? lease->token : 0);
  atomic_store(&w->plugin_task, lease ? lease->task : 0);
  atomic_store(&slot->task, lease ? lease->task : 0);
  w->plugin_extended_ms = worker_now_ms();
  pthread_mutex_unlock(&w->lock);
}

/* Non-zero when `text` is NULL (null) or valid JSON text. */
static int plugin_valid_json(const char *text) {
  if (text == NULL)
    return 1;
  json_t *value = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  json_decref(value);
  return value != NULL;
}

void worker_plugin_run(worker_slot_t *slot, const muster_lease_t *lease) {
  worker_t *w = slot->worker;
  muster_plugin_task_t task = {.id = lease->task,
                               .attempt = lease->attempt,
                               .queue = w->queue,
                               .payload = lease->payload,
                               .payload_len = strlen(lease->payload),
                               .session = lease->session,
                               .index = lease->index,
                               .worker = worker_id(w)};
  muster_plugin_shared_t shared[WORKER_MAX_REQUIRES];
  worker_shared_plugin(slot, shared);
  task.shared = slot->nheld ? shared : NULL; /* ABI 2 fields, at the struct's end */
  task.shared_count = slot->nheld;
  muster_plugin_result_t result = {NULL, NULL, 0};
  plugin_set_task(slot, lease);
  int rc = w->plugin->run(w->plugin_state, &task, &result);
  plugin_set_task(slot, NULL);
  if (rc != 0) {
    worker_slot_fail(slot, lease, result.error ? result.error : "plugin failed", result.permanent);
  } else if (!plugin_valid_json(result.result)) {
    worker_slot_fail(slot, lease, "the plugin's result is not valid JSON", 0);
  } else {
    worker_slot_complete(slot, lease, result.result);
  }
  free(result.result);
  free(result.error);
}

void worker_plugin_keep_lease(worker_t *w, muster_client_t *client) {
  pthread_mutex_lock(&w->lock);
  int64_t task = atomic_load(&w->plugin_task), token = atomic_load(&w->plugin_token);
  int64_t due = w->plugin_extended_ms + atomic_load(&w->lease_ms) / 2;
  int64_t now = worker_now_ms();
  if (task == 0 || now < due) {
    pthread_mutex_unlock(&w->lock);
    return;
  }
  w->plugin_extended_ms = now;
  pthread_mutex_unlock(&w->lock);
  muster_ack_t ack;
  muster_ack_init(&ack, task, token);
  muster_err_t err = muster_extend(client, &ack, 1);
  if (err == MUSTER_OK) /* the plugin's slot: its result's retries may last this long */
    atomic_store(&w->slots[0].lease_until, now + atomic_load(&w->lease_ms));
  if (err != MUSTER_OK)
    fprintf(stderr, "muster worker: task %lld: extending the lease: %s: %s\n", (long long)task,
            muster_err_name(err), muster_client_message(client));
}

void worker_plugin_unload(worker_t *w) {
  if (w->plugin && w->plugin_ready && w->plugin->fini)
    w->plugin->fini(w->plugin_state);
  w->plugin_ready = 0;
  if (w->plugin_lib)
    dlclose(w->plugin_lib);
  w->plugin = NULL;
  w->plugin_lib = NULL;
  w->plugin_state = NULL;
}
