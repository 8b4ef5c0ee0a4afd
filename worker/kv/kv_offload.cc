#include "worker/kv/kv_offload.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/logging.h"

namespace kvserve {
namespace {

static_assert(std::endian::native == std::endian::little,
              "block files are little-endian and written with memcpy");

namespace fs = std::filesystem;

// Writes queued for the disk tier beyond this are dropped (the block stays in the host tier).
constexpr int64_t kMaxQueuedBytes = int64_t{64} << 20;

// Block file header, little-endian, kHeaderBytes long:
//   0  magic "KVSBLOCK"          8 bytes
//   8  format version            u32 (1)
//  12  header length             u32 (kHeaderBytes)
//  16  block key hi, lo          2 x u64
//  32  model fingerprint hi, lo  2 x u64
//  48  layout hash               u64 (XXH3-64 of KvTierIdentity::layout)
//  56  payload length            u64
//  64  payload checksum          u64 (XXH3-64 of the payload)
//  72  header checksum           u64 (XXH3-64 of bytes 0..71)
constexpr std::array<char, 8> kMagic = {'K', 'V', 'S', 'B', 'L', 'O', 'C', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 80;
constexpr char kSuffix[] = ".kvb";
constexpr size_t kSuffixLen = sizeof(kSuffix) - 1;

template <typename T>
void Put(uint8_t* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}

template <typename T>
T Take(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

uint64_t LayoutHash(const KvTierIdentity& identity) {
  return XXH3_64bits(identity.layout.data(), identity.layout.size());
}

std::optional<BlockKey> KeyFromName(std::string_view name) {
  if (name.size() != 32 + kSuffixLen || !name.ends_with(kSuffix)) return std::nullopt;
  BlockKey key;
  for (int half = 0; half < 2; ++half) {
    uint64_t v = 0;
    for (int i = 0; i < 16; ++i) {
      const char c = name[half * 16 + i];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return std::nullopt;
      }
      v = v << 4 | static_cast<uint64_t>(d);
    }
    (half == 0 ? key.hi : key.lo) = v;
  }
  return key;
}

}  // namespace

BlockKey ModelWeightsFingerprint(const ModelWeights& weights) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  auto add = [&](std::string_view bytes) {
    XXH3_128bits_update(state, bytes.data(), bytes.size());
  };
  const ModelConfig& c = weights.config;
  add(absl::StrCat("kvserve.model_fingerprint.v1 ", c.architecture, " hidden=", c.hidden_size,
                   " layers=", c.num_layers, " heads=", c.num_heads, " kv_heads=", c.num_kv_heads,
                   " head_dim=", c.head_dim, " eps=", c.rms_norm_eps, " theta=", c.rope_theta,
                   " rope=", static_cast<int>(c.rope_scaling.type), ",", c.rope_scaling.factor, ",",
                   c.rope_scaling.low_freq_factor, ",", c.rope_scaling.high_freq_factor, ",",
                   c.rope_scaling.original_max_position_embeddings, ",", c.rope_scaling.beta_fast,
                   ",", c.rope_scaling.beta_slow, ",", c.rope_scaling.mscale, ",",
                   c.rope_scaling.mscale_all_dim, " style=", static_cast<int>(c.rope_style),
                   " mla=", c.kv_lora_rank, ",", c.q_lora_rank, ",", c.qk_nope_head_dim, ",",
                   c.qk_rope_head_dim, ",", c.v_head_dim, " experts=", c.num_experts, ",",
                   c.num_experts_per_tok));
  constexpr int64_t kEnd = 64 << 10;
  auto tensor = [&](const TensorView& t) {
    if (!t.present()) return;
    add(absl::StrCat(t.name, " ", static_cast<int>(t.dtype), " [", absl::StrJoin(t.shape, ","),
                     "]"));
    const auto* data = static_cast<const uint8_t*>(t.data);
    const int64_t n = t.nbytes();
    const uint64_t head = XXH3_64bits(data, static_cast<size_t>(std::min(n, kEnd)));
    const int64_t tail_from = std::max<int64_t>(0, n - kEnd);
    const uint64_t tail = XXH3_64bits(data + tail_from, static_cast<size_t>(n - tail_from));
    add(std::string_view(reinterpret_cast<const char*>(&head), sizeof(head)));
    add(std::string_view(reinterpret_cast<const char*>(&tail), sizeof(tail)));
  };
  tensor(weights.token_embedding);
  tensor(weights.rope_freqs);
  weights.ForEachLayerTensor(tensor);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return BlockKey{h.high64, h.low64};
}

std::string KvLayoutDescription(int num_layers, int64_t kv_heads, int64_t head_dim, bool has_v,
                                const std::string& kv_dtype, int64_t block_size, int tp_size,
                                int64_t block_bytes) {
  return absl::StrCat("kvserve.kv_block.v1 layers=", num_layers, " kv_heads=", kv_heads,
                      " head_dim=", head_dim, " v=", has_v ? 1 : 0, " dtype=", kv_dtype,
                      " block_size=", block_size, " tp=", tp_size, " bytes=", block_bytes);
}

// ---------------------------------------------------------------------------------------------
// KvHostTier

absl::StatusOr<std::unique_ptr<KvHostTier>> KvHostTier::Create(int64_t capacity,
                                                               int64_t block_bytes,
                                                               Backend* pinned) {
  if (capacity < 1 || block_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("host KV tier needs at least one block of ",
                                                   "at least one byte, got ", capacity, " of ",
                                                   block_bytes));
  }
  const size_t bytes = static_cast<size_t>(capacity) * static_cast<size_t>(block_bytes);
  if (pinned != nullptr) {
    absl::StatusOr<void*> host = pinned->AllocHost(bytes);
    if (host.ok()) {
      return std::unique_ptr<KvHostTier>(
          new KvHostTier(capacity, block_bytes, static_cast<uint8_t*>(*host), bytes, pinned));
    }
    if (host.status().code() != absl::StatusCode::kUnimplemented) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes,
                                                       " bytes of page-locked memory for the "
                                                       "host KV tier: ",
                                                       host.status().message()));
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes for the host KV tier: ", strerror(errno)));
  }
  return std::unique_ptr<KvHostTier>(
      new KvHostTier(capacity, block_bytes, static_cast<uint8_t*>(p), bytes, nullptr));
}

KvHostTier::~KvHostTier() {
  if (pinned_ != nullptr) {
    pinned_->FreeHost(base_);
  } else {
    munmap(base_, mapped_);
  }
}

const uint8_t* KvHostTier::Peek(const BlockKey& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : Slot(it->second->slot);
}

const uint8_t* KvHostTier::Get(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second);
  return Slot(it->second->slot);
}

std::vector<BlockKey> KvHostTier::Keys() const {
  std::vector<BlockKey> keys;
  keys.reserve(lru_.size());
  for (const Entry& e : lru_) keys.push_back(e.key);
  return keys;
}

uint8_t* KvHostTier::Put(const BlockKey& key) {
  int64_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (next_slot_ < capacity_) {
    slot = next_slot_++;
  } else {
    const Entry oldest = lru_.front();
    lru_.pop_front();
    index_.erase(oldest.key);
    slot = oldest.slot;
    ++evictions_;
    events_.push_back(KvEvent{KvEvent::Type::kEvicted, oldest.key, KvTier::kHost});
  }
  lru_.push_back(Entry{key, slot});
  index_[key] = std::prev(lru_.end());
  events_.push_back(KvEvent{KvEvent::Type::kStored, key, KvTier::kHost});
  return Slot(slot);
}

void KvHostTier::Erase(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  free_slots_.push_back(it->second->slot);
  lru_.erase(it->second);
  index_.erase(it);
  events_.push_back(KvEvent{KvEvent::Type::kEvicted, key, KvTier::kHost});
}

// ---------------------------------------------------------------------------------------------
// KvDiskTier

KvDiskTier::KvDiskTier(std::string dir, int64_t capacity_bytes, int64_t block_bytes,
                       const KvTierIdentity& identity)
    : dir_(std::move(dir)),
      capacity_bytes_(capacity_bytes),
      block_bytes_(block_bytes),
      model_(identity.model),
      layout_hash_(LayoutHash(identity)) {
  stats_.capacity_bytes = capacity_bytes;
}

absl::StatusOr<std::unique_ptr<KvDiskTier>> KvDiskTier::Open(const std::string& dir,
                                                             int64_t capacity_bytes,
                                                             int64_t block_bytes,
                                                             const KvTierIdentity& identity) {
  if (dir.empty()) return absl::InvalidArgumentError("--kv-disk-dir is empty");
  if (capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-disk-bytes must be positive with --kv-disk-dir, got ", capacity_bytes));
  }
  // One subdirectory per identity: the model fingerprint and the layout, hashed.
  std::array<uint8_t, 24> id;
  Put(id.data(), identity.model.hi);
  Put(id.data() + 8, identity.model.lo);
  Put(id.data() + 16, LayoutHash(identity));
  char sub[17];
  std::snprintf(sub, sizeof(sub), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(id.data(), id.size())));
  const fs::path path = fs::path(dir) / sub;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--kv-disk-dir: cannot create ", path.string(), ": ", ec.message()));
  }
  std::unique_ptr<KvDiskTier> tier(
      new KvDiskTier(path.string(), capacity_bytes, block_bytes, identity));
  // Index what an earlier run left, oldest first.
  struct Found {
    fs::file_time_type time;
    BlockKey key;
    int64_t bytes;
  };
  std::vector<Found> found;
  fs::directory_iterator it(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--kv-disk-dir: cannot read ", path.string(), ": ", ec.message()));
  }
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".tmp")) {
      fs::remove(entry.path(), ec);  // a write cut short by a crash
      continue;
    }
    const std::optional<BlockKey> key = KeyFromName(name);
    if (!key || !entry.is_regular_file(ec)) continue;
    const auto bytes = static_cast<int64_t>(entry.file_size(ec));
    if (ec) continue;
    found.push_back({entry.last_write_time(ec), *key, bytes});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.time < b.time; });
  {
    std::lock_guard<std::mutex> lock(tier->mu_);
    for (const Found& f : found) tier->IndexLocked(f.key, f.bytes);
  }
  tier->thread_ = std::thread([t = tier.get()] { t->Run(); });
  return tier;
}

KvDiskTier::~KvDiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string KvDiskTier::PathOf(const BlockKey& key) const {
  return absl::StrCat(dir_, "/", key.ToString(), kSuffix);
}

bool KvDiskTier::Contains(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return files_.contains(key) || queued_.contains(key);
}

std::vector<KvEvent> KvDiskTier::TakeEvents() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(events_, {});
}

std::vector<BlockKey> KvDiskTier::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<BlockKey>(lru_.begin(), lru_.end());
}

void KvDiskTier::IndexLocked(const BlockKey& key, int64_t bytes) {
  const bool known = files_.contains(key);
  DropLocked(key, /*record=*/false);
  if (!known) events_.push_back(KvEvent{KvEvent::Type::kStored, key, KvTier::kDisk});
  lru_.push_back(key);
  files_[key] = FileEntry{std::prev(lru_.end()), bytes};
  total_bytes_ += bytes;
  while (total_bytes_ > capacity_bytes_ && !lru_.empty()) {
    const BlockKey oldest = lru_.front();
    DropLocked(oldest);
    std::error_code ec;
    fs::remove(PathOf(oldest), ec);
  }
  stats_.files = static_cast<int64_t>(files_.size());
  stats_.bytes = total_bytes_;
}

void KvDiskTier::DropLocked(const BlockKey& key, bool record) {
  auto it = files_.find(key);
  if (it == files_.end()) return;
  if (record) events_.push_back(KvEvent{KvEvent::Type::kEvicted, key, KvTier::kDisk});
  total_bytes_ -= it->second.bytes;
  lru_.erase(it->second.it);
  files_.erase(it);
  stats_.files = static_cast<int64_t>(files_.size());
  stats_.bytes = total_bytes_;
}

void KvDiskTier::Reject(const BlockKey& key, const std::string& why) {
  const std::string path = PathOf(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropLocked(key);
    ++stats_.bad_files;
  }
  std::error_code ec;
  fs::remove(path, ec);
  logging::Log(logging::LogLevel::kWarning, "worker", "KV block file not used and removed",
               {{"path", path}, {"reason", why}});
}

bool KvDiskTier::Read(const BlockKey& key, uint8_t* dst) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A block still waiting to be written is served from its queued copy.
    if (queued_.contains(key)) {
      for (const Job& job : queue_) {
        if (job.key == key) {
          std::memcpy(dst, job.bytes.data(), job.bytes.size());
          return true;
        }
      }
    }
    auto it = files_.find(key);
    if (it == files_.end()) {
      // Not indexed, or being written right now: not available yet.
      return false;
    }
    lru_.splice(lru_.end(), lru_, it->second.it);
  }
  const std::string path = PathOf(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::lock_guard<std::mutex> lock(mu_);
    DropLocked(key);
    return false;
  }
  std::array<uint8_t, kHeaderBytes> header{};
  in.read(reinterpret_cast<char*>(header.data()), kHeaderBytes);
  if (in.gcount() != static_cast<std::streamsize>(kHeaderBytes)) {
    Reject(key, "truncated header");
    return false;
  }
  if (std::memcmp(header.data(), kMagic.data(), kMagic.size()) != 0) {
    Reject(key, "not a kvserve block file");
    return false;
  }
  if (Take<uint64_t>(header.data() + 72) != XXH3_64bits(header.data(), 72)) {
    Reject(key, "header checksum mismatch");
    return false;
  }
  if (Take<uint32_t>(header.data() + 8) != kVersion ||
      Take<uint32_t>(header.data() + 12) != kHeaderBytes) {
    Reject(key,
           absl::StrCat("format version ", Take<uint32_t>(header.data() + 8), ", want ", kVersion));
    return false;
  }
  if (Take<uint64_t>(header.data() + 16) != key.hi ||
      Take<uint64_t>(header.data() + 24) != key.lo) {
    Reject(key, "header names another block");
    return false;
  }
  if (Take<uint64_t>(header.data() + 32) != model_.hi ||
      Take<uint64_t>(header.data() + 40) != model_.lo) {
    Reject(key, "written for another model");
    return false;
  }
  if (Take<uint64_t>(header.data() + 48) != layout_hash_ ||
      Take<uint64_t>(header.data() + 56) != static_cast<uint64_t>(block_bytes_)) {
    Reject(key, "written for another KV layout (dtype, block size, heads or tensor parallelism)");
    return false;
  }
  in.read(reinterpret_cast<char*>(dst), block_bytes_);
  if (in.gcount() != block_bytes_) {
    Reject(key, "truncated payload");
    return false;
  }
  if (in.peek() != std::ifstream::traits_type::eof()) {
    Reject(key, "trailing bytes");
    return false;
  }
  if (XXH3_64bits(dst, static_cast<size_t>(block_bytes_)) != Take<uint64_t>(header.data() + 64)) {
    Reject(key, "payload checksum mismatch");
    return false;
  }
  return true;
}

void KvDiskTier::Write(const BlockKey& key, const uint8_t* bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_.contains(key)) return;
    if (queued_bytes_ + block_bytes_ > kMaxQueuedBytes) {
      ++stats_.write_drops;
      return;
    }
    queue_.push_back(Job{key, std::vector<uint8_t>(bytes, bytes + block_bytes_)});
    queued_.insert(key);
    queued_bytes_ += block_bytes_;
  }
  cv_.notify_all();
}

void KvDiskTier::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

KvDiskTier::Stats KvDiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KvDiskTier::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left to write
    writing_ = true;
    // The job stays queued (and readable) until its file is complete.
    // push_back does not move the deque's elements, and only this thread pops them.
    const BlockKey key = queue_.front().key;
    const std::vector<uint8_t>& bytes = queue_.front().bytes;
    lock.unlock();
    WriteFile(key, bytes);
    lock.lock();
    queue_.pop_front();
    queued_.erase(key);
    queued_bytes_ -= block_bytes_;
    writing_ = false;
    cv_.notify_all();
  }
}

void KvDiskTier::WriteFile(const BlockKey& key, const std::vector<uint8_t>& bytes) {
  std::array<uint8_t, kHeaderBytes> header{};
  std::memcpy(header.data(), kMagic.data(), kMagic.size());
  Put<uint32_t>(header.data() + 8, kVersion);
  Put<uint32_t>(header.data() + 12, kHeaderBytes);
  Put<uint64_t>(header.data() + 16, key.hi);
  Put<uint64_t>(header.data() + 24, key.lo);
  Put<uint64_t>(header.data() + 32, model_.hi);
  Put<uint64_t>(header.data() + 40, model_.lo);
  Put<uint64_t>(header.data() + 48, layout_hash_);
  Put<uint64_t>(header.data() + 56, static_cast<uint64_t>(bytes.size()));
  Put<uint64_t>(header.data() + 64, XXH3_64bits(bytes.data(), bytes.size()));
  Put<uint64_t>(header.data() + 72, XXH3_64bits(header.data(), 72));
  const std::string path = PathOf(key);
  const std::string tmp = path + ".tmp";
  bool ok;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header.data()), kHeaderBytes);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    ok = static_cast<bool>(out);
  }
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  std::lock_guard<std::mutex> lock(mu_);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    ++stats_.write_failures;
    return;
  }
  ++stats_.writes;
  IndexLocked(key, static_cast<int64_t>(kHeaderBytes + bytes.size()));
}

// ---------------------------------------------------------------------------------------------
// KvOffloader

absl::StatusOr<std::unique_ptr<KvOffloader>> KvOffloader::Create(const KvOffloadOptions& options,
                                                                 KvBlockAccess access,
                                                                 const KvTierIdentity& identity) {
  if (options.host_bytes < 0 || options.disk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-offload-memory and --kv-disk-bytes must be >= 0, got ",
                     options.host_bytes, " and ", options.disk_bytes));
  }
  if (!options.disk_dir.empty() && options.disk_bytes == 0) {
    return absl::InvalidArgumentError("--kv-disk-dir needs --kv-disk-bytes (the tier's size)");
  }
  if (access.block_bytes <= 0 || !access.read || !access.write) {
    return absl::InvalidArgumentError("KvOffloader: no block access");
  }
  std::unique_ptr<KvOffloader> offloader(new KvOffloader(std::move(access)));
  const int64_t block_bytes = offloader->access_.block_bytes;
  if (options.host_bytes > 0) {
    const int64_t blocks = options.host_bytes / block_bytes;
    if (blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-offload-memory ", options.host_bytes,
                                                     " holds no KV block (one block is ",
                                                     block_bytes, " bytes)"));
    }
    absl::StatusOr<std::unique_ptr<KvHostTier>> host =
        KvHostTier::Create(blocks, block_bytes, offloader->access_.host_memory);
    if (!host.ok()) return host.status();
    offloader->host_ = std::move(*host);
    offloader->stats_.host_capacity_blocks = blocks;
  }
  if (!options.disk_dir.empty()) {
    absl::StatusOr<std::unique_ptr<KvDiskTier>> disk =
        KvDiskTier::Open(options.disk_dir, options.disk_bytes, block_bytes, identity);
    if (!disk.ok()) return disk.status();
    offloader->disk_ = std::move(*disk);
    offloader->scratch_.resize(static_cast<size_t>(block_bytes));
  }
  return offloader;
}

bool KvOffloader::Contains(const BlockKey& key) {
  return (host_ != nullptr && host_->Contains(key)) || (disk_ != nullptr && disk_->Contains(key));
}

KvOffloader::~KvOffloader() { WritePendingToDisk(); }

bool KvOffloader::FinishCopies() {
  if (!access_.finish) return true;
  if (access_.finish().ok()) return true;
  ++stats_.copy_failures;
  return false;
}

void KvOffloader::WritePendingToDisk() {
  if (pending_disk_.empty()) return;
  const bool ok = FinishCopies();
  for (const BlockKey& key : pending_disk_) {
    // Gone when a later Put of the same Offload took its slot.
    const uint8_t* bytes = host_->Peek(key);
    if (ok && bytes != nullptr && !disk_->Contains(key)) disk_->Write(key, bytes);
  }
  pending_disk_.clear();
  pending_set_.clear();
}

bool KvOffloader::Restore(const BlockKey& key, BlockId dst) {
  const uint8_t* bytes = host_ != nullptr ? host_->Get(key) : nullptr;
  bool from_disk = false;
  if (bytes == nullptr) {
    if (disk_ == nullptr) return false;
    // Host-side writes below: every queued copy from scratch_ or a host slot must have run.
    WritePendingToDisk();
    if (!FinishCopies() || !disk_->Read(key, scratch_.data())) return false;
    bytes = scratch_.data();
    from_disk = true;
    // The block is in use again: keep it in the host tier too (and copy from there, so the
    // next disk read may reuse scratch_ at once).
    if (host_ != nullptr) {
      uint8_t* slot = host_->Put(key);
      std::memcpy(slot, bytes, scratch_.size());
      bytes = slot;
    }
  }
  if (!access_.write(dst, bytes).ok()) {
    ++stats_.copy_failures;
    return false;
  }
  // Without a host tier the next disk read reuses scratch_: the copy from it must be done.
  if (from_disk && host_ == nullptr && !FinishCopies()) return false;
  ++(from_disk ? stats_.restored_from_disk : stats_.restored_from_host);
  return true;
}

bool KvOffloader::ReadCached(const BlockKey& key, uint8_t* dst) {
  if (host_ != nullptr) {
    if (const uint8_t* bytes = host_->Peek(key)) {
      // The copy into the slot may still be queued.
      if (!FinishCopies()) return false;
      std::memcpy(dst, bytes, static_cast<size_t>(access_.block_bytes));
      return true;
    }
  }
  return disk_ != nullptr && disk_->Read(key, dst);
}

void KvOffloader::Offload(std::span<const StoredBlock> blocks) {
  // The previous step's copies are long done on the device by now; this also keeps a slot
  // from being reused below while a copy into it could still be queued for the disk tier.
  WritePendingToDisk();
  for (const StoredBlock& b : blocks) {
    if (host_ != nullptr) {
      if (host_->Get(b.key) == nullptr) {
        // A block still due on disk must get there before its slot is reused.
        const BlockKey* victim = host_->NextEvicted();
        if (victim != nullptr && pending_set_.contains(*victim)) WritePendingToDisk();
        uint8_t* slot = host_->Put(b.key);
        if (!access_.read(b.block, slot).ok()) {
          host_->Erase(b.key);
          ++stats_.copy_failures;
          continue;
        }
        ++stats_.offloaded_blocks;
      }
      if (disk_ != nullptr && !disk_->Contains(b.key) && pending_set_.insert(b.key).second) {
        pending_disk_.push_back(b.key);
      }
      continue;
    }
    // Disk tier alone: through scratch_, one block at a time.
    if (disk_->Contains(b.key)) continue;
    if (!access_.read(b.block, scratch_.data()).ok() || !FinishCopies()) {
      ++stats_.copy_failures;
      continue;
    }
    ++stats_.offloaded_blocks;
    disk_->Write(b.key, scratch_.data());
  }
}

void KvOffloader::Flush() {
  WritePendingToDisk();
  if (disk_ != nullptr) disk_->Flush();
}

std::vector<KvEvent> KvOffloader::TakeEvents() {
  std::vector<KvEvent> events;
  if (host_ != nullptr) events = host_->TakeEvents();
  if (disk_ != nullptr) {
    std::vector<KvEvent> disk = disk_->TakeEvents();
    events.insert(events.end(), disk.begin(), disk.end());
  }
  return events;
}

void KvOffloader::AppendSnapshot(std::vector<KvEvent>* events) const {
  if (host_ != nullptr) {
    for (const BlockKey& key : host_->Keys()) {
      events->push_back(KvEvent{KvEvent::Type::kStored, key, KvTier::kHost});
    }
  }
  if (disk_ != nullptr) {
    for (const BlockKey& key : disk_->Keys()) {
      events->push_back(KvEvent{KvEvent::Type::kStored, key, KvTier::kDisk});
    }
  }
}

KvOffloader::Stats KvOffloader::stats() const {
  Stats s = stats_;
  s.block_bytes = access_.block_bytes;
  if (host_ != nullptr) {
    s.host_blocks = host_->size();
    s.host_evictions = host_->evictions();
  }
  if (disk_ != nullptr) s.disk = disk_->stats();
  return s;
}

}  // namespace kvserve
