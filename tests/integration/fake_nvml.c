/*
 * fake_nvml.c — a stand-in for libnvidia-ml.so.1 that the node tests load
 * through MUSTER_NVML_LIBRARY, so that NVML's MIG calls can be tested on
 * machines without a GPU.  It describes one fixed machine:
 *
 *   GPU 0  Fake A100 80GB  in MIG mode, instances 0 (1g.10gb) and 2 (3g.40gb);
 *          slot 1 is free, as after `nvidia-smi mig -dci/-dgi` of the middle one
 *   GPU 1  Fake H100       MIG mode off
 *   GPU 2  Fake A30        in MIG mode without instances
 *
 * Only the calls src/node/gpu.c makes are here, with NVML's signatures.
 */
#include <stdio.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7

typedef struct fake_device {
  const char *name, *uuid;
  unsigned long long total_mb, free_mb;
  int mig_mode;                     /* 1: MIG mode on */
  const struct fake_device *mig[3]; /* instances by slot; NULL: a free slot */
} fake_device_t;

typedef struct {
  unsigned long long total, free, used;
} fake_memory_t;

static const fake_device_t fake_small = {"Fake A100 80GB MIG 1g.10gb",
                                         "MIG-5a2e1111-1111-5111-8111-111111111111",
                                         9728,
                                         9700,
                                         0,
                                         {NULL}};
static const fake_device_t fake_large = {"Fake A100 80GB MIG 3g.40gb",
                                         "MIG-5a2e2222-2222-5222-8222-222222222222",
                                         40192,
                                         40000,
                                         0,
                                         {NULL}};
static const fake_device_t fake_gpus[] = {
    {"Fake A100 80GB",
     "GPU-0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a",
     81920,
     80000,
     1,
     {&fake_small, NULL, &fake_large}},
    {"Fake H100", "GPU-0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b", 81559, 81000, 0, {NULL}},
    {"Fake A30", "GPU-0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c", 24576, 24000, 1, {NULL}},
};
#define FAKE_GPUS (sizeof fake_gpus / sizeof fake_gpus[0])

int nvmlInit_v2(void) {
  return NVML_SUCCESS;
}
int nvmlShutdown(void) {
  return NVML_SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
  *count = FAKE_GPUS;
  return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, const fake_device_t **dev) {
  if (i >= FAKE_GPUS)
    return NVML_ERROR_INVALID_ARGUMENT;
  *dev = &fake_gpus[i];
  return NVML_SUCCESS;
}

static int fake_copy(const char *text, char *buf, unsigned int size) {
  if (strlen(text) >= size)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(buf, text, strlen(text) + 1);
  return NVML_SUCCESS;
}

int nvmlDeviceGetName(const fake_device_t *dev, char *buf, unsigned int size) {
  return fake_copy(dev->name, buf, size);
}

int nvmlDeviceGetUUID(const fake_device_t *dev, char *buf, unsigned int size) {
  return fake_copy(dev->uuid, buf, size);
}

int nvmlDeviceGetMemoryInfo(const fake_device_t *dev, fake_memory_t *mem) {
  mem->total = dev->total_mb << 20;
  mem->free = dev->free_mb << 20;
  mem->used = mem->total - mem->free;
  return NVML_SUCCESS;
}

int nvmlDeviceGetMigMode(const fake_device_t *dev, unsigned int *current, unsigned int *pending) {
  *current = *pending = (unsigned int)dev->mig_mode;
  return NVML_SUCCESS;
}

int nvmlDeviceGetMaxMigDeviceCount(const fake_device_t *dev, unsigned int *count) {
  *count = dev->mig_mode ? 3 : 0;
  return NVML_SUCCESS;
}

int nvmlDeviceGetMigDeviceHandleByIndex(const fake_device_t *dev, unsigned int i,
                                        const fake_device_t **instance) {
  if (!dev->mig_mode || i >= 3)
    return NVML_ERROR_INVALID_ARGUMENT;
  if (dev->mig[i] == NULL)
    return NVML_ERROR_NOT_FOUND;
  *instance = dev->mig[i];
  return NVML_SUCCESS;
}
