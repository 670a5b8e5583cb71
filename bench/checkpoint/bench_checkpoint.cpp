// bench/checkpoint: how fast save_checkpoint writes compared with the disk itself. One process, stage 0, fp32,
// AdamW: a checkpoint of P parameters is 12P bytes (master + two Adam moments). Raw disk is the same number of bytes
// written by pwrite in 64 MiB pieces and fsynced, in the same directory. Prints GB/s of each and save / raw; then
// load_checkpoint's GB/s (page cache as the save left it: the files were just written).
// Expected time on a 2-core machine with the defaults (100M parameters, best of 3): ~1 min; ~3 GB of memory.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "dscpp/dscpp.h"

namespace {

double seconds_of(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Writes `bytes` to `path` in 64 MiB pwrites and fsyncs: what the disk sustains for one sequential writer.
void raw_write(const std::string& path, int64_t bytes) {
  const int64_t piece = int64_t{64} << 20;
  std::vector<char> buffer(piece, 1);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  for (int64_t done = 0; done < bytes;) {
    const auto n = ::pwrite(fd, buffer.data(), std::min(piece, bytes - done), done);
    if (n <= 0) throw std::runtime_error("write failed: " + path);
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_checkpoint: save_checkpoint GB/s against raw disk GB/s"};
  std::string dir = "/tmp/dscpp_bench_checkpoint";
  int64_t millions = 100;
  int repeats = 3;
  app.add_option("--dir", dir, "where to write (the disk being measured)");
  app.add_option("--params", millions, "model parameters, millions (checkpoint = 12 bytes each)");
  app.add_option("--repeats", repeats, "runs of each; the best is printed");
  CLI11_PARSE(app, argc, argv);

  // A stack of 4096-wide linears: the size is what matters here, not the architecture.
  const int64_t width = 4096;
  const int64_t layers = std::max<int64_t>(1, millions * 1'000'000 / (width * width));
  torch::nn::Sequential model;
  for (int64_t i = 0; i < layers; ++i) model->push_back(torch::nn::Linear(width, width));
  const auto config = dscpp::Config::from_string(
      R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  dscpp::InitOptions init;
  init.comm = dscpp::make_single_process_comm();
  init.log = [](const std::string&) {};
  auto engine = dscpp::initialize(model.ptr(), config, init);

  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  double save_best = 1e30, raw_best = 1e30, load_best = 1e30;
  int64_t bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto tag = "run" + std::to_string(r);
    save_best = std::min(save_best, seconds_of([&] { engine->save_checkpoint(dir + "/ckpt", tag); }));
    bytes = static_cast<int64_t>(std::filesystem::file_size(dir + "/ckpt/" + tag + "/rank_00000.safetensors"));
    raw_best = std::min(raw_best, seconds_of([&] { raw_write(dir + "/raw.bin", bytes); }));
    load_best = std::min(load_best, seconds_of([&] { engine->load_checkpoint(dir + "/ckpt", tag); }));
    std::filesystem::remove_all(dir + "/ckpt/" + tag);
    std::filesystem::remove(dir + "/raw.bin");
  }
  std::filesystem::remove_all(dir);
  const double gb = bytes / 1e9;
  std::printf("bench_checkpoint: %lld parameters (%lld x Linear(%lld, %lld)), fp32 + AdamW, one shard of %.2f GB, "
              "best of %d, in %s\n",
              static_cast<long long>(layers * (width * width + width)), static_cast<long long>(layers),
              static_cast<long long>(width), static_cast<long long>(width), gb, repeats, dir.c_str());
  std::printf("  raw disk (pwrite 64 MiB + fsync): %.3f GB/s\n", gb / raw_best);
  std::printf("  save_checkpoint (CRC-32, fsync, rename): %.3f GB/s\n", gb / save_best);
  std::printf("  ratio save / raw: %.3f\n", raw_best / save_best);
  std::printf("  load_checkpoint (CRC-32 checked, page cache warm): %.3f GB/s\n", gb / load_best);
  return 0;
}
