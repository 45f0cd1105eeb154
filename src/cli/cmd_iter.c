/*
 * cmd_iter.c — `muster iter create|next|held|ack|status|checkpoint|restore|
 * rm|stream`: iterations from the shell (docs/cli.md, docs/iterations.md).
 *
 * The configuration options are shared by `create` (a coordinated
 * iteration on the head) and `stream` (a rank's indices computed here, with
 * no head, through the standalone loader).  `next` prints one JSON line per
 * leased block with its indices, so a script can read blocks with `while
 * read` and hand block and token back to `ack`; `held` prints the blocks a
 * rank holds in the same form, leasing none.
 */
#include "cli/cli.h"
#include "client/jdump.h"
#include "core/dataset.h"
#include "core/partition.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define ITER_CONFIG_OPTS                                                                           \
  {"num-samples", "N", "the dataset has N samples (or give --shards)"},                            \
      {"shards", "C,C,...", "the dataset is shards of these sample counts"},                       \
      {"labels", "FILE", "a class label per sample, one per line (stratified)"},                   \
      {"seed", "S", "shuffle seed (default 0)"},                                                   \
      {"shuffle", "MODE", "none (default), global or shard"},                                      \
      {"shuffle-block-size", "N", "shard mode: samples shuffled together (default 1024)"},         \
      {"strategy", "S", "round_robin (default), contiguous, hash, range, stratified or dynamic"},  \
      {"world-size", "W", "number of ranks (default 1)"},                                          \
      {"block-size", "B", "samples per block (default 256)"},                                      \
      {"epochs", "E", "epochs (default 1; 0: unbounded)"},                                         \
      {"tail", "T", "keep (default), pad or drop"},                                                \
      {"num-partitions", "P", "hash: partitions (default: world size)"},                           \
      {"hash-seed", "S", "hash: seed of the sample hash"}, {                                       \
    "ranges", "B:E,...", "range: [B, E) per rank"                                                  \
  }

/* The coordinated settings `create` and `restore` take: a checkpoint holds
 * the configuration only, so a restore gives them again (a node-local
 * iteration's cluster_sync false above all, or the restore lands on the
 * head when the cluster has more than one node). */
#define ITER_SETTING_OPTS                                                                          \
  {"lease-ms", "MS", "block lease length (default 30000)"},                                        \
      {"rank-timeout-ms", "MS", "a rank silent this long is failed (default 30000)"}, {            \
    "replication", "R", "static strategies: ranks that may take over a rank's blocks (default 1)"  \
  }
#define ITER_SYNC_OPT                                                                              \
  {                                                                                                \
    "cluster-sync", "BOOL",                                                                        \
        "true: state on the head; false: on the node agent the command is sent to "                \
        "(omitted: true on the head; through an agent, true when the head knows more than one "    \
        "active node, else false)"                                                                 \
  }

const cli_opt_t iter_create_opts[] = {
    ITER_CONFIG_OPTS,   ITER_SETTING_OPTS, ITER_SYNC_OPT, {"rank", "R", "also join as rank R"},
    {NULL, NULL, NULL},
};

const cli_opt_t iter_stream_opts[] = {
    ITER_CONFIG_OPTS,
    {"rank", "R", "the rank whose indices to print (default 0)"},
    {"epoch", "E", "start at epoch E (default 0)"},
    {"all-epochs", NULL, "go on through every epoch (one blank line between epochs)"},
    {NULL, NULL, NULL},
};

const cli_opt_t iter_next_opts[] = {
    {"rank", "R", "the rank asking (required)"},
    {"epoch", "E", "the epoch it is consuming (default: the iteration's current one)"},
    {"max", "N", "lease up to N blocks (default 1)"},
    {"held", NULL, "first the blocks the rank holds (to retry a next whose reply was lost)"},
    {NULL, NULL, NULL},
};

const char iter_held_details[] =
    "Prints one JSON line per block the rank holds in the iteration's current\n"
    "epoch (leased to it and not acknowledged), lowest first, as `iter next`\n"
    "prints them: epoch, block, token, deadline_ms, takeover (and indices with\n"
    "--indices).  Nothing is leased, no lease is extended and the rank is not\n"
    "marked alive, so it is safe to run on a rank that looks stuck.  A rank\n"
    "that holds no block prints nothing.\n\n"
    "examples:\n"
    "  muster iter held train --rank 3\n"
    "  muster iter held train --rank 3 --indices\n";

const cli_opt_t iter_held_opts[] = {
    {"rank", "R", "the rank whose blocks to list (required)"},
    {"indices", NULL, "print each block's sample indices too"},
    {NULL, NULL, NULL},
};

const cli_opt_t iter_ack_opts[] = {
    {"rank", "R", "the rank acknowledging (required)"},
    {"epoch", "E", "the blocks' epoch (default: the current one)"},
    {NULL, NULL, NULL},
};

const cli_opt_t iter_restore_opts[] = {
    {"world-size", "W", "resume with W ranks (elastic; default: the checkpoint's)"},
    {"epochs", "E", "change the number of epochs"},
    ITER_SETTING_OPTS,
    ITER_SYNC_OPT,
    {"rank", "R", "also join as rank R"},
    {NULL, NULL, NULL},
};

const cli_opt_t iter_status_opts[] = {
    {"json", NULL, "print the iteration object as JSON"},
    {NULL, NULL, NULL},
};

const char *const cli_bool_words[] = {"true", "false", NULL};

/* Storage for the arrays a configuration points at. */
typedef struct {
  muster_iter_config_t cfg;
  uint64_t *shards;
  uint64_t *ranges;
  uint32_t *labels;
} iter_cfg_t;

static void cfg_free(iter_cfg_t *c) {
  free(c->shards);
  free(c->ranges);
  free(c->labels);
}

/* --rank R into *rank (`fallback` when not given): a rank of the largest world
 * size at most, so that no rank is cut to its low 32 bits (--rank 4294967296
 * leased rank 0's blocks). */
static int read_rank(const cli_args_t *args, int64_t fallback, int64_t *rank) {
  return cli_opt_int_range(args, "rank", fallback, 0, PART_MAX_WORLD_SIZE - 1, rank);
}

/* Parses "a,b,c" (or "a:b,c:d" with `pairs`) into a fresh array. */
static int parse_list(const cli_args_t *args, const char *opt, int pairs, uint64_t **out,
                      size_t *n) {
  const char *text = cli_opt(args, opt);
  *out = NULL;
  *n = 0;
  if (text == NULL)
    return CLI_OK;
  size_t cap = 1;
  for (const char *p = text; *p; p++)
    cap += *p == ',' || *p == ':';
  *out = calloc(cap, sizeof **out);
  const char *p = text;
  while (*out && *p) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    char want = pairs && *n % 2 == 0 ? ':' : ',';
    if (end == p || errno || *p == '-' || (*end && *end != want) || (!*end && pairs && *n % 2 == 0))
      return cli_usage_error(args->cmd, "--%s: expected %s, got '%s'", opt,
                             pairs ? "B:E,B:E,..." : "N,N,...", text);
    (*out)[(*n)++] = v;
    p = *end ? end + 1 : end;
  }
  return *out ? CLI_OK : CLI_FAIL;
}

/* CLI_OK, or CLI_USAGE after saying that --strategy stratified lacks --labels
 * (the library's words name its struct field, not the option to give). */
static int check_labels_given(const cli_args_t *args) {
  const char *strategy = cli_opt(args, "strategy");
  if (strategy == NULL || strcmp(strategy, "stratified") != 0 || cli_opt(args, "labels"))
    return CLI_OK;
  return cli_usage_error(args->cmd, "--strategy stratified needs --labels FILE: a class label "
                                    "per sample, one per line");
}

/* A class label: a whole number below DATASET_MAX_CLASSES, as the head takes
 * one (fscanf's %lu wrapped -1 and 2^32 round into labels of other classes). */
static int label_parse(const char *word, uint32_t *label) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(word, &end, 10);
  if (!isdigit((unsigned char)word[0]) || *end != '\0' || errno || v >= DATASET_MAX_CLASSES)
    return 0;
  *label = (uint32_t)v;
  return 1;
}

/* Reads one label per line of the --labels FILE; without one, checks that
 * the strategy needs none.  A word that is no label, or a file with another
 * number of labels than the dataset's samples, is told (exit 2). */
static int read_labels(const cli_args_t *args, iter_cfg_t *c, uint64_t n) {
  const char *path = cli_opt(args, "labels");
  if (path == NULL)
    return check_labels_given(args);
  FILE *fp = fopen(path, "r");
  if (fp == NULL)
    return cli_usage_error(args->cmd, "--labels: cannot open '%s': %s", path, strerror(errno));
  c->labels = calloc(n ? n : 1, sizeof *c->labels);
  uint64_t count = 0;
  uint32_t label = 0;
  char word[32];
  int bad = 0;
  while (c->labels && !bad && fscanf(fp, "%31s", word) == 1)
    if (!(bad = !label_parse(word, &label)) && count++ < n)
      c->labels[count - 1] = label;
  fclose(fp);
  if (bad)
    return cli_usage_error(args->cmd,
                           "--labels: %s: label %llu, '%s', is not a class label (a whole "
                           "number from 0 to %u, one per line)",
                           path, (unsigned long long)count + 1, word, DATASET_MAX_CLASSES - 1);
  if (c->labels && count != n)
    return cli_usage_error(args->cmd, "--labels: %s has %llu labels, the dataset %llu samples",
                           path, (unsigned long long)count, (unsigned long long)n);
  c->cfg.labels = c->labels;
  return c->labels ? CLI_OK : CLI_FAIL;
}

/* A seed given without a shuffle changes nothing: the order is unshuffled.  A
 * user coming from tenflowers, whose with_shuffle_seed(seed) shuffles, is told
 * on stderr (the output is what they asked for, so it stands). */
static void note_seed_without_shuffle(const cli_args_t *args, const muster_iter_config_t *cfg) {
  const char *seed = cli_opt(args, "seed");
  if (seed && (cfg->shuffle == NULL || strcmp(cfg->shuffle, "none") == 0))
    fprintf(stderr,
            "muster: note: --seed %s changes nothing while --shuffle is none (the default): "
            "the order is not shuffled; give --shuffle global (or shard) for a seeded order\n",
            seed);
}

/* The plan's numbers (--seed, --shuffle-block-size, --world-size,
 * --block-size, --epochs, --num-partitions, --hash-seed) into *values[0..7),
 * each its default when not given.  The fields of 32 bits take no more (a
 * larger one was cut to its low bits: --world-size 4294967297 streamed world
 * size 1); the others' ranges are the plan's to say, in the head's words. */
static int read_plan_numbers(const cli_args_t *args, int64_t *values[7]) {
  const char *names[] = {"seed",   "shuffle-block-size", "world-size", "block-size",
                         "epochs", "num-partitions",     "hash-seed"};
  int64_t dflt[] = {0, 1024, 1, 256, 1, 0, 0}, mins[] = {0, 1, 1, 1, 0, 0, 0};
  int64_t maxes[] = {INT64_MAX,  INT64_MAX, PART_MAX_WORLD_SIZE, INT64_MAX, INT64_MAX,
                     UINT32_MAX, INT64_MAX};
  int rc = CLI_OK;
  for (int i = 0; i < 7 && rc == CLI_OK; i++)
    rc = cli_opt_int_range(args, names[i], dflt[i], mins[i], maxes[i], values[i]);
  return rc;
}

/* Fills the configuration from the options (read_config). */
static int read_config_fields(const cli_args_t *args, iter_cfg_t *c) {
  memset(c, 0, sizeof *c);
  muster_iter_config_init(&c->cfg);
  muster_iter_config_t *cfg = &c->cfg;
  int64_t n, seed, sbs, world, block, epochs, parts, hseed;
  size_t nshards, nranges;
  int rc = cli_opt_int(args, "num-samples", -1, 0, &n);
  if (rc == CLI_OK)
    rc = parse_list(args, "shards", 0, &c->shards, &nshards);
  if (rc == CLI_OK && (n < 0) == (c->shards == NULL))
    return cli_usage_error(args->cmd, "give exactly one of --num-samples and --shards");
  int64_t *values[] = {&seed, &sbs, &world, &block, &epochs, &parts, &hseed};
  if (rc == CLI_OK)
    rc = read_plan_numbers(args, values);
  if (rc == CLI_OK)
    rc = parse_list(args, "ranges", 1, &c->ranges, &nranges);
  if (rc != CLI_OK)
    return rc;
  if (c->ranges && nranges != 2 * (size_t)world)
    return cli_usage_error(args->cmd, "--ranges: needs one B:E per rank (%lld)", (long long)world);
  cfg->num_samples = n >= 0 ? (uint64_t)n : 0;
  cfg->num_shards = c->shards ? nshards : 0;
  cfg->shard_counts = c->shards;
  uint64_t total = cfg->num_samples;
  for (size_t i = 0; c->shards && i < nshards; i++)
    total += c->shards[i];
  cfg->seed = (uint64_t)seed;
  cfg->shuffle = cli_opt(args, "shuffle");
  cfg->shuffle_block_size = (uint64_t)sbs;
  cfg->strategy = cli_opt(args, "strategy");
  cfg->world_size = (uint32_t)world;
  cfg->block_size = (uint64_t)block;
  cfg->epochs = (uint64_t)epochs;
  cfg->tail = cli_opt(args, "tail");
  cfg->num_partitions = (uint32_t)parts;
  cfg->hash_seed = (uint64_t)hseed;
  cfg->ranges = c->ranges;
  return read_labels(args, c, total);
}

/* Fills the configuration from the options, with a note on a seed that
 * shuffles nothing. */
static int read_config(const cli_args_t *args, iter_cfg_t *c) {
  int rc = read_config_fields(args, c);
  if (rc == CLI_OK)
    note_seed_without_shuffle(args, &c->cfg);
  return rc;
}

/* Reads the coordinated settings of `iter create`. */
static int read_settings(const cli_args_t *args, muster_iter_config_t *cfg) {
  int rc = cli_opt_int(args, "lease-ms", -1, 1, &cfg->lease_ms);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "rank-timeout-ms", -1, 1, &cfg->rank_timeout_ms);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "replication", -1, 1, &cfg->replication);
  const char *sync = cli_opt(args, "cluster-sync");
  if (rc == CLI_OK && sync) {
    if (strcmp(sync, cli_bool_words[0]) && strcmp(sync, cli_bool_words[1]))
      return cli_usage_error(args->cmd, "--cluster-sync: expected true or false");
    cfg->cluster_sync = strcmp(sync, cli_bool_words[0]) == 0;
  }
  return rc;
}

/* Prints a library reply with `pretty`, or the error. */
static int finish(muster_client_t *client, muster_err_t err, char *json, int pretty) {
  int rc = CLI_OK;
  if (err != MUSTER_OK)
    rc = cli_error(client, err);
  else if (json && pretty)
    cli_print_pretty(json);
  else if (json)
    puts(json);
  muster_free(json);
  muster_client_free(client);
  return rc;
}

int cmd_iter_create(cli_args_t *args) {
  iter_cfg_t c;
  int64_t rank;
  int rc = read_config(args, &c);
  if (rc == CLI_OK)
    rc = read_settings(args, &c.cfg);
  if (rc == CLI_OK)
    rc = read_rank(args, -1, &rank);
  muster_client_t *client = NULL;
  if (rc == CLI_OK && (rc = cli_connect(args, &client)) == CLI_OK) {
    char *json = NULL;
    muster_err_t err = muster_iter_create(client, args->pos[0], &c.cfg, NULL, rank, &json);
    rc = finish(client, err, json, 1);
  }
  cfg_free(&c);
  return rc;
}

/* Prints one leased block as a JSON line; "indices" only when the block
 * has them (they were asked for). */
static void print_block(uint64_t epoch, const muster_iter_block_t *b) {
  json_t *obj = json_pack("{s:I, s:I, s:I, s:I, s:b}", "epoch", (json_int_t)epoch, "block",
                          (json_int_t)b->block, "token", (json_int_t)b->token, "deadline_ms",
                          (json_int_t)b->deadline_ms, "takeover", b->takeover);
  if (b->indices) {
    json_t *indices = json_array();
    for (uint64_t i = 0; i < b->end - b->begin; i++)
      json_array_append_new(indices, json_integer((json_int_t)b->indices[i]));
    json_object_set_new(obj, "indices", indices);
  }
  char *line = jdump(obj, JSON_COMPACT);
  if (line)
    puts(line);
  free(line);
  json_decref(obj);
}

int cmd_iter_next(cli_args_t *args) {
  int64_t rank, epoch, max;
  int rc = read_rank(args, -1, &rank);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "epoch", -1, 0, &epoch);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "max", 1, 1, &max);
  if (rc == CLI_OK && rank < 0)
    return cli_usage_error(args->cmd, "'iter next' needs --rank R");
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  if (epoch < 0) { /* the iteration's current epoch */
    char *json = NULL;
    muster_err_t err = muster_iter_status(client, args->pos[0], &json);
    if (err != MUSTER_OK)
      return finish(client, err, json, 0);
    json_t *obj = json_loads(json, 0, NULL);
    epoch = json_integer_value(json_object_get(obj, "epoch"));
    json_decref(obj);
    muster_free(json);
  }
  muster_iter_next_t next;
  muster_err_t err = muster_iter_next(
      client, args->pos[0], (uint32_t)rank, (uint64_t)epoch, (size_t)max,
      MUSTER_ITER_INDICES | (cli_flag(args, "held") ? MUSTER_ITER_HELD : 0), &next);
  if (err == MUSTER_OK) {
    static const char *const states[] = {"blocks", "wait", "epoch_end", "finished"};
    for (size_t i = 0; i < next.count; i++)
      print_block(next.epoch, &next.blocks[i]);
    if (next.count == 0)
      printf("{\"state\":\"%s\",\"epoch\":%llu}\n", states[next.state],
             (unsigned long long)next.epoch);
    muster_iter_next_free(&next);
  }
  return finish(client, err, NULL, 0);
}

int cmd_iter_held(cli_args_t *args) {
  int64_t rank;
  int rc = read_rank(args, -1, &rank);
  if (rc == CLI_OK && rank < 0)
    return cli_usage_error(args->cmd, "'iter held' needs --rank R");
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  int flags = cli_flag(args, "indices") ? MUSTER_ITER_INDICES : 0;
  muster_err_t err = MUSTER_OK;
  /* Page after page until the head says the list is complete. */
  for (int64_t cursor = 0; err == MUSTER_OK && cursor >= 0;) {
    muster_iter_held_t held;
    err = muster_iter_held(client, args->pos[0], (uint32_t)rank, (uint64_t)cursor, 0, flags, &held);
    for (size_t i = 0; err == MUSTER_OK && i < held.count; i++)
      print_block(held.epoch, &held.blocks[i]);
    cursor = held.next;
    muster_iter_held_free(&held);
  }
  return finish(client, err, NULL, 0);
}

/* Prints a failed ack's error.  The server names the element of the body it
 * refused ("blocks[1]: block 3 of epoch 0 is not leased under token 7: ...")
 * and then the block itself; the body is the CLI's, built from BLOCK:TOKEN
 * arguments in order, so the index into it is dropped and the message starts
 * with the user's block. */
static int ack_error(const muster_client_t *client, muster_err_t err, size_t count) {
  const char *message = muster_client_message(client);
  char element[40] = "";
  size_t index;
  int used = 0;
  if (message && sscanf(message, "blocks[%zu]%n", &index, &used) == 1 && used > 0 && index < count)
    snprintf(element, sizeof element, "%.*s", used, message);
  return cli_error_of_one(client, err, element[0] ? element : NULL);
}

/* The iteration's current epoch, for an ack that names none. */
static muster_err_t ack_current_epoch(muster_client_t *client, const char *name, int64_t *epoch) {
  char *json = NULL;
  muster_err_t err = muster_iter_status(client, name, &json);
  if (err == MUSTER_OK) {
    json_t *obj = json_loads(json, 0, NULL);
    *epoch = json_integer_value(json_object_get(obj, "epoch"));
    json_decref(obj);
  }
  muster_free(json);
  return err;
}

int cmd_iter_ack(cli_args_t *args) {
  int64_t rank, epoch = -1;
  int rc = read_rank(args, -1, &rank);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "epoch", -1, 0, &epoch);
  if (rc == CLI_OK && rank < 0)
    return cli_usage_error(args->cmd, "'iter ack' needs --rank R");
  size_t n = (size_t)args->npos - 1;
  uint64_t *blocks = calloc(n ? n : 1, sizeof *blocks);
  int64_t *tokens = calloc(n ? n : 1, sizeof *tokens);
  for (size_t i = 0; rc == CLI_OK && blocks && tokens && i < n; i++) {
    unsigned long long b;
    long long t;
    char extra;
    if (sscanf(args->pos[i + 1], "%llu:%lld%c", &b, &t, &extra) != 2 || t <= 0)
      rc = cli_usage_error(args->cmd, "expected BLOCK:TOKEN, got '%s'", args->pos[i + 1]);
    else
      blocks[i] = b, tokens[i] = t;
  }
  muster_client_t *client = NULL;
  if (rc == CLI_OK && (blocks == NULL || tokens == NULL))
    rc = CLI_FAIL;
  if (rc == CLI_OK && (rc = cli_connect(args, &client)) == CLI_OK) {
    muster_err_t err = epoch < 0 ? ack_current_epoch(client, args->pos[0], &epoch) : MUSTER_OK;
    if (err == MUSTER_OK)
      err =
          muster_iter_ack(client, args->pos[0], (uint32_t)rank, (uint64_t)epoch, blocks, tokens, n);
    rc = err == MUSTER_OK ? CLI_OK : ack_error(client, err, n);
    muster_client_free(client);
  }
  free(blocks);
  free(tokens);
  return rc;
}

/* The shuffle mode as the summary line says it: "global" (a "global
 * shuffle"), and "no" for "none", which reads as "no shuffle". */
static const char *shuffle_word(const json_t *config) {
  const char *shuffle = json_string_value(json_object_get(config, "shuffle"));
  return shuffle == NULL || strcmp(shuffle, "none") == 0 ? "no" : shuffle;
}

/* Prints the iteration's summary and a row per rank. */
static void print_status(const char *json) {
  json_t *obj = json_loads(json, 0, NULL);
  json_t *blocks = json_object_get(obj, "blocks");
  json_t *config = json_object_get(obj, "config");
  /* A node-local iteration says where it lives: only that agent answers for it. */
  const char *node = json_string_value(json_object_get(obj, "node"));
  printf("%s%s%s%s: %s, %s shuffle, world %lld, epoch %lld%s, blocks %lld/%lld done, %lld leased\n",
         json_string_value(json_object_get(obj, "name")),
         node ? " (node-local, on node agent " : "", node ? node : "", node ? ")" : "",
         json_string_value(json_object_get(config, "strategy")), shuffle_word(config),
         (long long)json_integer_value(json_object_get(config, "world_size")),
         (long long)json_integer_value(json_object_get(obj, "epoch")),
         json_is_true(json_object_get(obj, "finished")) ? " (finished)" : "",
         (long long)json_integer_value(json_object_get(blocks, "done")),
         (long long)json_integer_value(json_object_get(blocks, "total")),
         (long long)json_integer_value(json_object_get(blocks, "leased")));
  printf("%6s  %-8s %10s %8s %12s %7s %6s\n", "RANK", "HEALTH", "SAMPLES", "BLOCKS", "SAMPLES/S",
         "LEASES", "TAKEN");
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(obj, "ranks"), i, r) {
    printf("%6lld  %-8s %10lld %8lld %12.1f %7lld %6lld\n",
           (long long)json_integer_value(json_object_get(r, "rank")),
           json_string_value(json_object_get(r, "health")),
           (long long)json_integer_value(json_object_get(r, "samples")),
           (long long)json_integer_value(json_object_get(r, "blocks")),
           json_number_value(json_object_get(r, "throughput")),
           (long long)json_integer_value(json_object_get(r, "leases")),
           (long long)json_integer_value(json_object_get(r, "taken_over")));
  }
  json_decref(obj);
}

int cmd_iter_status(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = muster_iter_status(client, args->pos[0], &json);
  if (err == MUSTER_OK && !cli_flag(args, "json")) {
    print_status(json);
    muster_free(json);
    muster_client_free(client);
    return CLI_OK;
  }
  return finish(client, err, json, 1);
}

int cmd_iter_checkpoint(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = muster_iter_checkpoint(client, args->pos[0], &json);
  return finish(client, err, json, 0);
}

/* Reads all of FILE ("-": stdin) into a NUL-terminated buffer, its length
 * (without the NUL) in *len; caller frees.  NULL with errno set when it
 * cannot be opened or read. */
static char *slurp(const char *path, size_t *len_out) {
  FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
  if (fp == NULL)
    return NULL;
  size_t len = 0, cap = 4096;
  char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + len, 1, cap - len - 1, fp)) > 0) {
    len += got;
    if (cap - len < 2) {
      char *grown = realloc(buf, cap *= 2);
      if (grown == NULL) {
        free(buf);
        buf = NULL;
      }
      buf = grown;
    }
  }
  int failed = ferror(fp), saved = errno;
  if (fp != stdin)
    fclose(fp);
  if (buf && failed) {
    free(buf);
    buf = NULL;
    errno = saved;
  }
  if (buf)
    buf[len] = '\0';
  *len_out = len;
  return buf;
}

/* The checkpoint object in FILE ("-": stdin), or NULL after printing why:
 * the OS's reason, or jansson's and where in the file (cli_json_parse, as
 * every JSON text the CLI reads is told).  These failures carry no error
 * code: the head was not asked. */
static json_t *read_checkpoint(const char *path) {
  size_t len;
  char *text = slurp(path, &len);
  if (text == NULL) {
    fprintf(stderr, "muster: cannot read the checkpoint file '%s': %s\n", path, strerror(errno));
    return NULL;
  }
  char why[CLI_JSON_WHY];
  json_t *ck = cli_json_parse(text, len, why, sizeof why);
  free(text);
  if (ck == NULL || !json_is_object(ck)) {
    fprintf(stderr,
            "muster: the checkpoint file '%s' is not %s%s; give the file that 'muster iter "
            "checkpoint' wrote\n",
            path, ck ? "a JSON object" : "JSON: ", ck ? "" : why);
    json_decref(ck);
    return NULL;
  }
  return ck;
}

int cmd_iter_restore(cli_args_t *args) {
  int64_t world, epochs, rank;
  muster_iter_config_t cfg;
  muster_iter_config_init(&cfg);
  int rc = read_settings(args, &cfg);
  if (rc == CLI_OK)
    rc = cli_opt_int_range(args, "world-size", 0, 1, PART_MAX_WORLD_SIZE, &world);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "epochs", -1, 0, &epochs);
  if (rc == CLI_OK)
    rc = read_rank(args, -1, &rank);
  if (rc != CLI_OK)
    return rc;
  json_t *ck = read_checkpoint(args->pos[1]);
  if (ck == NULL)
    return CLI_FAIL;
  json_t *config = json_object_get(ck, "config");
  if (epochs >= 0 && config)
    json_object_set_new(config, "epochs", json_integer(epochs)); /* not in the fingerprint */
  json_t *cw = json_object_get(config, "world_size");
  cfg.world_size = (uint32_t)(world > 0 ? world : json_integer_value(cw));
  char *ck_text = jdump(ck, JSON_COMPACT);
  json_decref(ck);
  muster_client_t *client = NULL;
  if ((rc = cli_connect(args, &client)) != CLI_OK) {
    free(ck_text);
    return rc;
  }
  char *json = NULL;
  muster_err_t err = muster_iter_create(client, args->pos[0], &cfg, ck_text, rank, &json);
  free(ck_text);
  return finish(client, err, json, 1);
}

int cmd_iter_rm(cli_args_t *args) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  muster_err_t err = muster_iter_delete(client, args->pos[0]);
  rc = err == MUSTER_OK ? CLI_OK : cli_error(client, err);
  muster_client_free(client);
  return rc;
}

/* Reads --epoch into *epoch: CLI_OK, or CLI_USAGE after saying that it names
 * an epoch the plan does not have (the loader's "every epoch is done" did not
 * say which option was wrong). */
static int read_stream_epoch(const cli_args_t *args, uint64_t epochs, int64_t *epoch) {
  int rc = cli_opt_int(args, "epoch", 0, 0, epoch);
  if (rc != CLI_OK || epochs == 0 || (uint64_t)*epoch < epochs)
    return rc;
  return cli_usage_error(args->cmd,
                         "--epoch %lld is past the last epoch, %llu (--epochs %llu counts epochs "
                         "from 0); give --epochs %lld or more, or --epochs 0 for no end",
                         (long long)*epoch, (unsigned long long)(epochs - 1),
                         (unsigned long long)epochs, (long long)*epoch + 1);
}

int cmd_iter_stream(cli_args_t *args) {
  iter_cfg_t c;
  int64_t rank, epoch;
  int rc = read_config(args, &c);
  if (rc == CLI_OK)
    rc = read_rank(args, 0, &rank);
  if (rc == CLI_OK)
    rc = read_stream_epoch(args, c.cfg.epochs, &epoch);
  muster_loader_t *loader = NULL;
  if (rc == CLI_OK) {
    muster_loader_opts_t opts;
    muster_loader_opts_init(&opts);
    opts.config = &c.cfg;
    opts.rank = (uint32_t)rank;
    char *message = NULL;
    muster_err_t err = muster_loader_open(&opts, &loader, &message);
    if (err != MUSTER_OK) {
      fprintf(stderr, "muster: %s: %s\n", muster_err_name(err), message ? message : "");
      rc = CLI_FAIL;
    }
    muster_free(message);
  }
  for (int64_t e = 0; rc == CLI_OK && e < epoch; e++)
    if (muster_loader_reset(loader) != MUSTER_OK) {
      fprintf(stderr, "muster: invalid_argument: %s\n", muster_loader_message(loader));
      rc = CLI_FAIL;
    }
  for (int first = 1; rc == CLI_OK; first = 0) {
    if (!first) {
      if (!cli_flag(args, "all-epochs") || muster_loader_reset(loader) != MUSTER_OK)
        break;
      putchar('\n');
    }
    uint64_t index;
    int has;
    while (muster_loader_next(loader, &index, NULL, &has) == MUSTER_OK && has)
      printf("%llu\n", (unsigned long long)index);
  }
  muster_loader_close(loader);
  cfg_free(&c);
  return rc;
}
