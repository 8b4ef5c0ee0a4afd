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

void RequestStream::Push(RequestOutput output) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (output.finished && samples_left_ > 0) --samples_left_;
    queue_.push_back(std::move(output));
  }
  cv_.notify_all();
}

}  // namespace kvserve
