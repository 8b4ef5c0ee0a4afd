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

// Where the CUDA library (or its simulated twin) may be, most specific first.
std::vector<std::string> CandidatePaths(bool simulator) {
  const std::string file = simulator ? "libkvserve_cuda_sim.so" : "libkvserve_cuda.so";
  std::vector<std::string> paths;
  const char* env = std::getenv(simulator ? "KVSERVE_CUDA_SIM_BACKEND" : "KVSERVE_CUDA_BACKEND");
  if (env != nullptr && *env != '\0') {
    paths.emplace_back(env);
    return paths;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    paths.push_back(dir + file);
    paths.push_back(dir + "../lib/" + file);
  }
  // The build tree's copy.
#ifdef KVSERVE_CUDA_BACKEND_PATH
  if (!simulator) paths.emplace_back(KVSERVE_CUDA_BACKEND_PATH);
#endif
#ifdef KVSERVE_CUDA_SIM_BACKEND_PATH
  if (simulator) paths.emplace_back(KVSERVE_CUDA_SIM_BACKEND_PATH);
#endif
  paths.push_back(file);  // LD_LIBRARY_PATH and the system paths
  return paths;
}

}  // namespace

std::optional<DeviceChoice> DeviceChoiceFromName(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  if (lower == "cpu") return DeviceChoice::kCpu;
  if (lower == "cuda") return DeviceChoice::kCuda;
  if (lower == "auto") return DeviceChoice::kAuto;
  if (lower == "cuda-sim") return DeviceChoice::kCudaSim;
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
    case DeviceChoice::kCudaSim:
      return "cuda-sim";
  }
  return "unknown";
}

absl::StatusOr<void*> CudaLibrarySymbol(const char* name, bool simulator) {
  // The library stays loaded for the life of the process: backends and their memory may
  // outlive any one caller, and unloading CUDA runtimes is not supported anyway.
  static std::mutex mu;
  static void* handles[2] = {nullptr, nullptr};
  const char* library = simulator ? "libkvserve_cuda_sim.so" : "libkvserve_cuda.so";
  std::lock_guard<std::mutex> lock(mu);
  void*& handle = handles[simulator ? 1 : 0];
  if (handle == nullptr) {
    std::string errors;
    for (const std::string& path : CandidatePaths(simulator)) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
      const char* e = dlerror();
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", e != nullptr ? e : path);
    }
    if (handle == nullptr) {
#ifndef KVSERVE_CUDA_BACKEND_PATH
      if (!simulator) {
        errors =
            absl::StrCat("kvserve was built without CUDA (no nvcc at configure time); ", errors);
      }
#endif
      return absl::UnavailableError(absl::StrCat("cannot load ", library, ": ", errors));
    }
  }
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) return absl::UnavailableError(absl::StrCat(library, " has no ", name));
  return symbol;
}

absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(const BackendOptions& options) {
  absl::StatusOr<void*> symbol = CudaLibrarySymbol(kCudaBackendEntryPoint, options.simulator);
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
  BackendOptions cuda_options = options;
  cuda_options.simulator = choice == DeviceChoice::kCudaSim;
  absl::StatusOr<std::unique_ptr<Backend>> cuda = LoadCudaBackend(cuda_options);
  if (cuda.ok() || choice != DeviceChoice::kAuto) return cuda;
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "kvserve: --device auto: using the CPU (no CUDA device: %s)\n",
                 std::string(cuda.status().message()).c_str());
  });
  return std::make_unique<cpu::CpuBackend>(pool);
}

}  // namespace kvserve
