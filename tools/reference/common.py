"""Helpers shared by the reference-data scripts (synthetic models, llama.cpp reference outputs, benchmarks).

Nothing here imports llama_cpp, so make_synthetic_gguf.py runs where only `gguf` and `numpy` are installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SMOLLM2_PATH = os.path.join(REPO_ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Tokenizer:
    """A GGUF tokenizer's metadata, ready to be written into another GGUF file."""

    model: str
    pre: str
    tokens: list[bytes]
    token_types: list[int]
    merges: list[bytes]
    bos_id: int
    eos_id: int
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_space_prefix: bool | None
    chat_template: str | None


def _scalar(field):
    return field.parts[field.data[0]][0]


def _string(field) -> bytes:
    return bytes(field.parts[field.data[0]])


def load_tokenizer(path: str, n_vocab: int | None = None) -> Tokenizer:
    """Reads tokenizer.* metadata from a GGUF file.

    With `n_vocab`, keeps the first n_vocab tokens and only the merges whose two parts and result are all among
    them, so the truncated BPE tokenizer stays consistent (every merge produces a token that exists).
    """
    import gguf

    reader = gguf.GGUFReader(path)
    fields = reader.fields

    def get(name):
        return fields.get(name)

    tokens = [bytes(get("tokenizer.ggml.tokens").parts[i]) for i in get("tokenizer.ggml.tokens").data]
    types_field = get("tokenizer.ggml.token_type")
    token_types = [int(types_field.parts[i][0]) for i in types_field.data]
    merges_field = get("tokenizer.ggml.merges")
    merges = [bytes(merges_field.parts[i]) for i in merges_field.data] if merges_field else []

    if n_vocab is not None and n_vocab < len(tokens):
        tokens = tokens[:n_vocab]
        token_types = token_types[:n_vocab]
        ids = {t: i for i, t in enumerate(tokens)}
        kept = []
        for m in merges:
            left, sep, right = m.partition(b" ")
            if sep and left in ids and right in ids and (left + right) in ids:
                kept.append(m)
        merges = kept

    def opt_int(name):
        f = get(name)
        return int(_scalar(f)) if f is not None else None

    def opt_bool(name):
        f = get(name)
        return bool(_scalar(f)) if f is not None else None

    tmpl = get("tokenizer.chat_template")
    return Tokenizer(
        model=_string(get("tokenizer.ggml.model")).decode(),
        pre=_string(get("tokenizer.ggml.pre")).decode() if get("tokenizer.ggml.pre") else "default",
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        bos_id=opt_int("tokenizer.ggml.bos_token_id"),
        eos_id=opt_int("tokenizer.ggml.eos_token_id"),
        unk_id=opt_int("tokenizer.ggml.unknown_token_id"),
        pad_id=opt_int("tokenizer.ggml.padding_token_id"),
        add_bos=bool(opt_bool("tokenizer.ggml.add_bos_token")),
        add_space_prefix=opt_bool("tokenizer.ggml.add_space_prefix"),
        chat_template=_string(tmpl).decode() if tmpl else None,
    )


def llama_cpp_version() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}"


@contextlib.contextmanager
def running_daemon(build_dir: str, *flags: str, prefix: str = "inferd-bench-"):
    """Starts `build_dir`/bin/inferd on a socket in a fresh temporary directory (its log beside it), waits
    until it answers, yields (process, socket path) and terminates it on exit."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    sock = os.path.join(tmp, "inferd.sock")
    with open(os.path.join(tmp, "inferd.log"), "w") as log:
        proc = subprocess.Popen([os.path.join(build_dir, "bin", "inferd"), "--socket", sock, *flags],
                                stderr=log, stdout=subprocess.DEVNULL)
    try:
        for _ in range(500):
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(sock)
                break
            except OSError:
                time.sleep(0.01)
        yield proc, sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)
