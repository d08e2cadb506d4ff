#!/usr/bin/env python3
"""End-to-end: the CUDA backend through the daemon, with or without a GPU.

Without a usable device (no GPU, or no driver, or "driver version is insufficient", as on the build
machines): `load --backend cuda` is refused with the CUDA runtime's reason, so are `cuda:N` and a bad
INFERD_CUDA_MATMUL value (naming the variable), nothing of the refused models stays, and the daemon keeps
serving: a CPU load and a generation work after each refusal. With a device: the model loads on it,
`status` names the device and the upload, greedy output is the same twice and through a cuda,cpu
pipeline (`--layer-split 15 --stage-backends cuda,cpu`) completes. Which case applies is decided by the
first load's answer; each case asserts its own outcome.

    test_cuda.py --bin-dir BUILD/bin --model MODEL.gguf

Exits 77 (skipped) when the worker was built without the CUDA backend.
"""
import os
import sys

import harness
from harness import Connection, request, run_async

PROMPT = "The capital of France is"
N_TOKENS = 16
CONTEXT = 256
NO_DEVICE = "no CUDA device"


def worker_has_cuda(bin_dir):
    """Whether inferd-worker was built with the CUDA backend (its registry names the family)."""
    try:
        with open(os.path.join(bin_dir, "inferd-worker"), "rb") as f:
            return b"no CUDA device" in f.read()
    except OSError:
        return False


class CudaTest(harness.DaemonTestCase):

    def test_cuda_load_with_or_without_a_device(self):
        daemon = harness.Daemon(threads=2, env={"INFERD_CUDA_MATMUL": "gemv"}).start()
        self.addCleanup(daemon.stop)

        async def serves(conn, context):
            """A CPU model loads and generates: the daemon kept serving."""
            await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, backend="cpu")
            out = await conn.generate(request("cpu", PROMPT, max_tokens=N_TOKENS, temperature=0.0))
            self.assertCompleted(out, context)
            await conn.unload("cpu")

        async def body():
            conn = await Connection.open(daemon.socket_path)
            try:
                await conn.load(harness.Config.model, id="gpu", contextSize=CONTEXT, parallel=2, backend="cuda")
                have_device = True
            except Exception as e:  # noqa: BLE001 - the refusal is the no-device case's assertion
                self.assertKjError(e, "FAILED", NO_DEVICE, context="load --backend cuda without a device")
                have_device = False
            st = await conn.status()
            if not have_device:
                self.assertNotIn("gpu", [m.info.id for m in st.models], "a refused load must leave nothing")
                await serves(conn, "a CPU model after the CUDA refusal")
                await self.expect_error(conn.load(harness.Config.model, id="gpu9", contextSize=CONTEXT,
                                                  backend="cuda:9"),
                                        "FAILED", NO_DEVICE, context="cuda:9 without a device")
                await self.expect_error(conn.load(harness.Config.model, id="gpux", contextSize=CONTEXT,
                                                  backend="cuda:x"),
                                        "FAILED", "unknown backend", context="a malformed CUDA device index")
                await serves(conn, "a CPU model after the second refusal")
                conn.close()
                return
            model = next(m for m in st.models if m.info.id == "gpu")
            device = model.info.workers[0].device
            self.assertTrue(device.startswith("CUDA: "), device)
            self.assertIn("uploaded", device)
            a = await conn.generate(request("gpu", PROMPT, max_tokens=N_TOKENS, temperature=0.0, ignoreEog=True))
            b = await conn.generate(request("gpu", PROMPT, max_tokens=N_TOKENS, temperature=0.0, ignoreEog=True))
            self.assertCompleted(a, "greedy on the GPU")
            self.assertEqual(a.text, b.text, "greedy output on the GPU must repeat")
            await conn.load(harness.Config.model, id="gpu-cpu", contextSize=CONTEXT, layerSplit=[15],
                            stageBackends=["cuda", "cpu"])
            c = await conn.generate(request("gpu-cpu", PROMPT, max_tokens=N_TOKENS, temperature=0.0, ignoreEog=True))
            self.assertCompleted(c, "greedy through a cuda,cpu pipeline")
            await serves(conn, "a CPU model beside the GPU ones")
            conn.close()

        run_async(body(), daemons=[daemon])

    def test_a_bad_setting_is_refused_naming_the_variable(self):
        daemon = harness.Daemon(threads=2, env={"INFERD_CUDA_MATMUL": "fastest"}).start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await self.expect_error(conn.load(harness.Config.model, id="gpu", contextSize=CONTEXT, backend="cuda"),
                                    "FAILED", "INFERD_CUDA_MATMUL", context="a bad INFERD_CUDA_MATMUL")
            await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, backend="cpu")
            out = await conn.generate(request("cpu", PROMPT, max_tokens=N_TOKENS, temperature=0.0))
            self.assertCompleted(out, "a CPU model after the refusal")
            conn.close()

        run_async(body(), daemons=[daemon])


if __name__ == "__main__":
    bin_dir = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--bin-dir"), None)
    if bin_dir and not worker_has_cuda(bin_dir):
        print("SKIP: inferd-worker is built without the CUDA backend", file=sys.stderr)
        sys.exit(harness.SKIP_RETURN_CODE)
    harness.main()
