/*
 * node.h — the node agent (`muster node --join URL`): what its files share.
 *
 * One agent runs per machine (lock.c).  It detects the machine's GPUs
 * (gpu.c), registers the node with the head and heart-beats (agent.c),
 * starts one `muster worker` process per GPU or N CPU workers and restarts
 * them when they die (supervisor.c), and answers the HTTP API on its own port
 * by forwarding requests to the head (forward.c).  Everything but the
 * heartbeat runs on one libevent loop in the main thread; the heartbeat and
 * the crash reports run on one background thread with its own libmuster
 * handle, so a slow head never stalls forwarding.
 */
#ifndef MUSTER_NODE_H
#define MUSTER_NODE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NODE_DEFAULT_PORT 7371
#define NODE_DEFAULT_LOCK "/tmp/muster-node.lock"
#define NODE_MAX_GPUS 64
#define NODE_MAX_WORKERS 1024

/* ---- gpu.c ---------------------------------------------------------------- */

typedef struct {
  int index;               /* the GPU's index in PCI bus order (nvidia-smi, NVML) */
  char name[128];          /* "NVIDIA H100 80GB HBM3" */
  int64_t memory_total_mb; /* -1 when the source does not say (nvidia-smi -L) */
  int64_t memory_free_mb;  /* -1 when unknown */
  char uuid[96];           /* "GPU-8f1c...", as nvidia-smi -L prints it; "" when unknown.
                            * Never sent to the head: only --gpus matches it. */
} node_gpu_t;

typedef struct {
  node_gpu_t gpus[NODE_MAX_GPUS];
  int count;
  const char *source; /* "nvml", "nvidia-smi", "nvidia-smi -L" or "none" (static text) */
} node_gpus_t;

/*
 * Fills *out with the machine's GPUs: NVML loaded with dlopen() when the
 * library is there (MUSTER_NVML_LIBRARY overrides its name, for tests), else
 * `nvidia-smi --query-gpu=...`, else `nvidia-smi -L`, else none.  Never fails:
 * no NVIDIA software simply means no GPUs.
 */
void gpu_detect(node_gpus_t *out);

/*
 * Keeps the GPUs of *gpus that `only` names ("0,2"; NULL: all) and whose total
 * memory is at least `min_memory_mb` (0: any).  As in CUDA_VISIBLE_DEVICES,
 * `only` names GPUs by index or by UUID ("GPU-8f1c...", or any start of one
 * that matches exactly one GPU of *gpus), mixed as one likes, or is "", "-1"
 * (or "none") for none.  Returns 0; 1 when `only` asked for no GPU (the node
 * then runs CPU workers); -1 with `err` filled when an entry is malformed,
 * names a MIG instance, or is a UUID that matches no GPU or several.
 */
int gpu_filter(node_gpus_t *gpus, const char *only, int64_t min_memory_mb, char *err,
               size_t err_size);

/* ---- lock.c --------------------------------------------------------------- */

/*
 * Takes the machine's agent lock at `path` (flock, held for the process's
 * life through the returned descriptor, close-on-exec).  Returns the fd, or -1
 * with `err` naming the running agent (its pid, head and address, read from
 * the file) or the I/O error.  The file keeps the last holder's text: read it
 * with node_lock_previous() before node_lock_describe() replaces it.
 */
int node_lock_take(const char *path, char *err, size_t err_size);

/*
 * With the lock held: the instance of the dead agent that held it last, read
 * from its line "previous_instance ID" (it inherited that one and never got
 * registered) or else "instance ID", into `instance` (size: 129 is enough).
 * "" unless the text was written on this machine's running kernel into this
 * same file (boot id and inode, see node_lock_describe), so that the lock
 * proves the writer gone.
 */
void node_lock_previous(int fd, char *instance, size_t size);

/* Replaces the lock file's text with `info` (lines "key value") followed by
 * "boot ID" and "inode DEV:INO", where it was written. */
void node_lock_describe(int fd, const char *info);

/* ---- the agent ------------------------------------------------------------ */

typedef struct {
  const char *head_url;  /* http://HOST:PORT of the head (required) */
  const char *token;     /* bearer token for the head */
  const char *name;      /* node name; NULL: the hostname */
  const char *listen;    /* HOST:PORT for the API; NULL: 127.0.0.1:7371; "none": no port */
  const char *lock_path; /* NULL: NODE_DEFAULT_LOCK (env MUSTER_NODE_LOCK overrides) */
  const char *gpus;      /* --gpus list, or NULL (then CUDA_VISIBLE_DEVICES) */
  int64_t min_gpu_memory_mb;
  int64_t cpu_workers; /* --workers; -1: the number of usable cores */
  /* the worker processes; no queue: the agent starts no workers */
  const char *queue;
  const char *plugin;
  const char *init_data;
  const char *nickname;
  int64_t concurrency; /* slots per worker process (command workers) */
  int json_result;
  char **cmd;             /* NULL-terminated command, or NULL */
  const char *log_prefix; /* "muster node" or "muster head" */
  int beside_head;        /* the agent of `muster head`: its head stops with it */
  int lock_busy_ok;       /* another agent holds the lock: say so and return 0 */
  const char *cache_dir;  /* the node cache's directory; NULL: /var/tmp/muster-node-NAME/cache */
  int64_t cache_bytes;    /* its size limit; 0: CACHE_DEFAULT_BYTES (10 GiB) */
  const char *state_dir;  /* node-local iterations' store; NULL: /var/tmp/muster-node-NAME/state */
} node_config_t;

/* Runs the agent until SIGINT/SIGTERM (graceful) or SIGHUP (hard stop);
 * returns the process exit status: 0, 1 (a failure, or the head refused the
 * token), or 2 (a bad argument: node name, GPU list). */
int node_agent_main(const node_config_t *cfg);

#endif /* MUSTER_NODE_H */
