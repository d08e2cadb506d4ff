#!/usr/bin/env python3
"""End-to-end: the OpenCL backend through the daemon — `inferctl load --backend opencl`, the device and
storage in `inferctl status`, greedy generation next to the CPU backend, teacher-forced agreement
through the API, and a bad device index refused without harm. Mixed pipelines (LoadOptions.stageBackends,
like llama.cpp's -ngl): layers 0-14 on OpenCL and 15-29 on the CPU (`inferctl load --layer-split 15
--stage-backends opencl,cpu`) and the reverse, each stage's backend in the placement and the workers,
greedy output equal to the whole model on the CPU; a bad stageBackends is refused and the daemon goes on.
Any model the OpenCL backend runs: ctest runs this file on SmolLM2 and on Gemma 3 270M (inferd_e2e_opencl_gemma3).
The int8 form of the exact matmul's dot products (INFERD_OPENCL_INT_DOT=int8) gives the same text.
Half-precision activations (INFERD_OPENCL_NUMERICS=float INFERD_OPENCL_ACTIVATIONS=f16) show in the
worker's device string and agree with the CPU backend, teacher-forced, at the float numerics' floor; f16
with the exact numerics, and unknown values, fail the load with a clear message and the daemon serves on.

    test_opencl.py --bin-dir BUILD/bin --model MODEL.gguf

Exits 77 (skipped) without an OpenCL device (probed through the ICD loader, as the worker finds them)
or when the worker was built without OpenCL.

What "equal to the CPU backend" means: by default the OpenCL engine runs its exact numerics, which
reproduce the CPU engine's float operations in its order (8-bit activation blocks, integer dot
products combined in the CPU kernels' lane order, ggml's expf, ...), so its logits are the CPU
backend's bit for bit: greedy runs are the same text, and teacher-forced (at every position of the
CPU backend's greedy run the OpenCL backend is given the same context and must pick the same next
token) it agrees everywhere. workers/opencl/cl_engine_test.cpp measures 320/320 positions with a
largest logit difference of 0; here it is checked through the daemon over 32 positions against a
floor of 99% and the greedy texts must be equal. A device without cl_khr_fp64 runs the float
numerics instead (the worker's device string says "numerics float"), whose logits differ from the
CPU backend's by its 8-bit rounding noise: greedy runs part at the first near-tie, and the floor is
90% (they reach about 96%).
"""
import ctypes
import ctypes.util
import os
import subprocess
import sys

import harness
from harness import Connection, request, run_async

PROMPT = "The capital of France is"
N_TOKENS = 32
CONTEXT = 256


def opencl_devices():
    """The number of OpenCL devices the ICD loader reports (0 without a loader or a driver)."""
    name = ctypes.util.find_library("OpenCL")
    if not name:
        return 0
    try:
        cl = ctypes.CDLL(name)
    except OSError:
        return 0
    n_platforms = ctypes.c_uint(0)
    if cl.clGetPlatformIDs(0, None, ctypes.byref(n_platforms)) != 0 or n_platforms.value == 0:
        return 0
    platforms = (ctypes.c_void_p * n_platforms.value)()
    if cl.clGetPlatformIDs(n_platforms.value, platforms, None) != 0:
        return 0
    total = 0
    for p in platforms:
        n = ctypes.c_uint(0)
        if cl.clGetDeviceIDs(ctypes.c_void_p(p), ctypes.c_ulonglong(0xFFFFFFFF), 0, None, ctypes.byref(n)) == 0:
            total += n.value
    return total


async def teacher_forced_agreement(test, conn, model_id, reference_tokens):
    """How many of `reference_tokens` (a greedy run after PROMPT) model `model_id` picks when given the
    reference's own context at each position, one token each."""
    prompt_ids = await conn.tokenize(model_id, PROMPT, True, True)
    agree = 0
    for i, want in enumerate(reference_tokens):
        out = await conn.generate(request(model_id, tokens=prompt_ids + reference_tokens[:i], max_tokens=1,
                                          ignoreEog=True))
        test.assertCompleted(out, f"teacher-forced position {i}")
        agree += out.tokens == [want]
    return agree


def worker_has_opencl(bin_dir):
    """Whether inferd-worker links the OpenCL loader (it does exactly when built with the backend)."""
    try:
        out = subprocess.run(["ldd", os.path.join(bin_dir, "inferd-worker")], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return True  # no ldd: assume so, and let the load say otherwise
    return "libOpenCL" in out


class OpenClTest(harness.DaemonTestCase):
    """One daemon; the CPU and the OpenCL backend hold the same model under two ids."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = harness.Daemon(threads=2).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def run_test(self, coro):
        return run_async(coro, daemons=[self.daemon])

    def inferctl(self, *args):
        out = subprocess.run([os.path.join(harness.Config.bin_dir, "inferctl"), "--socket", self.daemon.socket_path]
                             + list(args), capture_output=True, text=True, timeout=300, check=False)
        self.assertEqual(out.returncode, 0, f"inferctl {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
        return out.stdout

    # ---------------------------------------------------------------------------------------------

    def test_load_status_and_greedy_against_cpu(self):
        # inferctl load --backend opencl, then status shows the device and the storage per tensor kind.
        self.inferctl("load", "--id", "ocl", "--backend", "opencl", "--ctx", str(CONTEXT), "--parallel", "2",
                      harness.Config.model)
        status = self.inferctl("status")
        self.assertIn("OpenCL:", status, f"inferctl status does not show the OpenCL device:\n{status}")
        self.assertIn("storage: weights=", status, f"inferctl status does not show the storage:\n{status}")

        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            m = await conn.model_status("ocl")
            self.assertIsNotNone(m, "status() lacks the OpenCL model")
            self.assertEqual(m.info.state, "ready")
            self.assertEqual([w.backend for w in m.info.workers], ["opencl"])
            device = m.info.workers[0].device
            print(f"\n[opencl] worker device: {device}", file=sys.stderr)
            for fragment in ("OpenCL: ", "driver ", "activations=", "logits=", "kv=", "numerics "):
                self.assertIn(fragment, device, f"the worker's device string lacks {fragment!r}: {device!r}")
            exact = "numerics exact" in device
            self.assertGreater(m.kvBytes, 0, "kvBytes is 0")
            self.assertEqual(harness.process_name(m.info.workers[0].pid), "inferd-worker")

            await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, parallel=2, backend="cpu")
            cpu = await conn.generate(request("cpu", PROMPT, max_tokens=N_TOKENS, ignoreEog=True))
            self.assertCompleted(cpu, "cpu")
            ocl = await conn.generate(request("ocl", PROMPT, max_tokens=N_TOKENS, ignoreEog=True))
            self.assertCompleted(ocl, "opencl")
            self.assertEqual(len(ocl.tokens), N_TOKENS, f"the OpenCL backend stopped early: {ocl}")
            same = sum(a == b for a, b in zip(cpu.tokens, ocl.tokens))
            first = next((i for i, (a, b) in enumerate(zip(cpu.tokens, ocl.tokens)) if a != b), None)
            print(f"[opencl] greedy {N_TOKENS} tokens: cpu {cpu.text!r}", file=sys.stderr)
            print(f"[opencl]                    opencl {ocl.text!r}", file=sys.stderr)
            print(f"[opencl] greedy: {same}/{N_TOKENS} positions equal, first divergence at "
                  f"{'none' if first is None else first}", file=sys.stderr)

            # Teacher-forced through the API: the CPU run's context at each position, one token each.
            agree = await teacher_forced_agreement(self, conn, "ocl", cpu.tokens)
            print(f"[opencl] teacher-forced top-1 agreement through the daemon: {agree}/{N_TOKENS} "
                  f"({'exact' if exact else 'float'} numerics)", file=sys.stderr)
            floor = 0.99 if exact else 0.9
            self.assertGreaterEqual(agree, int(floor * N_TOKENS),
                                    f"the OpenCL backend's next token differs from the CPU backend's at more than "
                                    f"{100 * (1 - floor):.0f}% of the positions of the CPU's greedy run")
            if exact:
                self.assertIsNone(first, "with exact numerics the greedy runs must be the same text")
            if first is not None:
                # Up to the first divergence the runs had the same context: the tokens were equal there
                # by definition; the divergence itself must be one of the teacher-forced disagreements.
                self.assertLess(agree, N_TOKENS, "greedy runs diverged although every forced position agreed")
            await conn.unload("cpu")
            await conn.unload("ocl")
            conn.close()

        self.run_test(body())

    def test_mixed_opencl_and_cpu_stages_equal_the_whole_cpu_model(self):
        self.inferctl("load", "--id", "ocl-cpu", "--ctx", str(CONTEXT), "--parallel", "2", "--layer-split", "15",
                      "--stage-backends", "opencl,cpu", harness.Config.model)
        status = self.inferctl("status")

        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            # The model's layers (30 for SmolLM2, 18 for Gemma 3 270M): the end of the last stage.
            n_layer = (await conn.model_status("ocl-cpu")).info.placement.stages[-1].endLayer
            last = f"layers 15-{n_layer - 1}"
            self.assertIn("opencl:0 layers 0-14", status, f"inferctl status lacks the OpenCL stage:\n{status}")
            self.assertIn(f"cpu:1 {last}", status, f"inferctl status lacks the CPU stage:\n{status}")
            await conn.load(harness.Config.model, id="cpu-whole", contextSize=CONTEXT, parallel=2, backend="cpu")
            await conn.load(harness.Config.model, id="cpu-ocl", contextSize=CONTEXT, parallel=2, layerSplit=[15],
                            stageBackends=["cpu", "opencl"])
            requests = [request(None, PROMPT, max_tokens=N_TOKENS, ignoreEog=True),
                        request(None, "Once upon a time", max_tokens=16, temperature=0.9, seed=5, ignoreEog=True)]
            refs = []
            for r in requests:
                ref = await conn.generate(dict(r, model="cpu-whole"))
                self.assertCompleted(ref, "whole model on the CPU")
                refs.append(ref)
            for model_id, backends in (("ocl-cpu", ["opencl", "cpu"]), ("cpu-ocl", ["cpu", "opencl"])):
                m = await conn.model_status(model_id)
                self.assertIsNotNone(m, f"status() lacks {model_id}")
                self.assertEqual(m.info.state, "ready")
                stages = [(s.worker, s.backend, s.firstLayer, s.endLayer) for s in m.info.placement.stages]
                self.assertEqual(stages, [(0, backends[0], 0, 15), (1, backends[1], 15, n_layer)],
                                 f"{model_id}: placement {m.info.placement}")
                self.assertEqual([w.backend for w in m.info.workers], backends, f"{model_id}: {m.info.workers}")
                ocl = m.info.workers[backends.index("opencl")].device
                self.assertIn("OpenCL: ", ocl, f"{model_id}: the OpenCL stage's device: {ocl!r}")
                self.assertIn("layers 0-14" if backends[0] == "opencl" else last, ocl)
                print(f"\n[opencl] {model_id}: {m.info.placement.summary}; OpenCL stage: {ocl}", file=sys.stderr)
                for i, r in enumerate(requests):
                    out = await conn.generate(dict(r, model=model_id))
                    if "numerics exact" in ocl:
                        self.assertStreamMatches(out, refs[i].tokens,
                                                 f"{model_id} request {i}: the mixed pipeline differs from the CPU")
                    else:  # float numerics differ from the CPU by design (see above)
                        self.assertCompleted(out, f"{model_id} request {i}")

            # Bad stage backends are refused with a clear message, and the daemon goes on serving.
            bad = [(dict(layerSplit=[15], stageBackends=["opencl"]), "stage backends"),
                   (dict(layerSplit=[15], stageBackends=["opencl", "cpu", "cpu"]), "stage backends"),
                   (dict(stageBackends=["opencl", "cpu"]), "stage backends"),
                   (dict(layerSplit=[15], stageBackends=["opencl", "gpu"]), "unknown backend 'gpu'"),
                   (dict(layerSplit=[15], stageBackends=["cpu:1", "cpu"]), "unknown backend 'cpu:1'")]
            for options, fragment in bad:
                await self.expect_error(conn.load(harness.Config.model, id="bad-stages", contextSize=CONTEXT,
                                                  **options),
                                        "FAILED", fragment, context=f"load with {options}")
            st = await conn.status()
            self.assertNotIn("bad-stages", [m.info.id for m in st.models])
            after = await conn.generate(dict(requests[0], model="ocl-cpu"))
            self.assertCompleted(after, "after the refused loads")
            for model_id in ("ocl-cpu", "cpu-ocl", "cpu-whole"):
                await conn.unload(model_id)
            conn.close()

        self.run_test(body())

    def test_bad_device_index_is_refused(self):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            await self.expect_error(conn.load(harness.Config.model, id="ocl-bad", contextSize=CONTEXT,
                                              backend="opencl:999"),
                                    "FAILED", "OpenCL device 999", context="load on a device that does not exist")
            await self.expect_error(conn.load(harness.Config.model, id="ocl-bad2", contextSize=CONTEXT,
                                              backend="opencl:x"),
                                    "FAILED", "unknown backend", context="load with a malformed device index")
            st = await conn.status()
            self.assertNotIn("ocl-bad2", [m.info.id for m in st.models])
            conn.close()

        self.run_test(body())


class OpenClIntDotTest(harness.DaemonTestCase):
    """INFERD_OPENCL_INT_DOT, inherited by the workers: int8 forces the cl_khr_integer_dot_product form of
    the exact matmul (emulated on a device without the extension), which must give the CPU backend's
    greedy text; a bad value fails the load with a message naming the variable, and the daemon serves on."""

    def test_int8_dots_give_the_cpu_backends_text_and_a_bad_value_is_refused(self):
        async def body(daemon, value):
            conn = await Connection.open(daemon.socket_path)
            if value == "bogus":
                await self.expect_error(conn.load(harness.Config.model, id="ocl", contextSize=CONTEXT,
                                                  backend="opencl"),
                                        "FAILED", "INFERD_OPENCL_INT_DOT", context="load with a bad INFERD_OPENCL_INT_DOT")
                await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, backend="cpu")
                cpu = await conn.generate(request("cpu", PROMPT, max_tokens=4, ignoreEog=True))
                self.assertCompleted(cpu, "cpu after the refused load")
                conn.close()
                return
            await conn.load(harness.Config.model, id="ocl", contextSize=CONTEXT, backend="opencl")
            m = await conn.model_status("ocl")
            device = m.info.workers[0].device
            print(f"\n[opencl] worker device with INFERD_OPENCL_INT_DOT=int8: {device}", file=sys.stderr)
            if "numerics exact" not in device:
                conn.close()
                self.skipTest(f"the device runs the float numerics, which have no int8 form: {device}")
            self.assertIn("int8 dot", device)
            await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, backend="cpu")
            cpu = await conn.generate(request("cpu", PROMPT, max_tokens=N_TOKENS, ignoreEog=True))
            ocl = await conn.generate(request("ocl", PROMPT, max_tokens=N_TOKENS, ignoreEog=True))
            self.assertCompleted(cpu, "cpu")
            self.assertCompleted(ocl, "opencl, int8 dots")
            self.assertEqual(ocl.tokens, cpu.tokens, "int8 dot products changed the greedy tokens")
            conn.close()

        for value in ("int8", "bogus"):
            with self.subTest(INFERD_OPENCL_INT_DOT=value):
                daemon = harness.Daemon(threads=2, env={"INFERD_OPENCL_INT_DOT": value}).start()
                try:
                    run_async(body(daemon, value), daemons=[daemon])
                finally:
                    daemon.stop()


class OpenClHalfActivationsTest(harness.DaemonTestCase):
    """INFERD_OPENCL_ACTIVATIONS / INFERD_OPENCL_NUMERICS, inherited by the workers."""

    def test_half_activations_agree_with_the_cpu_backend(self):
        async def body(daemon):
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id="ocl", contextSize=CONTEXT, backend="opencl")
            m = await conn.model_status("ocl")
            device = m.info.workers[0].device
            print(f"\n[opencl] worker device with half activations: {device}", file=sys.stderr)
            self.assertRegex(device, r"activations=[a-z_0-9]+\(f16\)", "the device string does not show f16 activations")
            self.assertIn("numerics float", device)
            await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, backend="cpu")
            cpu = await conn.generate(request("cpu", PROMPT, max_tokens=N_TOKENS // 2, ignoreEog=True))
            ocl = await conn.generate(request("ocl", PROMPT, max_tokens=N_TOKENS // 2, ignoreEog=True))
            self.assertCompleted(cpu, "cpu")
            self.assertCompleted(ocl, "opencl, half activations")
            self.assertEqual(len(ocl.tokens), N_TOKENS // 2)
            agree = await teacher_forced_agreement(self, conn, "ocl", cpu.tokens)
            print(f"[opencl] half activations: teacher-forced top-1 agreement with the CPU backend "
                  f"{agree}/{len(cpu.tokens)}; greedy cpu {cpu.text!r} opencl {ocl.text!r}", file=sys.stderr)
            self.assertGreaterEqual(agree / len(cpu.tokens), 0.9)
            conn.close()

        daemon = harness.Daemon(threads=2, env={"INFERD_OPENCL_NUMERICS": "float",
                                                "INFERD_OPENCL_ACTIVATIONS": "f16"}).start()
        try:
            run_async(body(daemon), daemons=[daemon])
        finally:
            daemon.stop()

    def test_refused_settings_fail_the_load_and_the_daemon_serves_on(self):
        async def body(daemon, fragment):
            conn = await Connection.open(daemon.socket_path)
            load = conn.load(harness.Config.model, id="ocl", contextSize=CONTEXT, backend="opencl")
            if fragment.startswith("half-precision"):
                try:
                    await load
                except harness.capnp.KjException as e:
                    self.assertKjError(e, "FAILED", fragment, context="f16 with the exact numerics")
                else:
                    # Only a device without cl_khr_fp64 loads: it runs the float numerics, where halves are fine.
                    device = (await conn.model_status("ocl")).info.workers[0].device
                    self.assertIn("numerics float", device)
                    self.assertIn("(f16)", device)
            else:
                await self.expect_error(load, "FAILED", fragment, context=f"load refused for {fragment!r}")
            await conn.load(harness.Config.model, id="cpu", contextSize=CONTEXT, backend="cpu")
            cpu = await conn.generate(request("cpu", PROMPT, max_tokens=4, ignoreEog=True))
            self.assertCompleted(cpu, "cpu after the refused load")
            conn.close()

        cases = [({"INFERD_OPENCL_ACTIVATIONS": "f8"}, "INFERD_OPENCL_ACTIVATIONS"),
                 ({"INFERD_OPENCL_NUMERICS": "fast"}, "INFERD_OPENCL_NUMERICS"),
                 # The default (exact) numerics with half activations: refused, with the reason.
                 ({"INFERD_OPENCL_ACTIVATIONS": "f16"}, "half-precision activations need float numerics")]
        for env, fragment in cases:
            with self.subTest(env=env):
                daemon = harness.Daemon(threads=2, env=env).start()
                try:
                    run_async(body(daemon, fragment), daemons=[daemon])
                finally:
                    daemon.stop()


if __name__ == "__main__":
    if opencl_devices() == 0:
        print("SKIP: no OpenCL device (no ICD loader, platform or device)", file=sys.stderr)
        sys.exit(harness.SKIP_RETURN_CODE)
    bin_dir = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--bin-dir"), None)
    if bin_dir and not worker_has_opencl(bin_dir):
        print("SKIP: inferd-worker is built without the OpenCL backend", file=sys.stderr)
        sys.exit(harness.SKIP_RETURN_CODE)
    harness.main()
