// Checkpoints as trusted storage, under mpirun: a corrupt or extended file is
// refused naming the file and its rank (whichever rank holds it), a
// directory holding another run's checkpoints or one that cannot be written
// is refused before the first step, a NaN loss stops the run before it
// writes a checkpoint, and a NaN gradient stops it too or, with
// --skip-nonfinite-steps, makes no update.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace {

using megascope::test::Launch;
using megascope::test::shell;

std::string run2(const std::string& dir, const std::string& extra) {
  return fmt::format("timeout 120 {} --allow-run-as-root --oversubscribe {} 2 {} run --model tiny-gpt --plan dp=2 "
                     "--global-batch 8 --checkpoint-dir {} {}",
                     MEGASCOPE_MPIEXEC, MEGASCOPE_MPIEXEC_NUMPROC_FLAG, MEGASCOPE_BINARY, dir, extra);
}

// A fresh directory with a two-step run's checkpoint of step 2.
std::filesystem::path checkpointed(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  const Launch l = shell(run2(dir.string(), "--steps 2"));
  INFO(l.output);
  REQUIRE(l.status == 0);
  REQUIRE(std::filesystem::exists(dir / "step-2" / "rank-1.bin"));
  return dir;
}

}  // namespace

TEST_CASE("A corrupt checkpoint is refused on resume, naming the file and the rank that holds it", "[exec][mpi]") {
  const auto dir = checkpointed("megascope-test-ckpt-corrupt");
  const auto file = dir / "step-2" / "rank-1.bin";
  const auto size = std::filesystem::file_size(file);
  {   // NaN bytes over a weight in the middle of rank 1's file
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};
    f.write(reinterpret_cast<const char*>(nan), 4);
  }
  const Launch bad = shell(run2(dir.string(), "--steps 1 --resume"));
  INFO(bad.output);
  CHECK(bad.status != 0);
  CHECK_THAT(bad.output, Catch::Contains("rank 1:") && Catch::Contains("rank-1.bin") &&
                             Catch::Contains("checksum does not match"));
  CHECK_THAT(bad.output, !Catch::Contains("step    3"));
  // Bytes appended after the checksum are refused too.
  std::filesystem::remove_all(dir);
  const auto dir2 = checkpointed("megascope-test-ckpt-corrupt");
  { std::ofstream(dir2 / "step-2" / "rank-0.bin", std::ios::app | std::ios::binary) << "junk"; }
  const Launch junk = shell(run2(dir2.string(), "--steps 1 --resume"));
  CHECK(junk.status != 0);
  CHECK_THAT(junk.output, Catch::Contains("rank-0.bin: bytes after the checksum"));
  // Intact, it resumes.
  std::filesystem::remove_all(dir2);
  const auto dir3 = checkpointed("megascope-test-ckpt-corrupt");
  const Launch ok = shell(run2(dir3.string(), "--steps 1 --resume"));
  INFO(ok.output);
  CHECK(ok.status == 0);
  CHECK_THAT(ok.output, Catch::Contains("resumed from") && Catch::Contains("step    3"));
  std::filesystem::remove_all(dir3);
}

TEST_CASE("A resume with another batch, micro-batch size, seed or learning rate on the same sharding goes on and says so",
          "[exec][mpi]") {
  const auto dir = checkpointed("megascope-test-ckpt-changed");
  const Launch l = shell(fmt::format("timeout 120 {} --allow-run-as-root --oversubscribe {} 2 {} run --model tiny-gpt "
                                     "--plan dp=2,mbs=2 --global-batch 16 --seed 7 --lr 0.002 --steps 1 "
                                     "--checkpoint-dir {} --resume",
                                     MEGASCOPE_MPIEXEC, MEGASCOPE_MPIEXEC_NUMPROC_FLAG, MEGASCOPE_BINARY, dir.string()));
  INFO(l.output);
  CHECK(l.status == 0);
  CHECK_THAT(l.output, Catch::Contains("resumed from") && Catch::Contains("step    3"));
  CHECK_THAT(l.output, Catch::Contains("resumed with a change: global-batch: 8 -> 16"));
  CHECK_THAT(l.output, Catch::Contains("resumed with a change: seed: 1234 -> 7"));
  CHECK_THAT(l.output, Catch::Contains("resumed with a change: lr: 0.001 -> 0.002"));
  CHECK_THAT(l.output, Catch::Contains("resumed with a change: plan: ") && Catch::Contains("mbs=2"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("A fresh run into another run's checkpoints, or into a directory it cannot write, stops before step 1",
          "[exec][mpi]") {
  const auto dir = checkpointed("megascope-test-ckpt-fresh");
  const Launch fresh = shell(run2(dir.string(), "--steps 1"));
  CHECK(fresh.status != 0);
  CHECK_THAT(fresh.output, Catch::Contains("holds a checkpoint at step 2") && Catch::Contains("--resume"));
  CHECK_THAT(fresh.output, !Catch::Contains("step    1"));
  std::ifstream latest(dir / "latest");
  int step = 0;
  latest >> step;
  CHECK(step == 2);   // untouched
  std::filesystem::remove_all(dir);
  // A path under a regular file cannot be a directory.
  const auto file = std::filesystem::temp_directory_path() / "megascope-test-ckpt-file";
  { std::ofstream(file) << "x"; }
  const Launch blocked = shell(run2((file / "ckpt").string(), "--steps 1"));
  CHECK(blocked.status != 0);
  CHECK_THAT(blocked.output, Catch::Contains("cannot write in the checkpoint directory"));
  CHECK_THAT(blocked.output, !Catch::Contains("step    1"));
  std::filesystem::remove(file);
}

TEST_CASE("A NaN loss stops the run before it writes that step's checkpoint", "[exec][mpi]") {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-test-ckpt-nan";
  std::filesystem::remove_all(dir);
  // A learning rate this large drives the weights to infinity within a few steps.
  const Launch l = shell(run2(dir.string(), "--steps 6 --save-every 1 --lr 1e30 --clip-grad 0"));
  INFO(l.output);
  CHECK(l.status != 0);
  CHECK_THAT(l.output, Catch::Contains("stopping before any checkpoint of this step is written"));
  // Every checkpoint written holds finite numbers: 'latest' names a step
  // before the one that failed.
  std::ifstream latest(dir / "latest");
  int last = 0;
  if (latest >> last) CHECK(last < 6);
  std::filesystem::remove_all(dir);
}

namespace {
std::vector<char> bytes_of(const std::filesystem::path& f) {
  std::ifstream in(f, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("A NaN gradient stops the run, or with --skip-nonfinite-steps leaves the weights and moments as they were",
          "[exec][mpi]") {
  const auto dir = std::filesystem::temp_directory_path() / "megascope-test-ckpt-skip";
  std::filesystem::remove_all(dir);
  // Rank 1's gradient is NaN at step 2: the job's norm is NaN, the loss finite.
  const Launch stop = shell(run2(dir.string(), "--steps 3 --save-every 1 --inject-failure 1:2:nan"));
  INFO(stop.output);
  CHECK(stop.status != 0);
  CHECK_THAT(stop.output, Catch::Contains("step 2: the loss is") && Catch::Contains("the gradient norm nan") &&
                              Catch::Contains("--skip-nonfinite-steps skips"));
  CHECK_FALSE(std::filesystem::exists(dir / "step-2"));
  std::filesystem::remove_all(dir);

  const Launch skip = shell(run2(dir.string(), "--steps 3 --save-every 1 --inject-failure 1:2:nan --skip-nonfinite-steps"));
  INFO(skip.output);
  REQUIRE(skip.status == 0);
  CHECK_THAT(skip.output, Catch::Contains("skipped: no update"));
  CHECK_THAT(skip.output, Catch::Contains("step    3"));
  // Step 2's checkpoint holds step 1's weights and moments: the files differ
  // only in the header's step line and the checksum at the end.
  for (const char* rank : {"rank-0.bin", "rank-1.bin"}) {
    const std::vector<char> a = bytes_of(dir / "step-1" / rank), b = bytes_of(dir / "step-2" / rank);
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() > 100000);
    std::size_t differ = 0, late = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) {
        ++differ;
        if (i >= 512 && i < a.size() - 8) ++late;
      }
    CHECK(differ > 0);
    CHECK(late == 0);
  }
  // Step 3 updated again: its weights differ from step 2's.
  const std::vector<char> c = bytes_of(dir / "step-3" / "rank-0.bin"), d = bytes_of(dir / "step-2" / "rank-0.bin");
  std::size_t payload = 0;
  for (std::size_t i = 512; i + 8 < c.size() && i < d.size(); ++i) payload += c[i] != d[i];
  CHECK(payload > 1000);
  std::filesystem::remove_all(dir);
}
