#include "worker/tp/cpu_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvserve {

/// One rank's view of a CpuCommGroup. Calls are made by that rank's thread only.
class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(CpuCommGroup* group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }
  void Abort() override { group_->Abort(); }

  absl::Status AllReduceSum(float* data, int64_t n) override {
    const int size = group_->size_;
    if (n < 0) return absl::InvalidArgumentError("AllReduceSum: negative element count");
    if (size == 1) return absl::OkStatus();
    const int parity = static_cast<int>(calls_++ & 1);
    CpuCommGroup::Slot& mine = group_->slots_[rank_];
    const int64_t begin = ChunkBegin(n, rank_);
    const int64_t end = ChunkBegin(n, rank_ + 1);
    // Only this rank touches its own scratch size; nobody reads this parity's scratch now.
    std::vector<float>& scratch = mine.scratch[parity];
    if (static_cast<int64_t>(scratch.size()) < end - begin) scratch.resize(end - begin);
    mine.src = data;
    mine.n = n;
    if (absl::Status s = group_->Arrive(); !s.ok()) return s;

    absl::Status agreed = CheckSizes(n, "AllReduceSum");
    if (agreed.ok()) {
      for (int64_t i = begin; i < end; ++i) {
        float sum = group_->slots_[0].src[i];
        for (int r = 1; r < size; ++r) sum += group_->slots_[r].src[i];
        scratch[i - begin] = sum;
      }
    }
    if (absl::Status s = group_->Arrive(); !s.ok()) return s;
    if (!agreed.ok()) return agreed;

    for (int r = 0; r < size; ++r) {
      const int64_t b = ChunkBegin(n, r);
      const int64_t e = ChunkBegin(n, r + 1);
      if (e > b) std::memcpy(data + b, group_->slots_[r].scratch[parity].data(), (e - b) * 4);
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* send, int64_t n, float* recv) override {
    const int size = group_->size_;
    if (n < 0) return absl::InvalidArgumentError("AllGather: negative element count");
    CpuCommGroup::Slot& mine = group_->slots_[rank_];
    mine.src = send;
    mine.n = n;
    if (absl::Status s = group_->Arrive(); !s.ok()) return s;
    absl::Status agreed = CheckSizes(n, "AllGather");
    if (agreed.ok()) {
      for (int r = 0; r < size; ++r) {
        if (n > 0) std::memcpy(recv + r * n, group_->slots_[r].src, n * 4);
      }
    }
    // Nobody may reuse its send buffer (or its slot) until every rank has copied from it.
    if (absl::Status s = group_->Arrive(); !s.ok()) return s;
    return agreed;
  }

  absl::Status Barrier() override { return group_->Arrive(); }

  void ResetCalls() { calls_ = 0; }

 private:
  int64_t ChunkBegin(int64_t n, int chunk) const { return n * chunk / group_->size_; }

  // Every rank reads every slot, so all reach the same verdict.
  absl::Status CheckSizes(int64_t n, const char* op) const {
    for (int r = 0; r < group_->size_; ++r) {
      if (group_->slots_[r].n != n) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": rank ", r, " passed ",
                                                       group_->slots_[r].n, " elements, rank ",
                                                       rank_, " passed ", n));
      }
    }
    return absl::OkStatus();
  }

  CpuCommGroup* group_;
  const int rank_;
  uint64_t calls_ = 0;  // AllReduceSum calls so far; its parity picks the scratch set
};

CpuCommGroup::CpuCommGroup(int size) : size_(size), slots_(new Slot[size]) {
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<CpuCommunicator>(this, r));
}

CpuCommGroup::~CpuCommGroup() = default;

absl::StatusOr<std::unique_ptr<CpuCommGroup>> CpuCommGroup::Create(int size) {
  if (size < 1 || size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuCommGroup: size must be in [1, 4096], got ", size));
  }
  return std::unique_ptr<CpuCommGroup>(new CpuCommGroup(size));
}

Communicator* CpuCommGroup::communicator(int rank) {
  return rank >= 0 && rank < size_ ? comms_[rank].get() : nullptr;
}

absl::Status CpuCommGroup::Arrive() {
  // Read the generation before arriving: it cannot move until this rank has arrived (except by
  // Abort, which the check after the wait catches).
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  if (aborted_.load(std::memory_order_acquire)) {
    return absl::AbortedError("tensor-parallel group aborted by another rank");
  }
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size_) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
  } else {
    while (generation_.load(std::memory_order_acquire) == generation) {
      generation_.wait(generation, std::memory_order_acquire);
    }
  }
  if (aborted_.load(std::memory_order_acquire)) {
    return absl::AbortedError("tensor-parallel group aborted by another rank");
  }
  return absl::OkStatus();
}

void CpuCommGroup::Abort() {
  aborted_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
}

void CpuCommGroup::Reset() {
  arrived_.store(0, std::memory_order_relaxed);
  for (auto& comm : comms_) comm->ResetCalls();
  aborted_.store(false, std::memory_order_release);
}

}  // namespace kvserve
