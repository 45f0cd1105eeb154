/*
 * worker_shared.c — the shared data a task requires (docs/api.md "Tasks that
 * require shared data", docs/shared-data.md "Workers").
 *
 * Before a task whose lease carries `requires` runs, each required level is
 * made a local, read-only file, and the task gets the paths: a command through
 * its environment (MUSTER_SHARED_<NAME> and the JSON list MUSTER_REQUIRES), a
 * plugin through muster_plugin_task_t.shared (ABI 2).  Files are kept between
 * tasks, so a level is fetched once per worker; a level goes when a task
 * requires a newer one of the same blob and no running task still uses it,
 * and all go when the worker exits.
 *
 * Where the bytes come from: the node cache (MUSTER_CACHE_URL, set by the
 * node agent; --cache-url) answers GET /v1/node/cache/{scope}/{name}?level=N
 * with the path of its verified copy, and the worker hard-links that file into
 * a directory of its own inside the cache's links/ directory (the same file
 * system): no copy, no second download, and the agent may evict its copy
 * without pulling the file from under a running task.  When there is no node
 * cache (a worker pointed at the head), the level is downloaded with
 * muster_shared_get into the worker's own directory under TMPDIR.
 *
 * One lock (shared_lock) guards the list of held levels and is held while a
 * level is fetched, so slots that need the same level at once fetch it once.
 */
#include "cli/worker.h"
#include "client/jdump.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARED_LINK_TRIES 3 /* the cache may evict a level between its answer and our link */

/* One level this worker holds as a local file (under shared_lock). */
struct worker_shared {
  char scope[129], name[129];
  int64_t level;
  int64_t size;
  char checksum[17];
  char path[1024];
  char cache_path[1024]; /* the node cache's file it is a link of; "" when downloaded */
  int refs;              /* running tasks using it */
  struct worker_shared *next;
};

/* ---- the worker's directory -------------------------------------------------- */

/* Creates the worker's directory `dir` (w->link_dir or w->download_dir)
 * inside `parent` (once, and again when it was removed behind our back:
 * `rm -rf` of the node's cache dir); 0 or -1 with errno. */
static int shared_make_dir(char dir[700], const char *parent) {
  if (dir[0] && (access(dir, F_OK) == 0 || errno != ENOENT))
    return 0;
  char made[700];
  int n = snprintf(made, sizeof made, "%s/%d-XXXXXX", parent, (int)getpid());
  if (n < 0 || (size_t)n >= sizeof made) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (mkdtemp(made) == NULL)
    return -1;
  memcpy(dir, made, sizeof made);
  return 0;
}

/* Removes the worker's directory `dir` and the files in it. */
static void shared_remove_dir(char dir[700]) {
  if (dir[0] == '\0')
    return;
  DIR *d = opendir(dir);
  struct dirent *de;
  while (d && (de = readdir(d)) != NULL) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (de->d_name[0] != '.')
      unlink(path);
  }
  if (d)
    closedir(d);
  rmdir(dir);
  dir[0] = '\0';
}

void worker_shared_cleanup(worker_t *w) {
  shared_remove_dir(w->link_dir);
  shared_remove_dir(w->download_dir);
}

/* ---- getting one level ---------------------------------------------------------- */

/* The client for shared data (made on first use; under shared_lock). */
static muster_client_t *shared_client(worker_t *w) {
  if (w->cache_client == NULL && muster_client_new(w->cache_url ? w->cache_url : w->url, w->token,
                                                   &w->cache_client) != MUSTER_OK)
    w->cache_client = NULL;
  return w->cache_client;
}

/* Links the file named by the node cache's `reply` into the worker's
 * directory as e->path.  MUSTER_OK; MUSTER_NOT_FOUND when linking cannot
 * work here (a cache on another machine or file system: download instead);
 * MUSTER_UNAVAILABLE when the file went between the reply and the link. */
static muster_err_t shared_link_reply(worker_t *w, struct worker_shared *e, const char *reply) {
  json_t *obj = json_loads(reply, 0, NULL);
  const char *from = json_string_value(json_object_get(obj, "path"));
  const char *links = json_string_value(json_object_get(obj, "links_dir"));
  const char *sum = json_string_value(json_object_get(obj, "checksum"));
  e->size = json_integer_value(json_object_get(obj, "size"));
  snprintf(e->checksum, sizeof e->checksum, "%s", sum ? sum : "");
  if (from == NULL || links == NULL || links[0] == '\0' ||
      shared_make_dir(w->link_dir, links) != 0) {
    json_decref(obj); /* no such directory here: a node cache on another machine */
    return MUSTER_NOT_FOUND;
  }
  snprintf(e->path, sizeof e->path, "%s/%s@%s@%lld", w->link_dir, e->scope, e->name,
           (long long)e->level);
  unlink(e->path); /* a leftover of a level we dropped and need again */
  int rc = link(from, e->path), link_errno = errno;
  snprintf(e->cache_path, sizeof e->cache_path, "%s", rc == 0 ? from : "");
  json_decref(obj);
  if (rc == 0)
    return MUSTER_OK;
  return link_errno == ENOENT ? MUSTER_UNAVAILABLE : MUSTER_NOT_FOUND;
}

/*
 * Asks the node cache for (scope, name, level) and links its file into the
 * worker's directory as e->path.  Returns MUSTER_OK; MUSTER_NOT_FOUND when
 * the URL is no node cache, or linking cannot work here (then download);
 * another error with `why` filled.
 */
static muster_err_t shared_link(worker_t *w, struct worker_shared *e, char *why, size_t size) {
  muster_client_t *client = shared_client(w);
  if (client == NULL) {
    snprintf(why, size, "out of memory");
    return MUSTER_NOMEM;
  }
  char api[400];
  snprintf(api, sizeof api, "/v1/node/cache/%s/%s?level=%lld", e->scope, e->name,
           (long long)e->level);
  for (int attempt = 0; attempt < SHARED_LINK_TRIES; attempt++) {
    char *reply = NULL;
    muster_err_t err = muster_request(client, "GET", api, NULL, &reply);
    if (err != MUSTER_OK) {
      snprintf(why, size, "%s: %s", muster_err_name(err), muster_client_message(client));
      return err; /* MUSTER_NOT_FOUND: a head, not a node agent */
    }
    err = shared_link_reply(w, e, reply);
    muster_free(reply);
    if (err != MUSTER_UNAVAILABLE)
      return err;
    /* the cache evicted the file since it answered; ask again */
  }
  snprintf(why, size, "the node cache evicted it %d times before it could be linked",
           SHARED_LINK_TRIES);
  return MUSTER_UNAVAILABLE;
}

/* Downloads (scope, name, level) into e->path, in the worker's directory
 * under TMPDIR: from the head when there is no node cache, or through the
 * cache's port when it keeps no file for the level.  Never into the cache
 * dir, even where the worker links its other levels: a level the cache has
 * no room for would not fit on that disk either. */
static muster_err_t shared_download(worker_t *w, struct worker_shared *e, char *why, size_t size) {
  const char *tmp = getenv("TMPDIR");
  if (shared_make_dir(w->download_dir, tmp && tmp[0] && strlen(tmp) < 400 ? tmp : "/tmp") != 0) {
    snprintf(why, size, "cannot create a directory for shared data: %s", strerror(errno));
    return MUSTER_INTERNAL;
  }
  snprintf(e->path, sizeof e->path, "%s/%s@%s@%lld", w->download_dir, e->scope, e->name,
           (long long)e->level);
  e->cache_path[0] = '\0';
  int fd = open(e->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
  if (fd < 0) {
    snprintf(why, size, "cannot create %.400s: %s", e->path, strerror(errno));
    return MUSTER_INTERNAL;
  }
  muster_client_t *client = shared_client(w);
  muster_shared_info_t info;
  muster_shared_opts_t opts;
  muster_shared_opts_init(&opts);
  opts.level = e->level;
  muster_err_t err =
      client ? muster_shared_get_fd(client, e->scope, e->name, fd, &opts, &info) : MUSTER_NOMEM;
  close(fd);
  if (err != MUSTER_OK) {
    snprintf(why, size, "%s: %s", muster_err_name(err),
             client ? muster_client_message(client) : "out of memory");
    unlink(e->path);
    return err;
  }
  e->size = info.size;
  snprintf(e->checksum, sizeof e->checksum, "%s", info.checksum);
  return MUSTER_OK;
}

/* Drops the levels of (scope, name) other than `keep` that no task uses. */
static void shared_drop_others(worker_t *w, const struct worker_shared *keep) {
  for (struct worker_shared **at = &w->shared; *at;) {
    struct worker_shared *e = *at;
    if (e != keep && e->refs == 0 && strcmp(e->scope, keep->scope) == 0 &&
        strcmp(e->name, keep->name) == 0) {
      unlink(e->path);
      *at = e->next;
      free(e);
    } else {
      at = &e->next;
    }
  }
}

/* Fetches (scope, name, level) into `e`: through the node cache, else from
 * the head.  MUSTER_OK, or an error with `why` filled. */
static muster_err_t shared_fetch(worker_t *w, struct worker_shared *e, char *why, size_t size) {
  muster_err_t err = shared_link(w, e, why, size);
  return err == MUSTER_NOT_FOUND ? shared_download(w, e, why, size) : err;
}

/* The held level (scope, name, level), fetched when not held yet, with one
 * more reference; NULL with `why` filled.  shared_lock held.  A held level
 * whose file is gone (someone removed the node's cache dir, the worker's
 * directory in it with it) is fetched again into place, so the next task
 * finds it. */
static struct worker_shared *shared_get(worker_t *w, const char *scope, const char *name,
                                        int64_t level, char *why, size_t size) {
  for (struct worker_shared *e = w->shared; e; e = e->next)
    if (e->level == level && strcmp(e->name, name) == 0 && strcmp(e->scope, scope) == 0) {
      if (access(e->path, F_OK) != 0 && errno == ENOENT &&
          shared_fetch(w, e, why, size) != MUSTER_OK)
        return NULL;
      e->refs++;
      return e;
    }
  struct worker_shared *e = calloc(1, sizeof *e);
  if (e == NULL) {
    snprintf(why, size, "out of memory");
    return NULL;
  }
  snprintf(e->scope, sizeof e->scope, "%s", scope);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->level = level;
  muster_err_t err = shared_fetch(w, e, why, size);
  if (err != MUSTER_OK) {
    free(e);
    return NULL;
  }
  e->refs = 1;
  e->next = w->shared;
  w->shared = e;
  shared_drop_others(w, e);
  return e;
}

/* ---- per task -------------------------------------------------------------------- */

int worker_shared_acquire(worker_slot_t *slot, char *why, size_t size) {
  worker_t *w = slot->worker;
  json_t *list = (json_t *)slot->requires;
  size_t n = json_array_size(list);
  if (n > WORKER_MAX_REQUIRES) {
    snprintf(why, size, "the task requires %zu levels of shared data, at most %d", n,
             WORKER_MAX_REQUIRES);
    return -1;
  }
  slot->held = calloc(n ? n : 1, sizeof *slot->held);
  if (slot->held == NULL) {
    snprintf(why, size, "out of memory");
    return -1;
  }
  pthread_mutex_lock(&w->shared_lock);
  for (size_t i = 0; i < n; i++) {
    json_t *req = json_array_get(list, i);
    const char *scope = json_string_value(json_object_get(req, "scope"));
    const char *name = json_string_value(json_object_get(req, "name"));
    json_int_t level = json_integer_value(json_object_get(req, "level"));
    char reason[600];
    struct worker_shared *e = scope && name && level > 0
                                  ? shared_get(w, scope, name, level, reason, sizeof reason)
                                  : NULL;
    if (e == NULL) {
      if (!(scope && name && level > 0))
        snprintf(reason, sizeof reason, "malformed entry in the lease");
      snprintf(why, size, "required shared data %.130s/%.130s level %lld: %s", scope ? scope : "?",
               name ? name : "?", (long long)level, reason);
      pthread_mutex_unlock(&w->shared_lock);
      worker_shared_release(slot);
      return -1;
    }
    slot->held[slot->nheld++] = e;
  }
  pthread_mutex_unlock(&w->shared_lock);
  return 0;
}

void worker_shared_release(worker_slot_t *slot) {
  worker_t *w = slot->worker;
  pthread_mutex_lock(&w->shared_lock);
  for (size_t i = 0; i < slot->nheld; i++)
    slot->held[i]->refs--;
  pthread_mutex_unlock(&w->shared_lock);
  free(slot->held);
  slot->held = NULL;
  slot->nheld = 0;
}

/* The variable name for blob `name`: MUSTER_SHARED_ + upper case, [.-] as '_'. */
static void shared_var_name(const char *name, char *buf, size_t size) {
  int n = snprintf(buf, size, "MUSTER_SHARED_");
  for (const char *p = name; *p && (size_t)n + 1 < size; p++)
    buf[n++] = *p >= 'a' && *p <= 'z'     ? (char)(*p - 'a' + 'A')
               : (*p == '.' || *p == '-') ? '_'
                                          : *p;
  buf[n] = '\0';
}

char **worker_shared_env(worker_slot_t *slot) {
  char **vars = calloc(slot->nheld + 2, sizeof *vars);
  json_t *list = json_array();
  if (vars == NULL || list == NULL) {
    free(vars);
    json_decref(list);
    return NULL;
  }
  size_t at = 0;
  for (size_t i = 0; i < slot->nheld; i++) {
    const struct worker_shared *e = slot->held[i];
    json_array_append_new(list,
                          json_pack("{s:s, s:s, s:I, s:s, s:I, s:s}", "scope", e->scope, "name",
                                    e->name, "level", (json_int_t)e->level, "path", e->path, "size",
                                    (json_int_t)e->size, "checksum", e->checksum));
    char var[200];
    shared_var_name(e->name, var, sizeof var);
    if (asprintf(&vars[at], "%s=%s", var, e->path) >= 0)
      at++;
  }
  char *text = jdump(list, JSON_COMPACT);
  json_decref(list);
  if (text && asprintf(&vars[at], "MUSTER_REQUIRES=%s", text) >= 0)
    at++;
  free(text);
  vars[at] = NULL;
  return vars;
}

void worker_shared_env_free(char **vars) {
  for (size_t i = 0; vars && vars[i]; i++)
    free(vars[i]);
  free(vars);
}

void worker_shared_plugin(worker_slot_t *slot, muster_plugin_shared_t *out) {
  for (size_t i = 0; i < slot->nheld; i++) {
    const struct worker_shared *e = slot->held[i];
    out[i] = (muster_plugin_shared_t){.scope = e->scope,
                                      .name = e->name,
                                      .level = e->level,
                                      .path = e->path,
                                      .size = e->size,
                                      .checksum = e->checksum};
  }
}

void worker_shared_prune(worker_t *w) {
  if (pthread_mutex_trylock(&w->shared_lock) != 0)
    return; /* a fetch holds it, perhaps for long: the heartbeat must not wait */
  for (struct worker_shared **at = &w->shared; *at;) {
    struct worker_shared *e = *at;
    if (e->refs == 0 && e->cache_path[0] && access(e->cache_path, F_OK) != 0 && errno == ENOENT) {
      unlink(e->path);
      *at = e->next;
      free(e);
    } else {
      at = &e->next;
    }
  }
  pthread_mutex_unlock(&w->shared_lock);
}

void worker_shared_free(worker_t *w) {
  worker_shared_cleanup(w);
  for (struct worker_shared *e = w->shared, *next; e; e = next) {
    next = e->next;
    free(e);
  }
  w->shared = NULL;
  muster_client_free(w->cache_client);
  w->cache_client = NULL;
}
