#include "common/rpc/live_calls.h"

#include <utility>

namespace kvserve {

struct LiveCalls::Token::State {
  mutable absl::Mutex mu;
  int64_t live ABSL_GUARDED_BY(mu) = 0;
};

LiveCalls::Token& LiveCalls::Token::operator=(Token&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
  }
  return *this;
}

LiveCalls::Token::~Token() { Release(); }

void LiveCalls::Token::Release() {
  if (state_ == nullptr) return;
  {
    absl::MutexLock lock(&state_->mu);
    --state_->live;
  }
  state_.reset();
}

LiveCalls::LiveCalls() : state_(std::make_shared<Token::State>()) {}

LiveCalls::~LiveCalls() { WaitForNone(); }

LiveCalls::Token LiveCalls::Track() {
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->live;
  }
  return Token(state_);
}

void LiveCalls::WaitForNone() {
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(
      +[](Token::State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->live == 0; }, state_.get()));
}

int64_t LiveCalls::live() const {
  absl::MutexLock lock(&state_->mu);
  return state_->live;
}

}  // namespace kvserve
