/*
 * iter.c — libmuster's iteration calls (docs/api.md, "Iterations"): create
 * or join, next, the blocks a rank holds, ack, heartbeat, status,
 * checkpoint, delete.  The loader
 * (loader.c) is built on these.
 */
#include "client/client_internal.h"
#include "client/iter_internal.h"

#include <stdlib.h>
#include <string.h>

#define ITER_PATH_MAX 256

void muster_iter_config_init_sized(muster_iter_config_t *cfg, size_t size) {
  const muster_iter_config_t defaults = {.size = sizeof defaults,
                                         .world_size = 1,
                                         .block_size = 256,
                                         .shuffle_block_size = 1024,
                                         .epochs = 1,
                                         .lease_ms = -1,
                                         .rank_timeout_ms = -1,
                                         .replication = -1,
                                         .cluster_sync = -1};
  opts_init_sized(cfg, size, &defaults, sizeof defaults);
}

/* Sets integer field `key`. */
static void set_int(json_t *obj, const char *key, uint64_t value) {
  json_object_set_new(obj, key, json_integer((json_int_t)value));
}

/* The dataset object of `cfg`. */
static json_t *dataset_json(const muster_iter_config_t *cfg) {
  json_t *ds = json_object();
  uint64_t n = cfg->num_samples;
  if (cfg->num_shards > 0) {
    json_t *shards = json_array();
    n = 0;
    for (size_t i = 0; i < cfg->num_shards; i++) {
      json_t *shard = json_pack("{s:I}", "count", (json_int_t)cfg->shard_counts[i]);
      if (cfg->shard_uris && cfg->shard_uris[i])
        json_object_set_new(shard, "uri", json_string(cfg->shard_uris[i]));
      json_array_append_new(shards, shard);
      n += cfg->shard_counts[i];
    }
    json_object_set_new(ds, "shards", shards);
  } else {
    set_int(ds, "num_samples", n);
  }
  if (cfg->labels) {
    json_t *labels = json_array();
    for (uint64_t i = 0; i < n; i++)
      json_array_append_new(labels, json_integer(cfg->labels[i]));
    json_object_set_new(ds, "labels", labels);
  }
  return ds;
}

/* Refuses coordinated settings below -1 (the head's default), which
 * settings_json would otherwise leave out as if they were -1. */
static muster_err_t settings_check(muster_client_t *client, const muster_iter_config_t *cfg) {
  static const char accepted[] = "a time in milliseconds, or -1 for the head's default";
  muster_err_t err = client_check_min(client, "lease_ms", cfg->lease_ms, -1, accepted);
  if (err == MUSTER_OK)
    err = client_check_min(client, "rank_timeout_ms", cfg->rank_timeout_ms, -1, accepted);
  if (err == MUSTER_OK)
    err = client_check_min(client, "replication", cfg->replication, -1,
                           "1 or more ranks, or -1 for the head's default");
  return err;
}

/* The coordinated settings of `cfg` that are not the head's defaults. */
static void settings_json(const muster_iter_config_t *cfg, json_t *obj) {
  if (cfg->lease_ms >= 0)
    json_object_set_new(obj, "lease_ms", json_integer(cfg->lease_ms));
  if (cfg->rank_timeout_ms >= 0)
    json_object_set_new(obj, "rank_timeout_ms", json_integer(cfg->rank_timeout_ms));
  if (cfg->replication >= 0)
    json_object_set_new(obj, "replication", json_integer(cfg->replication));
  if (cfg->cluster_sync >= 0)
    json_object_set_new(obj, "cluster_sync", json_boolean(cfg->cluster_sync));
}

json_t *iter_config_json(const muster_iter_config_t *cfg) {
  json_t *obj = json_object();
  json_object_set_new(obj, "dataset", dataset_json(cfg));
  set_int(obj, "seed", cfg->seed);
  json_object_set_new(obj, "shuffle", json_string(cfg->shuffle ? cfg->shuffle : "none"));
  set_int(obj, "shuffle_block_size", cfg->shuffle_block_size);
  json_object_set_new(obj, "strategy", json_string(cfg->strategy ? cfg->strategy : "round_robin"));
  set_int(obj, "world_size", cfg->world_size);
  set_int(obj, "block_size", cfg->block_size);
  set_int(obj, "epochs", cfg->epochs);
  json_object_set_new(obj, "tail", json_string(cfg->tail ? cfg->tail : "keep"));
  set_int(obj, "num_partitions", cfg->num_partitions);
  set_int(obj, "hash_seed", cfg->hash_seed);
  if (cfg->ranges) {
    json_t *ranges = json_array();
    for (uint32_t r = 0; r < cfg->world_size; r++)
      json_array_append_new(ranges, json_pack("[I, I]", (json_int_t)cfg->ranges[2 * r],
                                              (json_int_t)cfg->ranges[2 * r + 1]));
    json_object_set_new(obj, "ranges", ranges);
  }
  settings_json(cfg, obj);
  return obj;
}

/* Formats /v1/iterations/NAME + suffix into `path`. */
static muster_err_t iter_path(muster_client_t *client, char *path, const char *name,
                              const char *suffix) {
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "an iteration name is required");
  return client_path(client, path, ITER_PATH_MAX,
                     suffix ? "/v1/iterations/%s/%s" : "/v1/iterations/%s", name, suffix);
}

/* The create body of the (taken) configuration `cfg` (may be NULL) and
 * `checkpoint` (may be NULL; not both), without name and rank; NULL with
 * the handle's message set when the checkpoint is not JSON. */
static json_t *iter_create_body(muster_client_t *client, const muster_iter_config_t *cfg,
                                const char *checkpoint) {
  if (checkpoint == NULL)
    return iter_config_json(cfg);
  json_t *ck = client_parse_value(client, checkpoint, "checkpoint");
  if (ck == NULL)
    return NULL;
  json_t *body = json_pack("{s:o}", "checkpoint", ck);
  if (cfg) {
    set_int(body, "world_size", cfg->world_size);
    settings_json(cfg, body);
  }
  return body;
}

muster_err_t muster_iter_create(muster_client_t *client, const char *name,
                                const muster_iter_config_t *cfg, const char *checkpoint,
                                int64_t rank, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  if (name == NULL || (cfg == NULL && checkpoint == NULL))
    return client_fail(client, MUSTER_INVALID,
                       "a name and a configuration or checkpoint are needed");
  muster_iter_config_t taken; /* the caller's configuration over this library's defaults */
  muster_iter_config_init(&taken);
  if (cfg != NULL && (client_opts_take(client, &taken, sizeof taken, cfg, ITER_CONFIG_FIRST_END,
                                       "cfg", "muster_iter_config_init") != MUSTER_OK ||
                      settings_check(client, &taken) != MUSTER_OK))
    return MUSTER_INVALID;
  json_t *body = iter_create_body(client, cfg ? &taken : NULL, checkpoint);
  if (body == NULL)
    return MUSTER_INVALID;
  json_object_set_new(body, "name", json_string(name));
  if (rank >= 0)
    json_object_set_new(body, "rank", json_integer(rank));
  json_t *reply = NULL;
  muster_err_t err = client_call(client, "POST", "/v1/iterations", body, 0, &reply);
  json_decref(body);
  if (err == MUSTER_OK && json && (*json = client_dump_value(reply)) == NULL)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  json_decref(reply);
  return err;
}

/* Frees `count` blocks and their indices (next's and held's lists). */
static void iter_blocks_free(muster_iter_block_t **blocks, size_t *count) {
  for (size_t i = 0; i < *count; i++)
    free((*blocks)[i].indices);
  free(*blocks);
  *blocks = NULL;
  *count = 0;
}

void muster_iter_next_free(muster_iter_next_t *next) {
  if (next != NULL)
    iter_blocks_free(&next->blocks, &next->count);
}

muster_err_t muster_iter_next(muster_client_t *client, const char *name, uint32_t rank,
                              uint64_t epoch, size_t max, int flags, muster_iter_next_t *out) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (out == NULL)
    return client_fail(client, MUSTER_INVALID, "a place for the blocks is required");
  memset(out, 0, sizeof *out);
  char path[ITER_PATH_MAX];
  muster_err_t err = iter_path(client, path, name, "next");
  if (err)
    return err;
  jtext_buf_t *b = &client->body;
  jtext_reset(b);
  JTEXT_ADD_LITERAL(b, "{\"rank\":");
  jtext_add_int(b, (int64_t)rank);
  JTEXT_ADD_LITERAL(b, ",\"epoch\":");
  jtext_add_int(b, (int64_t)epoch);
  JTEXT_ADD_LITERAL(b, ",\"max\":");
  jtext_add_int(b, (int64_t)max);
  bool with_indices = (flags & MUSTER_ITER_INDICES) != 0;
  if (flags & MUSTER_ITER_HELD)
    JTEXT_ADD_LITERAL(b, ",\"held\":true");
  if (with_indices)
    JTEXT_ADD_LITERAL(b, ",\"indices\":true}");
  else
    JTEXT_ADD_LITERAL(b, ",\"indices\":false}");
  if (b->failed)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  err = client_call_text(client, "POST", path, b->data, 0);
  if (err != MUSTER_OK)
    return err;
  /* The reply's text, read without a tree: the indices are most of it. */
  char why[CLIENT_MESSAGE_MAX - 64];
  err = iter_next_read(client->reply.data, client->reply.len, with_indices, out, why, sizeof why);
  if (err == MUSTER_NOMEM)
    return client_fail(client, err, "out of memory");
  if (err != MUSTER_OK)
    return client_fail(client, err, "next: unreadable reply: %s", why);
  client_ok(client);
  return MUSTER_OK;
}

void muster_iter_held_free(muster_iter_held_t *held) {
  if (held != NULL)
    iter_blocks_free(&held->blocks, &held->count);
}

muster_err_t muster_iter_held(muster_client_t *client, const char *name, uint32_t rank,
                              uint64_t cursor, size_t max, int flags, muster_iter_held_t *out) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (out == NULL)
    return client_fail(client, MUSTER_INVALID, "a place for the blocks is required");
  memset(out, 0, sizeof *out);
  out->next = -1;
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "an iteration name is required");
  if (cursor > INT64_MAX || max > INT64_MAX)
    return client_fail(client, MUSTER_INVALID, "%s: beyond 2^63 - 1",
                       cursor > INT64_MAX ? "cursor" : "max");
  bool with_indices = (flags & MUSTER_ITER_INDICES) != 0;
  char path[ITER_PATH_MAX];
  /* max 0: the head's default page, which fits the indices a reply may hold. */
  muster_err_t err = client_path(
      client, path, sizeof path,
      max ? "/v1/iterations/%s/held?rank=%lld&cursor=%lld&indices=%s&max=%lld"
          : "/v1/iterations/%s/held?rank=%lld&cursor=%lld&indices=%s",
      name, (long long)rank, (long long)cursor, with_indices ? "true" : "false", (long long)max);
  if (err == MUSTER_OK)
    err = client_call_text(client, "GET", path, NULL, 0);
  if (err != MUSTER_OK)
    return err;
  char why[CLIENT_MESSAGE_MAX - 64];
  err = iter_held_read(client->reply.data, client->reply.len, with_indices, out, why, sizeof why);
  if (err == MUSTER_NOMEM)
    return client_fail(client, err, "out of memory");
  if (err != MUSTER_OK)
    return client_fail(client, err, "held: unreadable reply: %s", why);
  client_ok(client);
  return MUSTER_OK;
}

muster_err_t muster_iter_ack(muster_client_t *client, const char *name, uint32_t rank,
                             uint64_t epoch, const uint64_t *blocks, const int64_t *tokens,
                             size_t count) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[ITER_PATH_MAX];
  muster_err_t err = iter_path(client, path, name, "ack");
  if (err)
    return err;
  if (count > 0 && (blocks == NULL || tokens == NULL))
    return client_fail(client, MUSTER_INVALID, "%s are required (%zu of them)",
                       blocks == NULL ? "blocks" : "tokens", count);
  json_t *list = json_array();
  for (size_t i = 0; i < count; i++)
    json_array_append_new(list, json_pack("{s:I, s:I}", "block", (json_int_t)blocks[i], "token",
                                          (json_int_t)tokens[i]));
  json_t *body = json_pack("{s:I, s:I, s:o}", "rank", (json_int_t)rank, "epoch", (json_int_t)epoch,
                           "blocks", list);
  err = client_call(client, "POST", path, body, 0, NULL);
  json_decref(body);
  return err;
}

muster_err_t muster_iter_heartbeat(muster_client_t *client, const char *name, uint32_t rank) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[ITER_PATH_MAX];
  muster_err_t err = iter_path(client, path, name, "heartbeat");
  if (err)
    return err;
  json_t *body = json_pack("{s:I}", "rank", (json_int_t)rank);
  err = client_call(client, "POST", path, body, 0, NULL);
  json_decref(body);
  return err;
}

/* GETs path (under the iteration) and returns the reply text. */
static muster_err_t get_text(muster_client_t *client, const char *name, const char *suffix,
                             char **json) {
  if (json)
    *json = NULL;
  if (client == NULL || json == NULL)
    return client ? client_fail(client, MUSTER_INVALID, "a place for the reply is required")
                  : MUSTER_INVALID;
  char path[ITER_PATH_MAX];
  muster_err_t err = iter_path(client, path, name, suffix);
  json_t *reply = NULL;
  if (err == MUSTER_OK)
    err = client_call(client, "GET", path, NULL, 0, &reply);
  if (err == MUSTER_OK && (*json = client_dump_value(reply)) == NULL)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  json_decref(reply);
  return err;
}

muster_err_t muster_iter_status(muster_client_t *client, const char *name, char **json) {
  return get_text(client, name, NULL, json);
}

muster_err_t muster_iter_checkpoint(muster_client_t *client, const char *name, char **json) {
  return get_text(client, name, "checkpoint", json);
}

muster_err_t muster_iter_delete(muster_client_t *client, const char *name) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[ITER_PATH_MAX];
  muster_err_t err = iter_path(client, path, name, NULL);
  return err ? err : client_call(client, "DELETE", path, NULL, 0, NULL);
}
