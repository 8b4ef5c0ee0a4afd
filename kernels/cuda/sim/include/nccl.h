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
// Collectives on InitRank communicators and point-to-point on InitAll ones are ncclInvalidUsage.
// A failure (a peer that exited or closed its communicator, a size mismatch, an op waiting longer
// than KVSERVE_SIM_NCCL_TIMEOUT_S, default 120 s) completes the posted ops without data and shows
// in ncclCommGetAsyncError and ncclGetLastError; nothing hangs.

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

extern "C" {
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
/// A fresh id for ncclCommInitRank: a tag and a random token naming the ranks' sockets.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
/// Rank `rank` of `nranks` on the calling thread's current device. Returns once this rank's
/// socket listens, without waiting for the others (real NCCL waits for every rank).
/// ncclInvalidUsage when this rank of this id exists already, in this process or another.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
/// InitRank communicators: waits for the posted sends and recvs to finish (each completes,
/// fails, or times out), then closes the sockets and frees the communicator.
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/// Wakes every rank blocked in a collective of this communicator's clique, then frees it. On an
/// InitRank communicator: completes its posted sends and recvs without data (their streams go
/// on), closes its sockets and frees it; callable while another thread's stream waits on it.
ncclResult_t ncclCommAbort(ncclComm_t comm);
/// The communicator's asynchronous error: ncclRemoteError (a peer exited or closed its end),
/// ncclSystemError (a timeout), ncclInvalidUsage (a size mismatch), or ncclSuccess.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/// Point-to-point on InitRank communicators: the peer posts the matching ncclRecv (ncclSend) with
/// the same byte count. The call returns at once; its stream waits for the transfer.
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
}

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_
