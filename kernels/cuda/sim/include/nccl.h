#ifndef KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_
#define KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_

// NCCL as the simulator provides it (kernels/cuda/sim/nccl.cc), with real NCCL's signatures and
// two kinds of communicator:
//  - ncclCommInitAll: ranks are threads of one process; they run the collectives. Collectives run
//    when their stream reaches them (at once, or at graph replay) and wait for every rank;
//    reductions add in rank order, so every rank gets bit-identical results.
//  - ncclGetUniqueId + ncclCommInitRank: ranks may be threads or processes of one machine (they
//    talk over Unix sockets); they do point-to-point (ncclSend / ncclRecv), stream-ordered and
//    asynchronous, matched in FIFO order per ordered pair of ranks. A send completes once the
//    peer's process has taken the bytes, without waiting for its recv, so one thread may post a
//    send and then a recv to the same peer without ncclGroupStart. Unlike real NCCL,
//    ncclCommInitRank returns without waiting for the other ranks (they connect at the first
//    send), so one thread may init several ranks of one id, with or without ncclGroupStart.
//  - ncclCommInitRankConfig with config->blocking = 0: NCCL's non-blocking init (NCCL >= 2.14).
//    The call returns ncclInProgress; the rank then connects to every other rank, and its
//    ncclCommGetAsyncError says ncclInProgress until every rank has joined, then ncclSuccess.
//    A peer that never comes leaves it ncclInProgress for ever: the caller gives up after its
//    own deadline with ncclCommAbort, as with real NCCL.
// Collectives on InitRank communicators and point-to-point on InitAll ones are ncclInvalidUsage.
// A failure (a peer that exited or closed its communicator, a size mismatch, an op waiting longer
// than KVSERVE_SIM_NCCL_TIMEOUT_S, default 120 s) completes the posted ops without data and shows
// in ncclCommGetAsyncError and ncclGetLastError; nothing hangs.

#include <climits>
#include <cstddef>

#include "cuda_runtime_api.h"

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;
#define ncclFloat ncclFloat32
#define ncclInt ncclInt32

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;

typedef struct ncclComm* ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

// Only the fields the simulator reads, at real NCCL's offsets (a prefix of its ncclConfig_t): code
// that sets only these builds against both. Always start from NCCL_CONFIG_INITIALIZER, whose magic
// ncclCommInitRankConfig checks.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;  // 0: non-blocking init; 1 or NCCL_CONFIG_UNDEF_INT: blocking, as ncclCommInitRank
} ncclConfig_t;
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_INITIALIZER \
  { sizeof(ncclConfig_t), 0xcafebeef, 0, NCCL_CONFIG_UNDEF_INT }

extern "C" {
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
/// A fresh id for ncclCommInitRank: a tag and a random token naming the ranks' sockets.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
/// Rank `rank` of `nranks` on the calling thread's current device. Returns once this rank's
/// socket listens, without waiting for the others (real NCCL waits for every rank).
/// ncclInvalidUsage when this rank of this id exists already, in this process or another.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
/// A null `config`, or blocking 1 or undefined: ncclCommInitRank. Blocking 0: creates the
/// communicator (its socket listens) and returns ncclInProgress; its I/O thread then connects to
/// every other rank, retrying while a rank's socket does not exist yet, and
/// ncclCommGetAsyncError says ncclInProgress until every rank has joined (this rank's connection
/// to it is up and its connection to this rank has come), then ncclSuccess. Every rank of such a
/// communicator must init non-blocking: a blocking rank connects only at its first send to this
/// one. A rank that refuses this one (the ranks disagree on nranks), or that exits or aborts
/// before it joined, fails the init (ncclRemoteError). A send or recv before ncclSuccess is
/// ncclInvalidUsage. ncclInvalidArgument for a config not from NCCL_CONFIG_INITIALIZER or
/// another blocking value.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
/// InitRank communicators: waits for the posted sends and recvs to finish (each completes,
/// fails, or times out), then closes the sockets and frees the communicator.
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/// Wakes every rank blocked in a collective of this communicator's clique, then frees it. On an
/// InitRank communicator: completes its posted sends and recvs without data (their streams go
/// on), closes its sockets and frees it; callable while another thread's stream waits on it, and
/// during a non-blocking init (how a caller gives up on a rank that never comes).
ncclResult_t ncclCommAbort(ncclComm_t comm);
/// The communicator's asynchronous error: ncclRemoteError (a peer exited or closed its end),
/// ncclSystemError (a timeout), ncclInvalidUsage (a size mismatch), ncclInProgress (a
/// non-blocking init not done yet), or ncclSuccess.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
/// No-ops (ncclSuccess): no init or op of the simulator waits for another rank in the call.
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/// Point-to-point on InitRank communicators: the peer posts the matching ncclRecv (ncclSend) with
/// the same byte count. The call returns at once; its stream waits for the transfer. On a
/// non-blocking communicator real NCCL may return ncclInProgress here (then poll
/// ncclCommGetAsyncError until it is not, before syncing the stream); the simulator returns
/// ncclSuccess, having posted the op, but callers must handle both.
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
}

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_
