#!/usr/bin/env python3
"""kvserve_client (Python) and the stream_completion example against an in-process fake
kvserve.v1.Inference server written with grpcio. Needs the generated stubs on PYTHONPATH."""

import os
import subprocess
import sys
import threading
import unittest
from concurrent import futures

import grpc

from kvserve.v1 import inference_pb2, inference_pb2_grpc
from kvserve_client import Client

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "client",
                       "python", "examples", "stream_completion.py")


class FakeInference(inference_pb2_grpc.InferenceServicer):
    """Streams "Hello", ",", " world" then a final message with usage; can fail on request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.fail_first = 0
        self.fail_after_first = False
        self.calls = 0
        self.last_request = None

    def Generate(self, request, context):
        with self.lock:
            self.calls += 1
            self.last_request = request
            fail_now = self.fail_first > 0
            self.fail_first -= 1 if fail_now else 0
        if fail_now:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake worker draining")
        for i, word in enumerate(["Hello", ",", " world"]):
            yield inference_pb2.GenerateResponse(request_id="r1", index=0, token_ids=[10 + i],
                                                 text=word, worker="fake")
            if self.fail_after_first:
                context.abort(grpc.StatusCode.UNAVAILABLE, "fake worker lost")
        yield inference_pb2.GenerateResponse(
            request_id="r1", index=0, finish_reason=inference_pb2.FINISH_REASON_LENGTH,
            usage=inference_pb2.Usage(prompt_tokens=len(request.prompt), completion_tokens=3))

    def ListModels(self, request, context):
        return inference_pb2.ListModelsResponse(
            models=[inference_pb2.ModelCard(name="fake", max_model_len=64, vocab_size=256)])

    def Tokenize(self, request, context):
        special = [1] if not request.HasField("add_special_tokens") or \
            request.add_special_tokens else []
        return inference_pb2.TokenizeResponse(token_ids=special + list(request.text.encode()))

    def Detokenize(self, request, context):
        return inference_pb2.DetokenizeResponse(
            text=bytes(t for t in request.token_ids if t != 1).decode())


class PythonClientTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeInference()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        inference_pb2_grpc.add_InferenceServicer_to_server(self.fake, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"

    def tearDown(self):
        self.server.stop(grace=None)

    def client(self, **kwargs):
        return Client(self.address, timeout=20, initial_backoff=0.001, max_backoff=0.004,
                      **kwargs)

    def test_example_streams_text_then_usage(self):
        result = subprocess.run(
            [sys.executable, EXAMPLE, "--endpoint", self.address, "--prompt", "Hi there",
             "--max-tokens", "3", "--temperature", "0"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "Hello, world\nusage: prompt_tokens=8 completion_tokens=3 "
                                        "cached_prompt_tokens=0 finish_reason=length\n")
        sent = self.fake.last_request
        self.assertEqual(sent.prompt, "Hi there")
        self.assertEqual(sent.max_tokens, 3)
        self.assertTrue(sent.sampling.HasField("temperature"))
        self.assertEqual(sent.sampling.temperature, 0.0)

    def test_example_reports_an_unreachable_endpoint(self):
        self.server.stop(grace=None)
        result = subprocess.run(
            [sys.executable, EXAMPLE, "--endpoint", self.address, "--prompt", "Hi",
             "--timeout", "5"], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 1)
        self.assertIn("UNAVAILABLE", result.stderr)

    def test_retries_unavailable_before_the_first_message(self):
        self.fake.fail_first = 2
        with self.client() as client:
            completion = client.complete("Hi")
        self.assertEqual(completion.samples[0].text, "Hello, world")
        self.assertEqual(completion.samples[0].token_ids, [10, 11, 12])
        self.assertEqual(completion.samples[0].finish_reason, "length")
        self.assertEqual(completion.worker, "fake")
        self.assertEqual(self.fake.calls, 3)

    def test_gives_up_after_max_attempts(self):
        self.fake.fail_first = 10
        with self.client(max_attempts=3) as client:
            with self.assertRaises(grpc.RpcError) as err:
                client.complete("Hi")
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(self.fake.calls, 3)

    def test_failure_after_the_first_message_is_not_retried(self):
        self.fake.fail_after_first = True
        seen = []
        with self.client() as client:
            with self.assertRaises(grpc.RpcError) as err:
                for chunk in client.generate("Hi"):
                    seen.append(chunk.text)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(seen, ["Hello"])
        self.assertEqual(self.fake.calls, 1)

    def test_unary_calls(self):
        with self.client() as client:
            self.assertEqual([m.name for m in client.list_models()], ["fake"])
            self.assertEqual(client.tokenize("ok"), [1, ord("o"), ord("k")])
            self.assertEqual(client.tokenize("ok", add_special_tokens=False), [ord("o"), ord("k")])
            self.assertEqual(client.detokenize([1, ord("o"), ord("k")]), "ok")
            with self.assertRaises(ValueError):
                next(client.generate())
            with self.assertRaises(ValueError):  # two output constraints
                next(client.generate("x", regex="a", json_object=True))


if __name__ == "__main__":
    unittest.main()
