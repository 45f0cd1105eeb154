"""Node agent and MIG: a GPU in MIG mode runs CUDA work only on its MIG instances, so
the agent starts one worker per instance and gives it the instance's UUID.  Detection
through NVML (fake_nvml.c, loaded as MUSTER_NVML_LIBRARY) and through nvidia-smi (a fake
script), `--gpus` naming instances, and GPUs in MIG mode without instances."""
import os
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
import test_node  # noqa: E402
from test_node import NodeTestCase  # noqa: E402

# The machine fake_nvml.c describes: GPU 0 in MIG mode with instances 0 and 2, GPU 1
# without MIG, GPU 2 in MIG mode without instances.
SMALL = "MIG-5a2e1111-1111-5111-8111-111111111111"
LARGE = "MIG-5a2e2222-2222-5222-8222-222222222222"
GPU0 = "GPU-0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"
GPU1 = "GPU-0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
GPU2 = "GPU-0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c"
IDLE = ("GPU 2 is in MIG mode and has no MIG instance: no worker can use it (create "
        "instances with nvidia-smi mig -cgi PROFILES -C, or turn MIG mode off)")

# The same machine as nvidia-smi shows it: --query-gpu gives the MIG mode, `-L` the
# instances (here the second in the older form of instance UUIDs, as drivers before
# R470 print them).
OLD_LARGE = "MIG-" + GPU0 + "/2/0"
FAKE_SMI_MIG = textwrap.dedent("""\
    #!/bin/sh
    case "$*" in
      *--query-gpu=index,uuid,name,memory.total,memory.free,mig.mode.current\\ *)
        echo "0, %(g0)s, Fake A100 80GB, 81920, 80000, Enabled"
        echo "1, %(g1)s, Fake H100, 81559, 81000, Disabled"
        echo "2, %(g2)s, Fake A30, 24576, 24000, Enabled" ;;
      -L)
        echo "GPU 0: Fake A100 80GB (UUID: %(g0)s)"
        echo "  MIG 1g.10gb     Device  0: (UUID: %(small)s)"
        echo "  MIG 3g.40gb     Device  2: (UUID: %(large)s)"
        echo "GPU 1: Fake H100 (UUID: %(g1)s)"
        echo "GPU 2: Fake A30 (UUID: %(g2)s)" ;;
      *) exit 1 ;;
    esac
    """) % {"g0": GPU0, "g1": GPU1, "g2": GPU2, "small": SMALL, "large": OLD_LARGE}
# One GPU, in MIG mode without instances.
FAKE_SMI_IDLE = textwrap.dedent("""\
    #!/bin/sh
    case "$*" in
      *--query-gpu=index,uuid,name,memory.total,memory.free,mig.mode.current\\ *)
        echo "0, %(g2)s, Fake A30, 24576, 24000, Enabled" ;;
      -L) echo "GPU 0: Fake A30 (UUID: %(g2)s)" ;;
      *) exit 1 ;;
    esac
    """) % {"g2": GPU2}


class MigTest(NodeTestCase):
    def nvml_env(self):
        return {"MUSTER_NVML_LIBRARY": os.path.join(node_harness.build_dir(),
                                                    "libfake_nvml.so")}

    def workers_env(self, agent, count):
        """(CUDA_VISIBLE_DEVICES, MUSTER_GPU) of the agent's `count` workers, sorted."""
        pids = self.wait_workers(agent, count)
        envs = [node_harness.environ_of(p) for p in pids]
        for e in envs:
            self.assertEqual(e.get("CUDA_DEVICE_ORDER"), "PCI_BUS_ID")
        return sorted((e.get("CUDA_VISIBLE_DEVICES"), e.get("MUSTER_GPU")) for e in envs)

    def start(self, name, args=(), env=None, script=None):
        env = dict(env if env is not None else self.nvml_env())
        if script is not None:
            env.update(self.fake_smi_env(script))
        a = self.agent(name, args=["--queue", "gpu"] + list(args), env=env, cmd=["true"])
        a.start()
        return a

    def test_one_worker_per_instance_through_nvml(self):
        self.make_queue("gpu")
        a = self.start("mig1")
        self.assertEqual(self.workers_env(a, 3),
                         [("1", "1"), (SMALL, "0:0"), (LARGE, "0:2")])
        log = a.log()
        self.assertIn("GPU detection (nvml): 3 found, 3 used: "
                      "0:0 (Fake A100 80GB MIG 1g.10gb, 9728 MiB, MIG-5a2e1111), "
                      "0:2 (Fake A100 80GB MIG 3g.40gb, 40192 MiB, MIG-5a2e2222), "
                      "1 (Fake H100, 81559 MiB, GPU-0b0b0b0b)\n", log)
        self.assertIn(IDLE, log)
        # The head's record tells an instance by its "mig" number; the UUIDs stay here.
        self.assertEqual(self.node("mig1")["gpus"], [
            {"index": 0, "mig": 0, "name": "Fake A100 80GB MIG 1g.10gb",
             "memory_total_mb": 9728, "memory_free_mb": 9700},
            {"index": 0, "mig": 2, "name": "Fake A100 80GB MIG 3g.40gb",
             "memory_total_mb": 40192, "memory_free_mb": 40000},
            {"index": 1, "name": "Fake H100", "memory_total_mb": 81559,
             "memory_free_mb": 81000}])

    def test_one_worker_per_instance_through_nvidia_smi(self):
        self.make_queue("gpu")
        env = {"MUSTER_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"}
        a = self.start("mig2", env=env, script=FAKE_SMI_MIG)
        self.assertEqual(self.workers_env(a, 3),
                         sorted([("1", "1"), (SMALL, "0:0"), (OLD_LARGE, "0:2")]))
        self.assertIn("GPU detection (nvidia-smi): 3 found, 3 used: "
                      "0:0 (Fake A100 80GB MIG 1g.10gb, MIG-5a2e1111), "
                      "0:2 (Fake A100 80GB MIG 3g.40gb, MIG-GPU-0a0a), "
                      "1 (Fake H100, 81559 MiB, GPU-0b0b0b0b)\n", a.log())
        self.assertIn(IDLE, a.log())

    def test_instances_from_nvidia_smi_list_alone(self):
        # Where only `nvidia-smi -L` answers, a GPU listed with instances is replaced by
        # them (names and UUIDs; no memory).
        self.make_queue("gpu")
        env = {"MUSTER_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"}
        a = self.start("list1", env=env, script=test_node.FAKE_SMI_LIST_ONLY)
        instance = "MIG-0d1e2f3a-4b5c-5d6e-8f7a-8b9c0d1e2f3a"
        self.assertEqual(self.workers_env(a, 2), [("1", "1"), (instance, "0:0")])
        self.assertIn("GPU detection (nvidia-smi -L): 2 found, 2 used: "
                      "0:0 (Fake GPU Alpha MIG 1g.10gb, MIG-0d1e2f3a), "
                      "1 (Fake GPU Beta, 8GB, GPU-a1b2c3d4)\n", a.log())

    def test_gpus_names_instances(self):
        # By GPU:INSTANCE, by the instance's UUID or a start of it, or the whole GPU
        # (index or UUID: all its instances); from --gpus or CUDA_VISIBLE_DEVICES.
        self.make_queue("gpu")
        cases = (("pick1", ["--gpus", "0:2"], None, [(LARGE, "0:2")]),
                 ("pick2", ["--gpus", "0"], None, [(SMALL, "0:0"), (LARGE, "0:2")]),
                 ("pick3", ["--gpus", "GPU-0a0a"], None, [(SMALL, "0:0"), (LARGE, "0:2")]),
                 ("pick4", ["--gpus", "MIG-5a2e1"], None, [(SMALL, "0:0")]),
                 ("pick5", [], "1, " + LARGE, [("1", "1"), (LARGE, "0:2")]),
                 ("pick6", ["--min-gpu-memory", "20000"], None, [("1", "1"), (LARGE, "0:2")]))
        for name, args, visible, workers in cases:
            env = self.nvml_env()
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            a = self.start(name, args, env=env)
            self.assertEqual(self.workers_env(a, len(workers)), sorted(workers), name)
            labels = [("%d:%d" % (g["index"], g["mig"])) if "mig" in g else str(g["index"])
                      for g in self.node(name)["gpus"]]
            self.assertEqual(labels, sorted(w[1] for w in workers), name)
            a.stop()

    def test_names_that_keep_no_instance(self):
        # A free instance slot and a GPU in MIG mode without instances name nothing a
        # worker could use: no workers, and the log says why.
        self.make_queue("gpu")
        for name, args, why in (("none1", ["--gpus", "0:1"], "--gpus 0:1"),
                                ("none2", ["--gpus", "2"], "--gpus 2")):
            a = self.start(name, args)
            harness.wait_until(
                lambda: "none of the 3 GPUs found passes %s: starting no workers" % why
                in a.log(), timeout=20, what=lambda: "the refusal:\n" + a.log())
            node = harness.wait_until(lambda: self.node(name), timeout=20,
                                      what=lambda: "the node registered:\n" + a.log())
            self.assertEqual((node["gpus"], node["workers"]), ([], 0))
            self.assertEqual(a.workers(), [])
            a.stop()

    def test_mig_mode_without_instances_starts_no_cpu_workers(self):
        # The machine's one GPU is in MIG mode with no instance: not a machine without
        # GPUs, so `--workers 2` does not turn its GPU work into CPU work.
        self.make_queue("gpu")
        env = {"MUSTER_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"}
        a = self.start("idle1", ["--workers", "2"], env=env, script=FAKE_SMI_IDLE)
        harness.wait_until(lambda: "starting no workers (use --gpus none for CPU workers)"
                           in a.log(), timeout=20, what=lambda: "the refusal:\n" + a.log())
        self.assertIn("GPU detection (nvidia-smi): 0 found, 0 used\n", a.log())
        self.assertIn("GPU 0 is in MIG mode and has no MIG instance", a.log())
        node = harness.wait_until(lambda: self.node("idle1"), timeout=20,
                                  what=lambda: "the node registered:\n" + a.log())
        self.assertEqual(node["workers"], 0)
        self.assertEqual(a.workers(), [])
        a.stop()
        # Asked for CPU workers, it runs them.
        b = self.start("idle2", ["--workers", "2", "--gpus", "none"], env=env,
                       script=FAKE_SMI_IDLE)
        self.assertEqual(len(self.wait_workers(b, 2)), 2)

    def test_instance_names_refused(self):
        both = "0:0 %s, 0:2 %s" % (SMALL, LARGE)
        self.assertIn("--gpus: 'MIG-5a2e' matches 2 MIG instances (%s); give more of the "
                      "UUID, or the GPU:INSTANCE numbers" % both,
                      self.refusal("bad1", ["--gpus", "MIG-5a2e"], env=self.nvml_env()))
        self.assertIn("CUDA_VISIBLE_DEVICES: 'MIG-ffff' matches no MIG instance of this "
                      "machine; its GPUs and MIG instances are %s, 1 %s (name them by index "
                      "or UUID, an instance also as GPU:INSTANCE)" % (both, GPU1),
                      self.refusal("bad2", [], visible="MIG-ffff", env=self.nvml_env()))
        for k, entry in enumerate(("0:", "0:x", ":1", "0:1:2", "-0:1")):
            self.assertIn("--gpus: '%s' is not a list of GPU indexes or UUIDs such as 0,2 or "
                          "GPU-8f1c (a MIG instance: 0:1 or MIG-5a2e)\n" % entry,
                          self.refusal("bad%d" % (k + 3), ["--gpus", entry],
                                       env=self.nvml_env()))


if __name__ == "__main__":
    unittest.main()
