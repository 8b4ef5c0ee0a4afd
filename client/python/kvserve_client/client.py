"""kvserve_client.Client: a thin, typed wrapper over the generated kvserve.v1.Inference stub.

Retries: calls failing with UNAVAILABLE are retried with exponential backoff; unary calls always,
a Generate stream only when it failed before its first message (after that the caller has seen
output, and a retry would repeat it). Every attempt shares the call's one deadline.
"""

import dataclasses
import json
import time
from typing import Iterator, List, Optional, Sequence, Union

import grpc

try:
    from kvserve.v1 import inference_pb2, inference_pb2_grpc
except ImportError as e:  # The stubs are build output.
    raise ImportError(
        "kvserve_client: generated stubs not found; run client/python/generate_stubs.sh OUTDIR "
        "and add OUTDIR to PYTHONPATH") from e

_FINISH_REASONS = {
    inference_pb2.FINISH_REASON_UNSPECIFIED: "",
    inference_pb2.FINISH_REASON_STOP: "stop",
    inference_pb2.FINISH_REASON_LENGTH: "length",
    inference_pb2.FINISH_REASON_ABORT: "abort",
}


def finish_reason_name(reason: int) -> str:
    """"stop", "length", "abort", or "" while the sample runs."""
    return _FINISH_REASONS.get(reason, "")


@dataclasses.dataclass
class Sample:
    """One sample of a completion, its chunks concatenated."""
    index: int = 0
    token_ids: List[int] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    stop_reason: str = ""
    usage: Optional[inference_pb2.Usage] = None


@dataclasses.dataclass
class Completion:
    """A whole Generate call, gathered."""
    request_id: str = ""
    worker: str = ""
    samples: List[Sample] = dataclasses.field(default_factory=list)


class Client:
    """A connection to a kvserve router or worker at `endpoint` ("host:port")."""

    def __init__(self, endpoint: str, timeout: Optional[float] = None, max_attempts: int = 4,
                 initial_backoff: float = 0.1, max_backoff: float = 2.0,
                 max_message_bytes: int = 64 << 20):
        if not endpoint:
            raise ValueError("endpoint: empty address")
        if max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {max_attempts}")
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._channel = grpc.insecure_channel(endpoint, options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ])
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Runs attempt(timeout_left) with retries on UNAVAILABLE, within one overall deadline.
    def _with_retries(self, attempt, timeout):
        timeout = self._timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = self._initial_backoff
        for number in range(1, self._max_attempts + 1):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return attempt(left)
            except grpc.RpcError as e:
                retry = (e.code() == grpc.StatusCode.UNAVAILABLE and
                         number < self._max_attempts and
                         (deadline is None or time.monotonic() + backoff < deadline))
                if not retry:
                    raise
            time.sleep(backoff)  # Backoff between attempts, not synchronisation.
            backoff = min(backoff * 2, self._max_backoff)
        raise AssertionError("unreachable")

    def generate(self, prompt: str = "", prompt_token_ids: Sequence[int] = (), *, model: str = "",
                 max_tokens: int = 0, temperature: Optional[float] = None,
                 top_p: Optional[float] = None, top_k: int = 0, seed: Optional[int] = None,
                 stop: Sequence[str] = (), ignore_eos: bool = False, n: int = 1,
                 logprobs: Optional[int] = None, add_special_tokens: Optional[bool] = None,
                 request_id: str = "", timeout: Optional[float] = None,
                 json_schema: Union[None, str, dict] = None, json_object: bool = False,
                 regex: Optional[str] = None, grammar: Optional[str] = None,
                 ) -> Iterator[inference_pb2.GenerateResponse]:
        """Streams GenerateResponse messages; raises grpc.RpcError on failure.

        At most one of json_schema (a dict or JSON text), json_object, regex and grammar (GBNF)
        constrains the output (constrained decoding on the worker).
        """
        if bool(prompt) == bool(prompt_token_ids):
            raise ValueError("prompt, prompt_token_ids: exactly one of them must be set")
        constraints = [name for name, value in (("json_schema", json_schema),
                                                ("json_object", json_object or None),
                                                ("regex", regex), ("grammar", grammar))
                       if value is not None]
        if len(constraints) > 1:
            raise ValueError(f"{', '.join(constraints)}: give at most one output constraint")
        request = inference_pb2.GenerateRequest(
            model=model, prompt=prompt, prompt_token_ids=list(prompt_token_ids),
            max_tokens=max_tokens, stop=list(stop), ignore_eos=ignore_eos, n=n,
            request_id=request_id)
        sampling = request.sampling
        sampling.top_k = top_k
        if temperature is not None:
            sampling.temperature = temperature
        if top_p is not None:
            sampling.top_p = top_p
        if seed is not None:
            sampling.seed = seed
        if logprobs is not None:
            request.logprobs = logprobs
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        if json_schema is not None:
            request.json_schema = (json_schema if isinstance(json_schema, str)
                                   else json.dumps(json_schema))
        elif json_object:
            request.json_object = True
        elif regex is not None:
            request.regex = regex
        elif grammar is not None:
            request.grammar = grammar

        # Only the wait for the first message is retried; a failure after it reaches the caller.
        def attempt(left):
            stream = self._stub.Generate(request, timeout=left)
            first = next(stream, None)  # Raises RpcError when the attempt failed up front.
            return first, stream

        first, stream = self._with_retries(attempt, timeout)
        if first is None:
            return
        yield first
        yield from stream

    def complete(self, prompt: str = "", **kwargs) -> Completion:
        """Generates and gathers every sample (arguments as for generate)."""
        out = Completion()
        for chunk in self.generate(prompt, **kwargs):
            out.request_id = out.request_id or chunk.request_id
            out.worker = out.worker or chunk.worker
            while len(out.samples) <= chunk.index:
                out.samples.append(Sample(index=len(out.samples)))
            s = out.samples[chunk.index]
            s.token_ids.extend(chunk.token_ids)
            s.text += chunk.text
            if chunk.finish_reason:
                s.finish_reason = finish_reason_name(chunk.finish_reason)
            if chunk.stop_reason:
                s.stop_reason = chunk.stop_reason
            if chunk.HasField("usage"):
                s.usage = chunk.usage
        return out

    def list_models(self, timeout: Optional[float] = None) -> List[inference_pb2.ModelCard]:
        response = self._with_retries(
            lambda left: self._stub.ListModels(inference_pb2.ListModelsRequest(), timeout=left),
            timeout)
        return list(response.models)

    def tokenize(self, text: str, *, model: str = "", add_special_tokens: Optional[bool] = None,
                 timeout: Optional[float] = None) -> List[int]:
        request = inference_pb2.TokenizeRequest(model=model, text=text)
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        response = self._with_retries(
            lambda left: self._stub.Tokenize(request, timeout=left), timeout)
        return list(response.token_ids)

    def detokenize(self, token_ids: Sequence[int], *, model: str = "",
                   skip_special_tokens: bool = False, timeout: Optional[float] = None) -> str:
        request = inference_pb2.DetokenizeRequest(
            model=model, token_ids=list(token_ids), skip_special_tokens=skip_special_tokens)
        response = self._with_retries(
            lambda left: self._stub.Detokenize(request, timeout=left), timeout)
        return response.text
