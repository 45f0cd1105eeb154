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
 * driver cannot hang the agent.  UUIDs are kept only so that --gpus and
 * CUDA_VISIBLE_DEVICES may name GPUs by them; workers are still given indexes.
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
} gpu_nvml_t;

/* Looks up every symbol; 0 when all the required ones are there.  The UUID
 * is optional: a library without it still gives indexes, names and memory. */
static int gpu_nvml_bind(void *lib, gpu_nvml_t *nvml) {
  *(void **)&nvml->init = dlsym(lib, "nvmlInit_v2");
  *(void **)&nvml->shutdown = dlsym(lib, "nvmlShutdown");
  *(void **)&nvml->count = dlsym(lib, "nvmlDeviceGetCount_v2");
  *(void **)&nvml->handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&nvml->name = dlsym(lib, "nvmlDeviceGetName");
  *(void **)&nvml->memory = dlsym(lib, "nvmlDeviceGetMemoryInfo");
  *(void **)&nvml->uuid = dlsym(lib, "nvmlDeviceGetUUID");
  return nvml->init && nvml->shutdown && nvml->count && nvml->handle && nvml->name && nvml->memory
             ? 0
             : -1;
}

/* Fills *gpu with what NVML says of device `i`; what it cannot say stays unknown. */
static void gpu_nvml_describe(const gpu_nvml_t *nvml, gpu_nvml_device_t dev, unsigned int i,
                              node_gpu_t *gpu) {
  gpu_nvml_memory_t mem;
  gpu->index = (int)i;
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
        if (nvml.handle(i, &dev) == 0)
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

/* Keeps `text` as the GPU's UUID when it is one ("[N/A]" and the like are not). */
static void gpu_set_uuid(node_gpu_t *gpu, const char *text) {
  if (strncmp(text, "GPU-", 4) == 0)
    snprintf(gpu->uuid, sizeof gpu->uuid, "%s", text);
  else
    gpu->uuid[0] = '\0';
}

/*
 * Splits one CSV line of --query-gpu into fields[0..left+2]: `left` fields cut
 * at the first commas, the last two at the last commas, and the name, all that
 * lies between, in fields[left].  So a name with a comma in it stays whole
 * (no other field can hold one).  Returns -1 when the line has too few commas.
 */
static int gpu_split_query(char *line, int left, char **fields) {
  char *rest = line;
  for (int k = 0; k < left; k++) {
    char *comma = strchr(rest, ',');
    if (comma == NULL)
      return -1;
    *comma = '\0';
    fields[k] = gpu_trim(rest);
    rest = comma + 1;
  }
  for (int k = 0; k < 2; k++) {
    char *comma = strrchr(rest, ',');
    if (comma == NULL)
      return -1;
    *comma = '\0';
    fields[left + 2 - k] = gpu_trim(comma + 1);
  }
  fields[left] = gpu_trim(rest);
  return 0;
}

/*
 * Parses --query-gpu lines, "0, GPU-a159..., NVIDIA H100, 81559, 80000" (with
 * `with_uuid`) or "0, NVIDIA H100, 81559, 80000"; 0 when every line parsed.
 */
static int gpu_parse_query(char *text, int with_uuid, node_gpus_t *out) {
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    char *fields[5];
    int left = with_uuid ? 2 : 1;
    if (*gpu_trim(line) == '\0')
      continue;
    if (gpu_split_query(line, left, fields) != 0 || out->count >= NODE_MAX_GPUS)
      return -1;
    char *end;
    long index = strtol(fields[0], &end, 10);
    if (*end != '\0' || end == fields[0] || index < 0)
      return -1;
    node_gpu_t *gpu = &out->gpus[out->count++];
    gpu->index = (int)index;
    gpu_set_uuid(gpu, with_uuid ? fields[1] : "");
    snprintf(gpu->name, sizeof gpu->name, "%s", fields[left]);
    gpu->memory_total_mb = gpu_parse_mb(fields[left + 1]);
    gpu->memory_free_mb = gpu_parse_mb(fields[left + 2]);
  }
  return 0;
}

/* Parses `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)".  The
 * indented "MIG ... (UUID: MIG-...)" lines under a GPU are not GPUs: skipped. */
static void gpu_parse_list(char *text, node_gpus_t *out) {
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    int index = -1, used = 0;
    if (sscanf(line, "GPU %d: %n", &index, &used) < 1 || used == 0 || index < 0 ||
        out->count >= NODE_MAX_GPUS)
      continue;
    node_gpu_t *gpu = &out->gpus[out->count++];
    gpu->index = index;
    char *name = line + used, *uuid = strstr(name, " (UUID:");
    gpu->uuid[0] = '\0';
    if (uuid) {
      *uuid = '\0';
      char *close = strchr(uuid + 1, ')');
      if (close)
        *close = '\0';
      gpu_set_uuid(gpu, gpu_trim(uuid + strlen(" (UUID:")));
    }
    snprintf(gpu->name, sizeof gpu->name, "%s", gpu_trim(name));
    gpu->memory_total_mb = gpu->memory_free_mb = -1;
  }
}

/*
 * Asks nvidia-smi's --query-gpu with `fields` (parsed by gpu_parse_query with
 * `with_uuid`); 0 with *out filled, -1 with *out emptied when it did not
 * answer, -2 when it hung (asking it again would only hang again).
 */
static int gpu_from_query(const char *fields, int with_uuid, node_gpus_t *out) {
  char option[128];
  snprintf(option, sizeof option, "--query-gpu=%s", fields);
  char *query[] = {"nvidia-smi", option, "--format=csv,noheader,nounits", NULL};
  int hung = 0;
  char *text = gpu_run_smi(query, &hung);
  int rc = text && gpu_parse_query(text, with_uuid, out) == 0 ? 0 : hung ? -2 : -1;
  free(text);
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
  /* An nvidia-smi that does not know the uuid field still gives memory. */
  int rc = gpu_from_query("index,uuid,name,memory.total,memory.free", 1, out);
  if (rc == -1)
    rc = gpu_from_query("index,name,memory.total,memory.free", 0, out);
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

/*
 * Writes "0 GPU-aaaa..., 1 GPU-bbbb..." into buf: the index and UUID of each
 * GPU of *gpus whose UUID starts with `prefix` ("" for all); returns how many.
 * A list too long for buf ends with "...".
 */
static int gpu_list_uuids(const node_gpus_t *gpus, const char *prefix, char *buf, size_t size) {
  size_t at = 0, n = strlen(prefix);
  int matches = 0;
  buf[0] = '\0';
  for (int i = 0; i < gpus->count; i++) {
    const node_gpu_t *gpu = &gpus->gpus[i];
    if (gpu->uuid[0] == '\0' || strncasecmp(gpu->uuid, prefix, n) != 0)
      continue;
    const char *sep = matches++ > 0 ? ", " : "";
    if (at >= size) /* full: "..." written, only counting now */
      continue;
    if (at + sizeof gpu->uuid + 24 >= size) {
      snprintf(buf + at, size - at, "%s...", sep);
      at = size;
    } else {
      at += (size_t)snprintf(buf + at, size - at, "%s%d %s", sep, gpu->index, gpu->uuid);
    }
  }
  return matches;
}

/*
 * Finds the one GPU whose UUID is `uuid` or, as CUDA accepts, starts with it
 * (hex digits in either case); its index, or -1 with err naming the entry and
 * the UUIDs it could have meant.
 */
static int gpu_find_uuid(const node_gpus_t *gpus, const char *uuid, char *err, size_t err_size) {
  int index = -1, matches = 0;
  for (int i = 0; i < gpus->count; i++) {
    const node_gpu_t *gpu = &gpus->gpus[i];
    if (strcasecmp(gpu->uuid, uuid) == 0)
      return gpu->index; /* a whole UUID, even if another one starts with it */
    if (strncasecmp(gpu->uuid, uuid, strlen(uuid)) == 0) {
      matches++;
      index = gpu->index;
    }
  }
  if (matches == 1)
    return index;
  char found[1536];
  if (matches > 1) {
    gpu_list_uuids(gpus, uuid, found, sizeof found);
    snprintf(err, err_size, "'%s' matches %d GPUs (%s); give more of the UUID, or the index", uuid,
             matches, found);
  } else if (gpu_list_uuids(gpus, "", found, sizeof found) > 0) {
    snprintf(err, err_size,
             "'%s' matches no GPU of this machine; its GPUs are %s (name them by index or UUID)",
             uuid, found);
  } else {
    snprintf(err, err_size,
             "'%s' matches no GPU of this machine: detection (%s) found %d GPUs and no UUIDs; "
             "name GPUs by index instead",
             uuid, gpus->source ? gpus->source : "none", gpus->count);
  }
  return -1;
}

/* The index `entry` of the GPU list `list` names, or -1 with err saying why it names none. */
static int gpu_parse_entry(const node_gpus_t *gpus, const char *entry, const char *list, char *err,
                           size_t err_size) {
  if (strncmp(entry, "GPU-", 4) == 0 && entry[4] != '\0')
    return gpu_find_uuid(gpus, entry, err, err_size);
  if (strncmp(entry, "MIG-", 4) == 0) {
    snprintf(err, err_size,
             "'%s' is a MIG instance: MIG instances are not supported; name whole GPUs, "
             "by index or UUID (nvidia-smi -L lists them)",
             entry);
    return -1;
  }
  char *end;
  long index = strtol(entry, &end, 10);
  if (end != entry && *end == '\0' && index >= 0 && index < 1000000)
    return (int)index;
  if (strcmp(entry, list) == 0)
    snprintf(err, err_size, "'%s' is not a list of GPU indexes or UUIDs such as 0,2 or GPU-8f1c",
             list);
  else
    snprintf(err, err_size,
             "'%s' is not a list of GPU indexes or UUIDs such as 0,2 or GPU-8f1c: '%s' is neither",
             list, entry);
  return -1;
}

/* Parses "0,GPU-8f1c" into `wanted` (indexes); -1 with err when an entry names no GPU. */
static int gpu_parse_only(const node_gpus_t *gpus, const char *only, int *wanted, int *count,
                          char *err, size_t err_size) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s", only);
  *count = 0;
  for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
    if (*count >= NODE_MAX_GPUS) {
      snprintf(err, err_size, "'%s' names more than %d GPUs", only, NODE_MAX_GPUS);
      return -1;
    }
    int index = gpu_parse_entry(gpus, gpu_trim(f), only, err, err_size);
    if (index < 0)
      return -1;
    wanted[(*count)++] = index;
  }
  return 0;
}

int gpu_filter(node_gpus_t *gpus, const char *only, int64_t min_memory_mb, char *err,
               size_t err_size) {
  int wanted[NODE_MAX_GPUS], nwanted = -1; /* -1: every GPU */
  if (only != NULL) {
    char trimmed[512];
    snprintf(trimmed, sizeof trimmed, "%s", only);
    const char *t = gpu_trim(trimmed);
    if (t[0] == '\0' || strcmp(t, "-1") == 0 || strcmp(t, "none") == 0) {
      gpus->count = 0;
      return 1;
    } else if (gpu_parse_only(gpus, t, wanted, &nwanted, err, err_size) != 0) {
      return -1;
    }
  }
  int kept = 0;
  for (int i = 0; i < gpus->count; i++) {
    const node_gpu_t *gpu = &gpus->gpus[i];
    int listed = nwanted < 0;
    for (int k = 0; k < nwanted && !listed; k++)
      listed = wanted[k] == gpu->index;
    int big =
        min_memory_mb <= 0 || gpu->memory_total_mb < 0 || gpu->memory_total_mb >= min_memory_mb;
    if (listed && big)
      gpus->gpus[kept++] = *gpu;
  }
  gpus->count = kept;
  return 0;
}
