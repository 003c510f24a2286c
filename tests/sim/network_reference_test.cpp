// Network against a from-scratch reference: random flows, every rate
// re-solved globally at every event by plain progressive filling. The
// incremental solver must give the same finish times.
#include <algorithm>
#include <catch2/catch.hpp>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "fabric.hpp"
#include "sim/network.hpp"

using namespace megascope;
using namespace megascope::sim;

namespace {

using test::fabric;

struct Job {
  FlowSpec spec;
  double start = 0;
};

// Global progressive filling: all unfrozen rates rise together; a saturated
// link freezes its flows.
std::vector<double> max_min(const std::vector<const FlowSpec*>& fs, const std::vector<double>& cap) {
  std::vector<double> rate(fs.size(), 0.0);
  std::vector<bool> frozen(fs.size(), false);
  std::vector<double> residual = cap;
  std::size_t left = fs.size();
  double level = 0;
  while (left > 0) {
    double step = std::numeric_limits<double>::infinity();
    for (std::size_t l = 0; l < cap.size(); ++l) {
      double w = 0;
      for (std::size_t i = 0; i < fs.size(); ++i)
        if (!frozen[i])
          for (const auto& [link, x] : fs[i]->load)
            if (link == l) w += x;
      if (w > 0) step = std::min(step, residual[l] / w);
    }
    level += step;
    for (std::size_t l = 0; l < cap.size(); ++l)
      for (std::size_t i = 0; i < fs.size(); ++i)
        if (!frozen[i])
          for (const auto& [link, x] : fs[i]->load)
            if (link == l) residual[l] -= step * x;
    for (std::size_t i = 0; i < fs.size(); ++i) {
      if (frozen[i]) continue;
      bool saturated = false;
      for (const auto& [link, x] : fs[i]->load) saturated = saturated || residual[link] <= 1e-9 * cap[link];
      if (saturated) {
        frozen[i] = true;
        rate[i] = level;
        --left;
      }
    }
  }
  return rate;
}

// Finish time of every job, simulated from scratch.
std::vector<double> reference(const std::vector<Job>& jobs, const std::vector<double>& cap) {
  const std::size_t n = jobs.size();
  std::vector<double> remaining(n), done(n, -1);
  for (std::size_t i = 0; i < n; ++i) remaining[i] = jobs[i].spec.payload_bytes;
  double now = 0;
  for (;;) {
    std::vector<std::size_t> moving;
    std::vector<const FlowSpec*> specs;
    double next = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; ++i) {
      if (done[i] >= 0) continue;
      const double begin = jobs[i].start + jobs[i].spec.latency_s;
      if (begin > now + 1e-12) {
        next = std::min(next, begin);
      } else {
        moving.push_back(i);
        specs.push_back(&jobs[i].spec);
      }
    }
    if (moving.empty() && next == std::numeric_limits<double>::infinity()) break;
    const auto rate = max_min(specs, cap);
    for (std::size_t k = 0; k < moving.size(); ++k) next = std::min(next, now + remaining[moving[k]] / rate[k]);
    for (std::size_t k = 0; k < moving.size(); ++k) {
      const std::size_t i = moving[k];
      remaining[i] -= rate[k] * (next - now);
      if (remaining[i] <= 1e-9 * jobs[i].spec.payload_bytes) done[i] = next;
    }
    now = next;
  }
  return done;
}

// Random jobs on `devices` device links both ways (2 x devices links):
// `per_job` links each, the network against the reference, `rounds` times.
void check_random_jobs(int devices, int max_links_per_job, int rounds, unsigned seed) {
  const Topology t = fabric(devices, 100);  // 2 x devices links of 100 bytes/s
  std::vector<double> cap;
  for (const auto& l : t.links()) cap.push_back(l.capacity_Bps);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> link(0, static_cast<int>(cap.size()) - 1), count(1, max_links_per_job), payload(10, 400);
  std::uniform_real_distribution<double> weight(0.5, 3.0), latency(0.0, 2.0), start(0.0, 6.0);
  for (int round = 0; round < rounds; ++round) {
    std::vector<Job> jobs(30);
    for (auto& j : jobs) {
      std::map<LinkId, double> load;
      for (int k = count(rng); k > 0; --k) load[static_cast<LinkId>(link(rng))] += weight(rng);
      j.spec.load.assign(load.begin(), load.end());
      j.spec.payload_bytes = payload(rng);
      j.spec.latency_s = latency(rng);
      j.start = start(rng);
    }
    const auto expected = reference(jobs, cap);

    // The network: each job started at its start time (events in between first).
    Network net(t);
    std::vector<std::size_t> order(jobs.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return jobs[a].start < jobs[b].start; });
    std::map<FlowId, std::size_t> job_of;
    std::vector<double> got(jobs.size(), -1);
    std::size_t next_job = 0;
    for (;;) {
      const auto e = net.next_event_time();
      const double start_at = next_job < order.size() ? jobs[order[next_job]].start : -1;
      if (next_job < order.size() && (!e || start_at <= *e)) {
        for (FlowId id : net.advance_to(start_at)) got[job_of.at(id)] = start_at;
        job_of[net.start(jobs[order[next_job]].spec, start_at)] = order[next_job];
        ++next_job;
        continue;
      }
      if (!e) break;
      for (FlowId id : net.advance_to(*e)) got[job_of.at(id)] = *e;
    }
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      INFO("round " << round << " job " << i);
      CHECK(got[i] == Approx(expected[i]).epsilon(1e-6));
    }
  }
}

}  // namespace

TEST_CASE("Incremental max-min sharing finishes random flows when a global re-solve at every event does", "[sim]") {
  SECTION("dense: 30 flows of 1-4 links on 12 links") { check_random_jobs(6, 4, 20, 7); }
  // Most flows start alone on their links (the network settles them at
  // their solo rate without a solve), and later ones join some of them.
  SECTION("sparse: 30 flows of 1-2 links on 60 links") { check_random_jobs(30, 2, 20, 11); }
}
