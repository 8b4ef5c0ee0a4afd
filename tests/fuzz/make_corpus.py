#!/usr/bin/env python3
"""Writes the fuzz seed corpora under tests/fuzz/corpus/<target>/: small valid inputs (and a few
near misses) for each fuzz target, built from the formats' specifications. Re-run after changing
it; the output is deterministic. Usage: tests/fuzz/make_corpus.py [OUT_DIR]"""

import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- GGUF (v3): header, typed metadata, tensor infos, aligned data ------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gvalue(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gvalue(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(metadata, tensors, version=3, alignment=32):
    """metadata: [(key, type, value)]; tensors: [(name, dims, ggml_type, data_bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, t, v in metadata:
        out += gstr(key) + struct.pack("<I", t) + gvalue(t, v)
    offset = 0
    for name, dims, gtype, data in tensors:
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gtype, offset)
        offset += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % alignment)
    return out


def make_gguf():
    f32 = struct.pack("<8f", *[0.5 * i for i in range(8)])
    f16 = struct.pack("<8e", *[0.25 * i for i in range(8)])
    q8_0 = struct.pack("<e", 0.1) + bytes(range(32))  # one block of 32
    metadata = [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 32),
        ("llama.context_length", U32, 64),
        ("llama.embedding_length", U64, 8),
        ("test.u8", U8, 7), ("test.i8", I8, -7), ("test.u16", U16, 700), ("test.i16", I16, -700),
        ("test.i32", I32, -70000), ("test.f32", F32, 1.5), ("test.bool", BOOL, True),
        ("test.i64", I64, -(1 << 40)), ("test.f64", F64, 2.25),
        ("test.strings", ARR, (STR, ["a", "bc", "\u00e9"])),
        ("test.floats", ARR, (F32, [0.0, -1.0, 3.5])),
        ("test.nested", ARR, (ARR, [(I32, [1, 2]), (I32, [])])),
    ]
    tensors = [("token_embd.weight", [4, 2], 0, f32), ("output_norm.weight", [8], 1, f16),
               ("blk.0.attn_q.weight", [32, 1], 8, q8_0)]
    write("gguf_fuzzer", "tensors_v3.gguf", gguf(metadata, tensors))
    write("gguf_fuzzer", "metadata_v2.gguf", gguf(metadata[:6], [], version=2))
    write("gguf_fuzzer", "empty_v3.gguf", gguf([], []))
    write("gguf_fuzzer", "truncated.gguf", gguf(metadata, tensors)[:100])
    # SentencePiece-style ("llama") vocabulary: special tokens, byte fallback, scored pieces.
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + [
        "\u2581", "\u2581a", "\u2581t", "he", "\u2581the", "on", "ce", "\u2581on", "\u2581once"]
    types = [2, 3, 3] + [6] * 256 + [1] * 9
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(9)]
    llama_vocab = [
        ("general.architecture", STR, "llama"),
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, pieces)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
    ]
    write("gguf_fuzzer", "vocab_llama.gguf", gguf(llama_vocab, []))
    # GPT-2-style vocabulary: byte-level pieces and merges.
    byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["\u0120"]
    gpt2_tokens = byte_chars + ["he", "\u0120t", "\u0120the", "<|endoftext|>"]
    gpt2_vocab = [
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "gpt-2"),
        ("tokenizer.ggml.tokens", ARR, (STR, gpt2_tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, [1] * (len(gpt2_tokens) - 1) + [3])),
        ("tokenizer.ggml.merges", ARR, (STR, ["h e", "\u0120 t", "\u0120t he"])),
        ("tokenizer.ggml.eos_token_id", U32, len(gpt2_tokens) - 1),
    ]
    write("gguf_fuzzer", "vocab_gpt2.gguf", gguf(gpt2_vocab, []))


# --- safetensors: u64 header length, JSON header, data ------------------------------------------
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def make_safetensors():
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    f16 = struct.pack("<3e", 0.5, -1, 2)
    bf16 = b"\x80\x3f\x00\x40"
    write("safetensors_fuzzer", "three_dtypes.safetensors",
          safetensors([("w", "F32", [2, 2], f32), ("b", "F16", [3], f16),
                       ("s", "BF16", [2], bf16)], {"format": "pt"}))
    write("safetensors_fuzzer", "scalar.safetensors", safetensors([("x", "F32", [], f32[:4])]))
    write("safetensors_fuzzer", "empty_tensor.safetensors", safetensors([("e", "F16", [0, 3], b"")]))
    write("safetensors_fuzzer", "no_tensors.safetensors", safetensors([], {}))
    write("safetensors_fuzzer", "bad_offsets.safetensors",
          safetensors([("w", "F32", [2, 2], f32)]).replace(b"[0,16]", b"[0,99]"))


# --- tokenizer.json ------------------------------------------------------------------------------
def added(i, content):
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def make_tokenizer_json():
    sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        sp_vocab["<0x%02X>" % b] = 3 + b
    for piece in ["\u2581", "\u2581t", "h", "e", "he", "\u2581the", "o", "n", "c", "on", "\u2581on"]:
        sp_vocab.setdefault(piece, len(sp_vocab))
    sentencepiece = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": sp_vocab,
                  "merges": ["\u2581 t", "h e", "\u2581t he", "o n", "\u2581 on"]},
    }
    write("tokenizer_json_fuzzer", "sentencepiece_bpe.json", json.dumps(sentencepiece, indent=1))
    byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["\u0120", "\u010a"]
    bl_vocab = {c: i for i, c in enumerate(byte_chars)}
    for piece in ["he", "\u0120t", "\u0120the", "ll", "llo"]:
        bl_vocab[piece] = len(bl_vocab)
    bl_vocab["<|endoftext|>"] = len(bl_vocab)
    byte_level = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(bl_vocab["<|endoftext|>"], "<|endoftext|>")],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": bl_vocab,
                  "merges": [["h", "e"], ["\u0120", "t"], ["\u0120t", "he"], ["l", "l"],
                             ["ll", "o"]]},
    }
    write("tokenizer_json_fuzzer", "byte_level_bpe.json", json.dumps(byte_level, indent=1))
    write("tokenizer_json_fuzzer", "not_bpe.json", json.dumps({"model": {"type": "WordPiece"}}))
    write("tokenizer_json_fuzzer", "truncated.json", json.dumps(sentencepiece)[:300])


# --- tokenizer encode/decode: mode byte, then text or int32 ids ---------------------------------
def make_codec():
    texts = ["Once upon a time, there was a little girl named Lily.",
             "Hello world! 12345 \u00e9t\u00e9 \u4f60\u597d \U0001F600\n\ttabs  and  spaces",
             "<s>special</s> <|endoftext|> <unk>", "   ", "a" * 200]
    for i, text in enumerate(texts):
        for mode in (0, 1, 2, 3, 5):
            write("tokenizer_codec_fuzzer", "text%d_mode%d" % (i, mode), bytes([mode]) + text.encode())
    write("tokenizer_codec_fuzzer", "invalid_utf8", b"\x01ab\xff\xc3(cd\xe2\x82")
    for mode in (8, 9, 12, 13):
        ids = [1, 403, 407, 261, 378, 3 + 0xE2, 3 + 0x82, 3 + 0xAC, 2, 50256, 0, 220]
        write("tokenizer_codec_fuzzer", "ids_mode%d" % mode,
              bytes([mode]) + b"".join(struct.pack("<i", x) for x in ids))


# --- GenerateRequest protos (protoc --encode from text format) ----------------------------------
def make_requests():
    requests = {
        "text_prompt": 'prompt: "Once upon a time" max_tokens: 8 sampling { temperature: 0.7 '
                       'top_p: 0.9 top_k: 40 seed: 7 } stop: "." stop_token_ids: 2 n: 2 '
                       'logprobs: 3 request_id: "r1" cache_salt: "tenant"',
        "token_prompt": "prompt_token_ids: [1, 403, 407, 261] max_tokens: 4 ignore_eos: true "
                        "add_special_tokens: false include_stop_str_in_output: true",
        "bad_sampling": 'prompt: "x" sampling { temperature: -1 top_p: 2 min_p: 3 '
                        "repetition_penalty: 0 presence_penalty: 9 frequency_penalty: -9 }",
        "bad_ids": "prompt_token_ids: [1, 600, 4294967295] stop_token_ids: 99999 n: 4294967295",
        "both_prompts": 'prompt: "a" prompt_token_ids: 5 model: "other"',
        "empty": "",
    }
    proto = os.path.join(ROOT, "proto", "kvserve", "v1", "inference.proto")
    for name, text in requests.items():
        data = subprocess.run(
            ["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
             "--encode=kvserve.v1.GenerateRequest", proto],
            input=text.encode(), check=True, capture_output=True).stdout
        write("generate_request_fuzzer", name + ".pb", data)


# --- OpenAI HTTP bodies ----------------------------------------------------------------------------
def make_openai():
    bodies = {
        "completion": {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 8,
                       "temperature": 0.5, "top_p": 0.9, "top_k": 20, "n": 2, "stop": ["."],
                       "logprobs": 2, "seed": 3, "stream": True,
                       "stream_options": {"include_usage": True}},
        "token_prompt": {"prompt": [1, 403, 407], "stop_token_ids": [2], "ignore_eos": True},
        "chat": {"messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                 "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 2},
        "unsupported": {"prompt": "x", "echo": True, "best_of": 3, "logit_bias": {"1": 2},
                        "response_format": {"type": "json_object"}},
        "wrong_types": {"prompt": 5, "temperature": "hot", "n": 1.5, "stop": [1]},
        # Once threw nlohmann::json::type_error out of ParseOpenAiRequest (found by this target).
        "response_format_type_number": {"prompt": "x", "response_format": {"type": 1}},
        "chat_part_type_number": {"messages": [{"role": "user",
                                                "content": [{"type": 7, "text": "hi"}]}]},
        "tools": {"messages": [{"role": "user", "content": "Weather?"},
                               {"role": "assistant", "content": None, "tool_calls": [
                                   {"id": "call_1", "type": "function",
                                    "function": {"name": "get_weather",
                                                 "arguments": "{\"city\": \"Paris\"}"}}]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}],
                  "tools": [{"type": "function", "function": {
                      "name": "get_weather", "description": "Weather now",
                      "parameters": {"type": "object",
                                     "properties": {"city": {"type": "string"}}}}},
                            {"type": "function", "function": {"name": "get_time"}}],
                  "tool_choice": {"type": "function", "function": {"name": "get_time"}},
                  "parallel_tool_calls": False},
        "tools_required": {"messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function", "function": {"name": "f"}}],
                           "tool_choice": "required"},
    }
    for name, body in bodies.items():
        write("openai_request_fuzzer", name + ".json", json.dumps(body))
    write("openai_request_fuzzer", "not_json.txt", "{\"prompt\": ")


# --- Constraints: kind byte (0 JSON schema, 1 regex, 2 GBNF), text, NUL, text to match --------
def make_constraints():
    cases = {
        "schema": (0, json.dumps({"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 3}, "b": {"type": "integer", "minimum": -5,
                                                            "maximum": 300},
            "c": {"type": "array", "items": {"enum": ["x", 1, None]}}}, "required": ["a"]}),
                   '{"a": "yes", "b": 12}'),
        "schema_ref": (0, json.dumps({"$defs": {"n": {"type": ["number", "null"]}},
                                      "type": "array", "items": {"$ref": "#/$defs/n"}}), "[1.5, null]"),
        "regex": (1, r"(ab|c[0-9]{2,3})+\.?[^\x00-\x1f]*", "abc123."),
        "grammar": (2, 'root ::= "(" item* ")"\nitem ::= [a-z]+ | root\n', "(ab(c))"),
        "ambiguous": (2, 'root ::= r\nr ::= "a" r "b" | "a" r "c" | ""\n', "aaaaaaaaaaaaaaaaaaaaaa"),
    }
    for name, (kind, text, feed) in cases.items():
        write("constraint_fuzzer", name + ".bin", bytes([kind]) + text.encode() + b"\0" + feed.encode())


make_gguf()
make_safetensors()
make_tokenizer_json()
make_codec()
make_requests()
make_openai()
make_constraints()
