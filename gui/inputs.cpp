#include "gui/inputs.hpp"

#include "config/library.hpp"
#include "config/spec_toml.hpp"

namespace megascope::gui {

namespace {
using Err = tl::unexpected<Error>;
}

Result<Inputs> loadInputs(const StartOptions& o) {
  Inputs in;
  bool haveModel = false, haveCluster = false, havePlan = false, haveTraining = false;
  const bool nothing = !o.model && !o.cluster && !o.plan;
  if (o.example || nothing) {
    const std::string path = o.example.value_or(default_example_path());
    auto ex = load_example_toml(path);
    if (!ex) return Err(ex.error());
    auto m = resolve_model(ex->model);
    if (!m) return Err(m.error());
    auto c = resolve_cluster(ex->cluster);
    if (!c) return Err(c.error());
    in.modelName = ex->model;
    in.clusterName = ex->cluster;
    in.model = *m;
    in.cluster = *c;
    in.training = ex->training;
    in.plan = ex->plan;
    in.gpus = ex->gpus.value_or(c->total_devices());
    haveModel = haveCluster = havePlan = haveTraining = true;
    in.source = o.example ? "example " + path : "the default example (" + path + ")";
  }
  if (o.model) {
    auto m = resolve_model(*o.model);
    if (!m) return Err(m.error());
    in.model = *m;
    in.modelName = *o.model;
    haveModel = true;
  }
  if (o.cluster) {
    auto c = resolve_cluster(*o.cluster);
    if (!c) return Err(c.error());
    in.cluster = *c;
    in.clusterName = *o.cluster;
    if (!o.gpus && !o.nodes) in.gpus = c->total_devices();
    haveCluster = true;
  }
  if (o.plan) {
    auto p = resolve_plan(*o.plan);
    if (!p) return Err(p.error());
    in.plan = *p;
    havePlan = true;
  }
  if (!haveModel) return Err(fail("--model", "a model is required: --model NAME|FILE"));
  if (!haveCluster) return Err(fail("--cluster", "a cluster is required: --cluster NAME|FILE"));
  if (!havePlan) return Err(fail("--plan", "a plan is required: --plan \"tp=8,pp=2,...\"|FILE"));
  if (o.globalBatch) in.training.global_batch_size = *o.globalBatch;
  if (o.seqLen) in.training.seq_length = *o.seqLen;
  if (!haveTraining && !o.globalBatch)
    return Err(fail("--global-batch", "the global batch size is required: --global-batch B"));
  if (o.nodes) {
    if (*o.nodes < 1) return Err(fail("--nodes", "must be >= 1"));
    in.gpus = *o.nodes * in.cluster.node.devices_per_node;
  }
  if (o.gpus) in.gpus = *o.gpus;
  if (in.gpus < 1) return Err(fail("--gpus", "must be >= 1"));
  if (in.source.empty()) in.source = "command line";
  return in;
}

Result<Setup> makeSetup(const Inputs& in) {
  auto c = with_device_count(in.cluster, in.gpus);
  if (!c) return Err(c.error());
  return validate_setup(in.model, *c, in.training, in.plan, in.gpus);
}

}  // namespace megascope::gui
