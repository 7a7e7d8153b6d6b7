"""Tinker's protobuf messages to and from our types: `forward_backward` requests arrive as protobuf
(`tinker.proto.tinker_public_pb2`, the schema the pinned `tinker` package ships), and its results and sample results
go back as protobuf; everything else is JSON. Token ids travel as packed little-endian int32, tensors as raw bytes of
their dtype."""

from __future__ import annotations

import numpy as np
import torch

from rlinf_like.tinker.losses import Datum, UnsupportedLoss

_NUMPY = {1: np.float32, 2: np.int64, 3: np.int32}  # tinker_public.DType


def _pb():
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as e:  # the schema is the client package's: install the extra, do not copy it
        raise ImportError("the Tinker-compatible server needs the `tinker` package: pip install -e '.[tinker]'") from e
    return tinker_public_pb2


def _tensor(name: str, message) -> torch.Tensor:
    pb = _pb()
    if message.WhichOneof("encoding") != "dense":
        raise UnsupportedLoss(f"loss_fn_inputs[{name!r}] is sent sparse; this server takes dense tensors only")
    dtype = _NUMPY.get(message.dtype)
    if dtype is None:
        raise UnsupportedLoss(f"loss_fn_inputs[{name!r}] has dtype {pb.DType.Name(message.dtype)}; "
                              f"supported: DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32")
    values = np.frombuffer(message.dense, dtype=dtype).copy()
    return torch.from_numpy(values.reshape(tuple(message.shape) or values.shape))


def model_input_tokens(chunks, where: str) -> list[int]:
    """A model input's token ids, its text chunks joined; any other chunk (an image) is refused by name."""
    tokens: list[int] = []
    for chunk in chunks:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise UnsupportedLoss(f"{where}: a {kind} chunk; this server serves a text model: encoded_text chunks only")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    return tokens


def decode_forward_backward(body: bytes) -> tuple[str, int, list[Datum], str, dict, bool]:
    """(model_id, seq_id, data, loss_fn, loss_fn_config, forward_only) of a `forward_backward` body."""
    pb = _pb()
    request = pb.ForwardBackwardRequest()
    request.ParseFromString(body)
    config = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "text":
            raise UnsupportedLoss(f"loss_fn_config[{key!r}] is text ({value.text!r}); this server takes numbers only")
        config[key] = value.number
    data = [Datum(model_input_tokens(d.model_input, f"datum {i}"),
                  {name: _tensor(name, t) for name, t in d.loss_fn_inputs.items()})
            for i, d in enumerate(request.data)]
    return request.model_id, request.seq_id, data, request.loss_fn, config, request.forward_only


def encode_forward_backward(outputs: list[dict[str, torch.Tensor]], metrics: dict[str, float]) -> bytes:
    """One ArrayRecord for the request's data: each output field batched, with int64 byte offsets per datum."""
    pb = _pb()
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = message.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in (outputs[0] if outputs else {}):
        arrays = [o[name].float().numpy().astype(np.float32) for o in outputs]
        field = record.fields[name]
        field.dtype = pb.DTYPE_FLOAT32
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64).tobytes()
    for key, value in metrics.items():
        message.metrics[key] = value
    return message.SerializeToString()


def encode_sample(sequences: list[tuple[list[int], list[float], str]], prompt_logprobs: list[float] | None) -> bytes:
    """A SampleResponse: per sequence (tokens, logprobs, finish reason "stop" or "length"); `prompt_logprobs` with
    NaN where none is defined (position 0)."""
    pb = _pb()
    message = pb.SampleResponse()
    for tokens, logprobs, reason in sequences:
        seq = message.sequences.add()
        seq.stop_reason = pb.STOP_REASON_LENGTH if reason == "length" else pb.STOP_REASON_STOP
        seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return message.SerializeToString()
