#include "worker/engine/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvserve {

absl::Status SchedulerOptions::Validate() const {
  if (max_num_seqs <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_num_seqs must be positive, got ",
                                                   max_num_seqs));
  }
  if (max_num_batched_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_num_batched_tokens must be positive, got ", max_num_batched_tokens));
  }
  return absl::OkStatus();
}

Scheduler::Scheduler(const SchedulerOptions& options, KvManager* kv)
    : options_(options), kv_(kv) {}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->status = Sequence::Status::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  seq->status = Sequence::Status::kRunning;
  running_.push_back(seq);
}

void Scheduler::Remove(Sequence* seq) {
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
    kv_->Free(seq->id);
  } else if (auto w = std::find(waiting_.begin(), waiting_.end(), seq); w != waiting_.end()) {
    waiting_.erase(w);
  }
  seq->status = Sequence::Status::kFinished;
}

int32_t Scheduler::num_schedulable() const {
  return static_cast<int32_t>(
      std::count_if(running_.begin(), running_.end(), [](Sequence* s) { return !s->in_flight; }));
}

Sequence* Scheduler::PreemptNewest(size_t first) {
  auto it = std::find_if(running_.rbegin(), running_.rend() - static_cast<std::ptrdiff_t>(first),
                         [](Sequence* s) { return !s->in_flight; });
  if (it == running_.rend() - static_cast<std::ptrdiff_t>(first)) return nullptr;
  Sequence* victim = *it;
  running_.erase(std::next(it).base());
  kv_->Free(victim->id);
  victim->num_computed = 0;
  victim->status = Sequence::Status::kWaiting;
  waiting_.push_front(victim);
  ++num_preemptions_;
  return victim;
}

SchedulerOutput Scheduler::Schedule(int32_t max_seqs) {
  SchedulerOutput out;
  int32_t budget = options_.max_num_batched_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0 &&
                     static_cast<int32_t>(out.scheduled.size()) < max_seqs;) {
    Sequence* seq = running_[i];
    const int32_t n = std::min(seq->num_pending(), budget);
    if (n <= 0 || seq->in_flight) {
      ++i;
      continue;
    }
    bool stop = false;
    while (!kv_->Append(seq->id, n)) {
      Sequence* victim = PreemptNewest(i);
      // Nothing preemptible (the rest is in flight), or this sequence itself went.
      if (victim != nullptr) out.preempted.push_back(victim);
      if (victim == nullptr || victim == seq) {
        stop = true;
        break;
      }
    }
    if (stop) break;
    out.scheduled.push_back({seq, n, seq->num_computed + n == static_cast<int32_t>(seq->tokens.size())});
    budget -= n;
    ++i;
  }
  // Admitting new work while evicting running work would only thrash.
  if (out.preempted.empty()) AdmitWaiting(out, budget, max_seqs);
  out.num_batched_tokens = options_.max_num_batched_tokens - budget;
  return out;
}

void Scheduler::AdmitWaiting(SchedulerOutput& out, int32_t& budget, int32_t max_seqs) {
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < options_.max_num_seqs &&
         static_cast<int32_t>(out.scheduled.size()) < max_seqs) {
    Sequence* seq = waiting_.front();
    PrefixMatch match;
    if (options_.enable_prefix_caching) match = kv_->FindCachedPrefix(seq->tokens, seq->cache_salt);
    const int32_t remaining = static_cast<int32_t>(seq->tokens.size()) - match.num_tokens;
    const int32_t n = std::min(remaining, budget);
    if (n < remaining && !options_.enable_chunked_prefill) break;
    if (!kv_->AllocateNew(seq->id, match, n, seq->cache_salt)) break;
    waiting_.pop_front();
    seq->num_computed = match.num_tokens;
    if (!seq->admitted_before) {
      seq->num_cached_prompt_tokens = std::min(match.num_tokens, seq->num_prompt_tokens);
      seq->admitted_before = true;
    }
    seq->status = Sequence::Status::kRunning;
    running_.push_back(seq);
    out.scheduled.push_back({seq, n, n == remaining});
    budget -= n;
  }
}

void Scheduler::OnStepDone(const SchedulerOutput& output) {
  for (const ScheduledSequence& s : output.scheduled) {
    Sequence* seq = s.seq;
    if (seq->status != Sequence::Status::kRunning) continue;
    seq->num_computed += s.num_tokens;
    kv_->Commit(seq->id, seq->tokens, seq->num_computed);
    kv_->ReleaseOutOfWindow(seq->id, seq->num_computed);
    // Sliding-window holes (the null block) are not held.
    const std::span<const BlockId> table = kv_->BlockTable(seq->id);
    const auto held = static_cast<int32_t>(
        table.size() - std::count(table.begin(), table.end(), kNullBlock));
    seq->peak_kv_blocks = std::max(seq->peak_kv_blocks, held);
  }
}

}  // namespace kvserve
