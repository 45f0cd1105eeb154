/*
 * cmd_node.c — `muster node` (the node agent, src/node) and `muster head`
 * with its local node agent.
 *
 * `muster head` runs the head and, unless --server-only, a local node agent
 * beside it, as `start_node --head` does for a GPU pool: the process forks
 * before the head starts; the parent is the head (so its pid, signals and exit
 * status are the head's), the child waits for the head's DATA_DIR/url and
 * DATA_DIR/token and runs the agent against it, with no API port of its own
 * (the head's port serves the API on this machine).  The child asks for SIGHUP
 * when the head dies, which is the agent's hard stop; a stop signal reaches the
 * head, which passes it on and stops after the agent (head_with_agent).  Without a worker
 * command or plugin the local agent only registers the machine as a node; when
 * another agent already holds this machine's lock it says so and steps aside,
 * and the head runs on.  The agent options of `muster head` are the ones of
 * `muster node` below; every other option goes to the head (head.c).
 */
#include "cli/cli.h"
#include "cli/run.h"
#include "cli/worker.h"
#include "core/names.h"
#include "core/url.h"
#include "node/node.h"
#include "server/head.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NODE_HEAD_WAIT_POLL_MS 50

const cli_opt_t cli_node_opts[] = {
    {"join", "URL", "the head to join, e.g. http://10.0.0.1:7370 (default: as --url)"},
    {"listen", "ADDR:PORT",
     "serve the API here, forwarding to the head (default 127.0.0.1:7371; 'none': no port)"},
    {"name", "NAME", "node name, unique per machine (default: the hostname)"},
    {"queue", "Q", "queue the workers serve; without it no workers are started"},
    {"plugin", "PATH", "worker plugin (.so, see docs/node.md) instead of a command"},
    {"init-data", "JSON", "data for the plugin's init, as JSON text (default null)"},
    {"gpus", "LIST",
     "use only these GPUs, by index or UUID (or its start), e.g. 0,2 or GPU-8f1c, and MIG "
     "instances as 0:1 or MIG-5a2e; none: no GPU, CPU workers (default: "
     "CUDA_VISIBLE_DEVICES, else every GPU)"},
    {"min-gpu-memory", "MB", "skip GPUs with less total memory"},
    {"workers", "N", "CPU workers where there is no GPU (default: the number of cores)"},
    {"concurrency", "N", "tasks each command worker runs at once (default 1)"},
    {"nickname", "NAME", "leaderboard name of the workers"},
    {"json-result", NULL, "parse the command's stdout as JSON instead of storing a string"},
    {"permanent-exit", "N",
     "the command exiting N (1 to 125) fails its task for good, not retried "
     "(see `muster worker --help`)"},
    {"lock-file", "PATH",
     "the one-agent-per-machine lock (env MUSTER_NODE_LOCK, default " NODE_DEFAULT_LOCK ")"},
    {"cache-dir", "DIR", "the node cache of shared data (default /var/tmp/muster-node-NAME/cache)"},
    {"cache-bytes", "N", "the node cache's size limit, e.g. 500M or 20G (default 10G)"},
    {"state-dir", "DIR",
     "where node-local (cluster_sync false) iterations live "
     "(default /var/tmp/muster-node-NAME/state)"},
    {NULL, NULL, NULL},
};

const char cli_node_details[] =
    "The node agent: registers this machine (hostname, address, GPUs, CPUs) with\n"
    "the head and heart-beats; with --queue it starts one worker per GPU or MIG\n"
    "instance (CUDA_VISIBLE_DEVICES set to it, CUDA_DEVICE_ORDER=PCI_BUS_ID), or\n"
    "--workers CPU workers where there is no GPU, and restarts them when they die.\n"
    "A worker runs CMD per task like `muster worker`, or loads --plugin.  The\n"
    "agent also serves the HTTP API on --listen by forwarding to the head, so\n"
    "clients on this machine can use it.  One agent per machine (--lock-file).\n"
    "SIGINT/SIGTERM: the workers finish their tasks, the node leaves.\n\n"
    "examples:\n"
    "  muster node --join http://10.0.0.1:7370 --token T --queue pool -- ./work.sh\n"
    "  muster node --join http://10.0.0.1:7370 --queue pool --plugin ./libwork.so\n"
    "  muster node --join http://10.0.0.1:7370 --listen 10.0.0.2:7371\n";

/* `muster node` options of the agent's API port, which the local agent of
 * `muster head` does not open (the head's port serves the API on this
 * machine): without a port it has no node cache and no node-local
 * iterations, so these would change nothing.  `muster head --help` leaves
 * them out, and head_split refuses them with that reason, not as unknown. */
static const char *const head_agent_portless[] = {"cache-dir", "cache-bytes", "state-dir", NULL};

/* Whether `name` is in the NULL-terminated `list`. */
static int head_listed(const char *name, const char *const list[]) {
  for (int i = 0; list[i]; i++)
    if (strcmp(name, list[i]) == 0)
      return 1;
  return 0;
}

/* The column of head.c's `muster head --help`, whose list this one goes on. */
#define HEAD_HELP_WIDTH 25

void cli_head_agent_usage(FILE *out) {
  fprintf(out, "\nlocal node agent (like `muster node`; see `muster node --help`):\n");
  cli_print_item(out, "--server-only", "run the head alone, without a local node agent",
                 HEAD_HELP_WIDTH);
  for (int i = 0; cli_node_opts[i].name; i++) {
    if (strcmp(cli_node_opts[i].name, "join") == 0 ||
        strcmp(cli_node_opts[i].name, "listen") == 0 ||
        head_listed(cli_node_opts[i].name, head_agent_portless))
      continue;
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", cli_node_opts[i].name,
             cli_node_opts[i].metavar ? " " : "",
             cli_node_opts[i].metavar ? cli_node_opts[i].metavar : "");
    cli_print_item(out, left, cli_node_opts[i].help, HEAD_HELP_WIDTH);
  }
  cli_print_item(out, "-- CMD [ARGS...]", "the workers' command (with --queue)", HEAD_HELP_WIDTH);
}

/* Checks that --init-data is JSON text, as each worker checks it at its
 * start (worker_check_runner): workers that refuse it exit 2 at once and are
 * restarted for ever.  CLI_OK, or CLI_USAGE after saying where it is bad. */
static int node_check_init_data(const cli_cmd_t *cmd, const char *init_data) {
  char why[CLI_JSON_WHY];
  json_t *value = init_data ? cli_json_parse(init_data, strlen(init_data), why, sizeof why) : NULL;
  if (init_data == NULL || value != NULL) {
    json_decref(value);
    return CLI_OK;
  }
  return cli_usage_error(cmd, "--init-data: not valid JSON: %s", why);
}

/* Checks what each worker runs: a command with --queue, or a plugin, and
 * that the command can run or the plugin load.  Every worker would fail at
 * once otherwise, and be restarted for ever: refused before any starts. */
static int node_check_worker(const cli_cmd_t *cmd, const node_config_t *cfg) {
  if (cfg->cmd && cfg->queue == NULL)
    return cli_usage_error(cmd, "a worker command needs --queue Q");
  if (cfg->queue && cfg->cmd == NULL && cfg->plugin == NULL)
    return cli_usage_error(cmd, "--queue needs a worker: -- CMD [ARGS...] or --plugin PATH");
  if (cfg->cmd && cfg->plugin)
    return cli_usage_error(cmd, "give either a command or --plugin, not both");
  if (cfg->plugin && cfg->concurrency > 1)
    return cli_usage_error(cmd, "--concurrency is for command workers; a plugin worker "
                                "runs one task at a time");
  if (cfg->plugin && cfg->permanent_exit > 0)
    return cli_usage_error(cmd, "--permanent-exit is for a worker command's exit status; a "
                                "plugin fails a task for good with out->permanent");
  if (node_check_init_data(cmd, cfg->init_data) != CLI_OK)
    return CLI_USAGE;
  char why[1400], prog[32];
  snprintf(prog, sizeof prog, "muster %s", cmd->name);
  if ((cfg->cmd && run_resolve(cfg->cmd[0], why, sizeof why) != 0) ||
      (cfg->plugin && worker_plugin_check(prog, cfg->plugin, why, sizeof why) != 0)) {
    fprintf(stderr, "muster %s: %s; no worker was started\n", cmd->name, why);
    return CLI_USAGE;
  }
  return CLI_OK;
}

/* Fills the agent options shared by `muster node` and `muster head`; what
 * the workers run is checked apart (node_check_worker), once. */
static int node_read_opts(cli_args_t *args, node_config_t *cfg) {
  int rc = cli_opt_int(args, "min-gpu-memory", 0, 0, &cfg->min_gpu_memory_mb);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "workers", -1, 1, &cfg->cpu_workers);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "concurrency", 1, 1, &cfg->concurrency);
  if (rc == CLI_OK)
    rc = worker_read_permanent_exit(args, &cfg->permanent_exit);
  /* Refused here, not by each worker at its start (which the agent would
   * restart for ever) nor cut to the agent's limit without a word. */
  if (rc == CLI_OK && cfg->cpu_workers > NODE_MAX_WORKERS)
    rc = cli_usage_error(args->cmd, "--workers: at most %d, got %lld", NODE_MAX_WORKERS,
                         (long long)cfg->cpu_workers);
  if (rc == CLI_OK && cfg->concurrency > CLI_MAX_CONCURRENCY)
    rc = cli_usage_error(args->cmd, "--concurrency: at most %d, got %lld", CLI_MAX_CONCURRENCY,
                         (long long)cfg->concurrency);
  if (rc != CLI_OK)
    return rc;
  cfg->gpus = cli_opt(args, "gpus");
  cfg->queue = cli_opt(args, "queue");
  cfg->plugin = cli_opt(args, "plugin");
  cfg->init_data = cli_opt(args, "init-data");
  cfg->nickname = cli_opt(args, "nickname");
  cfg->json_result = cli_flag(args, "json-result");
  cfg->lock_path = cli_opt(args, "lock-file");
  cfg->name = cli_opt(args, "name");
  if (cfg->name && !name_is_valid(cfg->name)) /* the agent's rule and words (agent_identity) */
    return cli_usage_error(args->cmd, "node name '%s': %s (--name)", cfg->name,
                           name_rule_text(cfg->name));
  cfg->cmd = args->npos > 0 ? args->pos : NULL;
  return CLI_OK;
}

/* Reads --cache-bytes: an integer with an optional K, M, G or T (powers of 1024). */
static int node_read_cache_bytes(cli_args_t *args, int64_t *out) {
  const char *text = cli_opt(args, "cache-bytes");
  *out = 0;
  if (text == NULL)
    return CLI_OK;
  char *end;
  long long n = strtoll(text, &end, 10);
  int shift = *end == '\0'         ? 0
              : strchr("kK", *end) ? 10
              : strchr("mM", *end) ? 20
              : strchr("gG", *end) ? 30
              : strchr("tT", *end) ? 40
                                   : -1;
  if (end == text || n < 1 || shift < 0 ||
      (*end && end[1] && strcmp(end + 1, "iB") != 0 && strcmp(end + 1, "B") != 0) ||
      n > (INT64_MAX >> shift))
    return cli_usage_error(args->cmd, "--cache-bytes: expected a size such as 1073741824, "
                                      "500M or 20G");
  *out = (int64_t)n << shift;
  return CLI_OK;
}

/* Checks --join as cli_check_url checks --url (main.c checks the URL the
 * global options give only when there is no --join): before anything starts,
 * so a URL ending in /v1 is not taken for a head without a node API and a URL
 * without a scheme does not register the node with the address ":80". */
static int node_check_join(cli_args_t *args) {
  /* `muster node http://head:7370 [-- CMD]` meant --join: not a worker command. */
  if (args->npos_before_dashdash > 0 && strstr(args->pos[0], "://") != NULL)
    return cli_usage_error(args->cmd,
                           "'%s' looks like the head's URL: give it as --join %s (a "
                           "worker command goes after --)",
                           args->pos[0], args->pos[0]);
  const char *join = cli_opt(args, "join");
  const char *problem = join && join[0] ? url_head_problem(join) : NULL;
  if (problem == NULL)
    return CLI_OK;
  return cli_usage_error(args->cmd, "--join '%s' is not a head's URL (http://HOST:PORT): %s", join,
                         problem);
}

int cmd_node(cli_args_t *args) {
  node_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  int rc = node_check_join(args);
  if (rc == CLI_OK)
    rc = node_read_opts(args, &cfg);
  if (rc == CLI_OK)
    rc = node_check_worker(args->cmd, &cfg);
  if (rc == CLI_OK)
    rc = node_read_cache_bytes(args, &cfg.cache_bytes);
  if (rc != CLI_OK)
    return rc;
  cfg.cache_dir = cli_opt(args, "cache-dir");
  cfg.state_dir = cli_opt(args, "state-dir");
  const char *join = cli_opt(args, "join");
  cfg.head_url = join && join[0] ? join : cli_url(args);
  cfg.token = cli_token(args);
  cfg.listen = cli_opt(args, "listen");
  cfg.log_prefix = "muster node";
  return node_agent_main(&cfg); /* 0, 1 (CLI_FAIL) or 2 (CLI_USAGE) */
}

/* ---- muster head ------------------------------------------------------------ */

/* The agent options `muster head` takes (value-taking ones, then flags). */
static const char *const head_agent_valued[] = {
    "queue",       "plugin",   "init-data", "gpus", "min-gpu-memory", "workers",
    "concurrency", "nickname", "lock-file", "name", "permanent-exit", NULL};
static const char *const head_agent_flags[] = {"json-result", "server-only", NULL};

const char *cli_head_agent_option(size_t i, const char **metavar) {
  size_t nvalued = sizeof head_agent_valued / sizeof head_agent_valued[0] - 1;
  size_t nflags = sizeof head_agent_flags / sizeof head_agent_flags[0] - 1;
  if (i >= nvalued + nflags)
    return NULL;
  if (i >= nvalued) {
    *metavar = NULL;
    return head_agent_flags[i - nvalued];
  }
  *metavar = "VALUE"; /* a valued option not in `muster node`'s table: any value */
  for (int k = 0; cli_node_opts[k].name; k++)
    if (strcmp(cli_node_opts[k].name, head_agent_valued[i]) == 0)
      *metavar = cli_node_opts[k].metavar;
  return head_agent_valued[i];
}

/* `muster node`'s options under the name `head`, for the local agent's. */
static const cli_cmd_t head_agent_row = {.name = "head",
                                         .synopsis = "[options]",
                                         .summary = "",
                                         .opts = cli_node_opts,
                                         .client = 1,
                                         .max_pos = -1,
                                         .run = cmd_node};

/* The index of `--name[=...]` in `list`, or -1. */
static int head_match(const char *arg, const char *const list[]) {
  if (strncmp(arg, "--", 2) != 0)
    return -1;
  const char *name = arg + 2;
  size_t len = strcspn(name, "=");
  for (int i = 0; list[i]; i++)
    if (strlen(list[i]) == len && strncmp(name, list[i], len) == 0)
      return i;
  return -1;
}

/* Says why option `arg` (one of head_agent_portless) is refused; CLI_USAGE. */
static int head_refuse_portless(const char *arg) {
  fprintf(stderr,
          "muster head: %.*s is an option of `muster node` alone: the head's local node agent "
          "opens no API port, so it keeps no node cache (its workers read shared data from the "
          "head) and no node-local iterations; see 'muster head --help'\n",
          (int)strcspn(arg, "="), arg);
  return CLI_USAGE;
}

/*
 * Splits `muster head` argv into the head's options (head_argv, argv[0] kept)
 * and the agent's (agent_argv, in `muster node` form).  Returns CLI_OK or
 * CLI_USAGE after printing why.
 */
static int head_split(int argc, char **argv, char **head_argv, int *head_argc, char **agent_argv,
                      int *agent_argc) {
  *head_argc = *agent_argc = 0;
  head_argv[(*head_argc)++] = argv[0];
  for (int i = 1; i < argc; i++) {
    char why[800];
    if (strcmp(argv[i], "--") == 0 && i + 1 < argc && run_resolve(argv[i + 1], why, sizeof why)) {
      /* Checked here, before the head starts, rather than by its local agent alone. */
      fprintf(stderr, "muster head: %s; nothing was started\n", why);
      return CLI_USAGE;
    }
    if (strcmp(argv[i], "--") == 0) {
      while (i < argc)
        agent_argv[(*agent_argc)++] = argv[i++];
      break;
    }
    if (head_match(argv[i], head_agent_portless) >= 0)
      return head_refuse_portless(argv[i]);
    if (strncmp(argv[i], "--", 2) == 0 &&
        cli_misplaced_option(&head_agent_row, argv[i] + 2, strcspn(argv[i] + 2, "=")) != CLI_OK)
      return CLI_USAGE; /* `--join`: a node's option, said as such */
    if (argv[i][0] == '-' && argv[i][1] != '-' && cli_misplaced_short(&head_agent_row, argv[i]))
      return CLI_USAGE; /* `-p 8899`: a pool's port */
    if (head_match(argv[i], head_agent_flags) >= 0) {
      agent_argv[(*agent_argc)++] = argv[i];
    } else if (head_match(argv[i], head_agent_valued) >= 0) {
      agent_argv[(*agent_argc)++] = argv[i];
      if (strchr(argv[i], '=') == NULL) {
        if (i + 1 >= argc) {
          fprintf(stderr, "muster head: %s needs a value; see 'muster head --help'\n", argv[i]);
          return CLI_USAGE;
        }
        agent_argv[(*agent_argc)++] = argv[++i];
      }
    } else {
      head_argv[(*head_argc)++] = argv[i];
    }
  }
  head_argv[*head_argc] = agent_argv[*agent_argc] = NULL;
  return CLI_OK;
}

/* The head's data dir as its options name it (head.c's default otherwise). */
static const char *head_data_dir(int argc, char **argv) {
  const char *dir = "./muster-data";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--data-dir") == 0 && i + 1 < argc)
      dir = argv[++i];
    else if (strncmp(argv[i], "--data-dir=", 11) == 0)
      dir = argv[i] + 11;
  }
  return dir;
}

/* Reads the first line of DIR/name into buf; 0 when it has one. */
static int head_read_line(const char *dir, const char *name, char *buf, size_t size) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  char *line = fgets(buf, (int)size, f);
  fclose(f);
  if (line == NULL)
    return -1;
  buf[strcspn(buf, "\r\n")] = '\0';
  return buf[0] ? 0 : -1;
}

/*
 * In the agent child: waits until the head `head_pid` has written a fresh
 * DIR/url (not the one a killed head left behind: a new file has a new
 * inode).  0 with url and token read, -1 when the head went away first.
 */
static int head_wait_ready(pid_t head_pid, const char *dir, ino_t stale, char *url, size_t url_size,
                           char *token, size_t token_size) {
  char path[4200];
  snprintf(path, sizeof path, "%s/url", dir);
  for (;;) {
    if (getppid() != head_pid)
      return -1;
    struct stat st;
    if (stat(path, &st) == 0 && st.st_ino != stale &&
        head_read_line(dir, "url", url, url_size) == 0) {
      if (head_read_line(dir, "token", token, token_size) != 0)
        token[0] = '\0';
      return 0;
    }
    struct timespec pause = {0, NODE_HEAD_WAIT_POLL_MS * 1000000L};
    nanosleep(&pause, NULL);
  }
}

/* Parses the local agent's options as `muster node` would into *cfg; `pos`
 * has room for agent_argc + 1 pointers and holds the command after.  CLI_OK,
 * or CLI_USAGE after printing why. */
static int head_agent_opts(int agent_argc, char **agent_argv, char **pos, node_config_t *cfg) {
  cli_args_t args;
  memset(cfg, 0, sizeof *cfg);
  if (cli_parse(&head_agent_row, agent_argc, agent_argv, pos, &args) != CLI_OK)
    return CLI_USAGE;
  return node_read_opts(&args, cfg);
}

/*
 * Checks --gpus as the agent checks it (gpu_filter).  The GPUs are detected
 * only when the list names a GPU or MIG instance by UUID: indexes, GPU:INSTANCE
 * numbers and malformed entries are judged without them, and detection (NVML,
 * nvidia-smi) may take a while that the agent then spends again.
 * CUDA_VISIBLE_DEVICES is left to the agent: a value the environment set for
 * other programs must not stop the head.  CLI_OK, or CLI_USAGE after printing
 * why.
 */
static int head_check_gpus(const node_config_t *cfg) {
  if (cfg->gpus == NULL)
    return CLI_OK;
  node_gpus_t gpus = {.count = 0, .source = "none"};
  if (strstr(cfg->gpus, "GPU-") != NULL || strstr(cfg->gpus, "MIG-") != NULL)
    gpu_detect(&gpus);
  char err[2048]; /* room for the UUIDs of many GPUs, as the agent's */
  if (gpu_filter(&gpus, cfg->gpus, 0, err, sizeof err) >= 0)
    return CLI_OK;
  return cli_usage_error(&head_agent_row, "--gpus: %s", err);
}

/* Parses and checks the local agent's options into *cfg (`pos` as for
 * head_agent_opts) before the head starts: a mistake there (`--workers abc`,
 * `--queue Q` without a command, `--gpus 9x`) would otherwise be said by the
 * agent alone, between the head's log lines, while the head ran on with no
 * workers.  Parsed here once, for the agent too (a fork of this process), so
 * that what the parse says (an option given twice) is said once.  CLI_OK, or
 * CLI_USAGE after printing why. */
static int head_check_agent_opts(int agent_argc, char **agent_argv, char **pos,
                                 node_config_t *cfg) {
  int rc = head_agent_opts(agent_argc, agent_argv, pos, cfg);
  if (rc == CLI_OK) /* here alone: the local agent does not load the plugin again */
    rc = node_check_worker(&head_agent_row, cfg);
  if (rc == CLI_OK)
    rc = head_check_gpus(cfg);
  return rc;
}

/*
 * With --server-only no local agent runs, so its options would be dropped
 * without a word (`--server-only --queue q --workers 3 -- cat` started no
 * worker): names every agent option and the command given besides
 * --server-only.  CLI_OK when there is none, else CLI_USAGE after printing.
 */
static int head_check_server_only(int agent_argc, char **agent_argv) {
  char names[512] = "";
  size_t at = 0;
  for (int i = 0; i < agent_argc && at < sizeof names; i++) {
    const char *word = agent_argv[i];
    if (strcmp(word, "--server-only") == 0)
      continue;
    int len = strcmp(word, "--") == 0 ? -1 : (int)strcspn(word, "=");
    at += (size_t)snprintf(names + at, sizeof names - at, "%s%.*s", at ? ", " : "",
                           len < 0 ? 32 : len, len < 0 ? "a worker command (after --)" : word);
    if (len < 0)
      break;
    if (head_match(word, head_agent_valued) >= 0 && strchr(word, '=') == NULL)
      i++; /* its value */
  }
  if (names[0] == '\0')
    return CLI_OK;
  return cli_usage_error(&head_agent_row,
                         "--server-only starts no local node agent, so its options are refused: "
                         "%s; drop them, or drop --server-only to run the agent beside the head",
                         names);
}

/* The local agent: waits for the head, then runs with the options the head's
 * process parsed (head_check_agent_opts). */
static int head_local_agent(pid_t head_pid, node_config_t *cfg, const char *dir, ino_t stale) {
  char url[1024], token[1024];
  if (head_wait_ready(head_pid, dir, stale, url, sizeof url, token, sizeof token) != 0)
    return CLI_FAIL;
  cfg->head_url = url;
  cfg->token = token[0] ? token : NULL;
  cfg->listen = "none";
  cfg->log_prefix = "muster head (local node)";
  cfg->beside_head = 1;
  cfg->head_pid = head_pid;
  cfg->lock_busy_ok = 1;
  return node_agent_main(cfg);
}

/* Forks the local agent, then runs the head.  The agent gets a process group
 * of its own, so a terminal's Ctrl-C reaches the head alone, which passes it
 * on (head.c) and serves the agent's workers until the agent has gone; the
 * agent holds the write end of a pipe (close-on-exec: its workers do not) whose
 * end of file tells the head so. */
static int head_with_agent(int head_argc, char **head_argv, char **agent_argv, char **agent_pos,
                           node_config_t *agent_cfg) {
  const char *dir = head_data_dir(head_argc, head_argv);
  char url_path[4200];
  struct stat st;
  snprintf(url_path, sizeof url_path, "%s/url", dir);
  ino_t stale = stat(url_path, &st) == 0 ? st.st_ino : 0;
  pid_t head_pid = getpid();
  int exit_pipe[2] = {-1, -1};
  if (pipe2(exit_pipe, O_CLOEXEC) != 0)
    perror("muster head: cannot start the local node agent: pipe");
  fflush(NULL);
  pid_t child = exit_pipe[0] >= 0 ? fork() : -1;
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGHUP);
    setpgid(0, 0);
    close(exit_pipe[0]);
    int rc = getppid() == head_pid ? head_local_agent(head_pid, agent_cfg, dir, stale) : CLI_FAIL;
    free(head_argv);
    free(agent_argv);
    free(agent_pos);
    exit(rc);
  }
  if (exit_pipe[1] >= 0)
    close(exit_pipe[1]);
  if (child < 0 && exit_pipe[0] >= 0)
    perror("muster head: cannot start the local node agent");
  else if (child > 0)
    signal(SIGCHLD, SIG_IGN); /* the head reaps nothing: let an early-exiting agent vanish */
  head_agent_t agent = {.pid = child, .exit_fd = exit_pipe[0]};
  int rc = head_main(head_argc, head_argv, child > 0 ? &agent : NULL);
  if (exit_pipe[0] >= 0)
    close(exit_pipe[0]);
  return rc;
}

/* Checks the local agent's options, then runs the head and forks the agent
 * with them. */
static int head_run_with_agent(int head_argc, char **head_argv, int agent_argc, char **agent_argv) {
  char **pos = calloc((size_t)agent_argc + 2, sizeof *pos);
  node_config_t cfg;
  int rc = pos ? head_check_agent_opts(agent_argc, agent_argv, pos, &cfg) : CLI_FAIL;
  if (rc == CLI_OK)
    rc = head_with_agent(head_argc, head_argv, agent_argv, pos, &cfg);
  free(pos);
  return rc;
}

/*
 * Refuses a long option in the head's share of argv (head_split) that the
 * head does not have, with the name it likely meant among the head's options
 * and its local agent's (`--quue`: '--queue'): the head's own parser knows
 * only its own.  CLI_OK, or CLI_USAGE after one line.
 */
static int head_refuse_unknown(int head_argc, char **head_argv) {
  for (int i = 1; i < head_argc; i++) {
    const char *word = head_argv[i];
    if (strncmp(word, "--", 2) != 0 || word[2] == '\0')
      continue;
    size_t len = strcspn(word + 2, "=");
    int arity = head_option_arity(word + 2, len);
    if (arity == 1 && word[2 + len] == '\0')
      i++; /* its value, which may start with "--" */
    if (arity >= 0)
      continue;
    const char *agent[32]; /* the local agent's options, valued and flags */
    size_t n = 0;
    for (int k = 0; head_agent_valued[k] && n + 1 < sizeof agent / sizeof agent[0]; k++)
      agent[n++] = head_agent_valued[k];
    for (int k = 0; head_agent_flags[k] && n + 1 < sizeof agent / sizeof agent[0]; k++)
      agent[n++] = head_agent_flags[k];
    agent[n] = NULL;
    char guess[96];
    fprintf(stderr, "muster head: unrecognized option '%.*s'%s; see 'muster head --help'\n",
            (int)len + 2, word, head_likely_option(word, agent, guess, sizeof guess));
    return CLI_USAGE;
  }
  return CLI_OK;
}

int cmd_head_main(int argc, char **argv) {
  char **head_argv = calloc((size_t)argc + 1, sizeof *head_argv);
  char **agent_argv = calloc((size_t)argc + 1, sizeof *agent_argv);
  int head_argc = 0, agent_argc = 0, rc = CLI_FAIL;
  if (head_argv == NULL || agent_argv == NULL ||
      (rc = head_split(argc, argv, head_argv, &head_argc, agent_argv, &agent_argc)) != CLI_OK ||
      (rc = head_refuse_unknown(head_argc, head_argv)) != CLI_OK) {
    free(head_argv);
    free(agent_argv);
    return rc;
  }
  int server_only = 0, help = 0;
  for (int i = 0; i < agent_argc && strcmp(agent_argv[i], "--") != 0; i++)
    server_only |= strcmp(agent_argv[i], "--server-only") == 0;
  for (int i = 1; i < head_argc; i++)
    help |= strcmp(head_argv[i], "--help") == 0 || strcmp(head_argv[i], "-h") == 0;
  if (help) {
    head_usage();
    cli_head_agent_usage(stdout);
    rc = CLI_OK;
  } else if (server_only) {
    if ((rc = head_check_server_only(agent_argc, agent_argv)) == CLI_OK)
      rc = head_main(head_argc, head_argv, NULL);
  } else {
    rc = head_run_with_agent(head_argc, head_argv, agent_argc, agent_argv);
  }
  free(head_argv);
  free(agent_argv);
  return rc;
}
