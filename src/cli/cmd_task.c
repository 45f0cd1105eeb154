/*
 * cmd_task.c — `muster put` and `muster tasks ls|show|dead|requeue`.
 *
 * `put` reads every payload (arguments, stdin or --file) before it sends any,
 * so a bad line stops the command with nothing stored; it then sends batches
 * of up to 1000 tasks (the
 * server's batch limit) and prints each batch's ids as soon as it is stored.
 * Listings page through the server's results (1000 per request at most).
 */
#include "cli/cli.h"
#include "cli/table.h"
#include "client/jdump.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PUT_BATCH 1000
#define PUT_KEY_MAX 257 /* the head's keys are at most 256 bytes */
#define LIST_PAGE 1000

/* ---- put ---------------------------------------------------------------------- */

/* A growing list of payloads as JSON text. */
typedef struct {
  char **texts;
  size_t count, cap;
} put_list_t;

static void put_list_free(put_list_t *list) {
  for (size_t i = 0; i < list->count; i++)
    free(list->texts[i]);
  free(list->texts);
}

/*
 * Turns one raw payload into JSON text and appends it: parsed when `as_json`,
 * else stored as a JSON string.  `where` names it in errors ("argument 2",
 * "stdin line 7").  Returns CLI_OK or CLI_FAIL after printing the error.
 */
static int put_add(put_list_t *list, const char *raw, size_t len, int as_json, const char *where) {
  char why[CLI_JSON_WHY];
  json_t *value = as_json ? cli_json_parse(raw, len, why, sizeof why) : json_stringn(raw, len);
  if (value == NULL) {
    if (as_json)
      fprintf(stderr, "muster: invalid_argument: %s: not valid JSON: %s\n", where, why);
    else
      fprintf(stderr, "muster: invalid_argument: %s: not valid UTF-8 text\n", where);
    return CLI_FAIL;
  }
  char *text = jdump(value, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(value);
  if (list->count == list->cap) {
    size_t cap = list->cap ? list->cap * 2 : 256;
    char **grown = realloc(list->texts, cap * sizeof *grown);
    if (grown == NULL) {
      free(text);
      text = NULL;
    } else {
      list->texts = grown;
      list->cap = cap;
    }
  }
  if (text == NULL) {
    fprintf(stderr, "muster: out of memory\n");
    return CLI_FAIL;
  }
  list->texts[list->count++] = text;
  return CLI_OK;
}

/* Reads one payload per non-empty stdin line ("\n" or "\r\n" ended). */
static int put_read_stdin(put_list_t *list, int as_json) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int rc = CLI_OK;
  for (long lineno = 1; rc == CLI_OK && (len = getline(&line, &cap, stdin)) >= 0; lineno++) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      len--;
    if (len == 0)
      continue;
    char where[48];
    snprintf(where, sizeof where, "stdin line %ld", lineno);
    rc = put_add(list, line, (size_t)len, as_json, where);
  }
  free(line);
  return rc;
}

/* Reads all of `path` ("-": stdin) into a NUL-terminated buffer the caller
 * frees; NULL after printing why. */
static char *put_slurp(const char *path, size_t *len) {
  FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (fp == NULL) {
    fprintf(stderr, "muster: invalid_argument: cannot open '%s': %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 65536;
  char *buf = malloc(cap);
  *len = 0;
  for (size_t n; buf && (n = fread(buf + *len, 1, cap - *len - 1, fp)) > 0;) {
    *len += n;
    if (cap - *len - 1 == 0) {
      char *grown = realloc(buf, cap * 2);
      if (grown == NULL) {
        free(buf);
        buf = NULL;
      }
      buf = grown;
      cap *= 2;
    }
  }
  bool failed = buf == NULL || ferror(fp);
  if (fp != stdin)
    fclose(fp);
  if (failed) {
    fprintf(stderr, "muster: cannot read '%s'\n", path);
    free(buf);
    return NULL;
  }
  buf[*len] = '\0';
  return buf;
}

/* Adds one payload per element of JSON array `whole`, or `whole` itself when
 * it is no array; `path` names them in errors ("jobs.json element 3"). */
static int put_add_document(put_list_t *list, json_t *whole, const char *path) {
  int rc = CLI_OK;
  size_t n = json_is_array(whole) ? json_array_size(whole) : 1;
  for (size_t i = 0; rc == CLI_OK && i < n; i++) {
    json_t *elem = json_is_array(whole) ? json_array_get(whole, i) : whole;
    char *item = jdump(elem, JSON_COMPACT | JSON_ENCODE_ANY);
    char where[80];
    snprintf(where, sizeof where, "%.40s element %zu", path, i);
    rc = item ? put_add(list, item, strlen(item), 1, where) : CLI_FAIL;
    free(item);
  }
  return rc;
}

/*
 * With --json, for a file that is not one JSON document: non-zero when it was
 * meant as one all the same, so that its error is the document's, with the
 * line and column in the file.  It was when it starts as a document does
 * ('[' or '{') and its first non-empty line is not a JSON value alone: a
 * pretty-printed array with a typo in line 40 was said as "line 1: ']'
 * expected near end of file", as if it were JSON lines.
 */
static int put_meant_document(const char *text, size_t len) {
  size_t at = 0;
  while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\r' || text[at] == '\n'))
    at++;
  if (at == len || (text[at] != '[' && text[at] != '{'))
    return 0;
  const char *end = memchr(text + at, '\n', len - at);
  size_t n = end ? (size_t)(end - (text + at)) : len - at;
  json_t *first = json_loadb(text + at, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  int alone = first != NULL;
  json_decref(first);
  return !alone;
}

/* Adds one payload per non-empty line of `text` ("\n" or "\r\n" ended). */
static int put_add_lines(put_list_t *list, char *text, size_t len, int as_json, const char *path) {
  int rc = CLI_OK;
  char *line = text;
  for (long lineno = 1; rc == CLI_OK && line < text + len; lineno++) {
    char *end = memchr(line, '\n', (size_t)(text + len - line));
    size_t n = end ? (size_t)(end - line) : (size_t)(text + len - line);
    char *next = line + n + (end != NULL);
    while (n > 0 && line[n - 1] == '\r')
      n--;
    char where[80];
    snprintf(where, sizeof where, "%.40s line %ld", path, lineno);
    if (n > 0)
      rc = put_add(list, line, n, as_json, where);
    line = next;
  }
  return rc;
}

/*
 * Reads the payloads of --file: one per non-empty line; with `as_json` a file
 * that is one JSON array gives one task per element, any other whole JSON
 * document one task, and anything else is read as JSON lines (unless it was
 * meant as one document: then the document's error is said).
 */
static int put_read_file(put_list_t *list, const char *path, int as_json) {
  size_t len;
  char *text = put_slurp(path, &len);
  if (text == NULL)
    return CLI_FAIL;
  int rc;
  char why[CLI_JSON_WHY];
  json_t *whole = as_json ? cli_json_parse(text, len, why, sizeof why) : NULL;
  if (whole != NULL) {
    rc = put_add_document(list, whole, path);
    json_decref(whole);
  } else if (as_json && put_meant_document(text, len)) {
    fprintf(stderr, "muster: invalid_argument: %s: not valid JSON: %s\n", path, why);
    rc = CLI_FAIL;
  } else {
    rc = put_add_lines(list, text, len, as_json, path);
  }
  free(text);
  return rc;
}

/* True when `word` is not JSON but names a regular file: `--json jobs.json`. */
static int put_names_file(const char *word) {
  json_t *value = json_loads(word, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  struct stat st;
  int is_file = value == NULL && stat(word, &st) == 0 && S_ISREG(st.st_mode);
  json_decref(value);
  return is_file;
}

/* After `put --json WORD` found WORD to be no JSON: when WORD does not look
 * like JSON either, it likely names a file (`--json jobs.json`, mistyped or
 * elsewhere), so says that no such file is here rather than leave "not valid
 * JSON" alone to puzzle over. */
static void put_say_no_file(const char *word) {
  struct stat st;
  if (strchr("{[\"", word[0]) != NULL || stat(word, &st) == 0)
    return;
  fprintf(stderr,
          "muster: if '%s' names a file of payloads: there is none (%s); --json FILE reads "
          "FILE when it exists\n",
          word, strerror(errno));
}

/*
 * After a network error on the batch of payloads [at, at + n) of `total`:
 * says what became of it and where to resume.  A batch that was sent may
 * have been stored without its reply arriving; one that never left was not.
 * `last_id` is the last id printed (0: none), after which a stored batch's
 * tasks are listed: a plain `tasks ls` lists the queue's oldest tasks, which
 * tell nothing of a batch past the first 100.
 */
static void put_say_lost_batch(const cli_args_t *args, const muster_client_t *client, size_t at,
                               size_t n, size_t total, int64_t last_id) {
  const char *queue = cli_opt(args, "queue");
  if (cli_request_unsent(client)) {
    cli_say_batch_unsent("payload", "ids", at, n, total);
    return;
  }
  if (cli_opt(args, "key")) {
    fprintf(stderr, "muster: the task may or may not be stored: send it again with the same "
                    "--key, which never stores it twice\n");
    return;
  }
  if (cli_opt(args, "key-prefix")) {
    fprintf(stderr,
            "muster: payloads %zu to %zu (of %zu) may or may not be stored (they were sent, but "
            "no reply came); run the same command again, with the same input and "
            "--key-prefix: it stores only what is not stored yet, and prints every id\n",
            at + 1, at + n, total);
    return;
  }
  char check[700];
  if (last_id > 0)
    snprintf(check, sizeof check,
             "in queue '%.256s' ('muster tasks ls --queue %.256s --after %lld --limit 1' lists "
             "payload %zu's task if it is)",
             queue, queue, (long long)last_id, at + 1);
  else
    snprintf(check, sizeof check, "in queue '%.256s' ('muster tasks ls --queue %.256s')", queue,
             queue);
  cli_say_batch_unanswered("payload", "ids", check, at, n, total);
}

/* The specs of payloads [at, at + n): `base` with each payload and, with
 * --key-prefix P, the key P followed by the payload's number (from 1), written
 * into keys[i] (PUT_KEY_MAX bytes each). */
static void put_specs(const cli_args_t *args, const put_list_t *list,
                      const muster_task_spec_t *base, size_t at, size_t n,
                      muster_task_spec_t *specs, char (*keys)[PUT_KEY_MAX]) {
  const char *prefix = cli_opt(args, "key-prefix");
  for (size_t i = 0; i < n; i++) {
    specs[i] = *base;
    specs[i].payload = list->texts[at + i];
    if (prefix != NULL) {
      snprintf(keys[i], PUT_KEY_MAX, "%s%zu", prefix, at + i + 1);
      specs[i].key = keys[i];
    }
  }
}

/* Sends the payloads in batches, each task requiring `req`, and prints the ids. */
static int put_send(const cli_args_t *args, muster_client_t *client, const put_list_t *list,
                    const muster_task_spec_t *base, const cli_requires_t *req) {
  muster_task_spec_t *specs = calloc(PUT_BATCH, sizeof *specs);
  int64_t *ids = calloc(PUT_BATCH, sizeof *ids);
  char(*keys)[PUT_KEY_MAX] = calloc(PUT_BATCH, PUT_KEY_MAX);
  int rc = specs && ids && keys ? CLI_OK : CLI_FAIL;
  int64_t last_id = 0; /* the last id printed */
  for (size_t at = 0; rc == CLI_OK && at < list->count; at += PUT_BATCH) {
    size_t n = list->count - at < PUT_BATCH ? list->count - at : PUT_BATCH;
    put_specs(args, list, base, at, n, specs, keys);
    muster_err_t err = muster_put_requiring(client, cli_opt(args, "queue"), specs, n, req->levels,
                                            req->count, ids);
    if (err != MUSTER_OK) {
      rc = cli_error(client, err);
      if (err == MUSTER_NETWORK)
        put_say_lost_batch(args, client, at, n, list->count, last_id);
      break;
    }
    for (size_t i = 0; i < n; i++)
      printf("%lld\n", (long long)ids[i]);
    fflush(stdout);
    last_id = ids[n - 1];
  }
  free(specs);
  free(ids);
  free(keys);
  return rc;
}

/* No payload was read (an empty stdin or file, an empty JSON array): says so
 * and fails, since exiting 0 with nothing said would read as work submitted
 * (`muster session put` does the same).  The queue is looked up first: a
 * queue that does not exist (or a head that cannot be reached) is said too,
 * as a put of payloads would have said it.  Returns CLI_FAIL. */
static int put_say_none(const cli_args_t *args, muster_client_t *client, const char *file) {
  char from[300] = "standard input";
  if (file != NULL && strcmp(file, "-") != 0)
    snprintf(from, sizeof from, "'%.256s'", file);
  char *json = NULL;
  muster_err_t err = muster_queue_get(client, cli_opt(args, "queue"), &json);
  muster_free(json);
  if (err != MUSTER_OK) {
    cli_error(client, err);
    fprintf(stderr, "muster: no payloads were read from %s either; nothing was put\n", from);
    return CLI_FAIL;
  }
  fprintf(stderr,
          "muster: invalid_argument: no payloads were read from %s; nothing was put into queue "
          "'%s'\n",
          from, cli_opt(args, "queue"));
  return CLI_FAIL;
}

/* --key-prefix P: not with --key, and P short enough that P and a payload's
 * number (up to 20 digits) fit the head's 256-byte keys. */
static int put_check_key_prefix(const cli_args_t *args) {
  const char *prefix = cli_opt(args, "key-prefix");
  if (prefix == NULL)
    return CLI_OK;
  if (cli_opt(args, "key") != NULL)
    return cli_usage_error(args->cmd, "give --key (one payload) or --key-prefix, not both");
  if (prefix[0] == '\0')
    return cli_usage_error(args->cmd, "--key-prefix is empty: give a prefix that names this "
                                      "input, since another put with the same prefix would "
                                      "store nothing for its payloads 1, 2, ...");
  if (strlen(prefix) > PUT_KEY_MAX - 21)
    return cli_usage_error(args->cmd,
                           "--key-prefix is %zu bytes; at most %d, so that it and a payload's "
                           "number fit the head's 256-byte keys",
                           strlen(prefix), PUT_KEY_MAX - 21);
  return CLI_OK;
}

/* The part of put that talks to the head, once every payload was read: the
 * newest levels that --requires left open, then the batches. */
static int put_connected(const cli_args_t *args, const put_list_t *list,
                         const muster_task_spec_t *base, cli_requires_t *req, const char *file) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc == CLI_OK && list->count == 0)
    rc = put_say_none(args, client, file);
  else if (rc == CLI_OK && (rc = cli_requires_resolve(client, req)) == CLI_OK)
    rc = put_send(args, client, list, base, req);
  muster_client_free(client);
  return rc;
}

/* Reads put's payloads into `list`: from --file (or `--json FILE`, which sets
 * *file), the PAYLOAD arguments, or stdin. */
static int put_read_payloads(const cli_args_t *args, put_list_t *list, const char **file) {
  int as_json = cli_flag(args, "json"), npos = args->npos, rc = CLI_OK;
  *file = cli_opt(args, "file");
  if (*file == NULL && as_json && npos == 1 && put_names_file(args->pos[0])) {
    *file = args->pos[0];
    npos = 0;
  }
  if (*file != NULL && npos > 0)
    return cli_usage_error(args->cmd, "give PAYLOAD arguments or --file, not both");
  if (*file != NULL)
    rc = put_read_file(list, *file, as_json);
  for (int i = 0; rc == CLI_OK && i < npos; i++) {
    char where[48];
    snprintf(where, sizeof where, "argument %d", i + 1);
    rc = put_add(list, args->pos[i], strlen(args->pos[i]), as_json, where);
    if (rc != CLI_OK && as_json && npos == 1)
      put_say_no_file(args->pos[i]);
  }
  if (rc == CLI_OK && npos == 0 && *file == NULL)
    rc = put_read_stdin(list, as_json);
  return rc;
}

int cmd_put(cli_args_t *args) {
  if (cli_opt(args, "queue") == NULL)
    return cli_usage_error(args->cmd, "'put' needs --queue Q");
  muster_task_spec_t base;
  muster_task_spec_init(&base);
  cli_requires_t req;
  int rc = cli_opt_int_range(args, "priority", 0, INT32_MIN, INT32_MAX, &base.priority);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "delay-ms", 0, 0, &base.delay_ms);
  if (rc == CLI_OK)
    rc = cli_requires_parse(args, NULL, &req);
  if (rc == CLI_OK)
    rc = put_check_key_prefix(args);
  if (rc != CLI_OK)
    return rc;
  base.key = cli_opt(args, "key");
  put_list_t list = {0};
  const char *file;
  rc = put_read_payloads(args, &list, &file);
  if (rc == CLI_OK && base.key != NULL && list.count > 1)
    rc =
        cli_usage_error(args->cmd, "--key names one task, but %zu payloads were given", list.count);
  if (rc == CLI_OK)
    rc = put_connected(args, &list, &base, &req, file);
  put_list_free(&list);
  return rc;
}

/* ---- listings ------------------------------------------------------------------ */

/* `text` cut to `max` bytes with "..." (on a UTF-8 boundary) into `buf`. */
static const char *clip(const char *text, char *buf, size_t max) {
  size_t len = strlen(text);
  if (len <= max)
    return text;
  size_t cut = max - 3;
  while (cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80)
    cut--;
  snprintf(buf, max + 1, "%.*s...", (int)cut, text);
  return buf;
}

/* Adds one task object as a table row: ID STATE PRI ATTEMPTS FLAGS DETAIL, where
 * DETAIL is the result of a done task, the error of a failed, dead or
 * cancelled one, and the payload otherwise. */
static void task_row(cli_table_t *table, json_t *task) {
  char id[24], pri[24], attempts[24], flags[24], detail[64];
  snprintf(id, sizeof id, "%lld", (long long)json_integer_value(json_object_get(task, "id")));
  snprintf(pri, sizeof pri, "%lld",
           (long long)json_integer_value(json_object_get(task, "priority")));
  snprintf(attempts, sizeof attempts, "%lld",
           (long long)json_integer_value(json_object_get(task, "attempts")));
  snprintf(flags, sizeof flags, "%lld",
           (long long)json_integer_value(json_object_get(task, "flags")));
  const char *state = json_string_value(json_object_get(task, "state"));
  json_t *error = json_object_get(task, "error");
  json_t *shown = json_object_get(task, "payload");
  if (state && strcmp(state, "done") == 0)
    shown = json_object_get(task, "result");
  else if (json_is_string(error) && state && strcmp(state, "queued") != 0 &&
           strcmp(state, "leased") != 0)
    shown = error;
  char *text = json_is_string(shown) ? strdup(json_string_value(shown))
                                     : jdump(shown, JSON_COMPACT | JSON_ENCODE_ANY);
  for (char *p = text; p && *p; p++)
    if (*p == '\n' || *p == '\t' || *p == '\r')
      *p = ' ';
  const char *row[] = {id,    json_string_value(json_object_get(task, "state")),
                       pri,   attempts,
                       flags, text ? clip(text, detail, 60) : ""};
  table_add(table, row);
  free(text);
}

/* Prints `tasks` (an array) as a table or as one JSON object per line. */
static void task_print(json_t *tasks, int as_json) {
  static const char *const headers[] = {"ID", "STATE", "PRI", "ATTEMPTS", "FLAGS", "DETAIL"};
  static const int right[] = {1, 0, 1, 1, 1, 0};
  size_t i;
  json_t *task;
  if (as_json) {
    json_array_foreach(tasks, i, task) {
      char *line = jdump(task, JSON_COMPACT);
      if (line)
        puts(line);
      free(line);
    }
    return;
  }
  cli_table_t table;
  table_init(&table, 6, headers, right);
  json_array_foreach(tasks, i, task) task_row(&table, task);
  table_print(&table, stdout);
  table_free(&table);
}

/*
 * Appends up to `limit` (0: all) tasks of `queue` in `state` (NULL: any) with
 * ids above `after` to the array `out`, page by page.  *left is set to the
 * head's `next` cursor when `limit` stopped the listing before the end (the
 * head answers `next: null` at the end, so then more tasks follow), else 0.
 */
static muster_err_t task_collect(muster_client_t *client, const char *queue, const char *state,
                                 int64_t after, int64_t limit, json_t *out, int64_t *left) {
  *left = 0;
  for (;;) {
    int64_t want = LIST_PAGE;
    if (limit > 0 && limit - (int64_t)json_array_size(out) < want)
      want = limit - (int64_t)json_array_size(out);
    if (want <= 0) { /* only after a page whose `next` said more follow */
      *left = after;
      return MUSTER_OK;
    }
    char *json = NULL;
    muster_err_t err = muster_task_list(client, queue, state, after, want, &json);
    if (err != MUSTER_OK)
      return err;
    json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
    muster_free(json);
    json_t *next = json_object_get(root, "next");
    json_array_extend(out, json_object_get(root, "tasks"));
    int more = json_is_integer(next);
    after = more ? (int64_t)json_integer_value(next) : after;
    json_decref(root);
    if (!more)
      return MUSTER_OK;
  }
}

/* Checks --state against the task states: a usage error, like any other bad
 * option value, rather than the head's refusal (exit 1) after a request. */
static int tasks_check_state(const cli_args_t *args) {
  const char *state = cli_opt(args, "state");
  for (int i = 0; state != NULL && i < CLI_TASK_STATES; i++)
    if (strcmp(state, cli_task_states[i]) == 0)
      return CLI_OK;
  if (state == NULL)
    return CLI_OK;
  char names[128] = ""; /* "queued, leased, ... or cancelled" */
  for (int i = 0; i < CLI_TASK_STATES; i++) {
    size_t at = strlen(names);
    const char *sep = i == CLI_TASK_STATES - 1 ? " or " : ", ";
    snprintf(names + at, sizeof names - at, "%s%s", i > 0 ? sep : "", cli_task_states[i]);
  }
  return cli_usage_error(args->cmd, "--state: expected %s, got '%s'", names, state);
}

int cmd_tasks_ls(cli_args_t *args) {
  const char *queue = cli_opt(args, "queue");
  if (queue == NULL)
    return cli_usage_error(args->cmd, "'tasks ls' needs --queue Q");
  int64_t limit = 0, after = 0;
  int rc = tasks_check_state(args);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "limit", 100, 0, &limit);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "after", 0, 0, &after);
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  json_t *tasks = json_array();
  int64_t left = 0;
  muster_err_t err =
      task_collect(client, queue, cli_opt(args, "state"), after, limit, tasks, &left);
  if (err == MUSTER_OK)
    task_print(tasks, cli_flag(args, "json"));
  if (err == MUSTER_OK && left > 0) /* a listing cut short must not look complete */
    fprintf(stderr,
            "muster: listed the first %lld tasks; more follow: --after %lld lists the next "
            "ones, --limit 0 lists them all\n",
            (long long)limit, (long long)left);
  if (err != MUSTER_OK)
    rc = cli_error(client, err);
  json_decref(tasks);
  muster_client_free(client);
  return rc;
}

static int task_by_id(const void *a, const void *b) {
  json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "id"));
  json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "id"));
  return (x > y) - (x < y);
}

/* Sorts the array `tasks` by id, in place. */
static void task_sort(json_t *tasks) {
  size_t n = json_array_size(tasks);
  json_t **items = malloc((n ? n : 1) * sizeof *items);
  if (items == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    items[i] = json_incref(json_array_get(tasks, i));
  qsort(items, n, sizeof *items, task_by_id);
  json_array_clear(tasks);
  for (size_t i = 0; i < n; i++)
    json_array_append_new(tasks, items[i]);
  free(items);
}

int cmd_tasks_dead(cli_args_t *args) {
  const char *queue = cli_opt(args, "queue");
  if (queue == NULL)
    return cli_usage_error(args->cmd, "'tasks dead' needs --queue Q");
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc != CLI_OK)
    return rc;
  json_t *tasks = json_array();
  int64_t left; /* limit 0: the listings run to the end */
  muster_err_t err = task_collect(client, queue, "dead", 0, 0, tasks, &left);
  if (err == MUSTER_OK)
    err = task_collect(client, queue, "failed", 0, 0, tasks, &left);
  if (err == MUSTER_OK) {
    task_sort(tasks);
    task_print(tasks, cli_flag(args, "json"));
  } else {
    rc = cli_error(client, err);
  }
  json_decref(tasks);
  muster_client_free(client);
  return rc;
}

int cmd_tasks_show(cli_args_t *args) {
  int64_t id;
  int rc = cli_parse_int(args->cmd, args->pos[0], "ID", 1, &id);
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  char *json = NULL;
  muster_err_t err = muster_task_get(client, id, &json);
  if (err == MUSTER_OK)
    cli_print_pretty(json);
  else
    rc = cli_error(client, err);
  muster_free(json);
  muster_client_free(client);
  return rc;
}

int cmd_tasks_requeue(cli_args_t *args) {
  const char *queue = cli_opt(args, "queue");
  if (queue != NULL && args->npos > 0)
    return cli_usage_error(args->cmd,
                           "'tasks requeue': ID and --queue Q exclude each other: give ID to "
                           "requeue one task, or --queue Q to requeue all dead and failed "
                           "tasks of Q");
  if (queue == NULL && args->npos == 0)
    return cli_usage_error(args->cmd, "'tasks requeue' needs either ID or --queue Q");
  int64_t id = 0;
  int rc = queue ? CLI_OK : cli_parse_int(args->cmd, args->pos[0], "ID", 1, &id);
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  if (queue != NULL) {
    rc = cli_requeue_queue(client, queue);
  } else {
    muster_err_t err = muster_task_requeue(client, id);
    if (err == MUSTER_OK)
      printf("requeued task %lld\n", (long long)id);
    else
      rc = cli_error(client, err);
  }
  muster_client_free(client);
  return rc;
}
