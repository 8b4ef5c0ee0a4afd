#!/usr/bin/env bash
# Generates the Python protobuf and gRPC stubs of proto/kvserve/v1 into OUTDIR, as the modules
# kvserve.v1.inference_pb2(_grpc) and kvserve.v1.worker_pb2(_grpc). Put OUTDIR and client/python
# on PYTHONPATH to use the kvserve_client package. Needs protoc and grpc_python_plugin (Debian:
# protobuf-compiler, protobuf-compiler-grpc) and, to run them, python3-grpcio python3-protobuf.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
out=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
proto_root=$(cd "$here/../../proto" && pwd)
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}
if [ -z "$plugin" ]; then
  echo "generate_stubs: grpc_python_plugin not found (apt install protobuf-compiler-grpc)" >&2
  exit 1
fi
mkdir -p "$out"
protoc --proto_path="$proto_root" --python_out="$out" --grpc_out="$out" \
  --plugin=protoc-gen-grpc="$plugin" \
  "$proto_root/kvserve/v1/inference.proto" "$proto_root/kvserve/v1/worker.proto"
