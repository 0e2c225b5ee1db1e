#!/usr/bin/env python3
"""Regenerates the test vectors that pin our flags code to Python's own behaviour.

The Neuron cache wrapper is Python: it splits NEURON_CC_FLAGS with shlex.split, dumps
the flags with json.dumps and hashes with hashlib.md5. These vectors are computed by
those very functions, so the C++ tests compare against Python, not against us.
Strings are stored as hex of their bytes so invalid UTF-8 survives the JSON file.

Run from this folder: python3 gen_vectors.py (writes flags_vectors.json, shlex_vectors.json).
"""
import hashlib
import json
import shlex


def env_str(raw: bytes) -> str:
    # What os.environ gives Python for these bytes on Linux.
    return raw.decode("utf-8", "surrogateescape")


FLAG_LISTS = [
    [],
    [b"--target=trn1"],
    [b"--model-type=transformer"],
    [b"--target=trn1", b"-O1", b"--model-type=transformer"],
    [b""],
    [b"", b""],
    [b"--enable-fast-loading-neuron-binaries", b"--distribution-strategy=llm-training"],
    [b"with space", b"tab\there", b"new\nline", b"cr\rret"],
    [b'quote"inside', b"back\\slash", b"slash/fwd", b"single'quote"],
    [bytes(range(0, 32))],
    [b"\x7f del", b"~ tilde", b" leading and trailing "],
    ["é accent".encode(), "日本語".encode(), "Ωμέγα".encode()],
    ["emoji \U0001F600 and \U0010FFFF".encode()],
    ["bmp edge \uffff \ue000 \u0800 \u07ff \u0080".encode()],
    [b"\xff lone byte", b"\xe2\x82 truncated euro", b"\xc0\xaf overlong"],
    [b"\xed\xa0\x80 encoded surrogate", b"\xf4\x90\x80\x80 beyond max", b"\xf8\x88\x80\x80\x80"],
    [b"\x80\x80 continuation only", b"ok\xe2\x82\xac euro"],
    [b"--internal-hlo2tensorizer-options=--verify-hlo=false --modular-flow-mac-threshold=10"],
]

flags_vectors = []
for raw_list in FLAG_LISTS:
    flags = [env_str(f) for f in raw_list]
    dumped = json.dumps(flags)
    legacy = " ".join(flags).encode("utf-8", "surrogateescape")
    flags_vectors.append({
        "flags_hex": [f.hex() for f in raw_list],
        "json": dumped,
        "json_hash": hashlib.md5(dumped.encode()).hexdigest()[:8],
        "legacy_hash": hashlib.md5(legacy).hexdigest()[:8],
    })

SHLEX_INPUTS = [
    "",
    "   ",
    "--target=trn1 -O1",
    "  --a\t--b\r\n--c  ",
    "--cache_dir=/tmp/x --retry_failed_compilation",
    "--cache_dir '/tmp/with space'",
    '--opt="a b" plain',
    '"a\\"b" "c\\\\d" "e\\$f" "g\\`h" "i\\nj"',
    "'single \\ back' '' \"\"",
    "a\\ b c\\\\d e\\'f",
    "x\\\ny",
    "a'b'c\"d\"e",
    "# not a comment",
    '--internal-hlo2tensorizer-options="--verify-hlo=false --x=1"',
    "é 日本",
    "'unterminated",
    '"unterminated',
    "trailing\\",
]

shlex_vectors = []
for text in SHLEX_INPUTS:
    try:
        words = shlex.split(text)
        shlex_vectors.append({"input_hex": text.encode().hex(), "words_hex": [w.encode().hex() for w in words]})
    except ValueError as e:
        shlex_vectors.append({"input_hex": text.encode().hex(), "error": str(e)})

with open("flags_vectors.json", "w") as f:
    json.dump(flags_vectors, f, indent=1)
    f.write("\n")
with open("shlex_vectors.json", "w") as f:
    json.dump(shlex_vectors, f, indent=1)
    f.write("\n")
