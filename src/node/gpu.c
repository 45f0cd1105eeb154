/*
 * gpu.c — finding the machine's NVIDIA GPUs without NVIDIA software at build time.
 *
 * Sources, in order: NVML (libnvidia-ml.so.1, the library nvidia-smi itself
 * uses) loaded with dlopen(), so the binary builds and runs where it is
 * absent; `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.free
 * --format=csv,noheader,nounits` (asked again without uuid when that fails);
 * `nvidia-smi -L` (names and UUIDs); none.  NVML and nvidia-smi both number
 * GPUs in PCI bus order, which is why workers get CUDA_DEVICE_ORDER=PCI_BUS_ID:
 * CUDA's own default order ("fastest first") could give index 0 another
 * meaning.  nvidia-smi is run without a shell and with a deadline, so a hung
 * driver cannot hang the agent.  UUIDs are kept so that --gpus and
 * CUDA_VISIBLE_DEVICES may name GPUs by them; workers are still given indexes.
 *
 * A GPU in MIG mode runs CUDA work only on its MIG instances, each a device
 * of its own (CUDA_VISIBLE_DEVICES=MIG-<uuid>): such a GPU is replaced by its
 * instances, found through NVML's MIG calls or under the GPU's line of
 * `nvidia-smi -L`; one with no instance is noted, for the agent to say why it
 * has no worker.
 */
#include "node/node.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define GPU_SMI_TIMEOUT_MS 10000
#define GPU_SMI_OUT_MAX 65536

/* ---- NVML ------------------------------------------------------------------ */

/* The few NVML declarations we need, from its stable C ABI (nvml.h). */
typedef int gpu_nvml_ret_t; /* NVML_SUCCESS is 0 */
typedef struct gpu_nvml_device *gpu_nvml_device_t;
typedef struct {
  unsigned long long total, free, used; /* bytes */
} gpu_nvml_memory_t;

typedef struct {
  gpu_nvml_ret_t (*init)(void);
  gpu_nvml_ret_t (*shutdown)(void);
  gpu_nvml_ret_t (*count)(unsigned int *);
  gpu_nvml_ret_t (*handle)(unsigned int, gpu_nvml_device_t *);
  gpu_nvml_ret_t (*name)(gpu_nvml_device_t, char *, unsigned int);
  gpu_nvml_ret_t (*memory)(gpu_nvml_device_t, gpu_nvml_memory_t *);
  gpu_nvml_ret_t (*uuid)(gpu_nvml_device_t, char *, unsigned int); /* NULL: not there */
  /* NULL in an NVML older than MIG (then no GPU is in MIG mode): */
  gpu_nvml_ret_t (*mig_mode)(gpu_nvml_device_t, unsigned int *current, unsigned int *pending);
  gpu_nvml_ret_t (*mig_max)(gpu_nvml_device_t, unsigned int *);
  gpu_nvml_ret_t (*mig_handle)(gpu_nvml_device_t, unsigned int, gpu_nvml_device_t *);
} gpu_nvml_t;

/* Looks up every symbol; 0 when all the required ones are there.  The UUID
 * and MIG calls are optional: a library without them still gives indexes,
 * names and memory. */
static int gpu_nvml_bind(void *lib, gpu_nvml_t *nvml) {
  *(void **)&nvml->init = dlsym(lib, "nvmlInit_v2");
  *(void **)&nvml->shutdown = dlsym(lib, "nvmlShutdown");
  *(void **)&nvml->count = dlsym(lib, "nvmlDeviceGetCount_v2");
  *(void **)&nvml->handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&nvml->name = dlsym(lib, "nvmlDeviceGetName");
  *(void **)&nvml->memory = dlsym(lib, "nvmlDeviceGetMemoryInfo");
  *(void **)&nvml->uuid = dlsym(lib, "nvmlDeviceGetUUID");
  *(void **)&nvml->mig_mode = dlsym(lib, "nvmlDeviceGetMigMode");
  *(void **)&nvml->mig_max = dlsym(lib, "nvmlDeviceGetMaxMigDeviceCount");
  *(void **)&nvml->mig_handle = dlsym(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
  return nvml->init && nvml->shutdown && nvml->count && nvml->handle && nvml->name && nvml->memory
             ? 0
             : -1;
}

/* Fills *gpu with what NVML says of device `i`; what it cannot say stays unknown. */
static void gpu_nvml_describe(const gpu_nvml_t *nvml, gpu_nvml_device_t dev, unsigned int i,
                              node_gpu_t *gpu) {
  gpu_nvml_memory_t mem;
  gpu->index = (int)i;
  gpu->mig = -1;
  gpu->gpu_uuid[0] = '\0';
  if (nvml->name(dev, gpu->name, sizeof gpu->name) != 0)
    snprintf(gpu->name, sizeof gpu->name, "GPU %u", i);
  gpu->memory_total_mb = gpu->memory_free_mb = -1;
  if (nvml->memory(dev, &mem) == 0) {
    gpu->memory_total_mb = (int64_t)(mem.total >> 20);
    gpu->memory_free_mb = (int64_t)(mem.free >> 20);
  }
  /* 96 bytes is NVML's own UUID buffer size (NVML_DEVICE_UUID_V2_BUFFER_SIZE). */
  if (nvml->uuid == NULL || nvml->uuid(dev, gpu->uuid, sizeof gpu->uuid) != 0)
    gpu->uuid[0] = '\0';
}

/* Notes GPU `index`, in MIG mode with no instance (gpu_detect says why no worker has it). */
static void gpu_note_idle_mig(node_gpus_t *out, int index) {
  if (out->nidle_mig < NODE_MAX_GPUS)
    out->idle_mig[out->nidle_mig++] = index;
}

/* 1 when `dev` is in MIG mode now (a mode pending until the next reset does not count). */
static int gpu_nvml_mig_on(const gpu_nvml_t *nvml, gpu_nvml_device_t dev) {
  unsigned int current = 0, pending = 0;
  return nvml->mig_mode && nvml->mig_max && nvml->mig_handle &&
         nvml->mig_mode(dev, &current, &pending) == 0 && current == 1; /* NVML_DEVICE_MIG_ENABLE */
}

/* Adds the MIG instances of GPU `i` (in MIG mode, handle `dev`), or notes it has none. */
static void gpu_nvml_add_instances(const gpu_nvml_t *nvml, gpu_nvml_device_t dev, unsigned int i,
                                   node_gpus_t *out) {
  unsigned int max = 0;
  char gpu_uuid[96] = "";
  int added = 0;
  if (nvml->mig_max(dev, &max) != 0)
    max = 0;
  if (nvml->uuid == NULL || nvml->uuid(dev, gpu_uuid, sizeof gpu_uuid) != 0)
    gpu_uuid[0] = '\0';
  for (unsigned int k = 0; k < max && out->count < NODE_MAX_GPUS; k++) {
    gpu_nvml_device_t instance;
    if (nvml->mig_handle(dev, k, &instance) != 0) /* NVML_ERROR_NOT_FOUND: a free slot */
      continue;
    node_gpu_t *gpu = &out->gpus[out->count];
    gpu_nvml_describe(nvml, instance, i, gpu);
    if (gpu->uuid[0] == '\0') /* CUDA knows an instance by its UUID only: unusable */
      continue;
    gpu->mig = (int)k; /* as NVIDIA's container toolkit reads "0:1", and nvidia-smi -L */
    snprintf(gpu->gpu_uuid, sizeof gpu->gpu_uuid, "%s", gpu_uuid);
    out->count++;
    added++;
  }
  if (added == 0)
    gpu_note_idle_mig(out, (int)i);
}

/* Fills *out through NVML; 0 when NVML answered (even with no GPU). */
static int gpu_from_nvml(node_gpus_t *out) {
  const char *name = getenv("MUSTER_NVML_LIBRARY");
  void *lib = dlopen(name && name[0] ? name : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    return -1;
  gpu_nvml_t nvml;
  unsigned int count = 0;
  int rc = -1;
  if (gpu_nvml_bind(lib, &nvml) == 0 && nvml.init() == 0) {
    if (nvml.count(&count) == 0) {
      rc = 0;
      for (unsigned int i = 0; i < count && out->count < NODE_MAX_GPUS; i++) {
        gpu_nvml_device_t dev;
        if (nvml.handle(i, &dev) != 0)
          continue;
        if (gpu_nvml_mig_on(&nvml, dev))
          gpu_nvml_add_instances(&nvml, dev, i, out);
        else
          gpu_nvml_describe(&nvml, dev, i, &out->gpus[out->count++]);
      }
    }
    nvml.shutdown();
  }
  dlclose(lib);
  return rc;
}

/* ---- nvidia-smi -------------------------------------------------------------- */

static long gpu_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Reads the child's stdout into buf until EOF or the deadline; 1 at EOF. */
static int gpu_read_all(int fd, char *buf, size_t size, long deadline) {
  size_t len = 0;
  int eof = 0;
  for (;;) {
    long wait = deadline - gpu_now_ms();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (wait <= 0 || poll(&p, 1, (int)wait) <= 0)
      break;
    ssize_t n = read(fd, buf + len, size - 1 - len);
    if (n < 0 && errno == EINTR)
      continue;
    eof = n == 0;
    if (n <= 0)
      break;
    len += (size_t)n;
    if (len + 1 >= size)
      break;
  }
  buf[len] = '\0';
  return eof;
}

/*
 * Runs nvidia-smi with `args` (found in PATH) and returns its stdout (free),
 * or NULL when it is not there, fails or times out; *hung (may be NULL) says
 * whether it had to be killed (past the deadline, or endless output).
 */
static char *gpu_run_smi(char *const args[], int *hung) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return NULL;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  pid_t pid;
  int rc = posix_spawnp(&pid, "nvidia-smi", &actions, &attr, args, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  char *out = NULL;
  if (rc == 0) {
    out = malloc(GPU_SMI_OUT_MAX);
    int eof = out && gpu_read_all(fds[0], out, GPU_SMI_OUT_MAX, gpu_now_ms() + GPU_SMI_TIMEOUT_MS);
    int status = -1;
    if (!eof) /* hung past the deadline, or too much output: not a usable answer */
      kill(pid, SIGKILL);
    if (hung)
      *hung = out && !eof;
    if (waitpid(pid, &status, 0) != pid || !eof)
      status = -1;
    if (status != 0) {
      free(out);
      out = NULL;
    }
  }
  close(fds[0]);
  return out;
}

/* Strips spaces at both ends of `s` in place. */
static char *gpu_trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

/* Parses a number of MiB ("81559"); -1 for "[N/A]" and the like. */
static int64_t gpu_parse_mb(const char *text) {
  char *end;
  long long v = strtoll(text, &end, 10);
  return end != text && *gpu_trim(end) == '\0' && v >= 0 ? (int64_t)v : -1;
}

/* Copies `text` into uuid[96] when it is a UUID starting with `prefix` ("GPU-"
 * or "MIG-"); "" otherwise ("[N/A]" and the like). */
static void gpu_set_uuid(char *uuid, const char *text, const char *prefix) {
  if (strncmp(text, prefix, 4) == 0 && text[4] != '\0')
    snprintf(uuid, 96, "%s", text);
  else
    uuid[0] = '\0';
}

/*
 * Splits one CSV line of --query-gpu into fields[0..left+right]: `left` fields
 * cut at the first commas, `right` at the last commas, and the name, all that
 * lies between, in fields[left].  So a name with a comma in it stays whole
 * (no other field can hold one).  Returns -1 when the line has too few commas.
 */
static int gpu_split_query(char *line, int left, int right, char **fields) {
  char *rest = line;
  for (int k = 0; k < left; k++) {
    char *comma = strchr(rest, ',');
    if (comma == NULL)
      return -1;
    *comma = '\0';
    fields[k] = gpu_trim(rest);
    rest = comma + 1;
  }
  for (int k = 0; k < right; k++) {
    char *comma = strrchr(rest, ',');
    if (comma == NULL)
      return -1;
    *comma = '\0';
    fields[left + right - k] = gpu_trim(comma + 1);
  }
  fields[left] = gpu_trim(rest);
  return 0;
}

/* The --query-gpu field lists, asked in this order: a driver that does not
 * know a field refuses the whole query and is asked the next one. */
typedef struct {
  const char *fields;
  int with_uuid, with_mig;
} gpu_query_t;

static const gpu_query_t gpu_queries[] = {
    {"index,uuid,name,memory.total,memory.free,mig.mode.current", 1, 1},
    {"index,uuid,name,memory.total,memory.free", 1, 0},
    {"index,name,memory.total,memory.free", 0, 0},
};

/* mig.mode.current: 1 "Enabled", 0 "Disabled" or not applicable, -1 not a mode at all. */
static int gpu_parse_mig_mode(const char *text) {
  if (strcmp(text, "Enabled") == 0)
    return 1;
  return strcmp(text, "Disabled") == 0 || strcmp(text, "[N/A]") == 0 || strcmp(text, "N/A") == 0 ||
                 strcmp(text, "[Not Supported]") == 0
             ? 0
             : -1;
}

/*
 * Parses one --query-gpu line of query `q` ("0, GPU-a159..., NVIDIA H100,
 * 81559, 80000, Disabled" for the first) into *gpu and *mig_on; -1 when the
 * line is not one (so the answer is not trusted, and the next query asked).
 */
static int gpu_parse_query_line(char *line, const gpu_query_t *q, node_gpu_t *gpu, int *mig_on) {
  char *fields[6];
  int left = q->with_uuid ? 2 : 1, right = 2 + q->with_mig;
  if (gpu_split_query(line, left, right, fields) != 0)
    return -1;
  char *end;
  long index = strtol(fields[0], &end, 10);
  *mig_on = q->with_mig ? gpu_parse_mig_mode(fields[left + 3]) : 0;
  if (*end != '\0' || end == fields[0] || index < 0 || index > 65535 || *mig_on < 0)
    return -1;
  gpu->index = (int)index;
  gpu->mig = -1;
  gpu_set_uuid(gpu->uuid, q->with_uuid ? fields[1] : "", "GPU-");
  gpu->gpu_uuid[0] = '\0';
  snprintf(gpu->name, sizeof gpu->name, "%s", fields[left]);
  gpu->memory_total_mb = gpu_parse_mb(fields[left + 1]);
  gpu->memory_free_mb = gpu_parse_mb(fields[left + 2]);
  return 0;
}

/* Parses the answer to query `q`, one GPU a line; 0 when every line parsed. */
static int gpu_parse_query(char *text, const gpu_query_t *q, node_gpus_t *out, int *mig_on) {
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    if (*gpu_trim(line) == '\0')
      continue;
    if (out->count >= NODE_MAX_GPUS ||
        gpu_parse_query_line(line, q, &out->gpus[out->count], &mig_on[out->count]) != 0)
      return -1;
    out->count++;
  }
  return 0;
}

/* Cuts "... (UUID: X)" off the end of `line`, keeping X in uuid[96] when it starts with `prefix`.
 */
static void gpu_cut_uuid(char *line, char *uuid, const char *prefix) {
  char *at = strstr(line, "(UUID:");
  uuid[0] = '\0';
  if (at == NULL)
    return;
  *at = '\0';
  char *text = at + strlen("(UUID:"), *close = strchr(text, ')');
  if (close)
    *close = '\0';
  gpu_set_uuid(uuid, gpu_trim(text), prefix);
}

/* Parses an instance line of `nvidia-smi -L`, "  MIG 1g.10gb  Device  0: (UUID: MIG-...)",
 * under GPU `parent`, into *gpu; -1 when it is not one. */
static int gpu_parse_instance(char *line, const node_gpu_t *parent, node_gpu_t *gpu) {
  char profile[32];
  int k = -1, used = 0;
  if (sscanf(line, " MIG %31s Device %d: %n", profile, &k, &used) < 2 || used == 0 || k < 0)
    return -1;
  gpu_cut_uuid(line + used, gpu->uuid, "MIG-");
  if (gpu->uuid[0] == '\0') /* CUDA knows an instance by its UUID only: unusable */
    return -1;
  gpu->index = parent->index;
  gpu->mig = k;
  snprintf(gpu->gpu_uuid, sizeof gpu->gpu_uuid, "%s", parent->uuid);
  snprintf(gpu->name, sizeof gpu->name, "%.90s MIG %s", parent->name, profile);
  gpu->memory_total_mb = gpu->memory_free_mb = -1;
  return 0;
}

/* Drops each whole GPU of *out that has instances listed after it (in MIG mode). */
static void gpu_drop_split_gpus(node_gpus_t *out) {
  int kept = 0;
  for (int i = 0; i < out->count; i++) {
    const node_gpu_t *gpu = &out->gpus[i];
    int split = gpu->mig < 0 && i + 1 < out->count && out->gpus[i + 1].mig >= 0 &&
                out->gpus[i + 1].index == gpu->index;
    if (!split)
      out->gpus[kept++] = *gpu;
  }
  out->count = kept;
}

/*
 * Parses `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)", a
 * GPU in MIG mode followed by its instances, indented ("  MIG 1g.10gb  Device
 * 0: (UUID: MIG-...)"), which stand for it.  (A GPU in MIG mode without
 * instances looks like any GPU there: only NVML and --query-gpu tell.)
 */
static void gpu_parse_list(char *text, node_gpus_t *out) {
  node_gpu_t parent = {.index = -1}; /* the last GPU line's */
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    int index = -1, used = 0;
    if (out->count >= NODE_MAX_GPUS)
      break;
    node_gpu_t *gpu = &out->gpus[out->count];
    if (parent.index >= 0 && gpu_parse_instance(line, &parent, gpu) == 0) {
      out->count++;
      continue;
    }
    if (sscanf(line, "GPU %d: %n", &index, &used) < 1 || used == 0 || index < 0)
      continue;
    gpu->index = index;
    gpu->mig = -1;
    gpu->gpu_uuid[0] = '\0';
    gpu_cut_uuid(line + used, gpu->uuid, "GPU-");
    snprintf(gpu->name, sizeof gpu->name, "%s", gpu_trim(line + used));
    gpu->memory_total_mb = gpu->memory_free_mb = -1;
    parent = out->gpus[out->count++];
  }
  gpu_drop_split_gpus(out);
}

/*
 * Replaces each GPU of *out that --query-gpu said is in MIG mode (mig_on[i])
 * with its instances from `nvidia-smi -L`, or notes it has none.
 */
static void gpu_split_mig(node_gpus_t *out, const int *mig_on) {
  node_gpus_t *list = calloc(1, sizeof *list), *all = malloc(sizeof *all);
  char *args[] = {"nvidia-smi", "-L", NULL};
  char *text = list && all ? gpu_run_smi(args, NULL) : NULL;
  if (list != NULL && all != NULL) { /* no list: no instance known, none used */
    if (text != NULL)
      gpu_parse_list(text, list);
    *all = *out;
    out->count = 0;
    for (int i = 0; i < all->count && out->count < NODE_MAX_GPUS; i++) {
      int added = 0;
      for (int k = 0; mig_on[i] && k < list->count && out->count < NODE_MAX_GPUS; k++) {
        const node_gpu_t *instance = &list->gpus[k];
        if (instance->index == all->gpus[i].index && instance->mig >= 0) {
          out->gpus[out->count++] = *instance;
          added++;
        }
      }
      if (!mig_on[i])
        out->gpus[out->count++] = all->gpus[i];
      else if (added == 0)
        gpu_note_idle_mig(out, all->gpus[i].index);
    }
  }
  free(text);
  free(list);
  free(all);
}

/*
 * Asks nvidia-smi query `q`; 0 with *out filled, -1 with *out emptied when it
 * did not answer, -2 when it hung (asking it again would only hang again).
 */
static int gpu_from_query(const gpu_query_t *q, node_gpus_t *out) {
  char option[128];
  snprintf(option, sizeof option, "--query-gpu=%s", q->fields);
  char *query[] = {"nvidia-smi", option, "--format=csv,noheader,nounits", NULL};
  int hung = 0, mig_on[NODE_MAX_GPUS] = {0}, any_mig = 0;
  char *text = gpu_run_smi(query, &hung);
  int rc = text && gpu_parse_query(text, q, out, mig_on) == 0 ? 0 : hung ? -2 : -1;
  free(text);
  for (int i = 0; rc == 0 && i < out->count; i++)
    any_mig |= mig_on[i];
  if (any_mig)
    gpu_split_mig(out, mig_on);
  if (rc != 0)
    memset(out, 0, sizeof *out);
  return rc;
}

void gpu_detect(node_gpus_t *out) {
  memset(out, 0, sizeof *out);
  if (gpu_from_nvml(out) == 0) {
    out->source = "nvml";
    return;
  }
  int rc = -1;
  for (size_t i = 0; rc == -1 && i < sizeof gpu_queries / sizeof gpu_queries[0]; i++)
    rc = gpu_from_query(&gpu_queries[i], out);
  if (rc == 0) {
    out->source = "nvidia-smi";
    return;
  }
  char *list[] = {"nvidia-smi", "-L", NULL};
  char *text = gpu_run_smi(list, NULL);
  if (text != NULL) {
    gpu_parse_list(text, out);
    free(text);
    out->source = "nvidia-smi -L";
    return;
  }
  out->source = "none";
}

/* ---- --gpus and CUDA_VISIBLE_DEVICES ------------------------------------------ */

/* What one entry of a GPU list picks: GPU `index` (with all its instances, in
 * MIG mode) or, where `mig` >= 0, that instance of it. */
typedef struct {
  int index, mig;
} gpu_pick_t;

const char *gpu_label(const node_gpu_t *gpu, char buf[24]) {
  if (gpu->mig < 0)
    snprintf(buf, 24, "%d", gpu->index);
  else
    snprintf(buf, 24, "%d:%d", gpu->index, gpu->mig);
  return buf;
}

/* The UUID of `gpu` that an entry starting with `prefix` is matched against:
 * an instance's own for "MIG-", for "GPU-" the GPU's (an instance's GPU's). */
static const char *gpu_uuid_for(const node_gpu_t *gpu, const char *prefix) {
  if (strncasecmp(prefix, "MIG-", 4) == 0)
    return gpu->mig >= 0 ? gpu->uuid : "";
  return gpu->mig >= 0 ? gpu->gpu_uuid : gpu->uuid;
}

/* What an entry naming `gpu` by a UUID starting with `prefix` picks. */
static gpu_pick_t gpu_pick_of(const node_gpu_t *gpu, const char *prefix) {
  int instance = strncasecmp(prefix, "MIG-", 4) == 0;
  return (gpu_pick_t){gpu->index, instance ? gpu->mig : -1};
}

/*
 * Writes "0 GPU-aaaa..., 1:0 MIG-bbbb..." into buf: for each device of *gpus
 * whose UUID (gpu_uuid_for) starts with `prefix`, or with "" each device's own
 * UUID, its label and that UUID, once per pick; returns how many.  A list too
 * long for buf ends with "...".
 */
static int gpu_list_uuids(const node_gpus_t *gpus, const char *prefix, char *buf, size_t size) {
  size_t at = 0, n = strlen(prefix);
  int matches = 0;
  gpu_pick_t last = {-1, -1};
  buf[0] = '\0';
  for (int i = 0; i < gpus->count; i++) {
    const node_gpu_t *gpu = &gpus->gpus[i];
    const char *uuid = n ? gpu_uuid_for(gpu, prefix) : gpu->uuid;
    gpu_pick_t pick = n ? gpu_pick_of(gpu, prefix) : (gpu_pick_t){gpu->index, gpu->mig};
    if (uuid[0] == '\0' || strncasecmp(uuid, prefix, n) != 0 ||
        (pick.index == last.index && pick.mig == last.mig))
      continue; /* the instances of one GPU, named by its UUID: one pick */
    last = pick;
    const char *sep = matches++ > 0 ? ", " : "";
    char label[24];
    if (at >= size) /* full: "..." written, only counting now */
      continue;
    if (at + sizeof gpu->uuid + 32 >= size) {
      snprintf(buf + at, size - at, "%s...", sep);
      at = size;
    } else {
      gpu_label(&(node_gpu_t){.index = pick.index, .mig = pick.mig}, label);
      at += (size_t)snprintf(buf + at, size - at, "%s%s %s", sep, label, uuid);
    }
  }
  return matches;
}

/* Says in err why `uuid` picks no device: it matches `matches` (0, or more than one). */
static void gpu_uuid_error(const node_gpus_t *gpus, const char *uuid, int matches, char *err,
                           size_t err_size) {
  char found[1536];
  int instance = strncasecmp(uuid, "MIG-", 4) == 0, some_mig = 0;
  for (int i = 0; i < gpus->count; i++)
    some_mig |= gpus->gpus[i].mig >= 0;
  const char *what = instance ? "MIG instance" : "GPU";
  if (matches > 1) {
    gpu_list_uuids(gpus, uuid, found, sizeof found);
    snprintf(err, err_size, "'%s' matches %d %ss (%s); give more of the UUID, or the %s", uuid,
             matches, what, found, instance ? "GPU:INSTANCE numbers" : "index");
  } else if (gpu_list_uuids(gpus, "", found, sizeof found) > 0) {
    snprintf(err, err_size,
             "'%s' matches no %s of this machine; its %s are %s (name them by index or UUID%s)",
             uuid, what, some_mig ? "GPUs and MIG instances" : "GPUs", found,
             some_mig ? ", an instance also as GPU:INSTANCE" : "");
  } else if (gpus->count == 0) {
    snprintf(err, err_size, "'%s' matches no %s of this machine: detection (%s) found no GPU", uuid,
             what, gpus->source ? gpus->source : "none");
  } else {
    snprintf(err, err_size,
             "'%s' matches no %s of this machine: detection (%s) found %d GPUs and no UUIDs; "
             "name GPUs by index instead",
             uuid, what, gpus->source ? gpus->source : "none", gpus->count);
  }
}

/*
 * Finds the one device whose UUID (gpu_uuid_for) is `uuid` or, as CUDA
 * accepts, starts with it (hex digits in either case): 0 with *pick set, or -1
 * with err naming the entry and the UUIDs it could have meant.
 */
static int gpu_find_uuid(const node_gpus_t *gpus, const char *uuid, gpu_pick_t *pick, char *err,
                         size_t err_size) {
  int matches = 0;
  for (int i = 0; i < gpus->count; i++) {
    const node_gpu_t *gpu = &gpus->gpus[i];
    const char *own = gpu_uuid_for(gpu, uuid);
    gpu_pick_t p = gpu_pick_of(gpu, uuid);
    if (own[0] != '\0' && strcasecmp(own, uuid) == 0) {
      *pick = p; /* a whole UUID, even if another one starts with it */
      return 0;
    }
    if (own[0] == '\0' || strncasecmp(own, uuid, strlen(uuid)) != 0)
      continue;
    if (matches == 0 || p.index != pick->index || p.mig != pick->mig)
      matches++;
    *pick = p;
  }
  if (matches == 1)
    return 0;
  gpu_uuid_error(gpus, uuid, matches, err, err_size);
  return -1;
}

/* Reads "2" or "2:1" (GPU 2's instance 1) into *pick; -1 when `entry` is neither. */
static int gpu_parse_numbers(const char *entry, gpu_pick_t *pick) {
  char *end;
  long index = strtol(entry, &end, 10), mig = -1;
  if (end == entry || !isdigit((unsigned char)entry[0]) || index > 65535)
    return -1;
  if (*end == ':') {
    const char *at = end + 1;
    mig = strtol(at, &end, 10);
    if (end == at || !isdigit((unsigned char)at[0]) || mig > 65535)
      return -1;
  }
  if (*end != '\0')
    return -1;
  *pick = (gpu_pick_t){(int)index, (int)mig};
  return 0;
}

/* What `entry` of the GPU list `list` picks: 0, or -1 with err saying why it names none. */
static int gpu_parse_entry(const node_gpus_t *gpus, const char *entry, const char *list,
                           gpu_pick_t *pick, char *err, size_t err_size) {
  if ((strncmp(entry, "GPU-", 4) == 0 || strncmp(entry, "MIG-", 4) == 0) && entry[4] != '\0')
    return gpu_find_uuid(gpus, entry, pick, err, err_size);
  if (gpu_parse_numbers(entry, pick) == 0)
    return 0;
  if (strcmp(entry, list) == 0)
    snprintf(err, err_size,
             "'%s' is not a list of GPU indexes or UUIDs such as 0,2 or GPU-8f1c "
             "(a MIG instance: 0:1 or MIG-5a2e)",
             list);
  else
    snprintf(err, err_size,
             "'%s' is not a list of GPU indexes or UUIDs such as 0,2 or GPU-8f1c "
             "(a MIG instance: 0:1 or MIG-5a2e): '%s' is neither",
             list, entry);
  return -1;
}

/* Parses "0,GPU-8f1c,1:0" into `picks`; -1 with err when an entry names nothing. */
static int gpu_parse_only(const node_gpus_t *gpus, const char *only, gpu_pick_t *picks, int *count,
                          char *err, size_t err_size) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s", only);
  *count = 0;
  for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
    if (*count >= NODE_MAX_GPUS) {
      snprintf(err, err_size, "'%s' names more than %d GPUs", only, NODE_MAX_GPUS);
      return -1;
    }
    if (gpu_parse_entry(gpus, gpu_trim(f), only, &picks[*count], err, err_size) != 0)
      return -1;
    (*count)++;
  }
  return 0;
}

/* 1 when one of `picks` (npicks < 0: all) names `gpu`. */
static int gpu_picked(const node_gpu_t *gpu, const gpu_pick_t *picks, int npicks) {
  if (npicks < 0)
    return 1;
  for (int k = 0; k < npicks; k++)
    if (picks[k].index == gpu->index && (picks[k].mig < 0 || picks[k].mig == gpu->mig))
      return 1;
  return 0;
}

int gpu_filter(node_gpus_t *gpus, const char *only, int64_t min_memory_mb, char *err,
               size_t err_size) {
  gpu_pick_t picks[NODE_MAX_GPUS];
  int npicks = -1; /* -1: every GPU */
  if (only != NULL) {
    char trimmed[512];
    snprintf(trimmed, sizeof trimmed, "%s", only);
    const char *t = gpu_trim(trimmed);
    if (t[0] == '\0' || strcmp(t, "-1") == 0 || strcmp(t, "none") == 0) {
      gpus->count = 0;
      return 1;
    } else if (gpu_parse_only(gpus, t, picks, &npicks, err, err_size) != 0) {
      return -1;
    }
  }
  int kept = 0;
  for (int i = 0; i < gpus->count; i++) {
    const node_gpu_t *gpu = &gpus->gpus[i];
    int big =
        min_memory_mb <= 0 || gpu->memory_total_mb < 0 || gpu->memory_total_mb >= min_memory_mb;
    if (big && gpu_picked(gpu, picks, npicks))
      gpus->gpus[kept++] = *gpu;
  }
  gpus->count = kept;
  return 0;
}
