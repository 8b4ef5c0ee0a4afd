#include "worker/engine/request.h"

#include <utility>

namespace kvserve {

bool RequestStream::Next(RequestOutput* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !queue_.empty() || samples_left_ == 0; });
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool RequestStream::TryNext(RequestOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void RequestStream::SetListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(listener);
}

void RequestStream::Push(RequestOutput output) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (output.finished && samples_left_ > 0) --samples_left_;
    queue_.push_back(std::move(output));
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (listener_) listener_();
}

bool KvEventStream::Next(KvEventBatch* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return !queue_.empty() || closed_; });
  if (queue_.empty() || closed_) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

bool KvEventStream::TryNext(KvEventBatch* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty() || closed_) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void KvEventStream::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  NotifyListener();
}

void KvEventStream::SetListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(listener);
}

void KvEventStream::NotifyListener() {
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (listener_) listener_();
}

bool KvEventStream::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

bool KvEventStream::Push(KvEventBatch batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    if (queue_.size() >= kMaxPending) {
      // The reader fell too far behind to catch up by deltas: make it resubscribe.
      closed_ = true;
      queue_.clear();
    } else {
      queue_.push_back(std::move(batch));
    }
  }
  cv_.notify_all();
  NotifyListener();
  return true;
}

}  // namespace kvserve
