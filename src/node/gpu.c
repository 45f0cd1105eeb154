/*
 * gpu.c — finding the machine's NVIDIA GPUs without NVIDIA software at build time.
 *
 * Sources, in order: NVML (libnvidia-ml.so.1, the library nvidia-smi itself
 * uses) loaded with dlopen(), so the binary builds and runs where it is
 * absent; `nvidia-smi --query-gpu=index,name,memory.total,memory.free
 * --format=csv,noheader,nounits`; `nvidia-smi -L` (names only); none.  NVML
 * and nvidia-smi both number GPUs in PCI bus order, which is why workers get
 * CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA's own default order ("fastest first")
 * could give index 0 another meaning.  nvidia-smi is run without a shell and
 * with a deadline, so a hung driver cannot hang the agent.
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
} gpu_nvml_t;

/* Looks up every symbol; 0 when all are there. */
static int gpu_nvml_bind(void *lib, gpu_nvml_t *nvml) {
  *(void **)&nvml->init = dlsym(lib, "nvmlInit_v2");
  *(void **)&nvml->shutdown = dlsym(lib, "nvmlShutdown");
  *(void **)&nvml->count = dlsym(lib, "nvmlDeviceGetCount_v2");
  *(void **)&nvml->handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&nvml->name = dlsym(lib, "nvmlDeviceGetName");
  *(void **)&nvml->memory = dlsym(lib, "nvmlDeviceGetMemoryInfo");
  return nvml->init && nvml->shutdown && nvml->count && nvml->handle && nvml->name && nvml->memory
             ? 0
             : -1;
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
        gpu_nvml_memory_t mem;
        if (nvml.handle(i, &dev) != 0)
          continue;
        node_gpu_t *gpu = &out->gpus[out->count++];
        gpu->index = (int)i;
        if (nvml.name(dev, gpu->name, sizeof gpu->name) != 0)
          snprintf(gpu->name, sizeof gpu->name, "GPU %u", i);
        gpu->memory_total_mb = gpu->memory_free_mb = -1;
        if (nvml.memory(dev, &mem) == 0) {
          gpu->memory_total_mb = (int64_t)(mem.total >> 20);
          gpu->memory_free_mb = (int64_t)(mem.free >> 20);
        }
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
 * or NULL when it is not there, fails or times out.
 */
static char *gpu_run_smi(char *const args[]) {
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

/* Parses "0, NVIDIA H100, 81559, 80000" lines; 0 when every line parsed. */
static int gpu_parse_query(char *text, node_gpus_t *out) {
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    char *fields[4];
    int n = 0;
    for (char *s2 = NULL, *f = strtok_r(line, ",", &s2); f && n < 4; f = strtok_r(NULL, ",", &s2))
      fields[n++] = gpu_trim(f);
    if (n == 0 || (n == 1 && fields[0][0] == '\0'))
      continue;
    char *end;
    long index = strtol(fields[0], &end, 10);
    if (n < 2 || *end != '\0' || end == fields[0] || index < 0 || out->count >= NODE_MAX_GPUS)
      return -1;
    node_gpu_t *gpu = &out->gpus[out->count++];
    gpu->index = (int)index;
    snprintf(gpu->name, sizeof gpu->name, "%s", fields[1]);
    gpu->memory_total_mb = n > 2 ? gpu_parse_mb(fields[2]) : -1;
    gpu->memory_free_mb = n > 3 ? gpu_parse_mb(fields[3]) : -1;
  }
  return 0;
}

/* Parses `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)". */
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
    if (uuid)
      *uuid = '\0';
    snprintf(gpu->name, sizeof gpu->name, "%s", gpu_trim(name));
    gpu->memory_total_mb = gpu->memory_free_mb = -1;
  }
}

void gpu_detect(node_gpus_t *out) {
  memset(out, 0, sizeof *out);
  if (gpu_from_nvml(out) == 0) {
    out->source = "nvml";
    return;
  }
  char *query[] = {"nvidia-smi", "--query-gpu=index,name,memory.total,memory.free",
                   "--format=csv,noheader,nounits", NULL};
  char *text = gpu_run_smi(query);
  if (text && gpu_parse_query(text, out) == 0) {
    free(text);
    out->source = "nvidia-smi";
    return;
  }
  free(text);
  out->count = 0;
  char *list[] = {"nvidia-smi", "-L", NULL};
  if ((text = gpu_run_smi(list)) != NULL) {
    gpu_parse_list(text, out);
    free(text);
    out->source = "nvidia-smi -L";
    return;
  }
  out->source = "none";
}

/* Parses "0,2" into `wanted` (indexes); -1 when an element is not an index. */
static int gpu_parse_only(const char *only, int *wanted, int *count) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s", only);
  *count = 0;
  for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
    char *end, *text = gpu_trim(f);
    long index = strtol(text, &end, 10);
    if (end == text || *end != '\0' || index < 0 || *count >= NODE_MAX_GPUS)
      return -1;
    wanted[(*count)++] = (int)index;
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
    } else if (gpu_parse_only(t, wanted, &nwanted) != 0) {
      snprintf(err, err_size, "'%s' is not a list of GPU indexes such as 0,2", only);
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
