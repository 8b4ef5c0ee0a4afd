#ifndef KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_
#define KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_

// NCCL as the simulator provides it: ranks are threads of one process (kernels/cuda/sim/nccl.cc).
// Collectives run when their stream reaches them (at once, or at graph replay) and wait for every
// rank; reductions add in rank order, so every rank gets bit-identical results.

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

extern "C" {
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/// Wakes every rank blocked in a collective of this communicator's clique, then frees it.
ncclResult_t ncclCommAbort(ncclComm_t comm);
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
}

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_NCCL_H_
