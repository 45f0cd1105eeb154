/*
 * cmd_shared.c — `muster shared put|get|rm|ls` (docs/shared-data.md).
 *
 * put and get stream through file descriptors (a file, stdin, stdout), so a
 * blob of any size passes through the CLI without being held in memory.  On a
 * terminal, transfers above 1 MiB draw a progress bar on stderr (bytes, rate,
 * ETA); --quiet turns it off.
 */
#include "cli/cli.h"
#include "cli/get_dest.h"
#include "cli/table.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 30
#define BAR_MIN_BYTES (1 << 20) /* smaller transfers draw no bar */
#define BAR_REDRAW_MS 100

const cli_opt_t cmd_shared_put_opts[] = {
    {"level", "N", "create level N of an existing blob (its current level + 1); default: level 1"},
    {"ttl-ms", "MS", "time to live (an update keeps the blob's; max: head's --max-shared-ttl-ms)"},
    {"json", NULL, "print the head's reply object instead of one line"},
    {"quiet", NULL, "no progress bar, even on a terminal"},
    {NULL, NULL, NULL},
};

const cli_opt_t cmd_shared_get_opts[] = {
    {"level", "N", "read level N (default: the newest)"},
    {"quiet", NULL, "no progress bar, even on a terminal"},
    {NULL, NULL, NULL},
};

const cli_opt_t cmd_shared_ls_opts[] = {
    {"json", NULL, "print the head's reply object instead of a table"},
    {NULL, NULL, NULL},
};

const char cmd_shared_details[] =
    "Shared data are versioned blobs (SCOPE, NAME, level) with a time to live,\n"
    "read by workers through their node's cache.  SCOPE is a session id (the\n"
    "blob goes with the session) or a global name.  `put` without --level\n"
    "creates level 1; each update names the next level (--level 2, 3, ...).\n"
    "FILE '-' or no FILE: stdin for put, stdout for get.  get replaces FILE\n"
    "only with a complete, verified download: a failed one leaves it as it was.\n\n"
    "examples:\n"
    "  muster shared put models weights model.onnx --ttl-ms 300000\n"
    "  muster shared put models weights model-v2.onnx --level 2\n"
    "  muster shared get models weights --level 1 > model.onnx\n"
    "  muster shared ls models\n"
    "  muster shared rm models weights\n";

/* ---- progress bar ---- */

typedef struct {
  int enabled, drawn;
  int64_t started_ms, drawn_ms;
  int64_t done, total; /* the last progress: bytes moved, of total (-1: not known yet) */
} bar_t;

static int64_t bar_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "12.3 MiB" into `out`. */
static void human_bytes(double bytes, char *out, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    u++;
  }
  snprintf(out, size, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

static void bar_draw(void *user, int64_t done, int64_t total) {
  bar_t *bar = user;
  int64_t now = bar_now_ms();
  bar->done = done;
  bar->total = total;
  if (!bar->enabled || (total >= 0 && total < BAR_MIN_BYTES) ||
      (total < 0 && done < BAR_MIN_BYTES) ||
      (now - bar->drawn_ms < BAR_REDRAW_MS && (total < 0 || done < total)))
    return;
  bar->drawn_ms = now;
  bar->drawn = 1;
  double secs = (double)(now - bar->started_ms) / 1000.0, rate = secs > 0 ? (double)done / secs : 0;
  char have[32], all[32] = "?", speed[32], eta[32] = "--";
  human_bytes((double)done, have, sizeof have);
  human_bytes(rate, speed, sizeof speed);
  if (total >= 0)
    human_bytes((double)total, all, sizeof all);
  int filled = total > 0 ? (int)((double)BAR_WIDTH * (double)done / (double)total) : 0;
  char cells[BAR_WIDTH + 1];
  for (int i = 0; i < BAR_WIDTH; i++)
    cells[i] = total < 0    ? (i == (int)((now / 100) % BAR_WIDTH) ? '#' : '-')
               : i < filled ? '#'
                            : '-';
  cells[BAR_WIDTH] = '\0';
  if (rate > 0 && total >= 0) {
    long left = (long)((double)(total - done) / rate + 0.5);
    snprintf(eta, sizeof eta, "%ldm%02lds", left / 60, left % 60);
  }
  fprintf(stderr, "\r[%s] %s / %s  %s/s  ETA %s  \x1b[K", cells, have, all, speed, eta);
  fflush(stderr);
}

static void bar_clear(const bar_t *bar) {
  if (bar->drawn)
    fputs("\r\x1b[K", stderr);
}

/* ---- commands ---- */

/* Opens FILE (positional 2) of `put` for reading; '-' or absent: stdin. */
static int open_input(const cli_args_t *args, int *fd) {
  const char *path = args->npos > 2 ? args->pos[2] : "-";
  if (strcmp(path, "-") == 0) {
    *fd = 0;
    return CLI_OK;
  }
  *fd = open(path, O_RDONLY | O_CLOEXEC);
  if (*fd < 0) {
    fprintf(stderr, "muster: cannot open %s: %s\n", path, strerror(errno));
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* cli_error for a put, in the CLI's words: the API's "update it with
 * level=5" becomes "--level 5", and an expired blob's "a new blob starts at
 * level 1" says to put it without --level. */
static int put_error(muster_client_t *client, muster_err_t err) {
  static const char api[] = "with level=";
  const char *message = muster_client_message(client);
  const char *at = message ? strstr(message, api) : NULL;
  if (err != MUSTER_VERSION_MISMATCH || message == NULL)
    return cli_error(client, err);
  if (at)
    fprintf(stderr, "muster: %s: %.*swith --level %s\n", muster_err_name(err), (int)(at - message),
            message, at + strlen(api));
  else
    cli_error(client, err);
  if (strstr(message, "a new blob starts at level 1"))
    fprintf(stderr, "muster: put it again without --level to start it at level 1\n");
  return CLI_FAIL;
}

/* Prints the head's reply to a put, as the other --json outputs print theirs
 * (indented by cli_print_pretty). */
static void put_print_json(const char *scope, const char *name, const muster_shared_info_t *info) {
  json_t *reply =
      json_pack("{s:s, s:s, s:I, s:I, s:s, s:I, s:b, s:I}", "scope", scope, "name", name, "level",
                (json_int_t)info->level, "size", (json_int_t)info->size, "checksum", info->checksum,
                "ttl_ms", (json_int_t)info->ttl_ms, "ttl_clamped", info->ttl_clamped, "expires_ms",
                (json_int_t)info->expires_ms);
  char *text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
  cli_print_pretty(text ? text : "{}");
  free(text);
  json_decref(reply);
}

static int shared_put(cli_args_t *args, muster_client_t *client) {
  muster_shared_opts_t opts;
  muster_shared_opts_init(&opts);
  int fd, rc = cli_opt_int(args, "level", 0, 1, &opts.level);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "ttl-ms", -1, 1, &opts.ttl_ms);
  if (rc != CLI_OK || (rc = open_input(args, &fd)) != CLI_OK)
    return rc;
  struct stat sb;
  int64_t len = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
  bar_t bar = {.enabled = isatty(2) && !cli_flag(args, "quiet"), .started_ms = bar_now_ms()};
  opts.progress = bar_draw;
  opts.user = &bar;
  muster_shared_info_t info;
  muster_err_t err =
      muster_shared_put_fd(client, args->pos[0], args->pos[1], fd, len, &opts, &info);
  bar_clear(&bar);
  if (fd != 0)
    close(fd);
  if (err != MUSTER_OK)
    return put_error(client, err);
  if (cli_flag(args, "json")) {
    put_print_json(args->pos[0], args->pos[1], &info);
  } else {
    printf("%s/%s level %lld: %lld bytes, checksum %s, ttl %lld ms%s\n", args->pos[0], args->pos[1],
           (long long)info.level, (long long)info.size, info.checksum, (long long)info.ttl_ms,
           info.ttl_clamped ? " (clamped to the head's maximum)" : "");
  }
  return CLI_OK;
}

int cmd_shared_put(cli_args_t *args) {
  return cli_with_client(args, shared_put);
}

/* Says why `get` failed.  A download whose connection broke is a read, safe
 * to repeat: rather than the CLI's advice for a request that got no reply
 * ("check what the head did before repeating it"), the user learns how far it
 * came, what became of FILE (left as it was, get_dest) or of stdout (a part
 * written), and to read it again. */
static void shared_get_error(muster_client_t *client, muster_err_t err, const bar_t *bar,
                             const char *path) {
  const char *message = muster_client_message(client);
  if (err != MUSTER_NETWORK || message == NULL || cli_message_unsent(message)) {
    cli_error(client, err);
    return;
  }
  char at[1200], came[80] = "before any of its bytes came";
  cli_server_at(muster_client_server(client), at, sizeof at);
  if (bar->total >= 0)
    snprintf(came, sizeof came, "after %lld of its %lld bytes", (long long)bar->done,
             (long long)bar->total);
  fprintf(stderr, "muster: %s: %s\n", muster_err_name(err), message);
  fprintf(stderr,
          "muster: the download broke off %s (%s may have stopped or restarted); %s: "
          "read it again\n",
          came, at,
          strcmp(path, "-") == 0 ? "what reached stdout is "
                                   "incomplete"
                                 : "the file was left as it was");
}

/* The download of `get`, to `fd` (stdout, or d's file). */
static muster_err_t shared_get_to(cli_args_t *args, muster_client_t *client, int fd,
                                  const muster_shared_opts_t *base) {
  muster_shared_opts_t opts = *base;
  /* No bar when the bytes themselves go to the terminal. */
  bar_t bar = {.enabled = isatty(2) && !isatty(fd) && !cli_flag(args, "quiet"),
               .started_ms = bar_now_ms(),
               .total = -1};
  opts.progress = bar_draw;
  opts.user = &bar;
  muster_shared_info_t info;
  muster_err_t err = muster_shared_get_fd(client, args->pos[0], args->pos[1], fd, &opts, &info);
  bar_clear(&bar);
  if (err != MUSTER_OK)
    shared_get_error(client, err, &bar, args->npos > 2 ? args->pos[2] : "-");
  return err;
}

/* FILE is written through get_dest: replaced once the bytes are complete
 * and verified, left as it was when the download fails. */
static int shared_get(cli_args_t *args, muster_client_t *client) {
  muster_shared_opts_t opts;
  muster_shared_opts_init(&opts);
  int rc = cli_opt_int(args, "level", 0, 1, &opts.level);
  if (rc != CLI_OK)
    return rc;
  const char *path = args->npos > 2 ? args->pos[2] : "-";
  if (strcmp(path, "-") == 0)
    return shared_get_to(args, client, 1, &opts) == MUSTER_OK ? CLI_OK : CLI_FAIL;
  get_dest_t dest;
  if ((rc = get_dest_open(&dest, path)) != CLI_OK)
    return rc;
  muster_err_t err = shared_get_to(args, client, dest.fd, &opts);
  if (err != MUSTER_OK) {
    get_dest_discard(&dest); /* FILE stays as it was */
    return CLI_FAIL;
  }
  return get_dest_commit(&dest);
}

int cmd_shared_get(cli_args_t *args) {
  return cli_with_client(args, shared_get);
}

static int shared_rm(cli_args_t *args, muster_client_t *client) {
  int64_t levels = 0;
  muster_err_t err = muster_shared_delete(client, args->pos[0], args->pos[1], &levels);
  if (err != MUSTER_OK)
    return cli_error(client, err);
  printf("deleted %s/%s (%lld level%s)\n", args->pos[0], args->pos[1], (long long)levels,
         levels == 1 ? "" : "s");
  return CLI_OK;
}

int cmd_shared_rm(cli_args_t *args) {
  return cli_with_client(args, shared_rm);
}

/* Adds a blob of GET /v1/shared/{scope} to the table: its name, level, kept
 * levels, size, checksum and the seconds left until it expires (`now`: the
 * wall clock in ms, as expires_ms is). */
static void shared_ls_row(cli_table_t *table, const json_t *blob, int64_t now) {
  char level[32], levels[256] = "", size[32], expires[32];
  snprintf(level, sizeof level, "%lld",
           (long long)json_integer_value(json_object_get(blob, "level")));
  size_t j;
  json_t *l;
  json_array_foreach(json_object_get(blob, "levels"), j, l) {
    size_t at = strlen(levels);
    snprintf(levels + at, sizeof levels - at, "%s%lld", j ? "," : "",
             (long long)json_integer_value(l));
  }
  human_bytes((double)json_integer_value(json_object_get(blob, "size")), size, sizeof size);
  int64_t left = (int64_t)json_integer_value(json_object_get(blob, "expires_ms")) - now;
  snprintf(expires, sizeof expires, "%llds", (long long)(left > 0 ? left / 1000 : 0));
  const char *cells[] = {json_string_value(json_object_get(blob, "name")),     level,  levels, size,
                         json_string_value(json_object_get(blob, "checksum")), expires};
  table_add(table, cells);
}

/* Prints the blobs of a scope as `shared ls` shows them without --json. */
static void shared_ls_print(const json_t *blobs) {
  static const char *const headers[] = {"NAME", "LEVEL",    "LEVELS",
                                        "SIZE", "CHECKSUM", "EXPIRES_IN"};
  static const int right[] = {0, 1, 0, 1, 0, 1};
  cli_table_t table;
  table_init(&table, 6, headers, right);
  size_t i;
  json_t *blob;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  json_array_foreach(blobs, i, blob) {
    shared_ls_row(&table, blob, now);
  }
  table_print(&table, stdout);
  table_free(&table);
}

static int shared_ls(cli_args_t *args, muster_client_t *client) {
  char *json = NULL;
  muster_err_t err = muster_shared_list(client, args->pos[0], &json);
  if (err != MUSTER_OK)
    return cli_error(client, err);
  if (cli_flag(args, "json")) {
    cli_print_pretty(json);
    muster_free(json);
    return CLI_OK;
  }
  json_t *root = json_loads(json, 0, NULL);
  muster_free(json);
  shared_ls_print(json_object_get(root, "blobs"));
  json_decref(root);
  return CLI_OK;
}

int cmd_shared_ls(cli_args_t *args) {
  return cli_with_client(args, shared_ls);
}
