// Hugging Face's model.safetensors.index.json, as --init_from reads it: the weight map names the shard files.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "dscpp/checkpoint/hf_gpt2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("dscpp_fuzz_hf_index_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  std::ofstream(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    dscpp::HfGpt2Weights weights(dir.string());
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
