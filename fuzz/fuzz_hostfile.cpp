// The launcher's inputs: a hostfile, then DeepSpeed's --include / --exclude strings applied to it, and --world_info
// node specs (what one launcher hands another). Input: hostfile text, '\0', include, '\0', exclude.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "dscpp/launcher/hostfile.h"

namespace {

std::string part(const std::string& text, size_t index) {
  size_t begin = 0;
  for (size_t i = 0; i < index; ++i) {
    begin = text.find('\0', begin);
    if (begin == std::string::npos) return "";
    ++begin;
  }
  const size_t end = text.find('\0', begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dscpp::launcher;
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    const Resources pool = parse_hostfile(part(input, 0), "hostfile");
    const Resources chosen = filter_resources(pool, part(input, 1), part(input, 2));
    // What the ssh launcher sends the other nodes must read back as the same world.
    if (parse_node_spec(format_node_spec(chosen), "--world_info") != chosen) __builtin_trap();
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  try {
    (void)parse_node_spec(part(input, 1), "--world_info");
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
