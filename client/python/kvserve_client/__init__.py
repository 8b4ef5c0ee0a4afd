"""Python client of the kvserve.v1.Inference service (served by the kvserve router and workers).

The protobuf/gRPC stubs are generated, not committed: run client/python/generate_stubs.sh OUTDIR
(the CMake build runs it into build/python) and put OUTDIR on PYTHONPATH beside client/python.
"""

from kvserve_client.client import Client, Completion, Sample

__all__ = ["Client", "Completion", "Sample"]
