#!/usr/bin/env python3
"""Structured outputs end to end, checked by an independent validator (python3-jsonschema).

Starts `kvserve up` (a router in front of two workers, with the HTTP front) on stories260K, whose
text is nonsense, so only constrained decoding can make its output valid. Then:
  * 100 sampled requests through the Python client over gRPC, each with a JSON schema of nested
    objects, arrays, enums, numbers and required keys: every output must parse and validate;
  * the same schema as OpenAI's response_format json_schema on /v1/completions, vLLM's
    guided_regex and guided_choice, and a schema with an unsupported keyword (a 400 naming it);
  * over gRPC, what tests/client/openai_npm checks over HTTP: streaming equal to the gathered
    completion, n, logprobs, stop strings, json_object, and an error status naming the field.
The cluster is always stopped.
"""

import argparse
import concurrent.futures
import json
import os
import queue
import re
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_client_test import start_reader, wait_for_address  # noqa: E402

from kvserve_client import Client  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 16},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "rating": {"type": "number", "minimum": 0, "maximum": 10},
        "genre": {"enum": ["drama", "comedy", "horror", "documentary"]},
        "cast": {
            "type": "array", "minItems": 1, "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer", "minimum": 1, "maximum": 99},
                    "lead": {"type": "boolean"},
                },
                "required": ["name", "lead"],
            },
        },
        "studio": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 10},
                           "founded": {"type": "integer"}},
            "required": ["name"],
        },
        "sequel": {"type": ["string", "null"], "maxLength": 10},
    },
    "required": ["title", "year", "genre", "cast", "studio"],
}
HTTP_LINE = re.compile(r"kvserve up: OpenAI API on http://(\S+)/v1")


def post(http: str, body: dict):
    request = urllib.request.Request(f"http://{http}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def check(ok: bool, what: str, failures: list) -> None:
    if not ok:
        failures.append(what)


def grpc_parity(client: Client, failures: list) -> None:
    """The openai npm test's cases (tests/client/openai_npm) through the Python client."""
    prompt = "Once upon a time"
    whole = client.complete(prompt, max_tokens=24, temperature=0).samples[0]
    streamed = "".join(m.text for m in client.generate(prompt, max_tokens=24, temperature=0))
    check(streamed == whole.text and whole.finish_reason == "length",
          f"stream {streamed!r} vs {whole.text!r} ({whole.finish_reason})", failures)

    samples = client.complete(prompt, max_tokens=12, temperature=1.0, seed=1234, n=3).samples
    check([s.index for s in samples] == [0, 1, 2] and len({s.text for s in samples}) > 1,
          f"n=3: {[(s.index, s.text) for s in samples]}", failures)

    entries = []
    tokens = 0
    for message in client.generate(prompt, max_tokens=8, temperature=0, logprobs=2):
        entries.extend(message.logprobs)
        tokens += len(message.token_ids)
    check(len(entries) == tokens == 8 and all(
        len(e.top) == 2 and e.logprob <= 0 and abs(e.top[0].logprob - e.logprob) < 1e-5
        and e.top[0].token_id == e.token_id for e in entries),
        f"logprobs: {tokens} tokens, {[(e.token_id, e.logprob, list(e.top)) for e in entries]}",
        failures)

    middle = len(whole.text) // 2
    stop = whole.text[middle:middle + 4]
    cut = client.complete(prompt, max_tokens=24, temperature=0, stop=[stop]).samples[0]
    check(cut.text == whole.text[:whole.text.index(stop)] and cut.finish_reason == "stop",
          f"stop {stop!r}: {cut.text!r} ({cut.finish_reason}) from {whole.text!r}", failures)

    obj = client.complete(prompt, max_tokens=300, temperature=0.7, seed=4,
                          json_object=True).samples[0]
    try:
        check(isinstance(json.loads(obj.text), dict) and obj.finish_reason == "stop",
              f"json_object: {obj.text!r} ({obj.finish_reason})", failures)
    except json.JSONDecodeError as e:
        failures.append(f"json_object: {obj.text!r}: {e}")

    try:
        client.complete(prompt, max_tokens=4, temperature=-1.0)
        failures.append("temperature -1 was accepted over gRPC")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in e.details(),
              f"temperature -1: {e.code()} {e.details()}", failures)
    print(f"gRPC parity: {len(failures)} failures so far")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvserve", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    validator = jsonschema.Draft202012Validator(SCHEMA)
    cluster = subprocess.Popen(
        [args.kvserve, "up", "--model", args.model, "--listen", "127.0.0.1:0",
         "--http-listen", "127.0.0.1:0", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    log: list = []
    start_reader(cluster.stdout, lines, log)
    failures: list = []
    try:
        address = wait_for_address(cluster, lines, args.timeout)
        http = next(m.group(1) for m in map(HTTP_LINE.search, log) if m)
        client = Client(address)

        def one(seed: int):
            return client.complete("Once upon a time", max_tokens=400, temperature=1.0, seed=seed,
                                   json_schema=SCHEMA, timeout=120).samples[0]

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            samples = list(pool.map(one, range(args.requests)))
        valid = 0
        for seed, s in enumerate(samples):
            try:
                validator.validate(json.loads(s.text))
                valid += s.finish_reason == "stop"
            except (json.JSONDecodeError, jsonschema.ValidationError) as e:
                failures.append(f"seed {seed}: {s.text!r}: {e}")
        print(f"gRPC: {valid}/{len(samples)} outputs parse and validate; e.g. {samples[0].text}")
        check(valid == args.requests, f"only {valid} of {args.requests} valid", failures)

        # The HTTP front: OpenAI's response_format and vLLM's guided_* fields.
        for seed in range(5):
            status, body = post(http, {
                "prompt": "Once upon a time", "max_tokens": 400, "temperature": 1.0, "seed": seed,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "movie", "schema": SCHEMA}}})
            check(status == 200, f"response_format: HTTP {status}: {body}", failures)
            if status != 200:
                continue
            text = body["choices"][0]["text"]
            try:
                doc = json.loads(text)
                validator.validate(doc)
            except (json.JSONDecodeError, jsonschema.ValidationError) as e:
                failures.append(f"response_format seed {seed}: {text!r}: {e}")
                continue
            # Properties come in the schema's order.
            check(list(doc) == [k for k in SCHEMA["properties"] if k in doc],
                  f"property order {list(doc)}", failures)
        pattern = r"(yes|no)(, (yes|no)){2}\."
        status, body = post(http, {"prompt": "Once upon a time", "max_tokens": 50,
                                   "guided_regex": pattern, "seed": 1})
        check(status == 200 and re.fullmatch(pattern, body["choices"][0]["text"]) is not None,
              f"guided_regex: {status} {body}", failures)
        choices = ["a cat (big)", "a dog?", "[none]"]
        status, body = post(http, {"prompt": "Once upon a time", "max_tokens": 50,
                                   "guided_choice": choices, "seed": 2})
        check(status == 200 and body["choices"][0]["text"] in choices,
              f"guided_choice: {status} {body}", failures)
        status, body = post(http, {"prompt": "x", "guided_json": {"type": "integer",
                                                                  "multipleOf": 3}})
        check(status == 400 and "multipleOf" in body["error"]["message"],
              f"unsupported keyword: {status} {body}", failures)
        status, body = post(http, {"prompt": "x", "guided_regex": "a", "guided_choice": ["b"]})
        check(status == 400 and "guided_choice" in body["error"]["message"],
              f"two constraints: {status} {body}", failures)
        grpc_parity(client, failures)
    except Exception:
        print("cluster output:\n" + "".join(log), file=sys.stderr)
        raise
    finally:
        cluster.terminate()
        try:
            cluster.wait(timeout=20)
        except subprocess.TimeoutExpired:
            cluster.kill()
            cluster.wait()
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print("PASS" if not failures else f"{len(failures)} failures")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
