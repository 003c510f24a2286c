// The GPU runtime's watchdog: a host wait on GPU work (a stream, an event)
// that gives up after a time limit instead of waiting forever. A rank whose
// NCCL peer stopped (killed, frozen, deadlocked) would otherwise sit in
// cudaStreamSynchronize until the launcher's own timeout; with the watchdog
// it aborts its NCCL communicators (which ends their kernels) and throws an
// error naming what it waited for, its group and the time (run's
// --recv-timeout, as the CPU executor's collectives and receives have).
//
// wait_until() is the polling loop, free of CUDA so that it is tested on
// any machine; exec/cuda/nccl_comm.cpp applies it to streams.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace megascope::exec::cuda {

struct WatchdogTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Polls `done` until it returns true. `failed` is asked each round for an
// asynchronous error (an NCCL communicator's); one ends the wait with that
// message. Past `timeout_s` `on_timeout` runs (abort the communicators) and
// a WatchdogTimeout names `what`. Sleeps grow from 0 to 1 ms between polls,
// so a short wait costs no more than cudaStreamSynchronize's spin.
inline void wait_until(const std::function<bool()>& done, const std::function<std::optional<std::string>()>& failed,
                       double timeout_s, const std::string& what, const std::function<void()>& on_timeout) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto pause = std::chrono::microseconds(0);
  for (std::size_t round = 0;; ++round) {
    if (done()) return;
    if (auto error = failed()) throw std::runtime_error(what + ": " + *error);
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > timeout_s) {
      if (on_timeout) on_timeout();
      throw WatchdogTimeout(what + " still waiting after " + std::to_string(static_cast<long long>(waited)) +
                            " s: a member of its group stopped or hangs (--recv-timeout); its NCCL communicators "
                            "were aborted");
    }
    if (round > 64) pause = std::min(std::chrono::microseconds(1000), pause + std::chrono::microseconds(10));
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
}

}  // namespace megascope::exec::cuda
