// NCCL on the simulator: the ranks of a clique are threads of this process (one per device, as
// kvserve runs them). A collective is posted when its stream reaches it (at once, or at graph
// replay) and, as on a GPU, the call returns at once: the rank's stream then waits for it
// (Pending, internal.h) before its next op and in cudaStreamSynchronize. The last rank to post
// does the whole operation, in rank order, so every rank gets bit-identical results.
// ncclCommAbort completes the posted round without data and frees the communicator
// (AddressSanitizer then catches any use after it). A stream left waiting longer than
// KVSERVE_SIM_NCCL_TIMEOUT_S (default 120 s) fails instead of hanging.

#include "nccl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "internal.h"

namespace kvsim {
namespace {

enum class Kind : uint8_t { kAllReduce, kAllGather };

struct Post {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  std::shared_ptr<Pending> done;  // finished when the round has run (or was aborted)
};

struct Clique {
  explicit Clique(int n) : size(n), posts(static_cast<size_t>(n)) {}
  const int size;
  std::mutex mu;
  uint64_t generation = 0;
  int arrived = 0;
  bool aborted = false;
  ncclResult_t round_result = ncclSuccess;
  std::vector<Post> posts;
};

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

double LoadAs(const void* p, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclInt8:
      return static_cast<const int8_t*>(p)[i];
    case ncclUint8:
      return static_cast<const uint8_t*>(p)[i];
    case ncclInt32:
      return static_cast<const int32_t*>(p)[i];
    case ncclUint32:
      return static_cast<const uint32_t*>(p)[i];
    case ncclInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case ncclUint64:
      return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case ncclFloat16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case ncclBfloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ncclFloat32:
      return static_cast<const float*>(p)[i];
    case ncclFloat64:
      return static_cast<const double*>(p)[i];
  }
  return 0;
}

/// out = a (op) b in the element type's own arithmetic (f32 adds as f32, like NCCL's kernels).
void Combine(ncclDataType_t t, ncclRedOp_t op, const void* a, size_t i, void* out) {
  auto apply = [op](auto x, auto y) {
    switch (op) {
      case ncclSum:
        return static_cast<decltype(x)>(x + y);
      case ncclProd:
        return static_cast<decltype(x)>(x * y);
      case ncclMax:
        return x < y ? y : x;
      case ncclMin:
        return y < x ? y : x;
    }
    return x;
  };
  switch (t) {
    case ncclFloat32: {
      auto* o = static_cast<float*>(out);
      o[i] = apply(o[i], static_cast<const float*>(a)[i]);
      break;
    }
    case ncclFloat64: {
      auto* o = static_cast<double*>(out);
      o[i] = apply(o[i], static_cast<const double*>(a)[i]);
      break;
    }
    case ncclInt32: {
      auto* o = static_cast<int32_t*>(out);
      o[i] = apply(o[i], static_cast<const int32_t*>(a)[i]);
      break;
    }
    case ncclInt64: {
      auto* o = static_cast<int64_t*>(out);
      o[i] = apply(o[i], static_cast<const int64_t*>(a)[i]);
      break;
    }
    case ncclFloat16: {
      auto* o = static_cast<__half*>(out);
      o[i] = __float2half_rn(apply(__half2float(o[i]), static_cast<float>(LoadAs(a, t, i))));
      break;
    }
    case ncclBfloat16: {
      auto* o = static_cast<__nv_bfloat16*>(out);
      o[i] =
          __float2bfloat16_rn(apply(__bfloat162float(o[i]), static_cast<float>(LoadAs(a, t, i))));
      break;
    }
    default:  // not reducible: refused before a round starts
      break;
  }
}

bool Reducible(ncclDataType_t t) {
  return t == ncclFloat32 || t == ncclFloat64 || t == ncclInt32 || t == ncclInt64 ||
         t == ncclFloat16 || t == ncclBfloat16;
}

/// The last rank of a round does the whole collective.
ncclResult_t RunRound(Clique& c) {
  const Post& p0 = c.posts[0];
  for (const Post& p : c.posts) {
    if (p.kind != p0.kind || p.count != p0.count || p.type != p0.type ||
        (p.kind == Kind::kAllReduce && p.op != p0.op)) {
      std::fprintf(stderr, "kvsim: NCCL ranks called different collectives in one round\n");
      return ncclInvalidUsage;
    }
  }
  const size_t bytes = p0.count * TypeBytes(p0.type);
  if (p0.kind == Kind::kAllReduce) {
    std::vector<unsigned char> acc(bytes);
    if (bytes > 0) std::memcpy(acc.data(), c.posts[0].send, bytes);
    for (size_t r = 1; r < c.posts.size(); ++r) {
      for (size_t i = 0; i < p0.count; ++i) Combine(p0.type, p0.op, c.posts[r].send, i, acc.data());
    }
    for (const Post& p : c.posts) {
      if (bytes > 0) std::memcpy(p.recv, acc.data(), bytes);
    }
  } else {
    std::vector<unsigned char> all(bytes * c.posts.size());
    for (size_t r = 0; r < c.posts.size(); ++r) {
      if (bytes > 0) std::memcpy(all.data() + r * bytes, c.posts[r].send, bytes);
    }
    for (const Post& p : c.posts) {
      if (!all.empty()) std::memcpy(p.recv, all.data(), all.size());
    }
  }
  return ncclSuccess;
}

/// Rank `rank`'s part of one round: posts it; the last rank runs the round for all.
ncclResult_t Arrive(Clique& c, int rank, const Post& post) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.aborted) {
    post.done->Finish();
    return ncclRemoteError;
  }
  c.posts[static_cast<size_t>(rank)] = post;
  if (++c.arrived < c.size) return ncclSuccess;
  c.round_result = RunRound(c);
  c.arrived = 0;
  ++c.generation;
  for (Post& p : c.posts) {
    p.done->Finish();
    p.done.reset();
  }
  return c.round_result;
}

/// Completes the posted part of the current round without data, for ever after.
void AbortClique(Clique& c) {
  std::lock_guard<std::mutex> lock(c.mu);
  c.aborted = true;
  for (Post& p : c.posts) {
    if (p.done != nullptr) p.done->Finish();
    p.done.reset();
  }
}

}  // namespace
}  // namespace kvsim

struct ncclComm {
  std::shared_ptr<kvsim::Clique> clique;
  int rank = 0;
  int device = 0;
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;
};

namespace {

ncclResult_t Submit(ncclComm_t comm, cudaStream_t stream, const kvsim::Post& post) {
  if (comm == nullptr) return ncclInvalidArgument;
  const size_t bytes = post.count * kvsim::TypeBytes(post.type);
  const size_t recv_bytes = post.kind == kvsim::Kind::kAllGather
                                ? bytes * static_cast<size_t>(comm->clique->size)
                                : bytes;
  if (bytes > 0 &&
      (!kvsim::IsDeviceRange(post.send, bytes) || !kvsim::IsDeviceRange(post.recv, recv_bytes))) {
    comm->last_error = "buffer outside device memory";
    std::fprintf(stderr, "kvsim: NCCL rank %d: a buffer of %zu bytes is not device memory\n",
                 comm->rank, bytes);
    return ncclInvalidArgument;
  }
  if (kvsim::StreamDevice(stream) != comm->device) {
    std::fprintf(stderr, "kvsim: NCCL rank %d (device %d) called on a stream of device %d\n",
                 comm->rank, comm->device, kvsim::StreamDevice(stream));
    return ncclInvalidUsage;
  }
  auto clique = comm->clique;
  const int rank = comm->rank;
  auto result = std::make_shared<ncclResult_t>(ncclSuccess);
  const cudaError_t e = kvsim::Enqueue(stream, [clique, rank, post, result] {
    kvsim::Post posted = post;
    posted.done = std::make_shared<kvsim::Pending>();
    kvsim::AddPending(kvsim::ExecutingStream(), posted.done);
    *result = kvsim::Arrive(*clique, rank, posted);
  });
  if (e != cudaSuccess) return ncclUnhandledCudaError;
  if (*result != ncclSuccess) comm->async_error = *result;
  return *result;
}

}  // namespace

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) return ncclInvalidArgument;
  if (ndev > kvsim::DeviceCount()) return ncclUnhandledCudaError;
  auto clique = std::make_shared<kvsim::Clique>(ndev);
  for (int i = 0; i < ndev; ++i) {
    const int device = devlist != nullptr ? devlist[i] : i;
    if (device < 0 || device >= kvsim::DeviceCount()) {
      for (int j = 0; j < i; ++j) delete comms[j];
      return ncclInvalidArgument;
    }
    comms[i] = new ncclComm();
    comms[i]->clique = clique;
    comms[i]->rank = i;
    comms[i]->device = device;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  kvsim::AbortClique(*comm->clique);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->clique->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error (a peer did not arrive)";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error (communicator aborted)";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm != nullptr ? comm->last_error.c_str() : "";
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (!kvsim::Reducible(datatype)) return ncclInvalidArgument;
  return Submit(comm, stream,
                kvsim::Post{kvsim::Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (kvsim::TypeBytes(datatype) == 0) return ncclInvalidArgument;
  return Submit(
      comm, stream,
      kvsim::Post{kvsim::Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum});
}

}  // extern "C"
