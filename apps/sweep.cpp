#include "apps/sweep.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "config/library.hpp"
#include "apps/scenario.hpp"
#include "config/plan_settings.hpp"
#include "config/token_histogram.hpp"
#include "exec/mpi_env.hpp"
#include "planner/planner.hpp"

namespace megascope::cli {

namespace {

using Err = tl::unexpected<Error>;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Error usage(const std::string& option, const std::string& message) { return Error{message, option, std::nullopt}; }

// The items of a comma list, each once, in order; an empty item is an error.
Result<std::vector<std::string>> names(const std::string& text, const std::string& option) {
  std::vector<std::string> out;
  for (const std::string& s : split_commas(text)) {
    if (s.empty()) return Err(usage(option, fmt::format("empty item in '{}'", text)));
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

std::string gbps_text(const ClusterSpec& c) { return fmt::format("{:g}", c.node.nic_bandwidth_Bps * 8 / 1e9); }

}  // namespace

void add_sweep_options(CLI::App& cmd, SweepOptions& o) {
  cmd.add_option("--model", o.search.model, "models, comma-separated: shipped names, TOML files or config.json")
      ->required();
  cmd.add_option("--cluster", o.search.cluster, "clusters, comma-separated: shipped names or TOML files")->required();
  cmd.add_option("--gpus", o.search.gpus,
                 "GPU counts: N, A,B,C, A-BxK (times K) or A-B+K (plus K), e.g. 64-1024x2 (default: the cluster's)");
  cmd.add_option("--device", o.device,
                 "GPU types replacing the cluster's: device names or unique prefixes (h100-sxm, h100-pcie, h200, "
                 "b200), shipped clusters or cluster files");
  cmd.add_option("--gpus-per-node", o.gpus_per_node,
                 "GPUs per node (same NICs per GPU; a node-sized NVLink domain follows the node)");
  cmd.add_option("--scale-up-domain", o.scale_up_domain, "GPUs per NVLink (scale-up) domain, a multiple of the node");
  cmd.add_option("--nic-gbps", o.nic_gbps, "NIC bandwidth, Gb/s per NIC per direction");
  add_search_options(cmd, o.search);
  cmd.add_option("--top", o.search.top, "plans simulated at each point (default 32)");
  cmd.add_option("--csv", o.csv, "write every point as CSV");
  cmd.add_option("--plot", o.plot, "write an SVG of throughput and MFU against the swept variable");
  cmd.add_option("--x", o.x, "the plot's x axis: a swept variable (default: gpus, else the innermost swept)");
  cmd.add_flag("--json", o.json, "print one JSON object instead of the table");
  cmd.add_flag("--no-progress", o.search.no_progress, "no progress line on the terminal");
}

// Numeric variables (not model, cluster or device): right-aligned, read as numbers.
bool numeric(SweepVar v) { return v != SweepVar::model && v != SweepVar::cluster && v != SweepVar::device; }

// ---------------------------------------------------------------------------
// The points

namespace {

struct Point {
  planner::SearchInputs in;
  std::array<std::string, kSweepVars> values;
};

struct Sweep {
  std::vector<Point> points;
  std::array<std::size_t, kSweepVars> given{};   // values given per option (1: not swept)
  std::array<std::size_t, kSweepVars> counts{};  // distinct values per variable over the points (a node-sized
                                                 // NVLink domain follows --gpus-per-node, the default GPU count
                                                 // follows the cluster)
  std::optional<std::int64_t> seq_len;           // given on the command line
  std::int64_t global_batch = 0;
  std::vector<std::string> notes;                // what was assumed (a Hugging Face config's length)
};

template <class T>
std::vector<std::optional<T>> or_none(std::vector<std::optional<T>> v) {
  if (v.empty()) v.push_back(std::nullopt);
  return v;
}

template <class T>
Result<std::vector<std::optional<T>>> numbers_of(const std::optional<std::string>& text, SweepVar var) {
  std::vector<std::optional<T>> out;
  if (!text) return or_none(out);
  auto v = parse_sweep_values(*text, option_of(var), std::is_integral_v<T>);
  if (!v) return Err(v.error());
  for (double x : *v) {
    if (std::is_integral_v<T> && x > 1e9) return Err(usage(option_of(var), fmt::format("{:g} is too large", x)));
    out.push_back(static_cast<T>(x));
  }
  return out;
}

Result<Sweep> make_points(const SweepOptions& o) {
  const PlanCommandOptions& so = o.search;
  Sweep sw;
  planner::SearchInputs common;
  if (auto ok = apply_search_options(so, common); !ok) return Err(ok.error());
  sw.seq_len = common.training.seq_length;   // --seq-len, else a --training file's
  sw.global_batch = common.training.global_batch_size;

  std::vector<ModelSpec> models;
  std::vector<std::optional<std::int64_t>> lengths;   // each model's training length: given, or a config.json's default
  auto model_names = names(so.model.value_or(""), "--model");
  if (!model_names) return Err(model_names.error());
  for (const std::string& m : *model_names) {
    auto spec = resolve_model(m);
    if (!spec) return Err(spec.error());
    TrainingSpec t = common.training;
    if (auto note = default_hf_seq_length(m, *spec, t)) sw.notes.push_back(*note);
    lengths.push_back(t.seq_length);
    // --moe-imbalance and --moe-histogram apply to the MoE models of the
    // sweep; dense ones route nothing. A histogram must fit each MoE model's
    // experts and layers (config/token_histogram.hpp names the mismatch).
    if (spec->moe) {
      if (auto ok = override_moe_imbalance(*spec, so.moe_imbalance); !ok) return Err(ok.error());
      if (so.moe_histogram)
        if (auto ok = apply_token_histogram(*spec, *so.moe_histogram); !ok) return Err(ok.error());
    }
    models.push_back(*spec);
  }
  const bool any_moe = std::any_of(models.begin(), models.end(), [](const ModelSpec& m) { return m.moe.has_value(); });
  if (so.moe_imbalance && !any_moe) return Err(usage("--moe-imbalance", "no model of the sweep has experts"));
  if (so.moe_histogram && !any_moe) return Err(usage("--moe-histogram", "no model of the sweep has experts"));
  std::vector<ClusterSpec> clusters;
  auto cluster_names = names(so.cluster.value_or(""), "--cluster");
  if (!cluster_names) return Err(cluster_names.error());
  for (const std::string& c : *cluster_names) {
    auto spec = resolve_cluster(c);
    if (!spec) return Err(spec.error());
    auto valid = validate_cluster(*spec);
    if (!valid) return Err(valid.error());
    clusters.push_back(*valid);
  }
  std::vector<std::optional<DeviceSpec>> devices;
  if (o.device) {
    auto device_names = names(*o.device, "--device");
    if (!device_names) return Err(device_names.error());
    for (const std::string& d : *device_names) {
      auto spec = resolve_device(d);
      if (!spec) return Err(spec.error());
      devices.push_back(*spec);
    }
  }
  devices = or_none(devices);
  auto per_node = numbers_of<int>(o.gpus_per_node, SweepVar::gpus_per_node);
  if (!per_node) return Err(per_node.error());
  auto domains = numbers_of<int>(o.scale_up_domain, SweepVar::scale_up_domain);
  if (!domains) return Err(domains.error());
  auto nics = numbers_of<double>(o.nic_gbps, SweepVar::nic_gbps);
  if (!nics) return Err(nics.error());
  auto gpus = numbers_of<int>(so.gpus, SweepVar::gpus);
  if (!gpus) return Err(gpus.error());

  sw.given = {models.size(),   clusters.size(), devices.size(), per_node->size(),
              domains->size(), nics->size(),    gpus->size()};
  std::array<std::vector<std::string>, kSweepVars> seen;
  for (std::size_t mi = 0; mi < models.size(); ++mi)
    for (const ClusterSpec& base : clusters)
      for (const auto& device : devices)
        for (const auto& g : *per_node)
          for (const auto& d : *domains)
            for (const auto& nic : *nics) {
              auto cluster = apply_variant(base, {device, g, d, nic});
              if (!cluster) return Err(cluster.error());
              for (const auto& n : *gpus) {
                const ModelSpec& model = models[mi];
                Point p;
                p.in = common;
                p.in.model = model;
                p.in.training.seq_length = lengths[mi];
                p.in.cluster = *cluster;
                const int count = n.value_or(cluster->total_devices());
                p.in.gpu_counts = {count};
                if (auto ok = grow_cluster(p.in.cluster, count); !ok) return Err(ok.error());
                p.values = {model.name,
                            cluster->name,
                            cluster->device.name,
                            std::to_string(cluster->node.devices_per_node),
                            std::to_string(cluster->scale_up_domain),
                            gbps_text(*cluster),
                            std::to_string(count)};
                auto checked = with_training_file(planner::check_inputs(p.in), so);
                if (!checked) {
                  Error e = checked.error();
                  e.message += fmt::format(" (sweep point {} of {} on {}, {} GPUs)", sw.points.size() + 1, model.name,
                                           cluster->name, count);
                  return Err(e);
                }
                p.in = *checked;
                for (int v = 0; v < kSweepVars; ++v) {
                  auto& s = seen[static_cast<std::size_t>(v)];
                  if (std::find(s.begin(), s.end(), p.values[static_cast<std::size_t>(v)]) == s.end())
                    s.push_back(p.values[static_cast<std::size_t>(v)]);
                }
                sw.points.push_back(std::move(p));
              }
            }
  for (int v = 0; v < kSweepVars; ++v)
    sw.counts[static_cast<std::size_t>(v)] = seen[static_cast<std::size_t>(v)].size();
  return sw;
}

// ---------------------------------------------------------------------------
// One point's search, and its result as JSON (the form that crosses MPI ranks)

SweepResult evaluate(const Point& p, std::size_t index, const planner::SearchOptions& so) {
  SweepResult r;
  r.point = index;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto res = planner::search(p.in, so);
    if (!res) {
      r.error = res.error().str();
    } else {
      r.evaluated = res->evaluated;
      r.fitting = res->fitting;
      r.capacity_bytes = res->capacity_bytes;
      if (!res->ranked.empty()) {
        const planner::SimulatedPlan& w = res->ranked.front();
        const sim::SimReport& rep = w.report;
        r.plan = plan_text(w.plan);
        r.tokens_per_s = rep.tokens_per_s;
        r.tflops_per_gpu = rep.tflops_per_gpu;
        r.mfu = rep.mfu;
        r.step_time_s = rep.step_time_s;
        r.peak_memory_bytes = w.memory.peak_bytes;
        r.bubble_fraction = rep.bubble_fraction;
        r.exposed_comm_fraction = w.exposed_comm_s() / rep.step_time_s;
      } else if (res->best_rejected) {
        r.status = SweepResult::Status::no_fit;
        r.plan = plan_text(planner::to_plan(*res->best_rejected));
        r.peak_memory_bytes = res->best_rejected_estimate.peak_bytes;
      } else {
        r.status = SweepResult::Status::no_legal_plan;
      }
    }
  } catch (const std::exception& e) {
    r.error = fmt::format("internal error: {}", e.what());
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

const char* to_string(SweepResult::Status s) {
  switch (s) {
    case SweepResult::Status::ok:
      return "ok";
    case SweepResult::Status::no_fit:
      return "no_fit";
    case SweepResult::Status::no_legal_plan:
      return "no_legal_plan";
  }
  return "?";
}

nlohmann::json to_json(const SweepResult& r) {
  return {{"point", r.point},
          {"status", to_string(r.status)},
          {"plan", r.plan},
          {"tokens_per_s", r.tokens_per_s},
          {"tflops_per_gpu", r.tflops_per_gpu},
          {"mfu", r.mfu},
          {"step_time_s", r.step_time_s},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"capacity_bytes", r.capacity_bytes},
          {"bubble_fraction", r.bubble_fraction},
          {"exposed_comm_fraction", r.exposed_comm_fraction},
          {"plans_evaluated", r.evaluated},
          {"plans_fitting", r.fitting},
          {"error", r.error},
          {"wall_s", r.wall_s}};
}

SweepResult from_json(const nlohmann::json& j) {
  SweepResult r;
  r.point = j.at("point").get<std::size_t>();
  const std::string status = j.at("status").get<std::string>();
  r.status = status == "ok"       ? SweepResult::Status::ok
             : status == "no_fit" ? SweepResult::Status::no_fit
                                  : SweepResult::Status::no_legal_plan;
  r.plan = j.at("plan").get<std::string>();
  r.tokens_per_s = j.at("tokens_per_s").get<double>();
  r.tflops_per_gpu = j.at("tflops_per_gpu").get<double>();
  r.mfu = j.at("mfu").get<double>();
  r.step_time_s = j.at("step_time_s").get<double>();
  r.peak_memory_bytes = j.at("peak_memory_bytes").get<double>();
  r.capacity_bytes = j.at("capacity_bytes").get<double>();
  r.bubble_fraction = j.at("bubble_fraction").get<double>();
  r.exposed_comm_fraction = j.at("exposed_comm_fraction").get<double>();
  r.evaluated = j.at("plans_evaluated").get<std::uint64_t>();
  r.fitting = j.at("plans_fitting").get<std::uint64_t>();
  r.error = j.at("error").get<std::string>();
  r.wall_s = j.at("wall_s").get<double>();
  return r;
}

// ---------------------------------------------------------------------------
// Output: table, CSV, JSON

// The variables given more than one value: the plot's axis and series.
std::vector<SweepVar> swept(const Sweep& sw) {
  std::vector<SweepVar> out;
  for (int v = 0; v < kSweepVars; ++v)
    if (sw.given[static_cast<std::size_t>(v)] > 1) out.push_back(static_cast<SweepVar>(v));
  return out;
}

// The variables whose value changes over the points: the table's columns.
std::vector<SweepVar> varying(const Sweep& sw) {
  std::vector<SweepVar> out;
  for (int v = 0; v < kSweepVars; ++v)
    if (sw.counts[static_cast<std::size_t>(v)] > 1) out.push_back(static_cast<SweepVar>(v));
  return out;
}

std::string header_of(SweepVar v) {
  switch (v) {
    case SweepVar::gpus_per_node:
      return "gpus/node";
    case SweepVar::scale_up_domain:
      return "domain";
    case SweepVar::nic_gbps:
      return "NIC Gb/s";
    default:
      return to_string(v);
  }
}

// What stays fixed over the sweep, in words.
std::string fixed_text(const Sweep& sw) {
  const Point& p0 = sw.points.front();
  std::vector<std::string> parts;
  const auto& v = p0.values;
  auto fixed = [&](SweepVar x) { return sw.counts[static_cast<std::size_t>(x)] == 1; };
  std::string on = fixed(SweepVar::model) ? v[0] + " on " : "on ";
  if (fixed(SweepVar::gpus)) on += v[6] + " GPUs of ";
  on += fixed(SweepVar::cluster) ? v[1] : "each cluster";
  if (fixed(SweepVar::device)) on += " (" + v[2] + ")";
  parts.push_back(on);
  if (fixed(SweepVar::gpus_per_node)) parts.push_back(v[3] + " GPUs per node");
  if (fixed(SweepVar::scale_up_domain)) parts.push_back("NVLink domain " + v[4]);
  if (fixed(SweepVar::nic_gbps)) parts.push_back("NICs " + v[5] + " Gb/s");
  if (sw.seq_len || fixed(SweepVar::model))
    parts.push_back(
        fmt::format("global batch {} x {} tokens", sw.global_batch,
                    p0.in.training.seq_length.value_or(p0.in.model.seq_length)));
  else
    parts.push_back(fmt::format("global batch {} sequences of each model's length", sw.global_batch));
  if (const std::string t = training_text(p0.in.training); !t.empty()) parts.push_back(t);
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_text(const Sweep& sw, const std::vector<SweepResult>& rs) {
  std::string t;
  for (int v = 0; v < kSweepVars; ++v) t += fmt::format("{},", to_string(static_cast<SweepVar>(v)));
  t += "status,tokens_per_s,tokens_per_s_per_gpu,tflops_per_gpu,mfu,step_time_s,peak_memory_gib,capacity_gib,"
       "bubble_fraction,exposed_comm_fraction,plans_evaluated,plans_fitting,plan\n";
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const SweepResult& r = rs[i];
    const Point& p = sw.points[i];
    for (const std::string& v : p.values) t += csv_field(v) + ",";
    t += std::string(to_string(r.status)) + ",";
    if (r.status == SweepResult::Status::ok)
      t += fmt::format("{:.1f},{:.2f},{:.2f},{:.4f},{:.4f},", r.tokens_per_s, r.tokens_per_s / p.in.gpu_counts.front(),
                       r.tflops_per_gpu, r.mfu, r.step_time_s);
    else
      t += ",,,,,";
    t += r.status == SweepResult::Status::no_legal_plan ? std::string(",")
                                                        : fmt::format("{:.2f},", r.peak_memory_bytes / kGiB);
    t += fmt::format("{:.2f},", r.capacity_bytes / kGiB);
    if (r.status == SweepResult::Status::ok)
      t += fmt::format("{:.4f},{:.4f},", r.bubble_fraction, r.exposed_comm_fraction);
    else
      t += ",,";
    t += fmt::format("{},{},{}\n", r.evaluated, r.fitting, csv_field(r.plan));
  }
  return t;
}

std::string table_text(const Sweep& sw, const std::vector<SweepResult>& rs) {
  const std::vector<SweepVar> vars = varying(sw);
  std::string t = fmt::format("megascope sweep: {} points; {}\n", rs.size(), fixed_text(sw));
  for (const std::string& note : sw.notes) t += "note: " + note + "\n";
  if (!swept(sw).empty()) {
    std::vector<std::string> s;
    for (SweepVar v : swept(sw))
      s.push_back(fmt::format("{} ({} values)", to_string(v), sw.given[static_cast<std::size_t>(v)]));
    t += fmt::format("  swept: {}; the best plan of a full search at each point\n", fmt::join(s, " x "));
  }
  t += "\n";
  std::vector<std::size_t> width;
  for (SweepVar v : vars) {
    std::size_t w = header_of(v).size();
    for (const Point& p : sw.points) w = std::max(w, p.values[static_cast<std::size_t>(v)].size());
    width.push_back(w);
  }
  auto cells = [&](const std::vector<std::string>& c) {
    std::string line;
    for (std::size_t k = 0; k < vars.size(); ++k)
      line += numeric(vars[k]) ? fmt::format("{:>{}}  ", c[k], width[k]) : fmt::format("{:<{}}  ", c[k], width[k]);
    return line;
  };
  std::vector<std::string> h1, h2;
  for (SweepVar v : vars) {
    h1.push_back(header_of(v));
    h2.push_back("");
  }
  t += cells(h1) +
       fmt::format("{:>10} {:>7} {:>6} {:>8} {:>6}  {}\n", "tokens/s", "TFLOP/s", "MFU", "step s", "peak", "best plan");
  t += cells(h2) + fmt::format("{:>10} {:>7} {:>6} {:>8} {:>6}\n", "", "/GPU", "", "", "GiB");
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const SweepResult& r = rs[i];
    std::vector<std::string> c;
    for (SweepVar v : vars) c.push_back(sw.points[i].values[static_cast<std::size_t>(v)]);
    std::string line = cells(c);
    switch (r.status) {
      case SweepResult::Status::ok:
        line += fmt::format("{:>10.0f} {:>7.1f} {:>5.1f}% {:>8.3f} {:>6.1f}  {}", r.tokens_per_s, r.tflops_per_gpu,
                            100 * r.mfu, r.step_time_s, r.peak_memory_bytes / kGiB, r.plan);
        break;
      case SweepResult::Status::no_fit:
        line +=
            fmt::format("{:>10} {:>7} {:>6} {:>8} {:>6}  no plan fits in {:.1f} GiB; the fastest needs {:.1f} GiB: {}",
                        "-", "-", "-", "-", "-", r.capacity_bytes / kGiB, r.peak_memory_bytes / kGiB, r.plan);
        break;
      case SweepResult::Status::no_legal_plan:
        line += fmt::format("{:>10} {:>7} {:>6} {:>8} {:>6}  no legal plan (batch, layers or heads do not divide)", "-",
                            "-", "-", "-", "-");
        break;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    t += line + "\n";
  }
  return t;
}

nlohmann::json sweep_json(const Sweep& sw, const std::vector<SweepResult>& rs) {
  nlohmann::json vars = nlohmann::json::array();
  for (SweepVar v : swept(sw)) vars.push_back(to_string(v));
  nlohmann::json points = nlohmann::json::array();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    nlohmann::json j = to_json(rs[i]);
    j.erase("wall_s");
    j.erase("error");
    for (int v = 0; v < kSweepVars; ++v) {
      const std::string& value = sw.points[i].values[static_cast<std::size_t>(v)];
      const char* key = to_string(static_cast<SweepVar>(v));
      if (!numeric(static_cast<SweepVar>(v)))
        j[key] = value;
      else if (const double x = std::stod(value); x == std::floor(x))
        j[key] = static_cast<std::int64_t>(x);
      else
        j[key] = x;
    }
    points.push_back(j);
  }
  return {{"swept", vars},
          {"global_batch", sw.global_batch},
          {"training", training_json(sw.points.front().in.training)},
          {"notes", sw.notes},
          {"points", points}};
}

// ---------------------------------------------------------------------------
// Running it, alone or under MPI

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

int threads_per_rank(const SweepOptions& o, bool mpi) {
  if (o.search.threads > 0) return o.search.threads;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!mpi) return hw;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 0) return std::max(1, hw / std::atoi(s));
  return 1;
}

Result<void> write_file(const std::string& path, const std::string& text, const char* option) {
  std::ofstream f(path, std::ios::binary);
  if (f) f << text;
  if (!f) return Err(usage(option, fmt::format("cannot write {}", path)));
  return {};
}

// Rank 0's part once every result is in: print and write.
int report(const SweepOptions& o, const Sweep& sw, const std::vector<SweepResult>& rs, std::ostream& out,
           std::ostream& err) {
  for (std::size_t i = 0; i < rs.size(); ++i)
    if (!rs[i].error.empty()) {
      err << fmt::format("megascope sweep: error: point {} ({} on {}, {} GPUs): {}\n", i + 1, sw.points[i].values[0],
                         sw.points[i].values[1], sw.points[i].values[6], rs[i].error);
      return 1;
    }
  if (o.csv)
    if (auto ok = write_file(*o.csv, csv_text(sw, rs), "--csv"); !ok) {
      err << "megascope sweep: error: " << ok.error().str() << "\n";
      return 1;
    }
  if (o.plot) {
    SweepPlotData d;
    d.title = fixed_text(sw);
    const std::vector<SweepVar> vars = swept(sw);
    // Default: the first swept of gpus, nic_gbps, scale_up_domain, gpus_per_node, device, cluster, model.
    d.x = o.x ? *parse_sweep_var(*o.x) : vars.empty() ? SweepVar::gpus : vars.back();
    for (SweepVar v : vars)
      if (v != d.x) d.series_vars.push_back(v);
    for (std::size_t i = 0; i < rs.size(); ++i) d.rows.push_back({sw.points[i].values, rs[i]});
    if (auto ok = write_file(*o.plot, sweep_svg(d), "--plot"); !ok) {
      err << "megascope sweep: error: " << ok.error().str() << "\n";
      return 1;
    }
  }
  if (o.json)
    out << sweep_json(sw, rs).dump(2) << "\n";
  else
    out << table_text(sw, rs);
  return 0;
}

// Rank 0: the results of every rank back in point order, then the report and the timing (stderr).
int finish(const SweepOptions& o, const Sweep& sw, const std::vector<std::string>& parts, int threads, int ranks,
           std::chrono::steady_clock::time_point t0, std::ostream& out, std::ostream& err) {
  const std::size_t n = sw.points.size();
  std::vector<SweepResult> rs(n);
  std::vector<char> have(n, 0);
  for (const std::string& part : parts)
    for (const auto& j : nlohmann::json::parse(part)) {
      SweepResult r = from_json(j);
      MEGASCOPE_CHECK(r.point < n && !have[r.point], "a sweep point came back twice or out of range");
      have[r.point] = 1;
      rs[r.point] = std::move(r);
    }
  MEGASCOPE_CHECK(std::all_of(have.begin(), have.end(), [](char c) { return c != 0; }), "a sweep point is missing");
  const int code = report(o, sw, rs, out, err);
  double busy = 0;
  for (const SweepResult& r : rs) busy += r.wall_s;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (code == 0)
    err << fmt::format("megascope sweep: {} points in {:.2f} s ({:.2f} s searching) on {} rank{} x {} thread{}\n", n,
                       wall, busy, ranks, ranks > 1 ? "s" : "", threads, threads > 1 ? "s" : "");
  return code;
}

}  // namespace

int run_sweep(const SweepOptions& o, std::ostream& out, std::ostream& err) {
  const bool mpi = exec::launched_by_mpi();
  const exec::MpiEnv* env = mpi ? &exec::MpiEnv::get() : nullptr;
  const int rank = env ? env->rank() : 0;
  const int ranks = env ? env->size() : 1;
  NullBuffer null_buffer;
  std::ostream null(&null_buffer);
  std::ostream& o_out = rank == 0 ? out : null;
  std::ostream& o_err = rank == 0 ? err : null;
  const auto t0 = std::chrono::steady_clock::now();

  // Every rank builds the same points from the same inputs (and fails alike).
  auto sw = make_points(o);
  if (!sw) {
    o_err << "megascope sweep: error: " << sw.error().str() << "\n";
    return 1;
  }
  if (o.x) {
    const auto x = parse_sweep_var(*o.x);
    const std::vector<SweepVar> vars = swept(*sw);
    if (!x || (!vars.empty() && std::find(vars.begin(), vars.end(), *x) == vars.end())) {
      std::vector<std::string> allowed;
      for (SweepVar v : vars) allowed.push_back(to_string(v));
      o_err << fmt::format("megascope sweep: error: --x: '{}' is not a swept variable; swept: {}\n", *o.x,
                           fmt::join(allowed, ", "));
      return 1;
    }
  }
  planner::SearchOptions so;
  so.top_k = o.search.top;
  so.threads = threads_per_rank(o, mpi);
  so.calibration = o.search.calibration;

  // Rank r takes points r, r + K, ...
  const bool progress = rank == 0 && !o.search.no_progress && !o.json && isatty(fileno(stderr));
  const std::size_t n = sw->points.size();
  std::vector<std::size_t> share;
  for (std::size_t i = static_cast<std::size_t>(rank); i < n; i += static_cast<std::size_t>(ranks)) share.push_back(i);
  nlohmann::json mine = nlohmann::json::array();
  for (std::size_t k = 0; k < share.size(); ++k) {
    if (progress)
      std::fprintf(stderr, "\rsweep: point %zu of %zu%s ", k + 1, share.size(), ranks > 1 ? " (rank 0's share)" : "");
    mine.push_back(to_json(evaluate(sw->points[share[k]], share[k], so)));
  }
  if (progress) std::fprintf(stderr, "\r%60s\r", "");

  // Results travel as JSON, also in a single process, so that both print the same.
  std::vector<std::string> parts = env ? env->gather(mine.dump()) : std::vector<std::string>{mine.dump()};
  int code = 0;
  if (rank == 0) {
    try {
      code = finish(o, *sw, parts, so.threads, ranks, t0, o_out, o_err);
    } catch (const std::exception& e) {  // a defect; the other ranks must not wait for rank 0 forever
      o_err << "megascope sweep: internal error: " << e.what() << "\n";
      code = 3;
    }
  }
  // Every rank exits as rank 0 does.
  if (env) code = std::atoi(env->broadcast(std::to_string(code)).c_str());
  return code;
}

}  // namespace megascope::cli
