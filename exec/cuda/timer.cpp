// CUDA-event op timing (exec/cuda/timer.hpp).
#include "exec/cuda/timer.hpp"

#include <stdexcept>
#include <string>

namespace megascope::exec::cuda {

Event& OpTimer::next_event() {
  if (used_ == pool_.size()) pool_.emplace_back();
  return pool_[used_++];
}

void OpTimer::start_step(cudaStream_t stream) {
  used_ = 0;
  records_.clear();
  open_.clear();
  next_event().record(stream);   // pool_[0]: time 0 of the step
  started_ = true;
}

void OpTimer::begin(std::uint32_t op, cudaStream_t stream) {
  if (!started_) throw std::logic_error("OpTimer::begin before start_step");
  const std::size_t i = used_;
  next_event().record(stream);
  open_[op] = records_.size();
  records_.push_back({op, i, i});
}

void OpTimer::end(std::uint32_t op, cudaStream_t stream) {
  const auto it = open_.find(op);
  if (it == open_.end()) throw std::logic_error("OpTimer::end: op " + std::to_string(op) + " was not begun");
  const std::size_t i = used_;
  next_event().record(stream);
  records_[it->second].end = i;
  open_.erase(it);
}

std::vector<Span> OpTimer::collect() {
  if (!open_.empty())
    throw std::logic_error("OpTimer::collect: op " + std::to_string(open_.begin()->first) + " was begun but not ended");
  std::vector<Span> spans;
  if (!started_) return spans;
  for (std::size_t i = 0; i < used_; ++i) pool_[i].synchronize();
  spans.reserve(records_.size());
  const Event& origin = pool_[0];
  for (const Record& r : records_)
    spans.push_back({rank_, r.op, pool_[r.start].seconds_since(origin), pool_[r.end].seconds_since(origin)});
  records_.clear();
  used_ = 0;
  started_ = false;
  return spans;
}

}  // namespace megascope::exec::cuda
