#include "router/http/admission_queue.h"

#include <algorithm>
#include <utility>

namespace kvserve::http {
namespace {

thread_local bool tls_shedding = false;

}  // namespace

AdmissionQueue::AdmissionQueue(const AdmissionOptions& options, AdmissionCounters* counters)
    : options_(options), counters_(counters) {
  // Every thread counts as idle from the start, so that a connection accepted before the
  // threads first wait is not refused.
  serve_.idle = std::max(options_.threads, 1);
  shed_.idle = std::max(options_.shed_threads, 1);
  for (int i = 0; i < std::max(options_.threads, 1); ++i) {
    serve_.threads.emplace_back([this] { Run(&serve_, /*shedding=*/false); });
  }
  for (int i = 0; i < std::max(options_.shed_threads, 1); ++i) {
    shed_.threads.emplace_back([this] { Run(&shed_, /*shedding=*/true); });
  }
}

AdmissionQueue::~AdmissionQueue() { shutdown(); }

bool AdmissionQueue::Shedding() { return tls_shedding; }

void AdmissionQueue::enqueue(std::function<void()> fn) {
  Lane* lane = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Waiting tasks beyond the idle threads are the ones that really wait.
    const size_t room = static_cast<size_t>(serve_.idle) + static_cast<size_t>(options_.max_queued);
    if (serve_.tasks.size() < room) {
      lane = &serve_;
      counters_->queued.fetch_add(1, std::memory_order_relaxed);
    } else {
      lane = &shed_;
      counters_->shed.fetch_add(1, std::memory_order_relaxed);
    }
    lane->tasks.push_back(std::move(fn));
  }
  lane->ready.notify_one();
}

void AdmissionQueue::Run(Lane* lane, bool shedding) {
  tls_shedding = shedding;
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      lane->ready.wait(lock, [&] { return !lane->tasks.empty() || shutting_down_; });
      if (lane->tasks.empty()) return;  // shutting down, nothing left
      task = std::move(lane->tasks.front());
      lane->tasks.pop_front();
      --lane->idle;
      if (!shedding) {
        counters_->queued.fetch_sub(1, std::memory_order_relaxed);
        counters_->admitted.fetch_add(1, std::memory_order_relaxed);
      }
    }
    task();
    std::lock_guard<std::mutex> lock(mu_);
    ++lane->idle;
  }
}

void AdmissionQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  for (Lane* lane : {&serve_, &shed_}) {
    lane->ready.notify_all();
    for (std::thread& thread : lane->threads) thread.join();
  }
}

}  // namespace kvserve::http
