#!/usr/bin/env python3
"""Streams a completion from a kvserve router or worker to stdout, then prints its usage.

  PYTHONPATH=build/python:client/python \
    python3 client/python/examples/stream_completion.py --endpoint 127.0.0.1:50051 \
      --prompt "Once upon a time" --max-tokens 64 --temperature 0

The last line is "usage: prompt_tokens=P completion_tokens=C cached_prompt_tokens=K
finish_reason=R", after a newline that ends the streamed text.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import grpc  # noqa: E402

from kvserve_client import Client  # noqa: E402
from kvserve_client.client import finish_reason_name  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="HOST:PORT of a router or worker")
    parser.add_argument("--prompt", required=True, help="prompt text")
    parser.add_argument("--model", default="", help="model name (default: the only one)")
    parser.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, default=None, help="0 is greedy")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline in seconds")
    args = parser.parse_args()

    usage = None
    finish = ""
    try:
        with Client(args.endpoint, timeout=args.timeout) as client:
            for chunk in client.generate(args.prompt, model=args.model,
                                         max_tokens=args.max_tokens,
                                         temperature=args.temperature, seed=args.seed):
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
                if chunk.finish_reason:
                    finish = finish_reason_name(chunk.finish_reason)
                if chunk.HasField("usage"):
                    usage = chunk.usage
    except grpc.RpcError as e:
        sys.stdout.write("\n")
        print(f"stream_completion: {args.endpoint}: {e.code().name}: {e.details()}",
              file=sys.stderr)
        return 1
    sys.stdout.write("\n")
    if usage is not None:
        print(f"usage: prompt_tokens={usage.prompt_tokens} "
              f"completion_tokens={usage.completion_tokens} "
              f"cached_prompt_tokens={usage.cached_prompt_tokens} finish_reason={finish}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
