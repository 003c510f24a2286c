// The replay of a Program on GPUs (exec/cuda/replay_cuda.hpp): buffers,
// streams, communicators, then steps of event-bracketed launches.
#include "exec/cuda/replay_cuda.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "core/trace.hpp"
#include "exec/comm.hpp"
#include "exec/cuda/device.hpp"
#include "exec/cuda/device_kernels.hpp"
#include "exec/cuda/gemm.hpp"
#include "exec/cuda/launch.hpp"
#include "exec/cuda/nccl_comm.hpp"
#include "exec/cuda/timer.hpp"
#include "exec/mpi_env.hpp"
#include "exec/replay.hpp"

namespace megascope::exec::cuda {

namespace {

// Buffers shared by every kernel of the replay: the j-th buffer a case asks
// for is slot j, as large as the largest j-th buffer of any case, filled
// once with bf16 values uniform in [0, 1) (read as fp32 they stay in that
// range, so variances and scales stay non-negative; fp8 reads them as other
// codes: the timing does not depend on them). Token ids have slots of their own, and so
// does what a case asks for with own() (attention backward's inputs, whose values decide
// how much work the kernel skips). Kernels of one stream run one
// after another, so sharing is safe. A slot that grows after a case took
// its pointer makes grew() true: the caller builds the calls again.
class Arena final : public Buffers {
 public:
  explicit Arena(cudaStream_t s) : stream_(s) {}
  [[nodiscard]] cudaStream_t stream() const override { return stream_; }
  void begin_case() { next_ = next_id_ = 0; }
  void begin_build() { next_owned_ = 0; }   // before the calls are (re)built
  [[nodiscard]] bool grew() const { return grew_; }
  void clear_grew() { grew_ = false; }
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (const Slot& s : slots_) n += s.mem.bytes();
    for (const Slot& s : ids_) n += s.mem.bytes();
    for (const DeviceMemory& m : owned_) n += m.bytes();
    return n;
  }
  std::int32_t* ids(std::int64_t n, std::int64_t modulo) override {
    const auto count = static_cast<std::size_t>(std::max<std::int64_t>(n, 1));
    if (next_id_ == ids_.size()) ids_.emplace_back();
    Slot& s = ids_[next_id_++];
    if (s.mem.bytes() < count * sizeof(std::int32_t)) {
      if (s.used) grew_ = true;
      std::vector<std::int32_t> host(count);
      for (std::size_t i = 0; i < count; ++i)
        host[i] = static_cast<std::int32_t>((static_cast<std::int64_t>(i) * 7919) % std::max<std::int64_t>(modulo, 1));
      s.mem = DeviceMemory(count * sizeof(std::int32_t));
      MEGASCOPE_CUDA_CHECK(cudaMemcpy(s.mem.get(), host.data(), count * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    }
    s.used = true;
    return static_cast<std::int32_t*>(s.mem.get());
  }

 protected:
  void* block(std::size_t bytes, bool& fresh) override {
    fresh = false;
    if (next_ == slots_.size()) slots_.emplace_back();
    Slot& s = slots_[next_++];
    if (s.mem.bytes() < bytes) {
      if (s.used) grew_ = true;
      const std::size_t size = (bytes + 255) / 256 * 256;
      s.mem = DeviceMemory(size);
      fill_uniform(static_cast<bf16*>(s.mem.get()), static_cast<std::int64_t>(size / sizeof(bf16)), ++seed_, 0.0f,
                   1.0f, stream_);
    }
    s.used = true;
    return s.mem.get();
  }
  // Owned buffers in the order the cases ask for them: a rebuild of the
  // calls (begin_build) asks again in the same order and gets the same ones.
  void* own_block(std::size_t bytes) override {
    const std::size_t size = (bytes + 255) / 256 * 256;
    if (next_owned_ == owned_.size()) owned_.emplace_back(size);
    DeviceMemory& m = owned_[next_owned_++];
    if (m.bytes() < size) m = DeviceMemory(size);
    return m.get();
  }

 private:
  struct Slot {
    DeviceMemory mem;
    bool used = false;
  };
  cudaStream_t stream_;
  std::vector<Slot> slots_, ids_;
  std::vector<DeviceMemory> owned_;   // buffers of one case alone (Buffers::own)
  std::size_t next_owned_ = 0;
  std::size_t next_ = 0, next_id_ = 0;
  bool grew_ = false;
};

// The GPU call of one replay kernel (none: no kernel of the runtime does it).
std::optional<Call> make_call(const ReplayKernel& k, Gemm& gemm, Arena& a) {
  switch (k.type) {
    case ReplayKernel::Type::gemm: {
      const GemmShape& g = k.gemm.shape;
      const bool fp8 = k.precision == Precision::fp8 && k.gemm.pass == GemmPass::forward && gemm.fp8_supported() &&
                       g.k % 16 == 0 && g.n % 16 == 0;
      return gemm_call(k.gemm, fp8 ? GemmDtype::fp8_e4m3 : GemmDtype::bfloat16, gemm, a);
    }
    case ReplayKernel::Type::memory: return memory_call(k.memory, a);
    case ReplayKernel::Type::attention: return attention_call(k.attention, a);
    case ReplayKernel::Type::copy: {
      const auto n = static_cast<std::int64_t>(std::max(1.0, k.bytes / 4));   // bf16 elements: bytes/2 read, bytes/2 written
      bf16* src = a.alloc<bf16>(n);
      bf16* dst = a.alloc<bf16>(n);
      const cudaStream_t st = a.stream();
      const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(bf16);
      return [=] { MEGASCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st)); };
    }
  }
  return std::nullopt;
}

// A stream per lane: the Program's five from a StreamSet, the channels' own.
class Lanes {
 public:
  Lanes(const StreamSet& set, int lanes) {
    int least = 0, greatest = 0;
    MEGASCOPE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int l = 0; l < lanes; ++l) {
      if (l < kReplayProgramLanes) {
        streams_.push_back(set.get(static_cast<Stream>(l)));
        continue;
      }
      cudaStream_t s = nullptr;
      MEGASCOPE_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
      owned_.push_back(s);
      streams_.push_back(s);
    }
  }
  ~Lanes() {
    for (cudaStream_t s : owned_) (void)cudaStreamDestroy(s);
  }
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;
  [[nodiscard]] cudaStream_t operator[](int lane) const { return streams_.at(static_cast<std::size_t>(lane)); }
  [[nodiscard]] int size() const { return static_cast<int>(streams_.size()); }
  // Under the NCCL watchdog: a lane may wait on a peer's collective.
  void synchronize(const std::string& what) const {
    for (cudaStream_t s : streams_) wait_stream(s, what);
  }

 private:
  std::vector<cudaStream_t> streams_, owned_;
};

// One NCCL communicator per route (sender index 0, receiver 1), made by
// every rank for every route in the same order, over its pipeline group.
class Route {
 public:
  Route() = default;
  Route(Route&& o) noexcept : mpi_(o.mpi_), nccl_(std::move(o.nccl_)) { o.mpi_ = MPI_COMM_NULL; }
  Route& operator=(Route&&) = delete;
  Route(const Route&) = delete;
  Route& operator=(const Route&) = delete;
  ~Route() {
    nccl_.reset();
    if (mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  }
  // Collective over `pp` (every member calls it for every route, in one order).
  void split(MPI_Comm pp, bool member, bool sender) {
    MPI_Comm_split(pp, member ? 0 : MPI_UNDEFINED, sender ? 0 : 1, &mpi_);
  }
  [[nodiscard]] bool member() const { return mpi_ != MPI_COMM_NULL; }
  // Creates the communicator and connects it: NCCL connects a pair on its
  // first transfer, blocking the host until the peer's first call on the same
  // communicator, so a first transfer reached in opposite orders by two
  // stages (DualPipe's) would wait forever; here both are at the same point.
  NcclCommunicator* connect(cudaStream_t stream) {
    nccl_ = NcclCommunicator::over_mpi(mpi_, stream, false, "pp route");
    DeviceBuffer<float> one(1);
    if (nccl_->rank() == 0) nccl_->send(one.get(), 1, ncclFloat32, 1);
    else nccl_->recv(one.get(), 1, ncclFloat32, 0);
    nccl_->synchronize();
    return nccl_.get();
  }

 private:
  MPI_Comm mpi_ = MPI_COMM_NULL;
  std::unique_ptr<NcclCommunicator> nccl_;
};

// Every rank's verdict; on failure, world rank 0 returns the first failing rank's message.
Result<void> agree(Result<void> mine) {
  int ok = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) return {};
  MpiEnv& env = MpiEnv::get();
  const std::vector<std::string> texts = env.gather(mine ? std::string() : mine.error().str(), 0);
  if (!mine) return mine;
  for (std::size_t r = 0; r < texts.size(); ++r)
    if (!texts[r].empty()) return fail("--plan", fmt::format("rank {} refused the replay: {}", r, texts[r]));
  return fail("--plan", "another rank refused the replay");
}

// Bytes of the communication buffers an op needs, in and out (bf16 elements).
struct LaneNeed {
  std::int64_t in = 0, out = 0;
};
LaneNeed need_of(const Op& op, std::int64_t elements, int group_size) {
  const std::int64_t part = std::max<std::int64_t>(1, elements / std::max(1, group_size)), all = part * group_size;
  switch (op.kind) {
    case OpKind::all_reduce: return {elements, 0};
    case OpKind::reduce_scatter: return {all, part};
    case OpKind::all_gather: return {part, all};
    case OpKind::all_to_all: return {all, all};
    case OpKind::send: return {elements, 0};
    case OpKind::recv: return {0, elements};
    case OpKind::compute: break;
  }
  return {};
}

Result<ReplayReport> replay_on_device(const Program& p, const ReplayOptions& o, int rank,
                                      const ReplayPlan& plan_);

}  // namespace

Result<ReplayReport> run_replay(const Setup& s, const Program& p, const ReplayOptions& o) {
  MpiEnv& env = MpiEnv::get();
  const int world = env.size(), me = env.rank();
  const bool shard = o.shard.has_value();
  if (shard && world != 1)
    return fail("--shard", fmt::format("shard mode measures one rank on one GPU, but the MPI job has {} processes; run "
                                       "it without mpirun",
                                       world));
  if (shard && (*o.shard < 0 || *o.shard >= p.grid.world()))
    return fail("--shard", fmt::format("rank {} is not a rank of the plan (0-{})", *o.shard, p.grid.world() - 1));
  if (!shard && world != p.grid.world())
    return fail("--plan", fmt::format("the plan runs on {} ranks (tp {} x cp {} x dp {} x pp {}) but the MPI job has {}; "
                                      "launch with mpirun -np {}, or measure one rank on one GPU with --shard RANK",
                                      p.grid.world(), p.grid.tp, p.grid.cp, p.grid.dp, p.grid.pp, world,
                                      p.grid.world()));
  if (o.steps < 1 || o.warmup < 0) return fail("--steps", "at least one measured step and no negative warm-up");
  const int rank = shard ? *o.shard : me;
  const int stage = p.grid.coord(rank).pp;
  auto plan = plan_replay(s, p, stage, shard);
  if (auto ok = agree(plan ? Result<void>{} : Result<void>{tl::unexpected(plan.error())}); !ok)
    return tl::unexpected(ok.error());
  try {
    return replay_on_device(p, o, rank, *plan);
  } catch (const std::exception& e) {
    if (world == 1) throw;
    // Other ranks may be waiting in a collective for this one: stop the job, naming it.
    // (The unwinding that got here freed no device memory and aborted the
    // NCCL communicators, so that no hung receive could block it.)
    std::fprintf(stderr, "megascope run: rank %d: error: --backend cuda: %s; aborting the job\n", me, e.what());
    env.abort(1);
  }
}

namespace {

Result<ReplayReport> replay_on_device(const Program& p, const ReplayOptions& o, int rank,
                                      const ReplayPlan& plan_) {
  MpiEnv& env = MpiEnv::get();
  const int world = env.size(), me = env.rank();
  const bool shard = o.shard.has_value();
  const int stage = plan_.stage;
  const ReplayPlan* plan = &plan_;
  const StageProgram& sp = p.stages[static_cast<std::size_t>(stage)];

  require_device();
  select_device(mpi_local_rank());
  set_watchdog_timeout(o.timeout_s);
  const DeviceInfo info = device_info();
  StreamSet streams;
  Lanes lanes(streams, plan->lanes);

  // Communicators: the groups', and one per route.
  std::unique_ptr<MpiGroups> mpi_groups;
  std::unique_ptr<NcclGroups> nccl;
  std::vector<Route> routes;
  std::vector<NcclCommunicator*> channel_comm(plan->channels.size(), nullptr);
  if (!shard) {
    mpi_groups = std::make_unique<MpiGroups>(p.grid);
    nccl = std::make_unique<NcclGroups>(p.grid, *mpi_groups, streams);
    auto* pp = dynamic_cast<MpiCommunicator*>(mpi_groups->get(CommGroup::pp));
    // Connect every group's communicator now, kind by kind in one order on
    // every rank (NCCL may connect lazily, blocking the host on a first call).
    for (int g = 0; g < kCommGroupCount; ++g)
      if (NcclCommunicator* c = nccl->get(static_cast<CommGroup>(g))) c->barrier();
    for (const ReplayRoute& r : replay_channels(p)) {
      const bool sender = stage == r.from, receiver = stage == r.to;
      Route route;
      if (pp) route.split(pp->handle(), sender || receiver, sender);
      if (route.member()) {
        std::size_t c = 0;
        while (c < plan->channels.size() &&
               !(plan->channels[c].send == sender && plan->channels[c].peer_stage == (sender ? r.to : r.from) &&
                 plan->channels[c].label == r.label))
          ++c;
        if (c == plan->channels.size()) throw std::logic_error("replay: a route with no channel on its stage");
        channel_comm[c] = route.connect(lanes[plan->channels[c].lane]);
      }
      routes.push_back(std::move(route));
    }
    // Every collective's group exists on this rank and enqueues on the op's lane.
    Result<void> ok;
    for (std::size_t i = 0; i < sp.ops.size() && ok; ++i) {
      const Op& op = sp.ops[i];
      const ReplayOp& ro = plan->ops[i];
      if (op.kind == OpKind::compute || op.kind == OpKind::send || op.kind == OpKind::recv) continue;
      NcclCommunicator* c = nccl->get(op.group);
      if (!c)
        ok = fail("--plan", fmt::format("rank {} op {}: a {} collective on a rank outside any {} group", rank, i,
                                        to_string(op.group), to_string(op.group)));
      else if (c->stream() != lanes[ro.lane])
        ok = fail("--plan", fmt::format("rank {} op {}: the Program puts a {} collective on the {} stream; the runtime "
                                        "runs that group on the {} stream",
                                        rank, i, to_string(op.group), to_string(op.stream),
                                        to_string(stream_of(op.group))));
    }
    if (auto agreed = agree(ok); !agreed) return tl::unexpected(agreed.error());
  }
  for (std::size_t i = 0; i < sp.ops.size(); ++i)
    if (sp.ops[i].kind == OpKind::compute && !plan->ops[i].kernels.empty() && plan->ops[i].lane != 0)
      throw std::logic_error(fmt::format("replay: rank {} op {} launches kernels off the compute stream", rank, i));

  // The kernels' calls on shared buffers (built twice if a buffer grew).
  Gemm gemm;
  Arena arena(lanes[0]);
  std::vector<std::optional<Call>> calls;
  for (int attempt = 0; attempt < 2; ++attempt) {
    arena.clear_grew();
    arena.begin_build();
    calls.clear();
    for (const ReplayKernel& k : plan->kernels) {
      arena.begin_case();
      calls.push_back(make_call(k, gemm, arena));
    }
    if (!arena.grew()) break;
  }
  // Communication buffers, per lane: the largest input and output of its ops.
  std::vector<LaneNeed> need(static_cast<std::size_t>(plan->lanes));
  for (std::size_t i = 0; i < sp.ops.size(); ++i) {
    const Op& op = sp.ops[i];
    const ReplayOp& ro = plan->ops[i];
    if (!ro.run || op.kind == OpKind::compute) continue;
    const bool p2p = op.kind == OpKind::send || op.kind == OpKind::recv;
    const LaneNeed n = need_of(op, ro.elements, p2p ? 1 : nccl->get(op.group)->size());
    LaneNeed& l = need[static_cast<std::size_t>(ro.lane)];
    l.in = std::max(l.in, n.in);
    l.out = std::max(l.out, n.out);
  }
  std::vector<DeviceBuffer<bf16>> lane_in, lane_out;
  for (const LaneNeed& n : need) {
    lane_in.emplace_back(static_cast<std::size_t>(std::max<std::int64_t>(1, n.in)));
    lane_out.emplace_back(static_cast<std::size_t>(std::max<std::int64_t>(1, n.out)));
    MEGASCOPE_CUDA_CHECK(cudaMemset(lane_in.back().get(), 0, lane_in.back().bytes()));
  }
  MEGASCOPE_CUDA_CHECK(cudaDeviceSynchronize());

  ReplayReport report;
  report.device = fmt::format("{} (cc {}.{}, {} SMs)", info.name, info.cc_major, info.cc_minor, info.sms);
  report.ops = sp.ops.size();
  report.distinct_kernels = plan->kernels.size();
  for (std::size_t k = 0; k < plan->kernels.size(); ++k)
    if (!calls[k]) report.skipped.push_back(plan->kernels[k].name());
  for (std::size_t i = 0; i < sp.ops.size(); ++i) {
    const ReplayOp& ro = plan->ops[i];
    if (!ro.run) continue;
    ++report.ops_run;
    report.kernels += ro.kernels.size();
    for (std::uint32_t k : ro.kernels) {
      report.skipped_kernels += calls[k] ? 0 : 1;
      const ReplayKernel& rk = plan->kernels[k];
      if (calls[k] && rk.type == ReplayKernel::Type::gemm)
        report.gemm_flops += 2.0 * static_cast<double>(rk.gemm.shape.m) * static_cast<double>(rk.gemm.shape.n) *
                             static_cast<double>(rk.gemm.shape.k);
    }
  }

  // Timing events per op (exec/cuda/timer.hpp); a completion event for each op another lane waits for.
  OpTimer timer(rank);
  std::vector<int> done_index(sp.ops.size(), -1);
  int waited = 0;
  for (const ReplayOp& ro : plan->ops)
    for (std::uint32_t w : ro.waits)
      if (done_index[w] < 0) done_index[w] = waited++;
  std::vector<Event> done(static_cast<std::size_t>(waited));
  Event begin;
  std::vector<Span> spans;
  auto one_step = [&]() -> double {
    int here = 1, all = 0;   // a barrier that gives up after the timeout, naming itself
    world_allreduce(&here, &all, 1, MPI_INT, MPI_MIN, o.timeout_s, "the step's start");
    timer.start_step(lanes[0]);
    begin.record(lanes[0]);
    for (int l = 1; l < lanes.size(); ++l) begin.wait(lanes[l]);
    for (std::size_t i = 0; i < sp.ops.size(); ++i) {
      const Op& op = sp.ops[i];
      const ReplayOp& ro = plan->ops[i];
      if (!ro.run) continue;
      const cudaStream_t st = lanes[ro.lane];
      for (std::uint32_t w : ro.waits) done[static_cast<std::size_t>(done_index[w])].wait(st);
      timer.begin(static_cast<std::uint32_t>(i), st);
      const auto l = static_cast<std::size_t>(ro.lane);
      void* in = lane_in[l].get();
      void* out = lane_out[l].get();
      switch (op.kind) {
        case OpKind::compute:
          for (std::uint32_t k : ro.kernels)
            if (calls[k]) (*calls[k])();
          break;
        case OpKind::send:
          channel_comm[static_cast<std::size_t>(ro.channel)]->send(in, ro.elements, ncclBfloat16, 1, st);
          break;
        case OpKind::recv:
          channel_comm[static_cast<std::size_t>(ro.channel)]->recv(out, ro.elements, ncclBfloat16, 0, st);
          break;
        default: {
          NcclCommunicator* c = nccl->get(op.group);
          const std::int64_t part = std::max<std::int64_t>(1, ro.elements / c->size());
          if (op.kind == OpKind::all_reduce) c->all_reduce(in, ro.elements, ncclBfloat16, ReduceOp::sum);
          else if (op.kind == OpKind::reduce_scatter) c->reduce_scatter(out, in, part, ncclBfloat16);
          else if (op.kind == OpKind::all_gather) c->all_gather(out, in, part, ncclBfloat16);
          else c->all_to_all(out, in, part, ncclBfloat16);
        }
      }
      timer.end(static_cast<std::uint32_t>(i), st);
      if (done_index[i] >= 0) done[static_cast<std::size_t>(done_index[i])].record(st);
    }
    lanes.synchronize(fmt::format("rank {}: the step's ops on stage {}", me, stage));
    spans = timer.collect();
    double mine = 0;
    for (const Span& x : spans) mine = std::max(mine, x.end);
    double slowest = 0;
    world_allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, o.timeout_s, "the step's time");
    return slowest;
  };
  for (int w = 0; w < o.warmup; ++w) (void)one_step();
  for (int k = 0; k < o.steps; ++k) report.step_times_s.push_back(one_step());

  if (o.trace) {   // the last step's spans of every rank, written by world rank 0
    std::string bytes(reinterpret_cast<const char*>(spans.data()), spans.size() * sizeof(Span));
    const std::vector<std::string> all = env.gather(bytes, 0);
    Result<void> ok;
    if (me == 0) {
      std::vector<Span> every;
      std::vector<int> ranks;
      for (const std::string& b : all) {
        const std::size_t n = b.size() / sizeof(Span), at = every.size();
        every.resize(at + n);
        std::memcpy(static_cast<void*>(every.data() + at), b.data(), n * sizeof(Span));
      }
      if (shard) ranks = {rank};
      else
        for (int r = 0; r < world; ++r) ranks.push_back(r);
      TraceInfo ti{TraceSource::measured, report.step_times_s.back(), o.plan_text, o.model_name, p.grid.world()};
      ok = write_trace(*o.trace, p, ti, ranks, every);
    }
    if (auto agreed = agree(ok); !agreed) return tl::unexpected(agreed.error());
  }
  return report;
}

}  // namespace

}  // namespace megascope::exec::cuda
