// Reads a trace file written by write_trace (core/trace.hpp), simulated or
// measured, back into spans with their op details, for `megascope compare`
// and the GUI. Only the events write_trace emits are read; anything else in
// the file (other tools' events) is ignored, but a malformed file or an event
// missing a required key is an error naming the file and the event index.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "core/trace.hpp"

namespace megascope {

struct TraceRecord {
  int rank = 0;
  int stream = 0;                 // Stream as an integer
  std::uint32_t op = 0;           // index in the rank's StageProgram
  double start_s = 0, end_s = 0;
  std::string name;               // "forward attention mb3", ...
  std::string label;              // OpLabel spelling ("attention", "tp_comm", ...)
  std::string phase;              // Phase spelling
  std::optional<int> microbatch, chunk, layer;
  double bytes = 0, flops = 0;
};

struct TraceFile {
  TraceInfo info;
  std::vector<int> ranks;             // ranks with a process_name entry, in file order
  std::vector<TraceRecord> spans;     // in file order
};

Result<TraceFile> read_trace(const std::string& path);

}  // namespace megascope
