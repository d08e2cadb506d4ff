#!/usr/bin/env python3
"""Writes the corrupt-GGUF test set: tests/data/corrupt/*.gguf plus MANIFEST.tsv.

Each file is the same small valid GGUF (valid_base.gguf, written by hand below and cross-checked
with the `gguf` package's reader) with exactly one thing broken. MANIFEST.tsv lists, per file, the
Status code the reader must return, a substring its message must contain, and what is broken;
tests/gguf_corrupt_test.cpp checks all of them.

Usage: tools/reference/make_corrupt_ggufs.py [OUT_DIR]   (default: tests/data/corrupt)
The output is deterministic; rerun after changing this script and commit the result.
"""

import copy
import os
import struct
import sys

# Value types (GGUF format numbers).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# Tensor types (ggml numbers) and (block size, block bytes).
T_F32, T_Q4_1, T_Q8_0 = 0, 3, 8
BLOCK = {T_F32: (1, 4), T_Q4_1: (32, 20), T_Q8_0: (32, 34)}


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def gstr(b, length=None):
    if isinstance(b, str):
        b = b.encode()
    return u64(len(b) if length is None else length) + b


def arr(elem_type, payloads, count=None):
    return u32(elem_type) + u64(len(payloads) if count is None else count) + b"".join(payloads)


class Gguf:
    """A GGUF file as editable parts; build() lays them out like llama.cpp's writer."""

    def __init__(self):
        self.magic = b"GGUF"
        self.version = 3
        self.n_tensors = None  # None: the real count
        self.n_kv = None
        self.alignment = 32
        # (key bytes, raw key length or None, value type, encoded value)
        self.kvs = [
            (b"general.architecture", None, STRING, gstr("llama")),
            (b"general.name", None, STRING, gstr("corrupt-base")),
            (b"general.alignment", None, U32, u32(32)),
            (b"llama.block_count", None, U32, u32(1)),
            (b"llama.rope.freq_base", None, F32, struct.pack("<f", 10000.0)),
            (b"tokenizer.ggml.add_bos_token", None, BOOL, b"\x01"),
            (b"tokenizer.ggml.tokens", None, ARRAY, arr(STRING, [gstr(t) for t in ["<s>", "</s>", "a", "b"]])),
            (b"tokenizer.ggml.scores", None, ARRAY, arr(F32, [struct.pack("<f", x) for x in [0, 0, -1, -2]])),
            (b"tokenizer.ggml.token_type", None, ARRAY, arr(I32, [struct.pack("<i", x) for x in [3, 3, 1, 1]])),
        ]
        # name, raw name length or None, ne (ggml order), type, offset (None: packed)
        self.tensors = [
            dict(name=b"token_embd.weight", name_len=None, ne=[32, 4], type=T_Q8_0, offset=None),
            dict(name=b"blk.0.attn_norm.weight", name_len=None, ne=[32], type=T_F32, offset=None),
            dict(name=b"output.weight", name_len=None, ne=[32, 2], type=T_Q4_1, offset=None),
        ]
        self.n_dims_override = {}  # tensor index -> n_dims written (ne list written as is)

    @staticmethod
    def nbytes(t):
        bs, bb = BLOCK[t["type"]]
        n = bb * (t["ne"][0] // bs)
        for d in t["ne"][1:]:
            n *= d
        return n

    @staticmethod
    def layout():
        """Packed offsets and data bytes of the valid file's tensors; variants keep these bytes
        (a variant that breaks a shape or offset changes only the descriptor)."""
        base = Gguf()
        offsets, data = [], b""
        for i, t in enumerate(base.tensors):
            offsets.append(len(data))
            n = Gguf.nbytes(t)
            data += bytes((i * 31 + k * 7) & 0xFF for k in range(n))
            if i + 1 < len(base.tensors):
                data += b"\0" * (-len(data) % base.alignment)
        return offsets, data

    def build(self):
        offsets, data = self.layout()
        out = self.magic + u32(self.version)
        out += u64(len(self.tensors) if self.n_tensors is None else self.n_tensors)
        out += u64(len(self.kvs) if self.n_kv is None else self.n_kv)
        for key, key_len, vtype, value in self.kvs:
            out += gstr(key, key_len) + u32(vtype) + value
        for i, t in enumerate(self.tensors):
            out += gstr(t["name"], t["name_len"])
            out += u32(self.n_dims_override.get(i, len(t["ne"])))
            out += b"".join(u64(n) for n in t["ne"])
            out += u32(t["type"])
            out += u64(offsets[i] if t["offset"] is None else t["offset"])
        self.infos_end = len(out)
        out += b"\0" * (-len(out) % self.alignment)
        self.data_start = len(out)
        return out + data

    def set_kv(self, key, vtype, value):
        self.kvs = [(k, kl, vtype, value) if k == key else (k, kl, t, v) for k, kl, t, v in self.kvs]

    def kv_value_offset(self, key):
        """File offset of the value of `key` in the built file."""
        pos = 4 + 4 + 8 + 8
        for k, _, _, value in self.kvs:
            pos += 8 + len(k) + 4
            if k == key:
                return pos
            pos += len(value)
        raise KeyError(key)

    def tensor_info_offset(self, index):
        pos = 4 + 4 + 8 + 8 + sum(8 + len(k) + 4 + len(v) for k, _, _, v in self.kvs)
        for t in self.tensors[:index]:
            pos += 8 + len(t["name"]) + 4 + 8 * len(t["ne"]) + 4 + 8
        return pos


def variant(fn):
    g = copy.deepcopy(BASE)
    fn(g)
    return g.build()


def cases():
    base_bytes = BASE.build()
    c = []

    def add(name, data, substring, what, code="CORRUPT"):
        c.append((name, data, code, substring, what))

    add("valid_base.gguf", base_bytes, "", "the valid file every other one is derived from", code="OK")
    add("empty_file.gguf", b"", "file is empty", "zero-length file")
    add("bad_magic.gguf", b"GGML" + base_bytes[4:], "bad magic", "magic is GGML, not GGUF")
    add("truncated_after_magic.gguf", base_bytes[:4], "version", "file ends right after the magic")
    add("truncated_in_header.gguf", base_bytes[:10], "tensor count", "file ends inside the tensor count")
    add("truncated_in_kv_count.gguf", base_bytes[:20], "kv count", "file ends inside the kv count")

    def version(v):
        return lambda g: setattr(g, "version", v)

    add("version_1.gguf", variant(version(1)), "GGUF version 1 is not supported", "GGUF v1 (32-bit counts)")
    add("version_4.gguf", variant(version(4)), "unsupported GGUF version 4", "a future version")
    add("version_0.gguf", variant(version(0)), "unsupported GGUF version 0", "version 0")
    add("version_big_endian.gguf", variant(version(0x03000000)), "big-endian GGUF version 3",
        "a big-endian v3 file")

    add("huge_tensor_count.gguf", variant(lambda g: setattr(g, "n_tensors", 1 << 60)),
        "tensor count 1152921504606846976 cannot fit", "tensor count 2^60")
    add("huge_kv_count.gguf", variant(lambda g: setattr(g, "n_kv", 1 << 60)),
        "kv count 1152921504606846976 cannot fit", "kv count 2^60")
    add("tensor_count_plus_one.gguf", variant(lambda g: setattr(g, "n_tensors", 4)), "tensor #3",
        "one tensor more than the file describes: its descriptor is read from padding and data")
    add("kv_count_zero.gguf", variant(lambda g: setattr(g, "n_kv", 0)), "tensor 'general.architecture': n_dims 8 is not in 1..4",
        "kv count 0 while kv pairs follow: they are read as tensor descriptors")

    def kv0_key_len(n):
        def f(g):
            k, _, t, v = g.kvs[0]
            g.kvs[0] = (k, n, t, v)
        return f

    add("huge_key_length.gguf", variant(kv0_key_len(1 << 62)), "kv #0 key: string length 4611686018427387904",
        "first key claims 2^62 bytes")
    add("key_length_zero.gguf", variant(lambda g: g.kvs.insert(0, (b"", None, U32, u32(1)))), "kv #0: empty key",
        "a key of length 0")
    add("huge_string_length.gguf", variant(lambda g: g.set_kv(b"general.name", STRING, gstr("x", 1 << 62))),
        "key 'general.name': string length 4611686018427387904", "string value claims 2^62 bytes")
    add("string_length_past_end.gguf",
        variant(lambda g: g.set_kv(b"general.name", STRING, u64(len(base_bytes)) + b"corrupt-base")),
        "key 'general.name': string length", "string value one file longer than what is left")
    add("bad_value_type.gguf", variant(lambda g: g.set_kv(b"llama.block_count", 13, u32(1))),
        "key 'llama.block_count': value type: unknown value type 13", "value type 13")
    add("bad_value_type_huge.gguf", variant(lambda g: g.set_kv(b"llama.block_count", 0xFFFFFFFF, u32(1))),
        "unknown value type 4294967295", "value type 0xffffffff")
    add("bad_array_element_type.gguf",
        variant(lambda g: g.set_kv(b"tokenizer.ggml.scores", ARRAY, u32(99) + u64(4) + b"\0" * 16)),
        "array element type: unknown value type 99", "array element type 99")
    add("huge_array_length.gguf",
        variant(lambda g: g.set_kv(b"tokenizer.ggml.tokens", ARRAY,
                                   arr(STRING, [gstr(t) for t in ["<s>", "</s>", "a", "b"]], count=1 << 61))),
        "array of 2305843009213693952 string values does not fit", "string array claims 2^61 elements")
    add("huge_array_length_u8.gguf",
        variant(lambda g: g.set_kv(b"tokenizer.ggml.scores", ARRAY, u32(U8) + u64(1 << 63) + b"\0" * 16)),
        "array of 9223372036854775808 u8 values does not fit", "u8 array claims 2^63 elements")

    def nested_bomb(g):
        value = arr(U8, [])
        for _ in range(64):
            value = arr(ARRAY, [value])
        g.kvs.append((b"bomb", None, ARRAY, value))

    add("nested_array_bomb.gguf", variant(nested_bomb), "key 'bomb'[0][0][0][0]: arrays nested more than 4 deep",
        "arrays nested 65 deep")
    add("string_in_array_past_end.gguf",
        variant(lambda g: g.set_kv(b"tokenizer.ggml.tokens", ARRAY,
                                   arr(STRING, [gstr("<s>"), gstr("</s>"), gstr("a", 1 << 40), gstr("b")]))),
        "key 'tokenizer.ggml.tokens'[2]: string length 1099511627776", "third token string claims 2^40 bytes")
    add("bool_not_0_or_1.gguf", variant(lambda g: g.set_kv(b"tokenizer.ggml.add_bos_token", BOOL, b"\x02")),
        "bool value is 2, not 0 or 1", "bool stored as 2")
    add("bool_array_element_not_0_or_1.gguf",
        variant(lambda g: g.kvs.append((b"flags", None, ARRAY, arr(BOOL, [b"\x01", b"\x00", b"\x05"])))),
        "bool array element 2 is 5", "bool array with a 5")
    add("duplicate_key.gguf", variant(lambda g: g.kvs.append((b"general.name", None, STRING, gstr("again")))),
        "duplicate key 'general.name'", "general.name twice")

    g = copy.deepcopy(BASE)
    g.build()
    at = g.kv_value_offset(b"tokenizer.ggml.add_bos_token")
    add("truncated_in_kv_value.gguf", base_bytes[:at],
        "truncated file: key 'tokenizer.ggml.add_bos_token' (bool) needs 1 bytes, only 0 left",
        "file ends right before a bool value")
    at = g.kv_value_offset(b"tokenizer.ggml.tokens")
    add("truncated_in_kv_array.gguf", base_bytes[:at + 20],
        "key 'tokenizer.ggml.tokens': array of 4 string values does not fit",
        "file ends inside the token array")
    at = g.tensor_info_offset(1)
    add("truncated_in_tensor_infos.gguf", base_bytes[:at + 8 + 22 + 4 + 3],
        "truncated file: tensor 'blk.0.attn_norm.weight': ne[0]", "file ends inside a tensor's shape")
    add("truncated_before_data.gguf", base_bytes[:g.infos_end],
        "extends past end of file", "file ends after the tensor descriptors: no data")
    add("truncated_in_data.gguf", base_bytes[:-10], "tensor 'output.weight': data",
        "last 10 bytes of tensor data missing")

    def tensor(i, **kw):
        def f(g):
            g.tensors[i].update(kw)
        return f

    add("bad_tensor_type.gguf", variant(tensor(1, type=99)), "unknown tensor type 99", "tensor type 99")
    add("removed_tensor_type_q4_2.gguf", variant(tensor(1, type=4)), "unknown tensor type 4",
        "type 4 (Q4_2, removed from ggml)")

    def n_dims(i, n):
        return lambda g: g.n_dims_override.__setitem__(i, n)

    add("n_dims_0.gguf", variant(n_dims(1, 0)), "n_dims 0 is not in 1..4", "a tensor with 0 dimensions")

    def five_dims(g):
        g.tensors[1]["ne"] = [32, 1, 1, 1, 1]

    add("n_dims_5.gguf", variant(five_dims), "n_dims 5 is not in 1..4", "a tensor with 5 dimensions")
    add("ne_negative.gguf", variant(tensor(0, ne=[32, -4], offset=0)), "ne[1] = -4 is negative",
        "negative dimension")
    add("ne_huge.gguf", variant(tensor(0, ne=[32 << 40, 1], offset=0)), "extends past end of file",
        "a 2^45-element Q8_0 tensor in a 1 KB file")
    add("element_count_overflow.gguf",
        variant(tensor(1, ne=[1 << 32, 1 << 32, 1 << 32], offset=160)), "element count overflows",
        "2^96 elements")
    add("byte_size_overflow.gguf", variant(tensor(1, ne=[1 << 62], offset=160)), "data size in bytes overflows",
        "2^62 F32 elements: 2^64 bytes")
    add("row_not_multiple_of_block.gguf", variant(tensor(0, ne=[33, 4], offset=0)),
        "not a multiple of the Q8_0 block size 32", "Q8_0 row of 33 elements")
    add("offset_past_end.gguf", variant(tensor(2, offset=1 << 20)), "extends past end of file",
        "data offset 1 MiB in a 1 KB file")
    add("offset_wraps_around.gguf", variant(tensor(2, offset=(1 << 64) - 32)), "extends past end of file",
        "data offset 2^64-32: the end wraps around")
    add("offset_misaligned.gguf", variant(tensor(1, offset=161)), "data offset 161 is not a multiple of the alignment 32",
        "data offset not aligned")
    add("overlapping_tensors.gguf", variant(tensor(2, offset=128)), "overlap",
        "output.weight starts inside token_embd.weight")
    add("same_offset_tensors.gguf", variant(tensor(1, offset=0)), "overlap", "two tensors at offset 0")
    add("alignment_not_power_of_two.gguf", variant(lambda g: g.set_kv(b"general.alignment", U32, u32(48))),
        "general.alignment = 48 is not a power of two", "alignment 48")
    add("alignment_zero.gguf", variant(lambda g: g.set_kv(b"general.alignment", U32, u32(0))),
        "general.alignment = 0", "alignment 0")
    add("alignment_huge.gguf", variant(lambda g: g.set_kv(b"general.alignment", U32, u32(1 << 31))),
        "general.alignment = 2147483648", "alignment 2^31")
    add("alignment_negative.gguf", variant(lambda g: g.set_kv(b"general.alignment", I32, struct.pack("<i", -32))),
        "general.alignment = -32", "alignment -32 (i32)")
    add("alignment_wrong_type.gguf", variant(lambda g: g.set_kv(b"general.alignment", STRING, gstr("32"))),
        "general.alignment has type string", "alignment stored as a string")
    add("duplicate_tensor.gguf", variant(tensor(2, name=b"token_embd.weight")),
        "duplicate tensor name 'token_embd.weight'", "two tensors named token_embd.weight")
    add("tensor_name_empty.gguf", variant(tensor(1, name=b"")), "tensor #1: empty tensor name",
        "a tensor with an empty name")
    add("tensor_name_too_long.gguf", variant(tensor(1, name=b"x" * 64)), "more than 63",
        "a 64-byte tensor name (ggml's limit is 63)")
    add("huge_tensor_name_length.gguf", variant(tensor(0, name_len=1 << 62)),
        "tensor #0 name: string length 4611686018427387904", "tensor name claims 2^62 bytes")
    return c


BASE = Gguf()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "data", "corrupt")
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if name.endswith(".gguf"):
            os.remove(os.path.join(out_dir, name))
    rows = ["# file\texpected code\tmessage substring\twhat is broken"]
    for name, data, code, substring, what in cases():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        rows.append("\t".join([name, code, substring, what]))
    with open(os.path.join(out_dir, "MANIFEST.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")

    # Cross-check the base file with the reference reader, so the set is derived from a real GGUF.
    try:
        import gguf  # noqa: PLC0415
    except ImportError:
        print("note: `gguf` package not installed; valid_base.gguf not cross-checked", file=sys.stderr)
    else:
        r = gguf.GGUFReader(os.path.join(out_dir, "valid_base.gguf"))
        assert [t.name for t in r.tensors] == [t["name"].decode() for t in BASE.tensors]
        assert bytes(r.fields["general.architecture"].parts[-1]) == b"llama"
    print(f"wrote {len(rows) - 1} files to {os.path.normpath(out_dir)}")


if __name__ == "__main__":
    main()
