#include "kernels/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"

namespace kvserve {
namespace {

using CreateFn = Backend* (*)(const BackendOptions*, char*, size_t);

// Where libkvserve_cuda.so may be, most specific first.
std::vector<std::string> CandidatePaths() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("KVSERVE_CUDA_BACKEND"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
    return paths;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    paths.push_back(dir + "libkvserve_cuda.so");
    paths.push_back(dir + "../lib/libkvserve_cuda.so");
  }
#ifdef KVSERVE_CUDA_BACKEND_PATH
  paths.emplace_back(KVSERVE_CUDA_BACKEND_PATH);  // the build tree's copy
#endif
  paths.emplace_back("libkvserve_cuda.so");  // LD_LIBRARY_PATH and the system paths
  return paths;
}

}  // namespace

std::optional<DeviceChoice> DeviceChoiceFromName(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  if (lower == "cpu") return DeviceChoice::kCpu;
  if (lower == "cuda") return DeviceChoice::kCuda;
  if (lower == "auto") return DeviceChoice::kAuto;
  return std::nullopt;
}

std::string_view DeviceChoiceName(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::kCpu:
      return "cpu";
    case DeviceChoice::kCuda:
      return "cuda";
    case DeviceChoice::kAuto:
      return "auto";
  }
  return "unknown";
}

absl::StatusOr<void*> CudaLibrarySymbol(const char* name) {
  // The library stays loaded for the life of the process: backends and their memory may
  // outlive any one caller, and unloading CUDA runtimes is not supported anyway.
  static std::mutex mu;
  static void* handle = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (handle == nullptr) {
    std::string errors;
    for (const std::string& path : CandidatePaths()) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
      const char* e = dlerror();
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", e != nullptr ? e : path);
    }
    if (handle == nullptr) {
#ifndef KVSERVE_CUDA_BACKEND_PATH
      errors = absl::StrCat("kvserve was built without CUDA (no nvcc at configure time); ", errors);
#endif
      return absl::UnavailableError(absl::StrCat("cannot load libkvserve_cuda.so: ", errors));
    }
  }
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    return absl::UnavailableError(absl::StrCat("libkvserve_cuda.so has no ", name));
  }
  return symbol;
}

absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(const BackendOptions& options) {
  absl::StatusOr<void*> symbol = CudaLibrarySymbol(kCudaBackendEntryPoint);
  if (!symbol.ok()) return symbol.status();
  auto create = reinterpret_cast<CreateFn>(*symbol);
  char error[512] = {0};
  Backend* backend = create(&options, error, sizeof(error));
  if (backend == nullptr) return absl::UnavailableError(error);
  return std::unique_ptr<Backend>(backend);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceChoice choice,
                                                       const BackendOptions& options,
                                                       cpu::ThreadPool* pool) {
  if (choice == DeviceChoice::kCpu) return std::make_unique<cpu::CpuBackend>(pool);
  absl::StatusOr<std::unique_ptr<Backend>> cuda = LoadCudaBackend(options);
  if (cuda.ok() || choice == DeviceChoice::kCuda) return cuda;
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "kvserve: --device auto: using the CPU (no CUDA device: %s)\n",
                 std::string(cuda.status().message()).c_str());
  });
  return std::make_unique<cpu::CpuBackend>(pool);
}

}  // namespace kvserve
