// run_cpu: the CPU executor's driver. Sets up the communicators, the data
// and one CpuRank (exec/cpu_rank.hpp) per process, runs the steps, gathers
// the loss, the gradient norm and the measured trace, and writes and reads
// the sharded checkpoints (one file per rank per step, written then renamed;
// a `latest` file names the last complete step).
#include "exec/runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory_resource>
#include <optional>
#include <ostream>
#include <set>
#include <thread>

#include "core/program/builder.hpp"
#include "core/trace.hpp"
#include "exec/comm.hpp"
#include "exec/cpu_rank.hpp"
#include "exec/data.hpp"
#include "exec/mpi_env.hpp"
#include "exec/params.hpp"

namespace megascope::exec {

namespace {

// ---- checkpoints: one file per rank per step, written then renamed ----

// A checkpoint's header: one "key value" line each, then "end". The keys up
// to `shards` decide whether it can resume this run (the same model, world,
// rank, GEMM precision, and the same sharding: the parallel sizes, the
// distributed optimizer and each model chunk's parameter count on this
// rank); the rest (the plan as written, the global batch, seed and learning
// rate) may change, and a resume reports what did.
constexpr const char* kCheckpointMagic = "megascope-checkpoint 5";
constexpr int kCheckpointMatchKeys = 5;   // model, world, rank, gemms, shards

struct CheckpointId {
  std::vector<std::pair<std::string, std::string>> fields;   // in header order
};

CheckpointId checkpoint_id(const Setup& s, const RunOptions& o, int world, int rank, const std::vector<Chunk>& chunks) {
  std::string sizes;
  for (const Chunk& c : chunks) sizes += fmt::format("{}{}", sizes.empty() ? "" : ",", c.w.size());
  CheckpointId id;
  id.fields = {{"model", o.model_name},
               {"world", std::to_string(world)},
               {"rank", std::to_string(rank)},
               {"gemms", o.bf16 ? "bf16" : "fp32"},
               {"shards", fmt::format("tp={} cp={} pp={} dp={} ep={} etp={} distopt={} chunks={}", s.plan.tp, s.plan.cp,
                                      s.plan.pp, s.dp, s.plan.ep, s.etp, s.plan.distributed_optimizer ? "on" : "off",
                                      sizes)},
               {"plan", o.plan_text},
               {"global-batch", std::to_string(s.training.global_batch_size)},
               {"seed", std::to_string(o.seed)},
               {"lr", fmt::format("{}", o.lr)}};
  return id;
}

std::string checkpoint_header(const CheckpointId& id) {
  std::string h = std::string(kCheckpointMagic) + "\n";
  for (const auto& [k, v] : id.fields) h += k + " " + v + "\n";
  return h + "end\n";
}

// FNV-1a (64-bit) over the payload after the header: the step and every
// vector, as written. A flipped bit, NaN bytes written over a weight or a
// truncation changes it; it ends the file.
class Checksum {
 public:
  void add(const void* data, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ULL;
  }
  [[nodiscard]] std::uint64_t value() const { return h_; }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

std::filesystem::path rank_file(const std::string& dir, int step, int rank) {
  return std::filesystem::path(dir) / fmt::format("step-{}", step) / fmt::format("rank-{}.bin", rank);
}

template <class T>
void write_pod(std::ofstream& f, const T& v, Checksum& sum) {
  f.write(reinterpret_cast<const char*>(&v), sizeof(T));
  sum.add(&v, sizeof(T));
}
void write_vec(std::ofstream& f, const Vec& v, Checksum& sum) {
  const auto n = static_cast<std::int64_t>(v.size());
  write_pod(f, n, sum);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  sum.add(v.data(), v.size() * sizeof(float));
}
bool read_vec(std::ifstream& f, Vec& v, Checksum& sum) {
  std::int64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), sizeof(n));
  if (!f || n != static_cast<std::int64_t>(v.size())) return false;
  sum.add(&n, sizeof(n));
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  sum.add(v.data(), v.size() * sizeof(float));
  return static_cast<bool>(f);
}

Result<void> save_rank(const std::string& dir, int step, int rank, const CheckpointId& id, std::vector<Chunk>& chunks,
                       std::vector<Vec>& m, std::vector<Vec>& v) {
  const auto path = rank_file(dir, step, rank);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return fail("--checkpoint-dir", fmt::format("{}: cannot write", tmp));
    const std::string h = checkpoint_header(id);
    f << h;
    Checksum sum;
    write_pod(f, static_cast<std::int32_t>(step), sum);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      write_vec(f, chunks[c].w, sum);
      write_vec(f, m[c], sum);
      write_vec(f, v[c], sum);
    }
    const std::uint64_t total = sum.value();
    f.write(reinterpret_cast<const char*>(&total), sizeof(total));
    f.flush();
    if (!f) return fail("--checkpoint-dir", fmt::format("{}: write failed", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return fail("--checkpoint-dir", fmt::format("{}: cannot rename: {}", tmp, ec.message()));
  return {};
}

// Loads this rank's checkpoint of `step`; `changed` gets "key: checkpoint
// -> now" for each header field that may change and did.
Result<void> load_rank(const std::string& dir, int step, int rank, const CheckpointId& id, std::vector<Chunk>& chunks,
                       std::vector<Vec>& m, std::vector<Vec>& v, std::vector<std::string>& changed) {
  const auto path = rank_file(dir, step, rank);
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail("--resume", fmt::format("{}: cannot read the checkpoint", path.string()));
  // The header: at most a few kB of lines (a plan string is short).
  std::string line;
  std::map<std::string, std::string> got;
  bool magic = false, ended = false;
  for (int n = 0; n < 64 && !ended && std::getline(f, line); ++n) {
    if (n == 0) {
      magic = line == kCheckpointMagic;
      if (!magic) break;
      continue;
    }
    if (line == "end") {
      ended = true;
      break;
    }
    const auto sp = line.find(' ');
    if (sp == std::string::npos || line.size() > 4096) break;
    got[line.substr(0, sp)] = line.substr(sp + 1);
  }
  if (!magic)
    return fail("--resume", fmt::format("{}: not a checkpoint of this version (expected a first line \"{}\")",
                                        path.string(), kCheckpointMagic));
  if (!ended) return fail("--resume", fmt::format("{}: its header is malformed or truncated", path.string()));
  for (std::size_t k = 0; k < id.fields.size(); ++k) {
    const auto& [key, now] = id.fields[k];
    const auto it = got.find(key);
    const std::string then = it == got.end() ? "(absent)" : it->second;
    if (then == now) continue;
    if (static_cast<int>(k) < kCheckpointMatchKeys)
      return fail("--resume", fmt::format("{}: written with {} \"{}\", this run has \"{}\": a checkpoint resumes only "
                                          "the same model, world size, rank, GEMM precision (--bf16) and sharding",
                                          path.string(), key, then, now));
    changed.push_back(fmt::format("{}: {} -> {}", key, then, now));
  }
  std::int32_t saved = 0;
  f.read(reinterpret_cast<char*>(&saved), sizeof(saved));
  if (saved != step) return fail("--resume", fmt::format("{}: holds step {}, expected {}", path.string(), saved, step));
  Checksum sum;
  sum.add(&saved, sizeof(saved));
  for (std::size_t c = 0; c < chunks.size(); ++c)
    if (!read_vec(f, chunks[c].w, sum) || !read_vec(f, m[c], sum) || !read_vec(f, v[c], sum))
      return fail("--resume", fmt::format("{}: truncated or of the wrong shape", path.string()));
  std::uint64_t stored = 0;
  f.read(reinterpret_cast<char*>(&stored), sizeof(stored));
  if (!f) return fail("--resume", fmt::format("{}: truncated (no checksum)", path.string()));
  if (stored != sum.value())
    return fail("--resume", fmt::format("{}: the checksum does not match: the file is corrupt", path.string()));
  if (f.peek() != std::ifstream::traits_type::eof())
    return fail("--resume", fmt::format("{}: bytes after the checksum: the file is corrupt", path.string()));
  return {};
}

std::optional<int> latest_step(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "latest");
  int step = 0;
  if (f >> step) return step;
  return std::nullopt;
}

// Every rank's verdict: the first error anywhere fails all ranks together,
// and rank 0 (whose message the user sees) reports the first failing rank's
// error, named.
Result<void> agree(Result<void> mine, const MpiEnv& env, const char* field) {
  int ok = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) return {};
  const std::vector<std::string> errors = env.gather(mine ? std::string() : mine.error().str(), 0);
  if (!mine) return mine;
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) return fail(field, fmt::format("rank {}: {}", r, errors[r]));
  return fail(field, "another rank failed (see its message)");
}

}  // namespace

Result<std::vector<StepLog>> run_cpu(const Setup& s, const Program& p, const RunOptions& o, std::ostream& out) {
  // The ranks allocate their temporaries per op and keep activations across
  // micro-batches; freed to the system at each step's end and touched again
  // in the next, the fresh pages cost tiny-llama pp=2 about 16% of its step
  // (page faults and zeroing). A pool keeps what was freed for reuse, as a
  // framework's caching allocator does (the cuda backend has the same).
  std::pmr::pool_options pooled;
  pooled.largest_required_pool_block = std::size_t{64} << 20;
  std::pmr::synchronized_pool_resource pool(pooled, std::pmr::new_delete_resource());
  std::pmr::memory_resource* previous = std::pmr::set_default_resource(&pool);
  struct Restore {
    std::pmr::memory_resource* r;
    ~Restore() { std::pmr::set_default_resource(r); }
  } restore{previous};
  CpuKernelOps ops(o.bf16);
  return run_training(s, p, o, out, ops, false);
}

Result<std::vector<StepLog>> run_training(const Setup& s, const Program& p, const RunOptions& o, std::ostream& out,
                                          KernelOps& ops, bool staged) {
  if (auto ok = check_supported(s); !ok) return tl::unexpected(ok.error());
  if (s.training.varlen && staged)
    return fail("training.lengths", "variable-length training runs on the cpu backend only: the cuda backend's "
                                    "attention has no document mask yet (run it with --backend cpu)");
  MpiEnv& env = MpiEnv::get();
  if (env.size() != p.grid.world())
    return fail("--plan", fmt::format("the plan runs on {} ranks (tp {} x cp {} x dp {} x pp {}) but the MPI job has {}; "
                                      "launch with mpirun -np {}",
                                      p.grid.world(), p.grid.tp, p.grid.cp, p.grid.dp, p.grid.pp, env.size(),
                                      p.grid.world()));
  auto corpus = ByteCorpus::load(o.data.empty() ? kDefaultCorpus : o.data, s.seq_length);
  if (!corpus) return tl::unexpected(corpus.error());
  if (s.model.vocab_size < 256)
    return fail("model.vocab_size", fmt::format("{} is below 256: the executor trains on bytes", s.model.vocab_size));
  MpiGroups groups(p.grid, o.recv_timeout_s);
  std::optional<StagedGroups> staged_groups;
  if (staged) staged_groups.emplace(groups);
  CpuRank rank(s, p, o, *corpus, staged_groups ? static_cast<const GroupSet&>(*staged_groups) : groups, ops);
  const int me = env.rank();
  const CheckpointId ckpt_id = checkpoint_id(s, o, env.size(), me, rank.chunks());

  // The checkpoint directory: writable before the first step (not found out
  // at the first save), and not one holding another run's checkpoints unless
  // this run resumes them ('latest' never moves to another run's step).
  if (o.checkpoint_dir) {
    const std::filesystem::path dir = *o.checkpoint_dir;
    Result<void> usable;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const auto probe = dir / fmt::format(".megascope-write-test-{}", me);
    if (!std::ofstream(probe, std::ios::trunc))
      usable = fail("--checkpoint-dir", fmt::format("{}: cannot write in the checkpoint directory", dir.string()));
    std::filesystem::remove(probe, ec);
    if (usable && !o.resume)
      if (const std::optional<int> held = latest_step(*o.checkpoint_dir))
        usable = fail("--checkpoint-dir", fmt::format("{} holds a checkpoint at step {} ('latest'): continue it with "
                                                      "--resume, or give an empty directory",
                                                      dir.string(), *held));
    if (auto ok = agree(usable, env, "--checkpoint-dir"); !ok) return tl::unexpected(ok.error());
  }

  int first = 1;
  if (o.resume) {
    if (!o.checkpoint_dir) return fail("--resume", "needs --checkpoint-dir");
    const std::optional<int> latest = latest_step(*o.checkpoint_dir);
    std::vector<std::string> changed;
    Result<void> mine = latest ? load_rank(*o.checkpoint_dir, *latest, me, ckpt_id, rank.chunks(), rank.moments_m(),
                                           rank.moments_v(), changed)
                               : fail("--resume", fmt::format("{}: no checkpoint (no 'latest' file)", *o.checkpoint_dir));
    if (auto ok = agree(mine, env, "--resume"); !ok) return tl::unexpected(ok.error());
    first = *latest + 1;
    if (me == 0) {
      out << fmt::format("resumed from {} at step {}\n", *o.checkpoint_dir, *latest);
      for (const std::string& c : changed) out << fmt::format("resumed with a change: {}\n", c);
    }
  }

  std::vector<StepLog> logs;
  std::vector<Span> spans;
  // Packed variable-length training: a Program per micro-batch count (the
  // same on every rank: the schedule is), built when first needed.
  const bool packing = s.training.varlen && s.training.varlen->packing == Packing::pack;
  std::map<int, Program> programs;
  const Program* last_program = &p;
  const auto program_of = [&](int microbatches) -> Result<const Program*> {
    if (!packing || microbatches == s.num_microbatches) return &p;
    auto it = programs.find(microbatches);
    if (it == programs.end()) {
      Setup step_setup = s;
      step_setup.num_microbatches = microbatches;
      auto built = o.build_program ? o.build_program(step_setup) : megascope::build_program(step_setup);
      if (!built)
        return fail("training.lengths", fmt::format("the Program of a step of {} packed micro-batches: {}",
                                                    microbatches, built.error().str()));
      it = programs.emplace(microbatches, std::move(*built)).first;
    }
    return &it->second;
  };
  const int last = first + o.steps - 1;
  if (o.fail_rank && (o.fail_step < first || o.fail_step > last))   // it would never fire
    return fail("--inject-failure", fmt::format("step {} is not one of this run's steps ({} to {})", o.fail_step, first, last));
  for (int step = first; step <= last; ++step) {
    double loss_sum = 0, grad_norm = 0;
    if (o.fail_rank && *o.fail_rank == me && step == o.fail_step && o.fail != RunOptions::Fail::nan) {
      if (o.fail == RunOptions::Fail::hang)   // alive but making no progress, as a stopped or deadlocked process
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      std::_Exit(9);
    }
    // The loss is averaged over the tokens with a target: every token of the
    // global batch, or, with variable lengths, the documents' tokens but
    // their last ones (the same count on every rank).
    double loss_tokens = static_cast<double>(s.training.global_batch_size * s.seq_length);
    if (s.training.varlen) {
      // The same on every rank (the lengths and the schedule are), so an
      // error here is every rank's.
      auto batch = varlen_batch(s, step - 1);
      if (!batch) return tl::unexpected(batch.error());
      auto program = program_of(batch->microbatches);
      if (!program) return tl::unexpected(program.error());
      last_program = *program;
      loss_tokens = static_cast<double>(std::max<std::int64_t>(batch->loss_tokens, 1));
      rank.step(step, spans, loss_sum, grad_norm, &*batch, *program);
    } else {
      rank.step(step, spans, loss_sum, grad_norm);
    }
    double sums[2] = {loss_sum, spans.empty() ? 0.0 : spans.back().end};
    double total_loss = 0, step_time = 0;
    world_allreduce(&sums[0], &total_loss, 1, MPI_DOUBLE, MPI_SUM, o.recv_timeout_s, "the step's loss");
    world_allreduce(&sums[1], &step_time, 1, MPI_DOUBLE, MPI_MAX, o.recv_timeout_s, "the step's time");
    StepLog log{step, total_loss / loss_tokens, grad_norm, step_time};
    // A NaN or infinite loss or gradient norm stops the run before anything
    // is written (Megatron-LM's --check-for-nan-in-loss-and-grad); both are
    // the same on every rank (reduced over the job). With skip_nonfinite a
    // non-finite gradient norm under a finite loss made no update (CpuRank
    // skipped it; the weights are the step's inputs, finite) and the run
    // goes on; a non-finite loss means the weights themselves went bad.
    int finite = std::isfinite(log.loss) && std::isfinite(log.grad_norm) ? 1 : 0, all_finite = 0;
    world_allreduce(&finite, &all_finite, 1, MPI_INT, MPI_MIN, o.recv_timeout_s, "the finite-loss check");
    log.skipped = !all_finite && o.skip_nonfinite && std::isfinite(log.loss) && !std::isfinite(log.grad_norm);
    if (!all_finite && !log.skipped)
      return fail("run", fmt::format("step {}: the loss is {} and the gradient norm {}; stopping before any checkpoint of "
                                     "this step is written{}",
                                     step, log.loss, log.grad_norm,
                                     !o.skip_nonfinite && std::isfinite(log.loss)
                                         ? " (--skip-nonfinite-steps skips a step whose gradient norm is not finite)"
                                         : ""));
    logs.push_back(log);
    if (me == 0)
      out << fmt::format("step {:>4}  loss {:.6f}  grad norm {:.6f}  time {:.3f} s{}\n", log.step, log.loss,
                         log.grad_norm, log.step_time_s, log.skipped ? "  skipped: no update" : "")
          << std::flush;
    const bool save = o.checkpoint_dir && ((o.save_every > 0 && step % o.save_every == 0) || step == last);
    if (save) {
      auto ok = agree(save_rank(*o.checkpoint_dir, step, me, ckpt_id, rank.chunks(), rank.moments_m(),
                                rank.moments_v()),
                      env, "--checkpoint-dir");
      if (!ok) return tl::unexpected(ok.error());
      if (me == 0) {   // every rank's file is complete: move the pointer
        const auto dir = std::filesystem::path(*o.checkpoint_dir);
        { std::ofstream f(dir / "latest.tmp", std::ios::trunc); f << step << "\n"; }
        std::error_code ec;
        std::filesystem::rename(dir / "latest.tmp", dir / "latest", ec);
      }
      env.barrier();
    }
  }

  if (o.trace) {   // the last step's spans of every rank, written by rank 0
    std::string mine(reinterpret_cast<const char*>(spans.data()), spans.size() * sizeof(Span));
    const std::vector<std::string> all = env.gather(mine, 0);
    Result<void> ok;
    if (me == 0) {
      std::vector<Span> every;
      for (const std::string& b : all) {
        const std::size_t n = b.size() / sizeof(Span);
        const std::size_t at = every.size();
        every.resize(at + n);
        std::memcpy(every.data() + at, b.data(), n * sizeof(Span));
      }
      std::vector<int> ranks(static_cast<std::size_t>(env.size()));
      for (int r = 0; r < env.size(); ++r) ranks[static_cast<std::size_t>(r)] = r;
      TraceInfo info{TraceSource::measured, logs.empty() ? 0.0 : logs.back().step_time_s, o.plan_text, o.model_name,
                     env.size()};
      ok = write_trace(*o.trace, *last_program, info, ranks, every);
    }
    if (auto agreed = agree(ok, env, "--trace"); !agreed) return tl::unexpected(agreed.error());
  }
  return logs;
}

}  // namespace megascope::exec
