/*
 * plan.c — how many workers a node agent starts, and on which GPUs.
 *
 * At start the agent detects the machine's GPUs (gpu.c), keeps those that
 * --gpus or CUDA_VISIBLE_DEVICES name and that have --min-gpu-memory, and
 * starts one worker per GPU or MIG instance kept.  It never runs GPU work on
 * CPUs unasked: GPUs found but none kept, or GPUs named on a machine with
 * none, start no workers and say why; only a machine without GPUs, or
 * `--gpus none`, gets the CPU workers.  Every decision is logged in one line
 * a person can act on (docs/node.md "GPU detection").
 */
#include "node/agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints what detection found and kept: "GPU detection (nvml): 1 found, 1
 * used: 0 (NVIDIA H100 80GB HBM3, 81559 MiB, GPU-a1599801)", a MIG instance as
 * "0:1 (NVIDIA A100-SXM4-40GB MIG 1g.5gb, 4864 MiB, MIG-c6d4f1ef)".  The memory
 * is left out where the source does not say (nvidia-smi -L), the UUID where it
 * does not say, and cut to its first 8 hex digits, enough to tell GPUs apart.
 * A GPU in MIG mode without instances is said apart: no worker can use it. */
static void plan_log_gpus(node_agent_t *a, int detected) {
  char list[1536] = "", label[24];
  size_t at = 0;
  for (int i = 0; i < a->gpus.count && at + 256 < sizeof list; i++) {
    const node_gpu_t *g = &a->gpus.gpus[i];
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%s (%s", i ? ", " : "",
                           gpu_label(g, label), g->name);
    if (g->memory_total_mb >= 0)
      at += (size_t)snprintf(list + at, sizeof list - at, ", %lld MiB",
                             (long long)g->memory_total_mb);
    if (g->uuid[0] != '\0')
      at += (size_t)snprintf(list + at, sizeof list - at, ", %.12s", g->uuid);
    at += (size_t)snprintf(list + at, sizeof list - at, ")");
  }
  agent_log(a, "GPU detection (%s): %d found, %d used%s%s", a->gpus.source, detected, a->gpus.count,
            a->gpus.count ? ": " : "", list);
  for (int i = 0; i < a->gpus.nidle_mig; i++)
    agent_log(a,
              "GPU %d is in MIG mode and has no MIG instance: no worker can use it (create "
              "instances with nvidia-smi mig -cgi PROFILES -C, or turn MIG mode off)",
              a->gpus.idle_mig[i]);
}

/* GPUs were found but the filters kept none: says which filters, since
 * running GPU work on CPUs instead would be a surprise, and how to ask for
 * CPU workers. */
static void plan_log_none_kept(node_agent_t *a, int detected, const char *only) {
  char why[512] = "";
  if (only != NULL)
    snprintf(why, sizeof why, "%s%s", a->cfg->gpus ? "--gpus " : "CUDA_VISIBLE_DEVICES=", only);
  if (a->cfg->min_gpu_memory_mb > 0)
    snprintf(why + strlen(why), sizeof why - strlen(why), "%s--min-gpu-memory %lld",
             why[0] ? " and " : "", (long long)a->cfg->min_gpu_memory_mb);
  char found[64] = "the one GPU found does not pass";
  if (detected > 1)
    snprintf(found, sizeof found, "none of the %d GPUs found passes", detected);
  agent_log(a,
            "%s %s: starting no workers (use --gpus to name GPUs of this machine, or "
            "--gpus none for CPU workers)",
            found, why);
}

/*
 * How many workers: one per GPU or MIG instance kept; none when GPUs are here
 * but none was kept, or `--gpus` names GPUs on a machine without any (GPU work
 * is not run on CPUs unasked); else the CPU workers.  `kept_rc` is
 * gpu_filter's (1: no GPU asked for).
 */
static int plan_count_workers(node_agent_t *a, int detected, const char *only, int kept_rc) {
  const node_config_t *cfg = a->cfg;
  int cpu_workers = (int)(cfg->cpu_workers > 0 ? cfg->cpu_workers : a->cpus);
  if (cfg->queue == NULL)
    return 0;
  if (a->gpus.count > 0)
    return a->gpus.count;
  if (kept_rc == 1)
    return cpu_workers;
  if (detected > 0) {
    plan_log_none_kept(a, detected, only);
    return 0;
  }
  if (a->gpus.nidle_mig > 0) {
    agent_log(a, "starting no workers (use --gpus none for CPU workers)");
    return 0;
  }
  if (cfg->gpus != NULL) {
    agent_log(a,
              "--gpus %s names GPUs, but detection (%s) found none on this machine: starting "
              "no workers (use --gpus none for CPU workers)",
              cfg->gpus, a->gpus.source);
    return 0;
  }
  if (only != NULL)
    agent_log(a,
              "CUDA_VISIBLE_DEVICES=%s names GPUs, but detection (%s) found none on this "
              "machine: CPU workers",
              only, a->gpus.source);
  return cpu_workers;
}

int plan_workers(node_agent_t *a) {
  const node_config_t *cfg = a->cfg;
  gpu_detect(&a->gpus);
  int detected = a->gpus.count;
  const char *only = cfg->gpus ? cfg->gpus : getenv("CUDA_VISIBLE_DEVICES");
  char err[2048]; /* room for the UUIDs of many GPUs */
  int rc = gpu_filter(&a->gpus, only, cfg->min_gpu_memory_mb, err, sizeof err);
  if (rc < 0) {
    agent_log(a, "%s%s", cfg->gpus ? "--gpus: " : "CUDA_VISIBLE_DEVICES: ", err);
    return -2;
  }
  plan_log_gpus(a, detected);
  a->nworkers = plan_count_workers(a, detected, only, rc);
  if (a->nworkers > NODE_MAX_WORKERS)
    a->nworkers = NODE_MAX_WORKERS;
  a->workers = calloc(a->nworkers > 0 ? (size_t)a->nworkers : 1, sizeof *a->workers);
  if (a->workers == NULL)
    return -1;
  for (int i = 0; i < a->nworkers; i++) {
    a->workers[i] = (node_worker_t){.agent = a, .slot = i, .report_fd = -1};
    if (a->gpus.count > 0)
      a->workers[i].gpu = &a->gpus.gpus[i];
  }
  return 0;
}
