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
  // One directory per fuzzing process, removed when it exits (libFuzzer ends with exit(), which runs destructors).
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("dscpp_fuzz_hf_index_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir owned;
  const std::filesystem::path& dir = owned.path;
  std::ofstream(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    dscpp::HfGpt2Weights weights(dir.string());
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
