#include "worker/kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const ModelConfig& config,
                                                          int64_t num_blocks, int64_t block_size,
                                                          KvCacheDType dtype, Backend* backend) {
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache needs positive num_blocks and block_size, got ", num_blocks,
                     " and ", block_size));
  }
  if (config.num_layers <= 0 || config.kv_cache_heads() <= 0 || config.kv_cache_dim() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache needs positive num_layers, num_kv_heads and head_dim, got ", config.num_layers,
        ", ", config.kv_cache_heads(), " and ", config.kv_cache_dim()));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t elem_bytes = KvCacheDTypeElemBytes(dtype);
  const bool scaled = KvCacheDTypeHasScales(dtype);
  // Rows (token x kv head vectors) per block, then per buffer; every product is checked.
  // MLA: one latent row per token (kv_cache_dim wide), in the K buffers only.
  const int64_t kv_heads = config.kv_cache_heads();
  const int64_t head_dim = config.kv_cache_dim();
  if (block_size > kMax / kv_heads) return absl::ResourceExhaustedError("KV cache size overflows");
  const int64_t rows_per_block = kv_heads * block_size;
  if (num_blocks > kMax / rows_per_block / (head_dim * elem_bytes + 4) / 2) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache size overflows (", num_blocks,
                                                     " blocks of ", block_size, " tokens)"));
  }
  const int64_t rows = rows_per_block * num_blocks;
  const int64_t data_bytes = rows * head_dim * elem_bytes;

  std::unique_ptr<KvCache> cache(new KvCache());
  if (backend != nullptr && !backend->host_memory()) cache->backend_ = backend;
  cache->layout_ = {kv_heads, head_dim, block_size, dtype};
  cache->num_blocks_ = num_blocks;
  for (int l = 0; l < config.num_layers; ++l) {
    for (std::vector<Buffer>* buffers : {&cache->k_, &cache->v_}) {
      if (buffers == &cache->v_ && !config.kv_cache_has_v()) continue;
      Buffer b;
      if (cache->backend_ != nullptr) {
        absl::Status s = cache->AllocDevice(&b, data_bytes, scaled ? rows : 0);
        if (!s.ok()) return s;
        buffers->push_back(std::move(b));
        continue;
      }
      const bool mapped = b.host_data.Map(static_cast<size_t>(data_bytes)) &&
                          (!scaled || b.host_scales.Map(static_cast<size_t>(rows) * sizeof(float)));
      b.data = b.host_data.data();
      b.scales = reinterpret_cast<float*>(b.host_scales.data());
      if (!mapped) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", num_blocks, " KV blocks (",
                         data_bytes + (scaled ? rows * 4 : 0), " bytes per buffer, ",
                         std::string(KvCacheDTypeName(dtype)), ")"));
      }
      buffers->push_back(std::move(b));
    }
  }
  return cache;
}

void KvCache::CopyBlock(int64_t src, int64_t dst) {
  if (src == dst) return;
  const int64_t rows = layout_.num_kv_heads * layout_.block_size;
  const int64_t bytes = rows * layout_.head_dim * KvCacheDTypeElemBytes(layout_.dtype);
  for (std::vector<Buffer>* buffers : {&k_, &v_}) {
    for (Buffer& b : *buffers) {
      if (backend_ != nullptr) {
        // Queued on the backend's stream, so it lands before the next step's kernels.
        (void)backend_->CopyOnDevice(b.data + dst * bytes, b.data + src * bytes,
                                     static_cast<size_t>(bytes));
        if (b.scales != nullptr) {
          (void)backend_->CopyOnDevice(b.scales + dst * rows, b.scales + src * rows,
                                       static_cast<size_t>(rows) * sizeof(float));
        }
        continue;
      }
      std::memcpy(b.data + dst * bytes, b.data + src * bytes, static_cast<size_t>(bytes));
      if (b.scales != nullptr) {
        std::memcpy(b.scales + dst * rows, b.scales + src * rows,
                    static_cast<size_t>(rows) * sizeof(float));
      }
    }
  }
}

template <typename Fn>
void KvCache::ForEachPart(int64_t block, Fn&& fn) const {
  const int64_t rows = layout_.num_kv_heads * layout_.block_size;
  const int64_t bytes = rows * layout_.head_dim * KvCacheDTypeElemBytes(layout_.dtype);
  for (size_t l = 0; l < k_.size(); ++l) {
    for (const Buffer* b : {&k_[l], v_.empty() ? nullptr : &v_[l]}) {
      if (b == nullptr) continue;
      fn(b->data + block * bytes, static_cast<size_t>(bytes));
      if (b->scales != nullptr) {
        fn(reinterpret_cast<uint8_t*>(b->scales + block * rows),
           static_cast<size_t>(rows) * sizeof(float));
      }
    }
  }
}

int64_t KvCache::BlockBytes() const {
  int64_t total = 0;
  ForEachPart(0, [&](uint8_t*, size_t bytes) { total += static_cast<int64_t>(bytes); });
  return total;
}

absl::Status KvCache::ReadBlock(int64_t block, uint8_t* dst) const {
  if (block < 0 || block >= num_blocks_) {
    return absl::OutOfRangeError(
        absl::StrCat("KV block ", block, " outside [0, ", num_blocks_, ")"));
  }
  absl::Status status;
  ForEachPart(block, [&](const uint8_t* part, size_t bytes) {
    if (backend_ != nullptr) {
      if (status.ok()) status = backend_->CopyToHostAsync(dst, part, bytes);
    } else {
      std::memcpy(dst, part, bytes);
    }
    dst += bytes;
  });
  return status;
}

absl::Status KvCache::WriteBlock(int64_t block, const uint8_t* src) {
  if (block < 0 || block >= num_blocks_) {
    return absl::OutOfRangeError(
        absl::StrCat("KV block ", block, " outside [0, ", num_blocks_, ")"));
  }
  absl::Status status;
  ForEachPart(block, [&](uint8_t* part, size_t bytes) {
    if (backend_ != nullptr) {
      if (status.ok()) status = backend_->CopyToDeviceAsync(part, src, bytes);
    } else {
      std::memcpy(part, src, bytes);
    }
    src += bytes;
  });
  return status;
}

absl::Status KvCache::FinishCopies() const {
  return backend_ != nullptr ? backend_->Synchronize() : absl::OkStatus();
}

absl::Status KvCache::AllocDevice(Buffer* b, int64_t data_bytes, int64_t scale_count) {
  auto fail = [&](const absl::Status& s) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", num_blocks_, " KV blocks on ", std::string(backend_->name()), " (",
        data_bytes + scale_count * 4, " bytes per buffer, ",
        std::string(KvCacheDTypeName(layout_.dtype)), "): ", s.message()));
  };
  absl::StatusOr<DeviceBuffer> data = backend_->AllocBuffer(static_cast<size_t>(data_bytes));
  if (!data.ok()) return fail(data.status());
  // Zero bytes decode to 0.0 in every dtype (scale 0): a fresh cache reads as empty.
  if (absl::Status s = backend_->Memset(data->get(), 0, data_bytes); !s.ok()) return fail(s);
  b->device_data = std::move(*data);
  b->data = b->device_data.as<uint8_t>();
  if (scale_count > 0) {
    const size_t scale_bytes = static_cast<size_t>(scale_count) * sizeof(float);
    absl::StatusOr<DeviceBuffer> scales = backend_->AllocBuffer(scale_bytes);
    if (!scales.ok()) return fail(scales.status());
    if (absl::Status s = backend_->Memset(scales->get(), 0, scale_bytes); !s.ok()) return fail(s);
    b->device_scales = std::move(*scales);
    b->scales = b->device_scales.as<float>();
  }
  return absl::OkStatus();
}

int64_t KvCache::BytesPerToken(const ModelConfig& config, KvCacheDType dtype) {
  return int64_t{config.kv_cache_has_v() ? 2 : 1} * config.num_layers * config.kv_cache_heads() *
         KvCacheDTypeVectorBytes(dtype, config.kv_cache_dim());
}

}  // namespace kvserve
