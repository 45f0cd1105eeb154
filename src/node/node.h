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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NODE_DEFAULT_PORT 7371
#define NODE_DEFAULT_LOCK "/tmp/muster-node.lock"
#define NODE_MAX_GPUS 64
#define NODE_MAX_WORKERS 1024

/* ---- gpu.c ---------------------------------------------------------------- */

/* A device a GPU worker can own: a whole GPU, or one MIG instance of a GPU in
 * MIG mode (CUDA then runs work on its instances only, never on the GPU). */
typedef struct {
  int index;               /* the GPU's index in PCI bus order (nvidia-smi, NVML) */
  int mig;                 /* -1: the whole GPU; else the instance's number under GPU
                            * `index`, as `nvidia-smi -L` numbers them ("Device 1") */
  char name[128];          /* "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB MIG 1g.5gb" */
  int64_t memory_total_mb; /* -1 when the source does not say (nvidia-smi -L) */
  int64_t memory_free_mb;  /* -1 when unknown */
  char uuid[96];           /* "GPU-8f1c..." or, for an instance, "MIG-..."; "" when unknown.
                            * Never sent to the head: only --gpus matches it, and an
                            * instance's worker is given it as CUDA_VISIBLE_DEVICES. */
  char gpu_uuid[96];       /* an instance's GPU's UUID ("" for a whole GPU, or unknown) */
} node_gpu_t;

typedef struct {
  node_gpu_t gpus[NODE_MAX_GPUS];
  int count;
  const char *source;          /* "nvml", "nvidia-smi", "nvidia-smi -L" or "none" (static text) */
  int idle_mig[NODE_MAX_GPUS]; /* GPUs in MIG mode without instances (indexes): no */
  int nidle_mig;               /* worker can use them, so none of gpus[] stands for them */
} node_gpus_t;

/* "0" for a whole GPU, "0:1" for instance 1 of GPU 0: how the agent names a device. */
const char *gpu_label(const node_gpu_t *gpu, char buf[24]);

/*
 * Fills *out with the machine's GPUs, each GPU in MIG mode replaced by its MIG
 * instances: NVML loaded with dlopen() when the library is there
 * (MUSTER_NVML_LIBRARY overrides its name, for tests), else `nvidia-smi
 * --query-gpu=...` (with `nvidia-smi -L` for the instances), else `nvidia-smi
 * -L`, else none.  Never fails: no NVIDIA software simply means no GPUs.
 */
void gpu_detect(node_gpus_t *out);

/*
 * Keeps the devices of *gpus that `only` names ("0,2"; NULL: all) and whose
 * total memory is at least `min_memory_mb` (0: any).  As in
 * CUDA_VISIBLE_DEVICES, `only` names GPUs by index or by UUID ("GPU-8f1c...",
 * or any start of one that matches exactly one GPU of *gpus) and MIG
 * instances by UUID ("MIG-..."), or as GPU:INSTANCE ("0:1"), mixed as one
 * likes, or is "", "-1" (or "none") for none.  Naming a GPU in MIG mode keeps
 * all its instances.  Returns 0; 1 when `only` asked for no GPU (the node then
 * runs CPU workers); -1 with `err` filled when an entry is malformed or is a
 * UUID that matches no device or several.
 */
int gpu_filter(node_gpus_t *gpus, const char *only, int64_t min_memory_mb, char *err,
               size_t err_size);

/* ---- lock.c --------------------------------------------------------------- */

/*
 * Takes the machine's agent lock at `path` (flock, held for the process's
 * life through the returned descriptor, close-on-exec).  Returns the fd;
 * NODE_LOCK_BUSY with `err` naming the running agent (its pid, head and
 * address, read from the file; what to do about it is the caller's to say);
 * or -1 with `err` saying the I/O error.  The file keeps the last holder's text: read it
 * with node_lock_previous() before node_lock_describe() replaces it.
 */
#define NODE_LOCK_BUSY (-2)
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

/*
 * A directory one agent at a time may use (the node cache's --cache-dir, the
 * node-local iterations' --state-dir): takes flock on the file `path` in it
 * (created, close-on-exec), held through the returned descriptor for the
 * caller's life; the kernel drops it with the process, however it ends.
 * Returns the fd; NODE_LOCK_BUSY with the holder's line ("pid 12, node n1",
 * or "unknown") in `held_by`; or -1 with errno.
 */
int node_dir_lock_take(const char *path, char *held_by, size_t size);
/* Writes "pid P, node NODE" into the held lock `fd`, for the next agent's
 * refusal to name; false when it could not (the lock is held all the same). */
bool node_dir_lock_note(int fd, const char *node);

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
  int permanent_exit;     /* --permanent-exit passed to command workers; 0: none */
  char **cmd;             /* NULL-terminated command, or NULL */
  const char *log_prefix; /* "muster node" or "muster head" */
  int beside_head;        /* the agent of `muster head`: its head stops with it */
  pid_t head_pid;         /* with beside_head: the head's pid (the agent's parent) */
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
