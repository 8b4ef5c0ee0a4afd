#!/usr/bin/env python3
"""End to end: client/python/examples/stream_completion.py against a real `kvserve up` cluster.

Starts `kvserve up --model stories260K.gguf --listen 127.0.0.1:0` (a router and two workers),
waits (bounded) for its "kvserve up: serving on HOST:PORT" line, streams a greedy completion of "Once upon a time"
with the example, and checks the text against the independent golden continuation in
stories260K/golden.json. The worker is always stopped.
"""

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

READY = re.compile(r"kvserve up: serving on (\S+)")


def start_reader(stream, lines: "queue.Queue[str]", log: list) -> None:
    def pump():
        for line in iter(stream.readline, ""):
            log.append(line)
            lines.put(line)
        lines.put("")  # EOF: the worker exited.
    threading.Thread(target=pump, daemon=True).start()


def wait_for_address(worker, lines, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no ready line from the worker within {timeout_s} s")
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line == "":  # The worker closed its output: it has exited or is about to.
            try:
                code = worker.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = "no status (closed its output)"
            raise RuntimeError(f"the worker exited with {code} before it was ready")
        match = READY.search(line)
        if match:
            return match.group(1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvserve", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--golden", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    with open(args.golden, encoding="utf-8") as f:
        case = next(c for c in json.load(f)["cases"] if c["prompt"] == "Once upon a time")
    prompt = case["prompt"]
    expected_text = case["text"][len(prompt):]
    max_tokens = len(case["generated_token_ids"])

    worker = subprocess.Popen(
        [args.kvserve, "up", "--model", args.model, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    log: list = []
    start_reader(worker.stdout, lines, log)
    try:
        address = wait_for_address(worker, lines, args.timeout)
        result = subprocess.run(
            [sys.executable, args.example, "--endpoint", address, "--prompt", prompt,
             "--max-tokens", str(max_tokens), "--temperature", "0",
             "--timeout", str(args.timeout)],
            capture_output=True, text=True, timeout=args.timeout)
        if result.returncode != 0:
            print(f"FAIL: example exited {result.returncode}\n{result.stderr}", file=sys.stderr)
            return 1
        text, sep, usage = result.stdout.rpartition("\nusage: ")
        if not sep:
            print(f"FAIL: no usage line in:\n{result.stdout}", file=sys.stderr)
            return 1
        ok = True
        if text != expected_text:
            print(f"FAIL: streamed text differs from the golden continuation\n"
                  f"got:      {text!r}\nexpected: {expected_text!r}", file=sys.stderr)
            ok = False
        want = (f"prompt_tokens={len(case['prompt_token_ids'])} "
                f"completion_tokens={max_tokens} ")
        if not usage.startswith(want):
            print(f"FAIL: usage {usage!r}, expected it to start with {want!r}", file=sys.stderr)
            ok = False
        print("PASS" if ok else "worker output:\n" + "".join(log))
        return 0 if ok else 1
    except Exception:
        print("worker output:\n" + "".join(log), file=sys.stderr)
        raise
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


if __name__ == "__main__":
    sys.exit(main())
