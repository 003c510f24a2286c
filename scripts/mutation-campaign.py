#!/usr/bin/env python3
"""Hostile-input mutation campaign against the megascope CLI (Python 3 standard library only).

Every case is generated from (--seed, case index) alone, so a case can be regenerated and rerun on
its own (--only-case N) and a run is reproducible with the same binary and seed inputs. Cases go
round-robin over the input loaders; each takes a shipped or test sample (a seed), applies one to
three mutations, runs one small `megascope` command on it and classifies the outcome:

  OK        exit 0 with sane figures           NOFIT    exit 4 (does not fit) with sane figures
  REJECTED  exit 1 or 2 with a message on stderr
  SIGNAL    killed by a signal                 HANG     ran past --timeout (killed)
  INTERNAL  exit 3 (main.cpp's internal-error exit) or "internal error" on stderr
  BAD_OK    exit 0/4 but a figure is NaN/inf, an impossible negative, MFU above 100%, or --json
            output that does not parse
  NO_MSG    exit 1/2 with nothing on stderr    OTHER_EXIT any other exit code

SIGNAL, HANG, INTERNAL, BAD_OK, NO_MSG and OTHER_EXIT are failures. Writes to --out:
  results.md      outcome table per loader and per command, failure groups with one-line repros
  failures.jsonl  one record per failing case (loader, mutation, argv, repro, rc/signal, stderr tail,
                  saved input path under OUT/cases/)
  cases.jsonl     one short record per case (all outcomes)
  seeds/          the seed samples the cases were mutated from; baseline.md: each seed run unmutated

  python3 scripts/mutation-campaign.py --bin /tmp/campaign/megascope --seed 1 --cases 19500 \\
      --jobs 2 --timeout 10 --out /tmp/campaign/out
  python3 scripts/mutation-campaign.py --bin ... --out ... --replay /tmp/campaign/out/failures.jsonl
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FAIL_CLASSES = ("SIGNAL", "HANG", "INTERNAL", "BAD_OK", "NO_MSG", "OTHER_EXIT")
ALL_CLASSES = ("OK", "NOFIT", "REJECTED") + FAIL_CLASSES + ("GEN_ERROR",)
LOADERS = ("model-toml", "cluster-toml", "training-toml", "plan-toml", "example-toml", "calibration-toml",
           "hf-config-json", "megatron-args", "inline-plan", "trace-json", "cli-numeric",
           "deepspeed-json", "moe-histogram")

# --------------------------------------------------------------------------------------------------
# Edge values
# --------------------------------------------------------------------------------------------------
EDGE_NUMS = ["0", "-1", "1", "2", "3", "7", "2147483647", "2147483648", "-2147483648", "4294967295",
             "4294967296", "9007199254740992", "9007199254740993", "9223372036854775807",
             "9223372036854775808", "-9223372036854775808", "18446744073709551616", "1e308", "1.7976931348623157e308",
             "1e400", "-1e400", "-1e-300", "1e-300", "5e-324", "1e-400", "nan", "-nan", "inf", "-inf", "+inf",
             "0.5", "-0.5", "1.5", "0.0", "-0.0", "0.999999", "1.000001", "65536", "1e20", "1e9", "3e9",
             "9" * 400, "1" + "0" * 40, "0x7fffffffffffffff", "0xffffffffffffffff", "0b1", "0o777",
             "1_000", "007", "+5", "1e", "1.", ".5", "--1", "1e+", "0e0"]
JSON_EDGE_NUMS = ["0", "-1", "1", "2147483647", "2147483648", "-2147483648", "4294967296", "9007199254740993",
                  "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551616",
                  "1e308", "1e400", "-1e400", "-1e-300", "1e-400", "5e-324", "NaN", "Infinity", "-Infinity",
                  "nan", "inf", "0.5", "-0.5", "1.5", "0.0", "-0.0", "9" * 400, "1" + "0" * 40, "1E2", "-0",
                  "0x10", "01", "1.", ".5", "+1", "1e", "65536", "3e9"]
CLI_EDGE = ["0", "-1", "1", "2", "2147483647", "2147483648", "-2147483648", "4294967296", "9223372036854775807",
            "9223372036854775808", "18446744073709551616", "1e400", "-1e400", "1e308", "1e-300", "-1e-300", "nan",
            "NaN", "inf", "-inf", "infinity", "0.5", "-0.5", "1.5", "", " ", "9" * 100, "0x10", "1_000", "+5", "5 ",
            " 5", "5x", "1e3", "1e9", "1e18", "-0", "0.0", "\u0661\u0662", "\uff18", "８", "5\t", "1,2"]
CLI_PLAUSIBLE = {
    "--gpus": ["1", "3", "5", "6", "7", "9", "12", "16", "64", "1024", "100000", "1000000"],
    "--nodes": ["1", "2", "3", "1000", "1000000"],
    "--global-batch": ["1", "3", "7", "9", "1000", "1000000", "100000000"],
    "--seq-len": ["1", "2", "3", "63", "65", "100000", "1000000", "100000000"],
    "--moe-imbalance": ["1", "1.0001", "2", "4", "1000", "1e9", "1e300", "0.9999", "1e-300"],
    "--mtp-layers": ["1", "2", "4", "100", "1000000"],
    "--headroom": ["0", "0.001", "79", "80", "1000", "1e9", "-0.0", "1e-300"],
    "--threads": ["1", "2", "1024", "1025"],
    "--top": ["1", "1000", "1000000"],
    "--min-dp": ["1", "2", "3", "8", "1000"],
    "--uneven-depth": ["0", "1", "3", "1000"],
    "--seq-len-plan": ["64"],
}
STR_EDGE = ['""', '" "', '"x"', '"' + "A" * 1000 + '"', '"' + "\u00e9\u4e2d\U0001F600\u202e\u0301" + '"',
            '"\\u0000"', '"\\ud800"', '"\\t\\n\\r"', '"../../../../etc/passwd"', '"/dev/zero"', '"%s%n%x"',
            "'literal'", '"""multi\nline"""', '"' + "\u00ff" * 300 + '"']
TOML_TYPE_VALUES = ["true", "false", "[]", "[1, 2]", '["a", "b"]', "[[1], [2]]", "{}", "{ a = 1 }", "1979-05-27",
                    "07:32:00", "1979-05-27T07:32:00Z", "[1, \"a\"]"]
UNICODE_BITS = ["\u00e9", "\u4e2d\u6587", "\U0001F600", "\u202e", "\u0301", "\ufeff", "\u200b", "\ud7ff",
                "\u0000", "\u2028"]


def rand_num_edge(rng: random.Random) -> str:
    return rng.choice(EDGE_NUMS)


# --------------------------------------------------------------------------------------------------
# Text (TOML and generic) mutators: each takes (rng, bytes) and returns (bytes, description)
# --------------------------------------------------------------------------------------------------
NUM_RE = re.compile(rb"(?<![\w.\"'])[-+]?(?:\d[\d_]*)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.\"'])")
KEYLINE_RE = re.compile(rb"^\s*([A-Za-z0-9_\-\.\"]+)\s*=\s*(.*?)\s*(#.*)?$")


def lines_of(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def value_spans(data: bytes):
    """(start, end) of the value of every `key = value` line (comment excluded)."""
    spans = []
    pos = 0
    for line in data.split(b"\n"):
        m = KEYLINE_RE.match(line)
        if m and m.group(2):
            spans.append((pos + m.start(2), pos + m.end(2), m.group(1)))
        pos += len(line) + 1
    return spans


def m_byte_flip(rng, data):
    if not data:
        return b"\xff", "byte_flip(empty->0xff)"
    b = bytearray(data)
    n = rng.choice([1, 1, 2, 4, 8, 32])
    for _ in range(n):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b), f"byte_flip(n={n})"


def m_byte_set(rng, data):
    if not data:
        return data, "byte_set(noop)"
    b = bytearray(data)
    i = rng.randrange(len(b))
    v = rng.choice([0, 0x7f, 0x80, 0xff, ord('"'), ord("["), ord("]"), ord("="), ord("\n"), ord("\\"), ord("'"),
                    ord("{"), ord("#"), ord(".")])
    b[i] = v
    return bytes(b), f"byte_set(@{i}={v:#x})"


def m_delete_lines(rng, data):
    ls = lines_of(data)
    if len(ls) < 2:
        return b"", "delete_lines(all)"
    i = rng.randrange(len(ls))
    n = rng.choice([1, 1, 1, 2, 5])
    del ls[i:i + n]
    return b"\n".join(ls), f"delete_lines({i},{n})"


def m_delete_keyline(rng, data):
    ls = lines_of(data)
    idx = [i for i, l in enumerate(ls) if KEYLINE_RE.match(l)]
    if not idx:
        return m_delete_lines(rng, data)
    i = rng.choice(idx)
    key = KEYLINE_RE.match(ls[i]).group(1).decode("latin-1")
    del ls[i]
    return b"\n".join(ls), f"delete_key({key})"


def m_duplicate_line(rng, data):
    ls = lines_of(data)
    idx = [i for i, l in enumerate(ls) if l.strip()] or [0]
    i = rng.choice(idx)
    k = rng.choice([1, 1, 2, 100, 10000])
    k = max(1, min(k, 8_000_000 // (len(ls[i]) + 1)))  # keep inputs under ~8 MB
    ls[i + 1:i + 1] = [ls[i]] * k
    return b"\n".join(ls), f"duplicate_line({i},x{k})"


def m_swap_lines(rng, data):
    ls = lines_of(data)
    if len(ls) < 2:
        return data, "swap_lines(noop)"
    if rng.random() < 0.3:
        rng.shuffle(ls)
        return b"\n".join(ls), "shuffle_lines"
    i, j = rng.randrange(len(ls)), rng.randrange(len(ls))
    ls[i], ls[j] = ls[j], ls[i]
    return b"\n".join(ls), f"swap_lines({i},{j})"


def m_truncate(rng, data):
    if not data:
        return data, "truncate(noop)"
    i = rng.randrange(len(data))
    return data[:i], f"truncate(@{i})"


def m_num_edge(rng, data):
    spans = value_spans(data)
    cands = []
    for s, e, _k in spans:
        for m in NUM_RE.finditer(data, s, e):
            cands.append((m.start(), m.end()))
    if not cands:
        return m_insert_unknown_key(rng, data)
    v = rand_num_edge(rng)
    if rng.random() < 0.12:
        parts, last = [], 0
        for s, e in cands:
            parts += [data[last:s], v.encode()]
            last = e
        parts.append(data[last:])
        return b"".join(parts), f"num_edge_all({v[:24]})"
    s, e = rng.choice(cands)
    key = data[:s].rsplit(b"\n", 1)[-1].split(b"=")[0].strip().decode("latin-1")
    return data[:s] + v.encode() + data[e:], f"num_edge({key}={v[:24]})"


def perturb_number(rng, text: str) -> str:
    """A plausible-looking change of a number: small ints, factors, tiny and huge magnitudes that parse."""
    try:
        v = float(text.replace("_", ""))
    except ValueError:
        v = 1.0
    if not math.isfinite(v) or abs(v) > 1e300:
        v = 1.0
    is_int = re.fullmatch(r"[-+]?\d[\d_]*", text) is not None
    op = rng.choice(["small", "small", "factor", "factor", "plus", "tiny", "huge", "zero"])
    if op == "small":
        return str(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 64, 100, 128, 1000]))
    if op == "zero":
        return "0" if is_int else rng.choice(["0.0", "1e-30", "-0.0"])
    if op == "plus":
        return str(int(v) + rng.choice([-2, -1, 1, 2])) if is_int else repr(v * rng.choice([0.999, 1.001, -1]))
    if op == "tiny":
        return "1" if is_int else rng.choice(["1e-9", "1e-30", "1e-300", "4.9e-324", "0.001"])
    if op == "huge":
        return str(rng.choice([10**6, 10**9, 2**31 - 1, 2**40, 10**15])) if is_int else \
            rng.choice(["1e9", "1e15", "1e30", "1e300", "1.7e308"])
    f = rng.choice([0.5, 2, 3, 10, 100, 1000, 0.01, 1 / 3])
    return str(max(0, int(v * f))) if is_int else repr(v * f)


def m_num_perturb(rng, data):
    spans = value_spans(data)
    cands = []
    for s, e, _k in spans:
        for m in NUM_RE.finditer(data, s, e):
            cands.append((m.start(), m.end()))
    if not cands:
        return m_num_edge(rng, data)
    s, e = rng.choice(cands)
    v = perturb_number(rng, data[s:e].decode("latin-1"))
    key = data[:s].rsplit(b"\n", 1)[-1].split(b"=")[0].strip().decode("latin-1")
    return data[:s] + v.encode() + data[e:], f"num_perturb({key}={v[:24]})"


def m_type_swap(rng, data):
    spans = value_spans(data)
    if not spans:
        return m_insert_unknown_key(rng, data)
    s, e, key = rng.choice(spans)
    pool = rng.choice([STR_EDGE, TOML_TYPE_VALUES, EDGE_NUMS])
    v = rng.choice(pool)
    return data[:s] + v.encode("utf-8", "surrogatepass") + data[e:], \
        f"type_swap({key.decode('latin-1')}={v[:24]!r})"


def table_header_positions(data: bytes):
    ls = lines_of(data)
    return [i for i, l in enumerate(ls) if l.strip().startswith(b"[")]


def insert_after_random_header(rng, data, text: bytes):
    ls = lines_of(data)
    hs = table_header_positions(data)
    at = rng.choice(hs) + 1 if hs and rng.random() < 0.85 else rng.randrange(len(ls) + 1)
    ls[at:at] = [text]
    return b"\n".join(ls)


def m_insert_unknown_key(rng, data):
    key = rng.choice(["frobnicate", "num_layerz", "Num_Layers", "hidden-size", "_", "\"\"", "\"a b\"",
                      "\"\u00e9\"", "x" * 64])
    v = rng.choice(["1", "\"x\"", "true", "[1]", "{a=1}"])
    return insert_after_random_header(rng, data, f"{key} = {v}".encode()), f"unknown_key({key[:20]})"


def m_long_key(rng, data):
    n = rng.choice([1000, 10000, 100000, 1000000])
    key = ("k" * n).encode()
    return insert_after_random_header(rng, data, key + b" = 1"), f"long_key(len={n})"


def m_dotted_key(rng, data):
    n = rng.choice([10, 1000, 50000, 200000])
    part = rng.choice(["a", "model", "x"])
    form = rng.choice(["key", "header", "array-header"])
    dotted = ".".join([part] * n).encode()
    if form == "key":
        return insert_after_random_header(rng, data, dotted + b" = 1"), f"dotted_key(parts={n})"
    if form == "header":
        return data + b"\n[" + dotted + b"]\nx = 1\n", f"dotted_header(parts={n})"
    return data + b"\n[[" + dotted + b"]]\nx = 1\n", f"dotted_array_header(parts={n})"


def m_deep_nesting(rng, data):
    n = rng.choice([100, 1000, 10000, 100000, 1000000])
    kind = rng.choice(["array", "inline-table", "mixed"])
    if kind == "array":
        v = b"[" * n + b"1" + b"]" * n
    elif kind == "inline-table":
        v = b"{a=" * n + b"1" + b"}" * n
    else:
        v = b"[{a=" * (n // 2) + b"1" + b"}]" * (n // 2)
    if rng.random() < 0.2:  # unterminated
        v = v[: len(v) // 2 + 1]
        kind += "-unterminated"
    # Either a new key or the value of an existing key.
    spans = value_spans(data)
    if spans and rng.random() < 0.5:
        s, e, key = rng.choice(spans)
        return data[:s] + v + data[e:], f"deep_{kind}({key.decode('latin-1')},depth={n})"
    return insert_after_random_header(rng, data, b"deep = " + v), f"deep_{kind}(depth={n})"


def m_big_array(rng, data):
    n = rng.choice([1000, 100000, 1000000])
    elem = rng.choice([b"1", b"0", b"\"a\"", b"1.5"])
    v = b"[" + b",".join([elem] * n) + b"]"
    spans = value_spans(data)
    if spans and rng.random() < 0.6:
        s, e, key = rng.choice(spans)
        return data[:s] + v + data[e:], f"big_array({key.decode('latin-1')},n={n})"
    return insert_after_random_header(rng, data, b"layers = " + v), f"big_array(layers,n={n})"


def m_empty(rng, data):
    return rng.choice([b"", b"\n", b" ", b"#", b"\x00", b"\xef\xbb\xbf"]), "empty_like"


def m_binary_junk(rng, data):
    n = rng.choice([1, 16, 512, 4096, 65536])
    junk = bytes(rng.randrange(256) for _ in range(n))
    where = rng.choice(["replace", "prefix", "suffix", "middle"])
    if where == "replace":
        return junk, f"binary_junk(n={n})"
    if where == "prefix":
        return junk + data, f"binary_prefix(n={n})"
    if where == "suffix":
        return data + junk, f"binary_suffix(n={n})"
    i = rng.randrange(len(data) + 1)
    return data[:i] + junk + data[i:], f"binary_middle(n={n})"


def m_long_string(rng, data):
    n = rng.choice([1000, 100000, 4000000])
    ch = rng.choice(["A", "\u00e9", "\U0001F600", "/", ".", "%"])
    v = ('"' + ch * n + '"').encode("utf-8")
    ls = lines_of(data)
    idx = [i for i, l in enumerate(ls) if KEYLINE_RE.match(l) and b'"' in l]
    if idx:
        i = rng.choice(idx)
        m = KEYLINE_RE.match(ls[i])
        ls[i] = m.group(1) + b" = " + v
        return b"\n".join(ls), f"long_string({m.group(1).decode('latin-1')},n={n})"
    return insert_after_random_header(rng, data, b"name = " + v), f"long_string(name,n={n})"


def m_dup_table(rng, data):
    ls = lines_of(data)
    hs = table_header_positions(data)
    if len(data) > 4_000_000:
        return data, "dup_table(skipped: input over 4 MB)"
    if not hs:
        return data + b"\n" + data, "dup_whole"
    i = rng.choice(hs)
    nxt = [h for h in hs if h > i]
    end = nxt[0] if nxt else len(ls)
    block = ls[i:end]
    if rng.random() < 0.5:
        return b"\n".join(ls + block), f"dup_table({ls[i].strip().decode('latin-1')[:40]})"
    return b"\n".join(ls + [ls[i]]), f"dup_header({ls[i].strip().decode('latin-1')[:40]})"


def m_unicode(rng, data):
    kind = rng.choice(["bom", "in_string", "key", "invalid_utf8", "nul", "overlong", "surrogate", "crlf", "cr"])
    if kind == "bom":
        return b"\xef\xbb\xbf" + data, "unicode_bom"
    if kind == "crlf":
        return data.replace(b"\n", b"\r\n"), "crlf"
    if kind == "cr":
        return data.replace(b"\n", b"\r"), "cr_only"
    if kind == "nul":
        i = rng.randrange(len(data) + 1)
        return data[:i] + b"\x00" + data[i:], f"nul(@{i})"
    if kind == "invalid_utf8":
        i = rng.randrange(len(data) + 1)
        bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
        return data[:i] + bad + data[i:], f"invalid_utf8(@{i})"
    if kind == "overlong":
        return data.replace(b'"', b'"\xc0\x80', 1), "overlong_nul"
    if kind == "surrogate":
        return data.replace(b'"', b'"\\ud800', 1), "escape_lone_surrogate"
    if kind == "key":
        u = rng.choice(UNICODE_BITS).encode("utf-8", "surrogatepass")
        return insert_after_random_header(rng, data, b'"' + u + b'" = 1'), "unicode_key"
    # in a string value
    u = "".join(rng.choice(UNICODE_BITS) for _ in range(rng.choice([1, 5, 300]))).encode("utf-8", "surrogatepass")
    i = data.find(b'"')
    if i < 0:
        return data + b"\nname = \"" + u + b"\"\n", "unicode_string(appended)"
    return data[:i + 1] + u + data[i + 1:], "unicode_string"


def m_toml_syntax(rng, data):
    snippet = rng.choice([b'name = "unterminated', b"name = '''never closed", b'x = """', b"[", b"[[", b"[]",
                          b"[a]]", b"= 1", b"a = ", b"a == 1", b"a = 1 2", b"a.b = 1\na = 2", b"a = 1\na.b = 2",
                          b"[x]\n[x]", b"[[x]]\n[x]", b"a = [1,,2]", b"a = {b=1,}", b"a = {\nb=1}",
                          b'"\\u0000" = 1', b"a = 1979-13-45", b"a = 0x", b"a = 1__0", b"a = _1", b"a = +nan",
                          b"a = 99999999999999999999", b"\\", b"a = \"\\x\"", b"a = \"\\U0011FFFF\"", b"a=\"\\"])
    return insert_after_random_header(rng, data, snippet), f"toml_syntax({snippet[:20]!r})"


TOML_MUTATORS = [
    (m_byte_flip, 8), (m_byte_set, 4), (m_delete_lines, 5), (m_delete_keyline, 6), (m_duplicate_line, 5),
    (m_swap_lines, 3), (m_truncate, 5), (m_num_edge, 22), (m_num_perturb, 30), (m_type_swap, 12), (m_insert_unknown_key, 4),
    (m_long_key, 2), (m_dotted_key, 3), (m_deep_nesting, 4), (m_big_array, 2), (m_empty, 1),
    (m_binary_junk, 2), (m_long_string, 3), (m_dup_table, 3), (m_unicode, 5), (m_toml_syntax, 5),
]


def weighted(rng, table):
    total = sum(w for _, w in table)
    x = rng.uniform(0, total)
    for f, w in table:
        x -= w
        if x <= 0:
            return f
    return table[-1][0]


def mutate_text(rng, data: bytes, table=TOML_MUTATORS):
    n = rng.choice([1, 1, 1, 1, 2, 2, 3])
    descs = []
    for _ in range(n):
        f = weighted(rng, table)
        if len(data) > 8_000_000:
            break
        data, d = f(rng, data)
        descs.append(d)
    return data, "+".join(descs)


# --------------------------------------------------------------------------------------------------
# JSON mutators (structured, then serialised by a writer that can emit raw tokens)
# --------------------------------------------------------------------------------------------------
class Raw(str):
    """A token written verbatim (NaN, 1e400, 0x10, a deep nesting ...)."""


def dump_json(obj, indent=False) -> str:
    parts = []

    def w(o, depth):
        if isinstance(o, Raw):
            parts.append(str(o))
        elif o is None:
            parts.append("null")
        elif o is True:
            parts.append("true")
        elif o is False:
            parts.append("false")
        elif isinstance(o, (int, float)):
            parts.append(json.dumps(o))
        elif isinstance(o, str):
            parts.append(json.dumps(o, ensure_ascii=False))
        elif isinstance(o, list):
            parts.append("[")
            for i, x in enumerate(o):
                if i:
                    parts.append(",")
                w(x, depth + 1)
            parts.append("]")
        elif isinstance(o, DupDict):
            parts.append("{")
            for i, (k, v) in enumerate(o.items_list):
                if i:
                    parts.append(",")
                parts.append("\n" if indent else "")
                parts.append(json.dumps(k, ensure_ascii=False) + ":")
                w(v, depth + 1)
            parts.append("}")
        elif isinstance(o, dict):
            parts.append("{")
            for i, (k, v) in enumerate(o.items()):
                if i:
                    parts.append(",")
                parts.append("\n" if indent else "")
                parts.append(json.dumps(k, ensure_ascii=False) + ":")
                w(v, depth + 1)
            parts.append("}")
        else:
            parts.append(json.dumps(str(o)))

    w(obj, 0)
    return "".join(parts)


class DupDict(dict):
    """An object written with duplicated keys."""

    def __init__(self, items_list):
        super().__init__()
        self.items_list = items_list


def json_paths(obj, path=(), out=None, limit=20000):
    if out is None:
        out = []
    if len(out) > limit:
        return out
    out.append(path)
    if isinstance(obj, dict):
        for k, v in obj.items():
            json_paths(v, path + (k,), out, limit)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            json_paths(v, path + (i,), out, limit)
    return out


def get_at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def set_at(obj, path, value):
    if not path:
        return value
    get_at(obj, path[:-1])[path[-1]] = value
    return obj


def deep_json(n, kind):
    if kind == "array":
        return Raw("[" * n + "1" + "]" * n)
    return Raw('{"a":' * n + "1" + "}" * n)


JSON_TYPE_VALUES = [None, True, False, "", "x", "A" * 1000, "\u00e9\U0001F600\u202e", [], [1, 2], {}, {"a": 1},
                    Raw('"\\u0000"'), Raw('"\\ud800"'), Raw('"\\uDFFF\\uD800"'), 0, -1, 1.5]


def json_structured(rng, obj, leaf_bias_keys=()):
    """One structured mutation of a parsed JSON document; returns (obj, desc)."""
    paths = json_paths(obj)
    # Prefer leaves with numeric values (they drive the model).
    leaves = [p for p in paths if p and not isinstance(get_at(obj, p), (dict, list))]
    nums = [p for p in leaves if isinstance(get_at(obj, p), (int, float)) and not isinstance(get_at(obj, p), bool)]
    op = rng.choice(["num_edge"] * 6 + ["num_perturb"] * 8 + ["type_swap"] * 3 + ["delete"] * 2 + ["unknown_key", "dup_key", "deep",
                                                                            "long_string", "null", "wrap_list",
                                                                            "big_list", "dup_container"])
    if op == "num_perturb" and nums:
        p = rng.choice(nums)
        v = perturb_number(rng, json.dumps(get_at(obj, p)))
        return set_at(obj, p, Raw(v)), f"num_perturb({'/'.join(map(str, p))[-60:]}={v[:24]})"
    if op in ("num_edge", "num_perturb") and nums:
        p = rng.choice(nums)
        v = rng.choice(JSON_EDGE_NUMS)
        return set_at(obj, p, Raw(v)), f"num_edge({'/'.join(map(str, p))[-60:]}={v[:24]})"
    if op in ("num_edge", "num_perturb", "type_swap") and leaves:
        p = rng.choice(leaves)
        v = rng.choice(JSON_TYPE_VALUES + [Raw(x) for x in ("NaN", "1e400", "-1", "2147483648")])
        return set_at(obj, p, v), f"type_swap({'/'.join(map(str, p))[-60:]}={str(v)[:24]!r})"
    if op == "delete" and len(paths) > 1:
        p = rng.choice(paths[1:])
        parent = get_at(obj, p[:-1])
        del parent[p[-1]]
        return obj, f"delete({'/'.join(map(str, p))[-60:]})"
    if op == "null" and paths:
        p = rng.choice(paths)
        return set_at(obj, p, None), f"null({'/'.join(map(str, p))[-60:]})"
    containers = [p for p in paths if isinstance(get_at(obj, p), dict)]
    if op == "unknown_key" and containers:
        p = rng.choice(containers)
        k = rng.choice(["frobnicate", "", "\u00e9", "x" * 100000, "num_hidden_layers ", "__proto__"])
        get_at(obj, p)[k] = rng.choice([1, "x", [1], {"a": 1}])
        return obj, f"unknown_key({'/'.join(map(str, p))[-40:]}:{k[:20]})"
    if op == "dup_key" and containers:
        p = rng.choice(containers)
        d = get_at(obj, p)
        if d:
            k = rng.choice(list(d.keys()))
            v2 = rng.choice([Raw(rng.choice(JSON_EDGE_NUMS)), "x", None, d[k]])
            items = list(d.items()) + [(k, v2)]
            if rng.random() < 0.5:
                items = [(k, v2)] + list(d.items())
            return set_at(obj, p, DupDict(items)), f"dup_key({'/'.join(map(str, p + (k,)))[-60:]})"
    if op == "deep":
        n = rng.choice([100, 1000, 10000, 100000, 1000000])
        kind = rng.choice(["array", "object"])
        p = rng.choice(paths)
        return set_at(obj, p, deep_json(n, kind)), f"deep_{kind}({'/'.join(map(str, p))[-60:]},depth={n})"
    if op == "long_string" and leaves:
        p = rng.choice(leaves)
        n = rng.choice([1000, 100000, 4000000])
        return set_at(obj, p, "B" * n), f"long_string({'/'.join(map(str, p))[-60:]},n={n})"
    if op == "wrap_list" and leaves:
        p = rng.choice(leaves)
        return set_at(obj, p, [get_at(obj, p)]), f"wrap_list({'/'.join(map(str, p))[-60:]})"
    if op == "big_list" and paths:
        p = rng.choice(paths)
        n = rng.choice([1000, 100000, 1000000])
        return set_at(obj, p, Raw("[" + ",".join(["1"] * n) + "]")), f"big_list({'/'.join(map(str, p))[-60:]},n={n})"
    if op == "dup_container":
        lists = [p for p in paths if isinstance(get_at(obj, p), list) and get_at(obj, p)]
        if lists:
            p = rng.choice(lists)
            lst = get_at(obj, p)
            k = rng.choice([2, 10, 100])
            lst.extend(lst * (k - 1) if len(lst) * k < 200000 else lst[:10])
            return obj, f"dup_list({'/'.join(map(str, p))[-60:]},x{k})"
    v = rng.choice(JSON_EDGE_NUMS)
    return Raw(v), f"whole_doc={v[:24]}"


def mutate_json(rng, text: bytes, structured_ops=None):
    """Structured mutations (most cases), text mutations of the JSON, or both."""
    mode = rng.random()
    descs = []
    data = text
    if mode < 0.72:
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if obj is not None:
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                if structured_ops and rng.random() < 0.5:
                    obj, d = structured_ops(rng, obj)
                else:
                    obj, d = json_structured(rng, obj)
                descs.append(d)
                if isinstance(obj, Raw):
                    break
            data = dump_json(obj, indent=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    if mode >= 0.6 or not descs:
        table = [(m_byte_flip, 8), (m_byte_set, 5), (m_truncate, 6), (m_delete_lines, 3), (m_duplicate_line, 2),
                 (m_empty, 1), (m_binary_junk, 2), (m_unicode, 5), (m_json_syntax, 5)]
        data, d = mutate_text(rng, data, table)
        descs.append(d)
    return data, "+".join(descs)


def m_json_syntax(rng, data):
    snippet = rng.choice([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"/*c*/", b"//c\n", b",]", b",}",
                          b"\"\\u", b"'a'", b"NaN", b"undefined", b"\x00"])
    i = rng.randrange(len(data) + 1)
    return data[:i] + snippet + data[i:], f"json_syntax({snippet!r}@{i})"


# --------------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------------
TRAINING_SEEDS = {
    "training-full.toml": """[training]
global_batch_size = 16
seq_length = 64
precision = "bf16"
params_dtype = "bf16"
grad_dtype = "fp32"
optimizer = "adam"
precision_aware_optimizer = true
main_params_dtype = "fp32"
exp_avg_dtype = "bf16"
exp_avg_sq_dtype = "bf16"
store_param_remainders = true

[training.overheads]
cuda_context_GiB = 0.5
nccl_per_group_GiB = 0.25
fragmentation = 0.05
""",
    "training-fp8.toml": """[training]
global_batch_size = 32
seq_length = 64
precision = "fp8"
fp8_recipe = "tensorwise"
params_dtype = "bf16"
grad_dtype = "fp32"
""",
    "training-min.toml": "[training]\nglobal_batch_size = 8\n",
    "training-fp16.toml": """[training]
global_batch_size = 16
seq_length = 32
params_dtype = "fp16"
grad_dtype = "fp16"
[training.overheads]
fragmentation = 0.0
""",
}

PLAN_SEEDS = {  # (text, model)
    "plan-rich.toml": ("""[plan]
tp = 2
pp = 2
mbs = 1
sp = true
recompute = "selective"
recompute_modules = ["core_attn", "layernorm"]
distopt = true
overlap_grad_reduce = true
overlap_param_gather = true
tp_comm_overlap = true
schedule = "1f1b"
attention = "flash"
""", "tiny-gpt"),
    "plan-interleaved.toml": ("""[plan]
tp = 1
pp = 2
vpp = 2
mbs = 1
schedule = "interleaved"
microbatch_group = 2
overlap_p2p_comm = true
overlap_p2p_warmup_flush = true
""", "tiny-gpt"),
    "plan-zero3.toml": ("""[plan]
tp = 2
dp = 4
zero = 3
reshard_after_forward = false
fsdp_prefetch = 2
grad_bucket = 1000000
overlap_grad_reduce = true
""", "tiny-llama"),
    "plan-moe.toml": ("""[plan]
tp = 1
ep = 4
etp = 1
mbs = 2
moe_dispatcher = "alltoall"
recompute = "full"
recompute_method = "uniform"
recompute_layers = 1
""", "tiny-moe"),
    "plan-zbv.toml": ("""[plan]
pp = 2
schedule = "zb-v"
""", "tiny-gpt"),
    "plan-uneven.toml": ("""[plan]
pp = 3
first_stage_layers = 1
last_stage_layers = 1
cp = 1
cp_comm = "p2p"
""", "tiny-gpt"),
    "plan-cp.toml": ("""[plan]
tp = 2
cp = 2
sp = true
cp_comm = "all-gather"
post_validation = false
""", "tiny-llama"),
}

MEGATRON_SMALL = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
                  "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16")
MEGATRON_SEEDS = [  # (line, cluster, gpus)
    (MEGATRON_SMALL + " --tensor-model-parallel-size 2", "dgx-h100", 8),
    ("torchrun --nproc_per_node 8 pretrain_gpt.py " + MEGATRON_SMALL +
     " --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --expert-model-parallel-size 2 "
     "--moe-layer-freq '([0]+[1]*3)' --swiglu --normalization RMSNorm --position-embedding-type rope "
     "--group-query-attention --num-query-groups 4 --disable-bias-linear", "dgx-h100", 8),
    ("--num-layers=4 --hidden-size=1024 --num-attention-heads 16 --seq-length=1024 --vocab-size=32000 "
     "--micro-batch-size=2 --global-batch-size 8 --bf16 --tensor-model-parallel-size=2 --data-path=a "
     "--pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer --recompute-activations",
     "dgx-h100", 8),
    ("--num-layers 96 --hidden-size 12288 --ffn-hidden-size 49152 --num-attention-heads 96 --vocab-size 51200 "
     "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 3 --global-batch-size 1536 --bf16 "
     "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 24 "
     "--sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
     "--tp-comm-overlap --overlap-p2p-communication-warmup-flush", "dgx-a100", 1024),
    ("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 8 --nnodes 32 --node_rank 0 --master_addr \"node-0\" "
     "--master_port 6000 pretrain_gpt.py --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 "
     "--num-attention-heads 64 --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
     "--norm-epsilon 1e-5 --position-embedding-type rope --rotary-base 500000 --use-rope-scaling "
     "--untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256 --tokenizer-type "
     "HuggingFaceTokenizer --tokenizer-model 'meta-llama/Meta-Llama-3-70B' --seq-length 8192 "
     "--max-position-embeddings 8192 --hidden-dropout 0.0 --attention-dropout 0.0 --micro-batch-size 1 "
     "--global-batch-size 1024 --bf16 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
     "--num-layers-per-virtual-pipeline-stage 5 --context-parallel-size 2 --sequence-parallel "
     "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap "
     "--recompute-activations --use-flash-attn --transformer-impl transformer_engine --use-mcore-models "
     "--attention-softmax-in-fp32 --lr=1.5e-4 --train-iters 1000 --mock-data   # a comment", "dgx-h100", 256),
    ("python pretrain_gpt.py --num-layers 105 --hidden-size 20480 --num-attention-heads 128 "
     "--seq-length 2048 --max-position-embeddings 2048 --tensor-model-parallel-size 8 "
     "--pipeline-model-parallel-size 35 --num-layers-per-virtual-pipeline-stage 1 --micro-batch-size 1 "
     "--global-batch-size 2520 --vocab-size 51200 --lr 6e-5 --bf16 --sequence-parallel "
     "--recompute-activations --use-distributed-optimizer", "dgx-a100", 2520),
]
MEGATRON_EXTRA_FLAGS = [
    ("--num-layers", "I"), ("--hidden-size", "I"), ("--ffn-hidden-size", "I"), ("--num-attention-heads", "I"),
    ("--num-query-groups", "I"), ("--kv-channels", "I"), ("--seq-length", "I"), ("--max-position-embeddings", "I"),
    ("--vocab-size", "I"), ("--micro-batch-size", "I"), ("--global-batch-size", "I"),
    ("--tensor-model-parallel-size", "I"), ("--pipeline-model-parallel-size", "I"),
    ("--context-parallel-size", "I"), ("--expert-model-parallel-size", "I"), ("--expert-tensor-parallel-size", "I"),
    ("--num-layers-per-virtual-pipeline-stage", "I"), ("--num-virtual-stages-per-pipeline-rank", "I"),
    ("--num-experts", "I"), ("--moe-router-topk", "I"), ("--moe-ffn-hidden-size", "I"),
    ("--moe-shared-expert-intermediate-size", "I"), ("--moe-layer-freq", "F"), ("--hidden-dropout", "R"),
    ("--attention-dropout", "R"), ("--recompute-granularity", "S"), ("--recompute-method", "S"),
    ("--recompute-num-layers", "I"), ("--window-size", "S"), ("--decoder-first-pipeline-num-layers", "I"),
    ("--decoder-last-pipeline-num-layers", "I"), ("--pipeline-model-parallel-layout", "S"), ("--fp8-format", "S"),
    ("--fp8-recipe", "S"), ("--moe-token-dispatcher-type", "S"), ("--mtp-num-layers", "I"),
    ("--moe-expert-capacity-factor", "R"), ("--moe-router-num-groups", "I"), ("--moe-router-group-topk", "I"),
    ("--make-vocab-size-divisible-by", "I"), ("--num-distributed-optimizer-instances", "I"),
    ("--cp-comm-type", "S"), ("--q-lora-rank", "I"), ("--kv-lora-rank", "I"), ("--multi-latent-attention", "-"),
    ("--swiglu", "-"), ("--sequence-parallel", "-"), ("--use-distributed-optimizer", "-"), ("--fp16", "-"),
    ("--bf16", "-"), ("--use-megatron-fsdp", "-"), ("--overlap-moe-expert-parallel-comm", "-"),
]
MOE_FREQ_EXPRS = ["1", "0", "-1", "2147483648", "[1,0,1,0]", "[]", "[", "'([0]+[1]*3)'", "'([1]*1000000000)'",
                  "'([1]*4)*1000000000'", "'[1]*2147483648'", "'[1]*-1'", "'([0]*3+'", "'" + "(" * 5000 + "1" +
                  ")" * 5000 + "'", "'[" + ",".join(["1"] * 50000) + "]'", "'2*[1,0]'", "'[1]*9999999999999999999'",
                  "'([1]*2)*([1]*2)'", "'[1]+[0]*-5'", "'1*[1]*1*[1]*1*[1]*4'", "'[1,0]*2**63'"]

INLINE_PLAN_SEEDS = [  # (plan, model)
    ("tp=2,pp=2", "tiny-gpt"),
    ("tp=1,pp=2,mbs=2,schedule=1f1b", "tiny-gpt"),
    ("tp=1,pp=2,vpp=2,schedule=interleaved,overlap_p2p_comm=on", "tiny-gpt"),
    ("tp=2,sp=on,recompute=selective,recompute_modules=core_attn+layernorm,distopt=on,overlap_grad_reduce=on",
     "tiny-llama"),
    ("tp=2,dp=4,zero=3,fsdp_prefetch=1,reshard_after_forward=off", "tiny-llama"),
    ("tp=1,ep=4,etp=1,moe_dispatcher=alltoall,mbs=1", "tiny-moe"),
    ("pp=2,schedule=zb-v", "tiny-gpt"),
    ("tp=2,cp=2,cp_comm=p2p,sp=on", "tiny-llama"),
    ("pp=2,recompute=full,recompute_method=block,recompute_layers=1,grad_bucket=1000", "tiny-gpt"),
]
PLAN_KEYS = ["tp", "pp", "vpp", "dp", "cp", "ep", "etp", "mbs", "sp", "recompute", "recompute_method",
             "recompute_layers", "recompute_modules", "distopt", "zero", "reshard_after_forward", "fsdp_prefetch",
             "fp8_param_gather", "dp_replicas", "grad_bucket", "overlap_grad_reduce", "overlap_param_gather",
             "tp_comm_overlap", "tp_grad_overlap", "grad_accum_fusion", "pp_scatter_gather", "overlap_p2p_comm",
             "overlap_p2p_warmup_flush", "moe_shared_expert_overlap", "moe_ep_overlap", "moe_dispatcher", "schedule",
             "post_validation", "attention", "cp_comm", "first_stage_layers", "last_stage_layers",
             "embedding_in_split", "loss_in_split", "layout", "microbatch_group"]
PLAN_PLAUSIBLE = {
    "tp": "1 2 4 8", "pp": "1 2 3 4", "vpp": "1 2 4", "dp": "1 2 4 8", "cp": "1 2 4", "ep": "1 2 4", "etp": "1 2",
    "mbs": "1 2 3 4 8 16", "recompute": "none selective full", "recompute_method": "uniform block",
    "recompute_layers": "0 1 2 4", "recompute_modules": "core_attn layernorm mlp moe moe_act core_attn+layernorm",
    "zero": "0 1 2 3", "fsdp_prefetch": "0 1 2 64", "dp_replicas": "1 2 4", "grad_bucket": "1 1000 100000000",
    "moe_dispatcher": "alltoall allgather flex", "attention": "flash unfused", "cp_comm": "p2p all-gather a2a",
    "schedule": "gpipe 1f1b interleaved zb-h1 zb-h2 zb-1p zb-2p zb-v dualpipe dualpipev",
    "first_stage_layers": "0 1 2 3", "last_stage_layers": "0 1 2 3", "microbatch_group": "1 2 3 4",
    "layout": "Et|tt|tL Ett|ttL E|tttt|L Etttt|L",
}
PLAN_VALUES = ["on", "off", "true", "false", "1", "0", "yes", "", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2",
               "zb-1p", "zb-2p", "zb-v", "dualpipe", "dualpipev", "none", "selective", "full", "uniform", "block",
               "flash", "unfused", "p2p", "all-gather", "a2a", "a2a+p2p", "alltoall", "allgather", "flex",
               "core_attn+layernorm+mla_up_proj+moe_act+mlp+moe+shared_experts", "moe+moe+moe", "+", "Et|tt|tL",
               "E|t|t|t|tL", "Ettt|tL", "E" + "t" * 100000 + "L", "|" * 1000, "m|m|m", "(E)", "E|" * 10000 + "L"]


def prepare_seeds(repo: Path, binp: str, seeddir: Path) -> dict:
    """Copy or write the seed samples into seeddir; return {loader: [(path, ctx)]}."""
    if seeddir.exists():
        shutil.rmtree(seeddir)
    seeddir.mkdir(parents=True)
    seeds = collections.defaultdict(list)

    def copy(loader, src: Path, ctx=None, name=None):
        d = seeddir / loader
        d.mkdir(exist_ok=True)
        dst = d / (name or src.name)
        shutil.copyfile(src, dst)
        seeds[loader].append((dst, ctx or {}))
        return dst

    def write(loader, name, text, ctx=None):
        d = seeddir / loader
        d.mkdir(exist_ok=True)
        dst = d / name
        dst.write_text(text)
        seeds[loader].append((dst, ctx or {}))
        return dst

    topo = repo / "topologies"
    fx = repo / "tests" / "fixtures"
    # 1. models: the tiny ones weigh more (three copies of each tiny seed in the list).
    for p in sorted((topo / "models").glob("*.toml")):
        copy("model-toml", p, {} if p.stem.startswith("tiny") else {"seq": "1024"})
        if p.stem.startswith("tiny"):
            seeds["model-toml"].extend([seeds["model-toml"][-1]] * 2)
    for n in ("tiny-model.toml", "wide-gpt.toml"):
        copy("model-toml", fx / "toml" / n)
        seeds["model-toml"].extend([seeds["model-toml"][-1]] * 2)
    # 2. clusters
    for p in sorted((topo / "clusters").glob("*.toml")):
        copy("cluster-toml", p)
    copy("cluster-toml", fx / "toml" / "tiny-cluster.toml")
    # 3. training
    for n, t in TRAINING_SEEDS.items():
        write("training-toml", n, t)
    for p in sorted((topo / "examples").glob("*.toml")):
        m = re.search(r"^\[training\][^\[]*", p.read_text(), re.M)
        if m:
            write("training-toml", "from-" + p.name, m.group(0))
    # 4. plans (each with the model it is valid for)
    for n, (t, model) in PLAN_SEEDS.items():
        write("plan-toml", n, t, {"model": model, "gpus": "6" if "pp = 3" in t else "8"})
    copy("plan-toml", fx / "toml" / "plan.toml", {"model": "tiny-gpt", "gpus": "8"})
    # 5. examples; the fixture example names tiny-model.toml and tiny-cluster.toml beside it
    for p in sorted((topo / "examples").glob("*.toml")):
        copy("example-toml", p)
    copy("example-toml", fx / "toml" / "example.toml")
    for n in ("tiny-model.toml", "tiny-cluster.toml"):  # named by example.toml, beside it
        shutil.copyfile(fx / "toml" / n, seeddir / "example-toml" / n)
    seeds["example-toml"].extend([seeds["example-toml"][-1]] * 2)
    # 6. calibration profiles: each with a cluster whose device it names
    dev2cluster = {}
    listing = subprocess.run([binp, "list"], capture_output=True, text=True, timeout=60).stdout
    for line in listing.splitlines():
        m = re.match(r"\s+(\S+)\s{2,}(.+)$", line)
        if m and not line.strip().endswith(".toml"):
            dev2cluster.setdefault(m.group(2).strip(), m.group(1))
    cal_files = sorted((topo / "profiles").glob("*.toml")) + sorted((topo / "calibrations").glob("*.toml")) + \
        sorted((fx / "profiles").glob("*.toml"))
    for p in cal_files:
        m = re.search(r'^device\s*=\s*"([^"]*)"', p.read_text(), re.M)
        cluster = dev2cluster.get(m.group(1), "dgx-h100") if m else "dgx-h100"
        copy("calibration-toml", p, {"cluster": cluster}, name=p.parent.name + "-" + p.name)
    # 7. Hugging Face configs
    for p in sorted((fx / "hf").glob("*.json")):
        copy("hf-config-json", p)
    # 8. megatron lines
    for i, (line, cluster, gpus) in enumerate(MEGATRON_SEEDS):
        write("megatron-args", f"line{i}.txt", line, {"cluster": cluster, "gpus": gpus})
    # 9. inline plans
    for i, (plan, model) in enumerate(INLINE_PLAN_SEEDS):
        write("inline-plan", f"plan{i}.txt", plan, {"model": model})
    # 10. traces: simulated traces of small models, and the measured GUI fixture
    d = seeddir / "trace-json"
    d.mkdir(exist_ok=True)
    trace_specs = [("tiny-gpt", "cpu-host", "2", "pp=2", "8"), ("tiny-gpt", "dgx-h100", "8", "tp=2,pp=2", "16"),
                   ("tiny-moe", "cpu-host", "2", "ep=2", "8")]
    for model, cluster, gpus, plan, gbs in trace_specs:
        out = d / f"sim-{model}-{cluster}-{plan.replace(',', '_').replace('=', '')}.json"
        subprocess.run([binp, "simulate", "--model", model, "--cluster", cluster, "--gpus", gpus, "--plan", plan,
                        "--global-batch", gbs, "--trace", str(out)], capture_output=True, timeout=120, check=True)
        seeds["trace-json"].append((out, {"pair": str(out)}))
    meas = repo / "tests" / "gui" / "fixtures" / "tiny-gpt-pp2-measured.json"
    if meas.exists():
        dst = d / meas.name
        shutil.copyfile(meas, dst)
        seeds["trace-json"].append((dst, {"pair": str(seeds["trace-json"][0][0])}))
    # 11. numeric CLI options: no file
    seeds["cli-numeric"].append((None, {}))
    # 12. DeepSpeed configs
    ds = topo / "examples" / "deepspeed-zero3.json"
    copy("deepspeed-json", ds)
    write("deepspeed-json", "ds-zero1.json", json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_batch_size": 128,
        "fp16": {"enabled": True}, "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000000}}, indent=1))
    write("deepspeed-json", "ds-zero2-mics.json", json.dumps({
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "overlap_comm": True, "mics_shard_size": 8}}, indent=1))
    # 13. MoE histograms for tiny-moe (4 experts, 3 MoE layers)
    write("moe-histogram", "hist-3layers.txt", "# tiny-moe routing\n10,20,30,40\n25,25,25,25\n1,2,3,94\n")
    write("moe-histogram", "hist-1layer.txt", "100,0,0,1\n")
    write("moe-histogram", "hist-float.txt", "0.5,1.5,2.5,3.5\n\n# comment\n7e3,7e3,7e3,7e3\n")
    return dict(seeds)


# --------------------------------------------------------------------------------------------------
# Case generation
# --------------------------------------------------------------------------------------------------
class Case:
    __slots__ = ("index", "loader", "seed", "mutation", "argv", "input_path", "command", "json_out", "note")

    def __init__(self, index, loader):
        self.index = index
        self.loader = loader
        self.seed = ""
        self.mutation = ""
        self.argv = []
        self.input_path = None
        self.command = ""
        self.json_out = False
        self.note = ""


def write_input(casedir: Path, case: Case, data: bytes, ext: str, rng) -> str:
    """Write a mutated input; sometimes hand the CLI something that is not a regular file instead."""
    r = rng.random()
    if r < 0.012:
        p = casedir / f"{case.index:06d}-dir{ext}"
        p.mkdir(parents=True, exist_ok=True)
        case.mutation += "+directory_instead_of_file"
        return str(p)
    if r < 0.018:
        case.mutation += "+missing_file"
        return str(casedir / f"{case.index:06d}-does-not-exist{ext}")
    if r < 0.022:
        case.mutation += "+dev_null"
        return "/dev/null"
    if r < 0.025:
        case.mutation += "+long_file_name"
        return str(casedir / ("n" * 300 + ext))
    if r < 0.027:
        case.mutation += "+dev_zero"
        return "/dev/zero"
    if r < 0.030:
        p = casedir / f"{case.index:06d}-loop{ext}"
        if not p.is_symlink():
            p.symlink_to(p.name)
        case.mutation += "+symlink_loop"
        return str(p)
    p = casedir / f"{case.index:06d}{ext}"
    p.write_bytes(data)
    return str(p)


def pick_seed(rng, seeds, loader):
    return rng.choice(seeds[loader])


def pick_command(rng, frac_sim=0.3, frac_plan=0.0):
    r = rng.random()
    if r < frac_plan:
        return "plan"
    if r < frac_plan + frac_sim:
        return "simulate"
    return "estimate"


def scenario_argv(cmd, rng, json_frac=0.8):
    a = [cmd]
    j = rng.random() < json_frac
    return a, j


def plan_tail(rng):
    return ["--threads", "1", "--no-progress", "--top", rng.choice(["2", "4"])]


def make_case(index: int, seed: int, seeds: dict, casedir: Path, binp: str, loaders=LOADERS) -> Case:
    rng = random.Random(f"megascope-campaign:{seed}:{index}")
    loader = loaders[index % len(loaders)]
    c = Case(index, loader)
    gen = GENERATORS[loader]
    gen(c, rng, seeds, casedir)
    c.argv = [binp] + c.argv
    if c.json_out:
        c.argv.append("--json")
    c.argv = [x.replace("\x00", "\\0") for x in c.argv]
    # Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN): cut, and say so.
    for k, a in enumerate(c.argv):
        if len(a.encode("utf-8", "surrogateescape")) > 120000:
            c.argv[k] = a.encode("utf-8", "surrogateescape")[:120000].decode("utf-8", "ignore")
            c.mutation += "+argv_cut_to_120000_bytes"
            if c.input_path and c.input_path.endswith(".txt") and k > 0 and c.argv[k - 1] in ("--megatron-args",
                                                                                              "--plan", "--explain"):
                Path(c.input_path).write_text(c.argv[k], encoding="utf-8", errors="surrogateescape")
    return c


def small_model_args(rng, model=None):
    model = model or rng.choice(["tiny-gpt", "tiny-gpt", "tiny-llama", "tiny-moe"])
    plan = {"tiny-moe": rng.choice(["tp=1,ep=4", "tp=2,pp=2", "tp=1"]),
            "tiny-llama": rng.choice(["tp=2,pp=2", "tp=1", "tp=2"]),
            "tiny-gpt": rng.choice(["tp=2,pp=2", "tp=1,pp=2", "tp=1"])}[model]
    return ["--model", model, "--cluster", "dgx-h100", "--gpus", "8", "--plan", plan, "--global-batch", "16"]


def gen_model_toml(c, rng, seeds, casedir):
    src, mctx = pick_seed(rng, seeds, "model-toml")
    c.seed = src.name
    data, c.mutation = mutate_text(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".toml", rng)
    c.input_path = path
    c.command = pick_command(rng, 0.3, 0.05)
    if c.command == "plan":
        c.argv = ["plan", "--model", path, "--cluster", "dgx-h100", "--gpus", rng.choice(["1", "2", "8"]),
                  "--global-batch", "8", "--seq-len", rng.choice(["64", "256"])] + plan_tail(rng)
    else:
        plan = rng.choice(["tp=1", "tp=1", "tp=2,pp=2", "tp=8", "pp=2,vpp=2,schedule=interleaved"])
        c.argv = [c.command, "--model", path, "--cluster", "dgx-h100", "--gpus", "8", "--plan", plan,
                  "--global-batch", "16"]
        if mctx.get("seq") and rng.random() < 0.8:
            c.argv += ["--seq-len", mctx["seq"]]
    c.json_out = rng.random() < 0.8


def gen_cluster_toml(c, rng, seeds, casedir):
    src, _ = pick_seed(rng, seeds, "cluster-toml")
    c.seed = src.name
    data, c.mutation = mutate_text(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".toml", rng)
    c.input_path = path
    c.command = pick_command(rng, 0.3, 0.05)
    if c.command == "plan":
        c.argv = ["plan", "--model", "tiny-gpt", "--cluster", path, "--gpus", rng.choice(["1", "2", "1-4"]),
                  "--global-batch", "8"] + plan_tail(rng)
    else:
        model = rng.choice(["tiny-gpt", "tiny-gpt", "tiny-moe"])
        gpus = rng.choice(["--gpus=2", "--gpus=2", "--gpus=4", "--nodes=1", "--gpus=16"])
        plan = "ep=2" if model == "tiny-moe" else rng.choice(["tp=1,pp=2", "tp=2"])
        c.argv = [c.command, "--model", model, "--cluster", path, gpus, "--plan", plan, "--global-batch", "8"]
    c.json_out = rng.random() < 0.8


def gen_training_toml(c, rng, seeds, casedir):
    src, _ = pick_seed(rng, seeds, "training-toml")
    c.seed = src.name
    data, c.mutation = mutate_text(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".toml", rng)
    c.input_path = path
    c.command = pick_command(rng, 0.3, 0.05)
    if c.command == "plan":
        c.argv = ["plan", "--model", "tiny-llama", "--cluster", "dgx-h100", "--gpus", rng.choice(["1", "2", "4"]),
                  "--training", path] + plan_tail(rng)
    else:
        model = "tiny-llama"
        c.argv = [c.command, "--model", model, "--cluster", rng.choice(["dgx-h100", "dgx-b200"]), "--gpus", "8",
                  "--plan", rng.choice(["tp=2,pp=2,distopt=on", "tp=2,distopt=on", "tp=1,pp=2"]), "--training", path]
    c.json_out = rng.random() < 0.8


def gen_plan_toml(c, rng, seeds, casedir):
    src, ctx = pick_seed(rng, seeds, "plan-toml")
    c.seed = src.name
    data, c.mutation = mutate_text(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".toml", rng)
    c.input_path = path
    if rng.random() < 0.06:
        c.command = "plan --explain"
        c.argv = ["plan", "--model", ctx["model"], "--cluster", "dgx-h100", "--gpus", ctx["gpus"],
                  "--global-batch", "16", "--explain", path] + plan_tail(rng)
    else:
        c.command = pick_command(rng, 0.3, 0.0)
        c.argv = [c.command, "--model", ctx["model"], "--cluster", "dgx-h100", "--gpus", ctx["gpus"],
                  "--global-batch", "16", "--plan", path]
    c.json_out = rng.random() < 0.8


def gen_example_toml(c, rng, seeds, casedir):
    src, _ = pick_seed(rng, seeds, "example-toml")
    c.seed = src.name
    data, c.mutation = mutate_text(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".toml", rng)
    c.input_path = path
    c.command = pick_command(rng, 0.35, 0.0)
    c.argv = [c.command, "--example", path]
    c.json_out = rng.random() < 0.8


def gen_calibration_toml(c, rng, seeds, casedir):
    src, ctx = pick_seed(rng, seeds, "calibration-toml")
    c.seed = src.name
    data, c.mutation = mutate_text(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".toml", rng)
    c.input_path = path
    cluster = ctx.get("cluster", "dgx-h100")
    if rng.random() < 0.08:
        c.command = "plan"
        c.argv = ["plan", "--model", "tiny-gpt", "--cluster", cluster, "--gpus", rng.choice(["1", "2"]),
                  "--global-batch", "8", "--calibration", path] + plan_tail(rng)
    else:
        c.command = "simulate"
        model = rng.choice(["tiny-gpt", "tiny-llama", "tiny-moe", "llama3-8b"])
        plan = {"tiny-moe": "ep=2", "llama3-8b": "tp=2,pp=2"}.get(model, rng.choice(["tp=1,pp=2", "tp=2"]))
        c.argv = ["simulate", "--model", model, "--cluster", cluster, "--gpus", "2" if cluster == "cpu-host" else "8",
                  "--plan", plan, "--global-batch", "8", "--calibration", path]
        if model == "llama3-8b":
            c.argv += ["--seq-len", "1024"]
    c.json_out = rng.random() < 0.8


def gen_hf_json(c, rng, seeds, casedir):
    src, _ = pick_seed(rng, seeds, "hf-config-json")
    c.seed = src.name
    data, c.mutation = mutate_json(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".json", rng)
    c.input_path = path
    c.command = pick_command(rng, 0.3, 0.03)
    if c.command == "plan" and "deepseek" in src.name:
        c.command = "simulate"  # the planner takes ~25 s on DeepSeek-V3 unmutated: too slow for a case
    if c.command == "plan":
        c.argv = ["plan", "--model", path, "--cluster", "dgx-h100", "--gpus", rng.choice(["8", "16"]),
                  "--global-batch", "16", "--seq-len", "512"] + plan_tail(rng)
    else:
        c.argv = [c.command, "--model", path, "--cluster", "dgx-h100", "--gpus", "8",
                  "--plan", rng.choice(["tp=1", "tp=8", "tp=2,pp=2"]), "--global-batch", "16"]
        if rng.random() < 0.7:
            c.argv += ["--seq-len", rng.choice(["512", "1024"])]
    c.json_out = rng.random() < 0.8


def gen_megatron(c, rng, seeds, casedir):
    src, ctx = pick_seed(rng, seeds, "megatron-args")
    c.seed = src.name
    line = src.read_text()
    descs = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        toks = line.split(" ")
        op = rng.choice(["value_edge"] * 6 + ["drop_token"] * 2 + ["dup_flag", "unknown_flag", "extra_flag"] * 2 +
                        ["moe_freq"] * 2 + ["quote", "equals", "long", "unicode", "text"])
        flag_idx = [i for i, t in enumerate(toks) if t.startswith("--")]
        if op == "value_edge":
            vi = [i for i in range(1, len(toks)) if toks[i - 1].startswith("--") and not toks[i].startswith("--")]
            vi += [i for i in flag_idx if "=" in toks[i]]
            if vi:
                i = rng.choice(vi)
                v = rng.choice(EDGE_NUMS + ["", "x", "'1'", '"2"', "1 2"])
                if "=" in toks[i] and toks[i].startswith("--"):
                    toks[i] = toks[i].split("=", 1)[0] + "=" + v
                else:
                    toks[i] = v
                descs.append(f"value_edge({toks[i - 1] if not toks[i].startswith('--') else toks[i][:30]}={v[:20]})")
        elif op == "drop_token" and toks:
            i = rng.randrange(len(toks))
            descs.append(f"drop({toks[i][:30]})")
            del toks[i]
        elif op == "dup_flag" and flag_idx:
            i = rng.choice(flag_idx)
            v = rng.choice(EDGE_NUMS[:20])
            toks += [toks[i].split("=")[0], v]
            descs.append(f"dup_flag({toks[i][:30]}={v[:20]})")
        elif op == "unknown_flag":
            f = rng.choice(["--frobnicate", "--num-layerz", "-x", "---num-layers", "--", "-", "--=1",
                            "--NUM-LAYERS", "--num_layers"])
            toks.insert(rng.randrange(len(toks) + 1), f)
            descs.append(f"unknown_flag({f})")
        elif op in ("extra_flag", "moe_freq"):
            if op == "moe_freq":
                f, kind = "--moe-layer-freq", "F"
            else:
                f, kind = rng.choice(MEGATRON_EXTRA_FLAGS)
            if kind == "-":
                toks.append(f)
                descs.append(f"extra_flag({f})")
            else:
                if kind == "F":
                    v = rng.choice(MOE_FREQ_EXPRS)
                    if "--num-experts" not in line:
                        toks += ["--num-experts", "4"]
                elif kind == "S":
                    v = rng.choice(["full", "selective", "uniform", "block", "hybrid", "e4m3", "blockwise",
                                    "mxfp8", "alltoall", "flex", "a2a+p2p", "4096,0", "-1,0", "0,0", "x",
                                    "Et|tt|tL", "E" + "|t" * 4 + "|L", "''", "2147483648,0"])
                else:
                    v = rng.choice(EDGE_NUMS)
                toks += [f, v]
                descs.append(f"extra_flag({f} {v[:30]})")
        elif op == "quote":
            q = rng.choice(["'", '"', "\\", "\\\n", "\\\r\n", "'\"'", "\"'\""])
            toks.insert(rng.randrange(len(toks) + 1), q)
            descs.append(f"quote({q!r})")
        elif op == "equals" and flag_idx:
            i = rng.choice(flag_idx)
            if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                toks[i] = toks[i] + "=" + toks[i + 1]
                del toks[i + 1]
                toks.insert(i + 1, rng.choice(["=", "==", "=1", ""]))
                descs.append(f"equals({toks[i][:30]})")
        elif op == "long":
            n = rng.choice([1000, 5000, 50000])
            kind = rng.choice(["repeat_flag", "long_value", "many_words", "long_flag"])
            if kind == "repeat_flag":
                n = min(n, 5000)
            if kind == "repeat_flag":
                toks += ["--num-layers 4"] * n
            elif kind == "long_value":
                toks += ["--num-layers", "4" * n]
            elif kind == "many_words":
                toks = ["w"] * n + toks
            else:
                toks += ["--" + "x" * n, "1"]
            descs.append(f"long_{kind}(n={n})")
        elif op == "unicode":
            i = rng.randrange(len(toks) + 1)
            u = rng.choice(["\u2014num-layers", "\u00e9", "\U0001F600", "\u202e", "\uff0d\uff0dnum-layers", "\u00a0"])
            toks.insert(i, u)
            descs.append(f"unicode({u!r})")
        else:
            d2, dd = mutate_text(rng, " ".join(toks).encode("utf-8", "surrogatepass"),
                                 [(m_byte_flip, 3), (m_truncate, 3), (m_byte_set, 3)])
            toks = d2.decode("utf-8", "replace").split(" ")
            descs.append(dd)
        line = " ".join(toks)
    c.mutation = "+".join(descs) or "none"
    p = casedir / f"{c.index:06d}-megatron.txt"
    p.write_text(line, encoding="utf-8", errors="surrogatepass")
    c.input_path = str(p)
    c.command = "estimate" if rng.random() < 0.85 else "simulate"
    gpus = str(ctx["gpus"])
    if rng.random() < 0.1:
        gpus = rng.choice(["1", "7", "16", "4096"])
    c.argv = [c.command, "--megatron-args", line, "--cluster", ctx["cluster"], "--gpus", gpus]
    if c.command == "simulate" and ctx["gpus"] > 64:
        c.command = "estimate"
        c.argv[0] = "estimate"
    c.json_out = rng.random() < 0.8


def gen_inline_plan(c, rng, seeds, casedir):
    src, ctx = pick_seed(rng, seeds, "inline-plan")
    c.seed = src.name
    plan = src.read_text()
    descs = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        toks = plan.split(",")
        op = rng.choice(["value_edge"] * 4 + ["key_value"] * 3 + ["plausible"] * 8 +
                        ["drop", "dup", "unknown", "syntax", "long", "unicode", "bytes"])
        if op == "value_edge" and toks:
            i = rng.randrange(len(toks))
            k = toks[i].split("=")[0]
            v = rng.choice(EDGE_NUMS)
            toks[i] = f"{k}={v}"
            descs.append(f"value_edge({k}={v[:20]})")
        elif op == "plausible":
            k = rng.choice(PLAN_KEYS)
            v = rng.choice(PLAN_PLAUSIBLE.get(k, "on off").split())
            toks = [t for t in toks if t.split("=")[0] != k] + [f"{k}={v}"]
            descs.append(f"plausible({k}={v})")
        elif op == "key_value":
            k = rng.choice(PLAN_KEYS)
            v = rng.choice(PLAN_VALUES + EDGE_NUMS[:30])
            toks.insert(rng.randrange(len(toks) + 1), f"{k}={v}")
            descs.append(f"set({k}={v[:20]})")
        elif op == "drop" and toks:
            i = rng.randrange(len(toks))
            descs.append(f"drop({toks[i][:20]})")
            del toks[i]
        elif op == "dup" and toks:
            i = rng.randrange(len(toks))
            toks.append(toks[i].split("=")[0] + "=" + rng.choice(["1", "2", "0", "on"]))
            descs.append(f"dup({toks[i][:20]})")
        elif op == "unknown":
            t = rng.choice(["frob=1", "TP=2", "tp ", " tp=2", "tp=2 ", "tp:2", "tp==2", "=2", "tp=", "tp", "=",
                            "tp=2=3", "vpp=-", "tp=0x2", "tp=2.0", "tp=+2", "tp=1e1"])
            toks.insert(rng.randrange(len(toks) + 1), t)
            descs.append(f"token({t!r})")
        elif op == "syntax":
            s = rng.choice(["", ",", ",,", ";", " ", "\t", "\n", "tp=2;pp=2", "{tp=2}", "[plan]", "tp=2,,pp=2"])
            if rng.random() < 0.5:
                toks = [s]
            else:
                toks.append(s)
            descs.append(f"syntax({s!r})")
        elif op == "long":
            n = rng.choice([1000, 10000, 50000])
            kind = rng.choice(["tokens", "key", "value", "modules", "layout"])
            if kind in ("tokens", "modules"):
                n = min(n, 10000)
            if kind == "tokens":
                toks += ["tp=1"] * n
            elif kind == "key":
                toks.append("k" * n + "=1")
            elif kind == "value":
                toks.append("tp=" + "1" * n)
            elif kind == "modules":
                toks.append("recompute=selective,recompute_modules=" + "+".join(["core_attn"] * n))
            else:
                toks.append("layout=" + "E" + "|t" * n + "|L")
            descs.append(f"long_{kind}(n={n})")
        elif op == "unicode":
            u = rng.choice(["tp=\u0662", "t\u0070=2", "tp\u200b=2", "\ufefftp=2", "tp=\U0001F600", "pp=\uff12"])
            toks.append(u)
            descs.append(f"unicode({u!r})")
        else:
            b, d = m_byte_flip(rng, ",".join(toks).encode())
            toks = b.decode("utf-8", "replace").split(",")
            descs.append(d)
        plan = ",".join(toks)
    c.mutation = "+".join(descs)
    p = casedir / f"{c.index:06d}-plan.txt"
    p.write_text(plan, encoding="utf-8", errors="surrogatepass")
    c.input_path = str(p)
    r = rng.random()
    model = ctx["model"]
    if r < 0.06:
        c.command = "plan --explain"
        c.argv = ["plan", "--model", model, "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                  "--explain", plan] + plan_tail(rng)
    else:
        c.command = "simulate" if r < 0.36 else "estimate"
        c.argv = [c.command, "--model", model, "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                  "--plan", plan]
    c.json_out = rng.random() < 0.8


TRACE_FIELDS_NUM = ["ts", "dur", "pid", "tid"]


def unshared(e, **kw):
    """A copy of one trace event that shares no container with it (later mutations touch one event only)."""
    return json.loads(json.dumps(dict(e, **kw))) if any(isinstance(v, (dict, list)) for v in e.values()) \
        else dict(e, **kw)


def trace_ops(rng, obj):
    """Trace-specific structured mutations."""
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list) or not obj["traceEvents"]:
        return json_structured(rng, obj)
    ev = obj["traceEvents"]
    evd = [e for e in ev if isinstance(e, dict)]
    if not evd:
        return json_structured(rng, obj)
    op = rng.choice(["event_field", "event_field", "header", "drop_events", "dup_events", "shuffle", "ph",
                     "name", "many_events", "args"])
    if op == "event_field":
        e = rng.choice(evd)
        f = rng.choice(TRACE_FIELDS_NUM)
        v = rng.choice(JSON_EDGE_NUMS + ['"1"', "null", "[]"])
        e[f] = Raw(v)
        return obj, f"event.{f}={v[:20]}"
    if op == "header":
        h = obj.get("megascope")
        if isinstance(h, dict) and h:
            k = rng.choice(list(h.keys()))
            v = rng.choice([Raw(rng.choice(JSON_EDGE_NUMS)), "", "measured", "simulated", "tp=2,pp=2", "x" * 10000,
                            None, [], {}])
            h[k] = v
            return obj, f"header.{k}={str(v)[:20]!r}"
        return obj, "header(none)"
    if op == "drop_events":
        n = rng.choice([1, 10, len(ev)])
        for _ in range(min(n, len(ev))):
            ev.pop(rng.randrange(len(ev)))
        return obj, f"drop_events({n})"
    if op == "dup_events":
        e = rng.choice(evd)
        ev.extend([unshared(e) for _ in range(rng.choice([1, 10, 1000]))])
        return obj, "dup_events"
    if op == "shuffle":
        rng.shuffle(ev)
        return obj, "shuffle_events"
    if op == "ph":
        e = rng.choice(evd)
        e["ph"] = rng.choice(["B", "E", "X", "M", "", "XX", 1, None, "i"])
        return obj, f"ph={e['ph']!r}"
    if op == "name":
        e = rng.choice(evd)
        e["name"] = rng.choice(["", "F", "F attention mb-1", "F attention mb99999999999", "B mlp mb0",
                                "\u00e9" * 100, "x" * 100000, " ", "F  mb0", "W mlp mb0", "F attention mb"])
        return obj, f"name={e['name'][:20]!r}"
    if op == "many_events" and len(ev) < 20000:
        xs = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X"]
        if xs:
            e = xs[0]
            n = rng.choice([10000, 50000])
            ev.extend([unshared(e, ts=i * 0.001) for i in range(n)])
            return obj, f"many_events({n})"
        return obj, "many_events(none)"
    e = rng.choice(evd)
    if isinstance(e.get("args"), dict) and e["args"]:
        k = rng.choice(list(e["args"].keys()))
        e["args"][k] = Raw(rng.choice(JSON_EDGE_NUMS)) if rng.random() < 0.6 else rng.choice(["x", None, [], {}])
        return obj, f"args.{k}"
    return obj, "args(none)"


def gen_trace(c, rng, seeds, casedir):
    src, ctx = pick_seed(rng, seeds, "trace-json")
    c.seed = src.name
    data, c.mutation = mutate_json(rng, src.read_bytes(), trace_ops)
    path = write_input(casedir, c, data, ".json", rng)
    c.input_path = path
    pair = ctx["pair"]
    c.command = "compare"
    if rng.random() < 0.6:
        c.argv = ["compare", pair, path]
        c.mutation = "measured:" + c.mutation
    else:
        c.argv = ["compare", path, pair]
        c.mutation = "simulated:" + c.mutation
    if rng.random() < 0.3:
        c.argv.append("--force")
    c.json_out = rng.random() < 0.7


def gen_cli_numeric(c, rng, seeds, casedir):
    c.seed = "-"
    r = rng.random()
    descs = []
    if r < 0.55:
        c.command = "estimate" if rng.random() < 0.6 else "simulate"
        model = rng.choice(["tiny-gpt", "tiny-moe", "tiny-llama"])
        opts = {"--gpus": "8", "--global-batch": "16", "--seq-len": None, "--moe-imbalance": None,
                "--mtp-layers": None, "--nodes": None}
        for _ in range(rng.choice([1, 1, 2])):
            k = rng.choice(["--gpus", "--gpus", "--global-batch", "--global-batch", "--seq-len", "--seq-len",
                            "--moe-imbalance", "--mtp-layers", "--nodes"])
            v = rng.choice(CLI_EDGE if rng.random() < 0.5 else CLI_PLAUSIBLE.get(k, CLI_EDGE))
            opts[k] = v
            if k == "--nodes":
                opts["--gpus"] = None
            if k == "--gpus":
                opts["--nodes"] = None
            descs.append(f"{k}={v[:20]!r}")
        plan = "tp=1,ep=2" if model == "tiny-moe" else rng.choice(["tp=2,pp=2", "tp=1", "pp=2"])
        c.argv = [c.command, "--model", model, "--cluster", "dgx-h100", "--plan", plan]
        for k, v in opts.items():
            if v is not None:
                c.argv.append(f"{k}={v}" if v.startswith("-") or v == "" or rng.random() < 0.5 else k)
                if not c.argv[-1].startswith(k + "="):
                    c.argv.append(v)
    else:
        c.command = "plan"
        model = rng.choice(["tiny-gpt", "tiny-moe"])
        opts = {"--gpus": rng.choice(["2", "4", "1-4"]), "--global-batch": "8"}
        extra_ok = ["--seq-len", "--headroom", "--threads", "--top", "--min-dp", "--uneven-depth",
                    "--moe-imbalance", "--max-gpus", "--tp", "--pp", "--dp", "--mbs", "--vpp", "--ep", "--cp"]
        for _ in range(rng.choice([1, 1, 2])):
            k = rng.choice(["--gpus", "--gpus", "--global-batch"] + extra_ok)
            if k in ("--gpus", "--max-gpus"):
                a, b = rng.choice(CLI_EDGE[:12]), rng.choice(CLI_EDGE[:12])
                v = rng.choice([rng.choice(CLI_EDGE), f"{a}-{b}", f"1-{b}", f"{a}-", "-", f"{a}-{b}-3", "8-1",
                                "1-2147483647", "0-0", "1-1e9", "4,8"])
                if k == "--max-gpus":
                    opts.pop("--gpus", None)
                    v = rng.choice(["1", "2", "8", "16"] + CLI_EDGE)
            elif k in ("--tp", "--pp", "--dp", "--mbs", "--vpp", "--ep", "--cp"):
                v = rng.choice(["<=" + rng.choice(CLI_EDGE), ">=" + rng.choice(CLI_EDGE), rng.choice(CLI_EDGE),
                                "1-" + rng.choice(CLI_EDGE), ",".join(rng.choice(CLI_EDGE[:10]) for _ in range(3)),
                                "<=", ">=", "1,,2", "2-1"])
            else:
                v = rng.choice(CLI_EDGE if rng.random() < 0.5 else CLI_PLAUSIBLE.get(k, CLI_EDGE))
            opts[k] = v
            descs.append(f"{k}={v[:20]!r}")
        c.argv = ["plan", "--model", model, "--cluster", "dgx-h100"]
        for k, v in opts.items():
            c.argv.append(f"{k}={v}")
        if "--threads" not in opts:
            c.argv += ["--threads", "1"]
        if "--top" not in opts:
            c.argv += ["--top", "2"]
        c.argv.append("--no-progress")
    c.mutation = "+".join(descs)
    p = casedir / f"{c.index:06d}-cli.txt"
    p.write_text(shlex.join(c.argv), encoding="utf-8", errors="surrogatepass")
    c.input_path = str(p)
    c.json_out = rng.random() < 0.8


def gen_deepspeed(c, rng, seeds, casedir):
    src, _ = pick_seed(rng, seeds, "deepspeed-json")
    c.seed = src.name
    data, c.mutation = mutate_json(rng, src.read_bytes())
    path = write_input(casedir, c, data, ".json", rng)
    c.input_path = path
    c.command = "estimate" if rng.random() < 0.75 else "simulate"
    c.argv = [c.command, "--model", rng.choice(["tiny-gpt", "tiny-llama"]), "--cluster", "dgx-h100", "--gpus", "16",
              "--plan", rng.choice(["tp=1", "tp=2", "tp=1,pp=2"]), "--deepspeed-config", path]
    c.json_out = rng.random() < 0.8


def gen_histogram(c, rng, seeds, casedir):
    src, _ = pick_seed(rng, seeds, "moe-histogram")
    c.seed = src.name
    table = [(m_num_edge_csv, 12), (m_num_perturb_csv, 10), (m_byte_flip, 3), (m_delete_lines, 2), (m_duplicate_line, 3), (m_truncate, 2),
             (m_empty, 1), (m_binary_junk, 1), (m_unicode, 2), (m_csv_shape, 6)]
    data, c.mutation = mutate_text(rng, src.read_bytes(), table)
    path = write_input(casedir, c, data, ".txt", rng)
    c.input_path = path
    c.command = rng.choice(["simulate", "simulate", "simulate", "plan"])
    if c.command == "plan":
        c.argv = ["plan", "--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "16",
                  "--moe-histogram", path] + plan_tail(rng)
    else:
        c.argv = ["simulate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8",
                  "--plan", rng.choice(["tp=1,ep=4", "tp=1,ep=2", "tp=2,pp=2"]), "--global-batch", "16",
                  "--moe-histogram", path]
    c.json_out = rng.random() < 0.8


CSV_NUM_RE = re.compile(rb"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def m_num_edge_csv(rng, data):
    ms = list(CSV_NUM_RE.finditer(data))
    if not ms:
        return data + b"\n1,2,3,4", "num_edge_csv(append)"
    m = rng.choice(ms)
    v = rand_num_edge(rng)
    return data[:m.start()] + v.encode() + data[m.end():], f"num_edge_csv({v[:20]})"


def m_num_perturb_csv(rng, data):
    ms = list(CSV_NUM_RE.finditer(data))
    if not ms:
        return data + b"\n1,2,3,4", "num_perturb_csv(append)"
    m = rng.choice(ms)
    v = perturb_number(rng, m.group(0).decode())
    return data[:m.start()] + v.encode() + data[m.end():], f"num_perturb_csv({v[:20]})"


def m_csv_shape(rng, data):
    op = rng.choice(["more_cols", "fewer_cols", "many_lines", "long_line", "sep", "all_zero"])
    ls = [l for l in data.split(b"\n")]
    if op == "more_cols":
        return data.replace(b"\n", b",5\n", 1), "csv_more_cols"
    if op == "fewer_cols":
        return re.sub(rb",[^,\n]*\n", b"\n", data, count=1), "csv_fewer_cols"
    if op == "many_lines":
        n = rng.choice([100, 100000])
        return data + b"\n" + b"\n".join([b"1,2,3,4"] * n), f"csv_many_lines({n})"
    if op == "long_line":
        n = rng.choice([1000, 1000000])
        return b",".join([b"1"] * n), f"csv_long_line({n})"
    if op == "sep":
        s = rng.choice([b" ", b";", b"\t", b",,", b", ", b"\r"])
        return data.replace(b",", s), f"csv_sep({s!r})"
    return b"0,0,0,0\n0,0,0,0\n", "csv_all_zero"


GENERATORS = {
    "model-toml": gen_model_toml, "cluster-toml": gen_cluster_toml, "training-toml": gen_training_toml,
    "plan-toml": gen_plan_toml, "example-toml": gen_example_toml, "calibration-toml": gen_calibration_toml,
    "hf-config-json": gen_hf_json, "megatron-args": gen_megatron, "inline-plan": gen_inline_plan,
    "trace-json": gen_trace, "cli-numeric": gen_cli_numeric, "deepspeed-json": gen_deepspeed,
    "moe-histogram": gen_histogram,
}


# --------------------------------------------------------------------------------------------------
# Running and classifying
# --------------------------------------------------------------------------------------------------
def limit_child(mem_mb):
    def f():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if mem_mb > 0:
            b = mem_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (b, b))
    return f


def run_argv(argv, timeout, mem_mb, tmpdir: Path, tag: str):
    """Run argv; returns dict(rc, signal, timed_out, wall, maxrss_kb, stdout, stderr)."""
    out_p = tmpdir / f"{tag}.out"
    err_p = tmpdir / f"{tag}.err"
    t0 = time.monotonic()
    with open(out_p, "wb") as fo, open(err_p, "wb") as fe:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, start_new_session=True,
                             preexec_fn=limit_child(mem_mb), cwd=str(tmpdir))
    timed_out = False
    status, ru = 0, None
    delay = 0.002
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > timeout:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 0.05)
    wall = time.monotonic() - t0
    p.returncode = 0  # reaped by wait4
    rc = os.waitstatus_to_exitcode(status)
    stdout = out_p.read_bytes()
    stderr = err_p.read_bytes()
    out_p.unlink(missing_ok=True)
    err_p.unlink(missing_ok=True)
    return {"rc": rc, "timed_out": timed_out, "wall": wall, "maxrss_kb": ru.ru_maxrss if ru else 0,
            "stdout": stdout, "stderr": stderr}


NEG_OK_KEY = re.compile(r"error|signed|delta|diff|offset|bias|skew|change|relative|rel_|vs_", re.I)
NANINF_RE = re.compile(r"(?<![A-Za-z])[-+]?(nan|inf|infinity)(?![A-Za-z])", re.I)
NEG_UNIT_RE = re.compile(r"(?<![\w+.\-=])-\d+(?:\.\d+)?(?:e[-+]?\d+)?\s*(s\b|ms\b|us\b|GiB|MiB|B\b|tokens/s|"
                         r"TFLOP/s|%|GB/s)")
ECHO_KEYS = {"model", "cluster", "device", "name", "plan", "source", "cost_profile", "class", "file", "kind",
             "simulated", "measured", "megatron_args"}
MFU_TEXT_RE = re.compile(r"MFU\s+(-?[\d.]+)%")


def check_json_figures(obj):
    problems = []

    def walk(o, path):
        if len(problems) > 5:
            return
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + [str(k)])
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, path + [str(i)])
        elif o is None:
            # nlohmann::json writes NaN and infinity as null. compare writes null on purpose for an
            # error with nothing measured (std::optional), so only nulls outside errors count.
            if not (path and "error" in path[-1]):
                problems.append(f"{'.'.join(path)}=null (NaN/inf written as null?)")
        elif isinstance(o, bool):
            return
        elif isinstance(o, (int, float)):
            key = ".".join(path)
            last = path[-1] if path else ""
            if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
                problems.append(f"{key}={o}")
            elif o < 0 and not NEG_OK_KEY.search(key):
                problems.append(f"{key}={o}")
            elif last.startswith("mfu") and o > 1.0 + 1e-9:
                problems.append(f"{key}={o} (MFU>100%)")
        elif isinstance(o, str):
            key = ".".join(path)
            if path and (path[0] == "setup" or path[-1] in ECHO_KEYS):
                return  # names echoed from the input
            if NANINF_RE.search(o):
                problems.append(f"{key} text {o[:80]!r}")
            m = NEG_UNIT_RE.search(o)
            if m and not NEG_OK_KEY.search(key) and "error" not in o and "signed" not in o:
                problems.append(f"{key} text {o[max(0, m.start() - 30):m.end() + 10]!r}")

    walk(obj, [])
    return problems


def check_text_figures(text: str, command: str):
    problems = []
    for line in text.splitlines():
        low = line.lower()
        if NANINF_RE.search(line):
            problems.append(f"nan/inf: {line.strip()[:120]}")
        if command != "compare" and "signed" not in low and "error" not in low:
            m = NEG_UNIT_RE.search(line)
            if m:
                problems.append(f"negative: {line.strip()[:120]}")
        for m in MFU_TEXT_RE.finditer(line):
            try:
                v = float(m.group(1))
                if v < 0 or v > 100:
                    problems.append(f"MFU {v}%: {line.strip()[:120]}")
            except ValueError:
                pass
        if len(problems) > 5:
            break
    return problems


def classify(res, case_json: bool, command: str):
    err = res["stderr"].decode("utf-8", "replace")
    out = res["stdout"].decode("utf-8", "replace")
    rc = res["rc"]
    if res["timed_out"]:
        return "HANG", ""
    if rc < 0:
        return "SIGNAL", signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(rc)
    if rc == 3 or "internal error" in err.lower():
        return "INTERNAL", ""
    if rc in (0, 4):
        problems = []
        if "internal error" in out.lower():
            problems.append("'internal error' in stdout")
        if case_json:
            try:
                obj = json.loads(out)
                problems += check_json_figures(obj)
            except ValueError as e:
                problems.append(f"--json output does not parse: {e}")
        else:
            problems += check_text_figures(out, command)
        if problems:
            return "BAD_OK", "; ".join(problems[:4])
        return ("OK" if rc == 0 else "NOFIT"), ""
    if rc in (1, 2):
        return ("REJECTED" if err.strip() else "NO_MSG"), ""
    return "OTHER_EXIT", ""


def stderr_tail(b: bytes, n=400):
    s = b.decode("utf-8", "replace").strip()
    return s[-n:]


def signature(cls, detail, stderr: str, loader: str, mutation: str = ""):
    """Group failures by root cause: class + normalised last stderr line (or BAD_OK detail)."""
    if cls == "BAD_OK":
        base = re.sub(r"\.\d+\.", ".N.", detail.split(";")[0])
        base = re.sub(r"=[-\d.e+]+", "=X", base)
        base = re.sub(r"'.*", "", base)
        return f"BAD_OK {base[:120]}"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if not last or cls in ("SIGNAL", "HANG"):
        # No message to group by: the loader and the first mutation operator stand in for the crash site.
        special = re.findall(r"\+(directory_instead_of_file|missing_file|dev_null|dev_zero|long_file_name|"
                             r"symlink_loop|argv_cut_to_120000_bytes)", mutation)
        op = special[0] if special else (re.split(r"[(+]", mutation)[0] if mutation else "")
        last = f"[{loader} {op}] " + last
    last = re.sub(r"/tmp/\S+", "FILE", last)
    last = re.sub(r"'[^']*'", "'Q'", last)
    last = re.sub(r"\"[^\"]*\"", '"Q"', last)
    last = re.sub(r"\d+", "N", last)
    return f"{cls}{(' ' + detail) if detail else ''} {last[:160]}"


def repro_line(argv, input_path):
    parts = []
    for a in argv:
        if input_path and len(a) > 160 and input_path.endswith(".txt") and Path(input_path).exists():
            try:
                if Path(input_path).read_text(encoding="utf-8", errors="surrogatepass") == a:
                    parts.append(f'"$(cat {input_path})"')
                    continue
            except OSError:
                pass
        parts.append(shlex.quote(a) if len(a) < 400 else shlex.quote(a[:60]) + f"...<{len(a)} chars>")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------
# Baselines: each seed unmutated, so a reader can see the seeds reach the code past the parser
# --------------------------------------------------------------------------------------------------
def baseline_argv(loader, path, ctx, binp):
    p = str(path) if path else ""
    if loader == "model-toml":
        return [binp, "estimate", "--model", p, "--cluster", "dgx-h100", "--gpus", "8", "--plan", "tp=1",
                "--global-batch", "16", "--json"] + (["--seq-len", ctx["seq"]] if ctx.get("seq") else [])
    if loader == "cluster-toml":
        return [binp, "estimate", "--model", "tiny-gpt", "--cluster", p, "--gpus=2", "--plan", "tp=1,pp=2",
                "--global-batch", "8", "--json"]
    if loader == "training-toml":
        return [binp, "simulate", "--model", "tiny-llama", "--cluster", "dgx-h100", "--gpus", "8", "--plan",
                "tp=2,pp=2,distopt=on", "--training", p, "--json"]
    if loader == "plan-toml":
        return [binp, "simulate", "--model", ctx["model"], "--cluster", "dgx-h100", "--gpus", ctx["gpus"],
                "--global-batch", "16", "--plan", p, "--json"]
    if loader == "example-toml":
        return [binp, "simulate", "--example", p, "--json"]
    if loader == "calibration-toml":
        c = ctx["cluster"]
        return [binp, "simulate", "--model", "tiny-gpt", "--cluster", c, "--gpus", "2" if c == "cpu-host" else "8",
                "--plan", "tp=1,pp=2", "--global-batch", "8", "--calibration", p, "--json"]
    if loader == "hf-config-json":
        return [binp, "estimate", "--model", p, "--cluster", "dgx-h100", "--gpus", "8", "--plan", "tp=1",
                "--global-batch", "16", "--seq-len", "1024", "--json"]
    if loader == "megatron-args":
        return [binp, "estimate", "--megatron-args", Path(p).read_text(), "--cluster", ctx["cluster"], "--gpus",
                str(ctx["gpus"]), "--json"]
    if loader == "inline-plan":
        return [binp, "simulate", "--model", ctx["model"], "--cluster", "dgx-h100", "--gpus", "8",
                "--global-batch", "16", "--plan", Path(p).read_text(), "--json"]
    if loader == "trace-json":
        return [binp, "compare", ctx["pair"], p, "--json"]
    if loader == "cli-numeric":
        return [binp, "estimate", "--model", "tiny-gpt", "--cluster", "dgx-h100", "--plan", "tp=2,pp=2", "--gpus",
                "8", "--global-batch", "16", "--json"]
    if loader == "deepspeed-json":
        return [binp, "estimate", "--model", "tiny-gpt", "--cluster", "dgx-h100", "--gpus", "16", "--plan", "tp=1",
                "--deepspeed-config", p, "--json"]
    if loader == "moe-histogram":
        return [binp, "simulate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--gpus", "8", "--plan",
                "tp=1,ep=4", "--global-batch", "16", "--moe-histogram", p, "--json"]
    raise KeyError(loader)


def run_baselines(seeds, binp, args, tmpdir):
    rows = []
    seen = set()
    for loader in LOADERS:
        for path, ctx in seeds.get(loader, []):
            key = (loader, str(path))
            if key in seen:
                continue
            seen.add(key)
            argv = baseline_argv(loader, path, ctx, binp)
            res = run_argv(argv, args.timeout, args.mem_limit_mb, tmpdir, "baseline")
            cls, detail = classify(res, True, argv[1])
            rows.append((loader, Path(path).name if path else "-", cls, res["rc"],
                         stderr_tail(res["stderr"], 140).replace("\n", " ") if cls not in ("OK", "NOFIT") else detail))
    return rows


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the megascope binary (use a copy, not the build dir)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1500 * len(LOADERS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent),
                    help="the Megascope checkout the seed samples are copied from")
    ap.add_argument("--mem-limit-mb", type=int, default=4096, help="RLIMIT_AS of each case (0: none)")
    ap.add_argument("--loaders", default="", help="comma-separated subset of: " + ",".join(LOADERS))
    ap.add_argument("--only-case", type=int, action="append", default=[], help="regenerate and run this case index")
    ap.add_argument("--replay", default="", help="rerun the argv of every record of a failures.jsonl")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--keep-all-inputs", action="store_true", help="keep the inputs of passing cases too")
    args = ap.parse_args()

    binp = str(Path(args.bin).resolve())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmpdir = out / "tmp"
    tmpdir.mkdir(exist_ok=True)

    if args.replay:
        return replay(args, binp, out, tmpdir)

    casedir = out / "cases"
    if casedir.exists() and not args.only_case:
        for p in casedir.iterdir():
            if p.is_dir():
                p.chmod(0o755)
                shutil.rmtree(p)
            else:
                try:
                    p.chmod(0o644)
                except OSError:
                    pass
                p.unlink()
    casedir.mkdir(exist_ok=True)
    seeds = prepare_seeds(Path(args.repo), binp, out / "seeds")
    # The fixture example names tiny-model.toml and tiny-cluster.toml beside it.
    for n in ("tiny-model.toml", "tiny-cluster.toml"):
        shutil.copyfile(Path(args.repo) / "tests" / "fixtures" / "toml" / n, casedir / n)

    loaders = tuple(x for x in args.loaders.split(",") if x) or LOADERS
    for l in loaders:
        if l not in GENERATORS:
            sys.exit(f"unknown loader {l}")

    if not args.no_baseline and not args.only_case:
        rows = run_baselines(seeds, binp, args, tmpdir)
        with open(out / "baseline.md", "w") as f:
            f.write("| loader | seed | outcome | rc | note |\n|---|---|---|---|---|\n")
            for r in rows:
                f.write("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |\n")
        bad = [r for r in rows if r[2] not in ("OK", "NOFIT")]
        print(f"baseline: {len(rows)} seeds, {len(bad)} not OK (see baseline.md)", flush=True)

    indices = args.only_case or list(range(args.cases))
    counts = collections.defaultdict(collections.Counter)
    by_cmd = collections.defaultdict(collections.Counter)
    failures = []
    lock = threading.Lock()
    peak = {"kb": 0, "case": None}
    maxrss_by_loader = collections.Counter()
    t_start = time.monotonic()
    done = [0]
    cases_f = open(out / ("cases.jsonl" if not args.only_case else "only-cases.jsonl"), "w")

    def work(i):
        try:
            c = make_case(i, args.seed, seeds, casedir, binp, loaders)
        except Exception as e:  # a defect of this script, not of megascope: count it and go on
            with lock:
                counts[loaders[i % len(loaders)]]["GEN_ERROR"] += 1
                done[0] += 1
                print(f"case {i}: generator error {type(e).__name__}: {e}", flush=True)
            return
        res = run_argv(c.argv, args.timeout, args.mem_limit_mb, tmpdir, f"c{i}")
        cls, detail = classify(res, c.json_out, c.command.split()[0])
        err = res["stderr"].decode("utf-8", "replace")
        rec = {"case": i, "loader": c.loader, "command": c.command, "seed_file": c.seed, "mutation": c.mutation,
               "class": cls, "rc": res["rc"], "wall_s": round(res["wall"], 3), "maxrss_kb": res["maxrss_kb"],
               "err_line": (err.strip().splitlines() or [""])[-1][-200:]}
        with lock:
            counts[c.loader][cls] += 1
            by_cmd[c.command][cls] += 1
            maxrss_by_loader[c.loader] = max(maxrss_by_loader[c.loader], res["maxrss_kb"])
            if res["maxrss_kb"] > peak["kb"]:
                peak["kb"], peak["case"] = res["maxrss_kb"], i
            cases_f.write(json.dumps(rec) + "\n")
            if cls in FAIL_CLASSES:
                rec2 = dict(rec)
                rec2.update({
                    "argv": [a if len(a) < 20000 else a[:200] + f"...<{len(a)} chars, see input_path>" for a in c.argv],
                    "input_path": c.input_path, "detail": detail,
                    "signal": signal.Signals(-res["rc"]).name if res["rc"] < 0 and not res["timed_out"] else None,
                    "timed_out": res["timed_out"], "stderr_tail": stderr_tail(res["stderr"]),
                    "stdout_head": res["stdout"][:300].decode("utf-8", "replace"),
                    "signature": signature(cls, detail, err, c.loader, c.mutation),
                    "repro": repro_line(c.argv, c.input_path),
                    "full_argv_len": [len(a) for a in c.argv]})
                failures.append(rec2)
            done[0] += 1
            if done[0] % 500 == 0:
                el = time.monotonic() - t_start
                nf = len(failures)
                print(f"{done[0]}/{len(indices)} cases, {el:.0f} s, {nf} failures", flush=True)
        if cls not in FAIL_CLASSES and not args.keep_all_inputs and c.input_path:
            p = Path(c.input_path)
            if str(p).startswith(str(casedir)):
                try:
                    if p.is_dir():
                        p.rmdir()
                    elif p.exists():
                        p.chmod(0o644)
                        p.unlink()
                except OSError:
                    pass

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        list(ex.map(work, indices))
    cases_f.close()
    elapsed = time.monotonic() - t_start
    failures.sort(key=lambda r: r["case"])
    with open(out / ("failures.jsonl" if not args.only_case else "only-failures.jsonl"), "w") as f:
        for r in failures:
            f.write(json.dumps(r) + "\n")
    if not args.only_case:
        write_report(out, args, loaders, counts, by_cmd, failures, elapsed, peak, maxrss_by_loader)
    print(f"done: {len(indices)} cases in {elapsed:.0f} s, {len(failures)} failures; "
          f"{out}/{'results.md' if not args.only_case else 'only-failures.jsonl'}")
    return 1 if failures else 0


def write_report(out, args, loaders, counts, by_cmd, failures, elapsed, peak, maxrss_by_loader):
    cols = ALL_CLASSES
    L = []
    L.append("# megascope mutation campaign\n")
    L.append(f"binary `{args.bin}`, seed {args.seed}, {sum(sum(c.values()) for c in counts.values())} cases, "
             f"jobs {args.jobs}, timeout {args.timeout} s, RLIMIT_AS {args.mem_limit_mb} MiB, "
             f"{elapsed:.0f} s wall\n")
    L.append("Rerun: `python3 scripts/mutation-campaign.py --bin " + args.bin + f" --seed {args.seed} --cases "
             f"{args.cases} --jobs {args.jobs} --timeout {args.timeout:g} --out {args.out}`\n")
    L.append("## Outcomes per loader\n")
    L.append("| loader | " + " | ".join(cols) + " | total | max RSS MiB |")
    L.append("|---" * (len(cols) + 3) + "|")
    tot = collections.Counter()
    for l in loaders:
        c = counts[l]
        tot.update(c)
        L.append(f"| {l} | " + " | ".join(str(c[k]) for k in cols) + f" | {sum(c.values())} | "
                 f"{maxrss_by_loader[l] / 1024:.0f} |")
    L.append("| **all** | " + " | ".join(str(tot[k]) for k in cols) + f" | {sum(tot.values())} | "
             f"{peak['kb'] / 1024:.0f} (case {peak['case']}) |")
    L.append("\n## Outcomes per command\n")
    L.append("| command | " + " | ".join(cols) + " |")
    L.append("|---" * (len(cols) + 1) + "|")
    for cmd in sorted(by_cmd):
        L.append(f"| {cmd} | " + " | ".join(str(by_cmd[cmd][k]) for k in cols) + " |")
    groups = collections.OrderedDict()
    for r in failures:
        groups.setdefault(r["signature"], []).append(r)
    L.append(f"\n## Failure groups ({len(groups)}; {len(failures)} failing cases)\n")
    for sig, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ex = min(rs, key=lambda r: (sum(r["full_argv_len"]), r["case"]))
        ls = collections.Counter(r["loader"] for r in rs)
        L.append(f"### {sig}\n")
        L.append(f"- {len(rs)} cases; loaders: " + ", ".join(f"{k} {v}" for k, v in ls.items()))
        L.append(f"- example case {ex['case']} ({ex['loader']}, seed {ex['seed_file']}, mutation `{ex['mutation'][:200]}`)")
        L.append(f"- rc {ex['rc']}" + (f", signal {ex['signal']}" if ex.get("signal") else "") +
                 (", timed out" if ex.get("timed_out") else "") + (f", {ex['detail'][:300]}" if ex['detail'] else ""))
        L.append(f"- input: `{ex['input_path']}`")
        L.append(f"- repro: `{ex['repro'][:600]}`")
        L.append("- stderr tail:\n\n```\n" + ex["stderr_tail"][-400:] + "\n```\n")
    (out / "results.md").write_text("\n".join(L) + "\n")


def replay(args, binp, out, tmpdir):
    recs = [json.loads(l) for l in open(args.replay)]
    rows = []
    for r in recs:
        argv = list(r["argv"])
        argv[0] = binp
        # Long arguments were elided in the record: the input file holds them.
        for k, a in enumerate(argv):
            if "chars, see input_path>" in a:
                argv[k] = Path(r["input_path"]).read_text(encoding="utf-8", errors="surrogatepass")
        res = run_argv(argv, args.timeout, args.mem_limit_mb, tmpdir, f"r{r['case']}")
        cmd = r["command"].split()[0]
        cls, detail = classify(res, "--json" in argv, cmd)
        same = cls == r["class"]
        rows.append((r["case"], r["loader"], r["class"], cls, same, res["rc"], round(res["wall"], 2)))
        print(f"case {r['case']:6d} {r['loader']:16s} was {r['class']:9s} now {cls:9s} "
              f"{'reproduced' if same else 'DIFFERENT'} rc={res['rc']} {res['wall']:.2f}s", flush=True)
    n_same = sum(1 for r in rows if r[4])
    with open(out / "replay.md", "w") as f:
        f.write(f"replayed {len(rows)} failures from {args.replay}: {n_same} reproduced\n\n")
        f.write("| case | loader | was | now | reproduced | rc | wall s |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write("| " + " | ".join(map(str, r)) + " |\n")
    print(f"replayed {len(rows)}: {n_same} reproduced the same class")
    return 0


if __name__ == "__main__":
    sys.exit(main())
