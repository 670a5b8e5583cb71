// JsonReader: typed access to one object of the config, tracking the dotted key path for error messages.
// Reads normalise the value in place (5e5 -> 500000, defaults written out) so the document becomes Config::resolved;
// keys never asked for are reported as unknown, with the closest known key, when the section is finished.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

// State shared by every reader of one parse: where warnings go and every key path known so far
// (so a key put at the wrong level can be pointed to its right place).
class ParseContext {
 public:
  explicit ParseContext(std::function<void(const std::string&)> warn);
  void warn(const std::string& message) const { warn_(message); }
  void note_known(const std::string& path) { known_paths_.push_back(path); }
  const std::vector<std::string>& known_paths() const { return known_paths_; }

 private:
  std::function<void(const std::string&)> warn_;
  std::vector<std::string> known_paths_;
};

class JsonReader {
 public:
  static constexpr int64_t kNoMin = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

  // `object` must outlive the reader; `path` is its dotted path ("" for the root).
  JsonReader(nlohmann::json& object, std::string path, ParseContext& context);

  std::string path_of(const std::string& key) const;
  // Marks `key` known; true when it is present and not null.
  bool has(const std::string& key);

  // Integers accept JSON floats with an integral value (5e5); min/max are inclusive.
  int64_t get_int(const std::string& key, int64_t def, int64_t min = kNoMin, int64_t max = kNoMax);
  std::optional<int64_t> get_optional_int(const std::string& key, int64_t min = kNoMin, int64_t max = kNoMax);
  double get_number(const std::string& key, double def);
  bool get_bool(const std::string& key, bool def);
  std::optional<bool> get_optional_bool(const std::string& key);
  std::string get_string(const std::string& key, const std::string& def);
  // A string or null; absent/null is written out as null.
  std::optional<std::string> get_optional_string(const std::string& key);
  // One of `allowed`, matched case-insensitively; returns (and writes back) the spelling in `allowed`.
  std::string get_choice(const std::string& key, const std::string& def, const std::vector<std::string>& allowed);
  std::array<double, 2> get_pair(const std::string& key, std::array<double, 2> def);
  // A list of strings, each one of `allowed`; absent: empty.
  std::vector<std::string> get_string_list(const std::string& key, const std::vector<std::string>& allowed);

  // An older spelling: its value moves to `key` (both given is an error), so the resolved config has one name.
  void rename(const std::string& old_key, const std::string& key);

  // A nested object; absent or null becomes {} (written out, so defaults appear in the resolved config).
  JsonReader section(const std::string& key);
  // The value at `key` as it is (marked known), or nullptr when absent: for shapes the typed getters do not cover
  // (lists of lists), which the caller checks itself and reports with fail().
  const nlohmann::json* raw(const std::string& key) { return lookup(key); }
  // The object's keys in order: for sections whose keys are names the user chooses (compression's groups).
  std::vector<std::string> keys() const;

  // Keys DeepSpeed accepts that we read elsewhere or ignore: known, so they draw no warning.
  void accept(const std::vector<std::string>& keys);
  // DeepSpeed features this engine does not have: accepted while off, a ConfigError ("... is not supported yet")
  // when the key is `true` or an object switched on (its "enabled" is true, or, for a section without an "enabled"
  // key, any sub-section's is).
  void accept_if_disabled(const std::vector<std::string>& keys);
  // A DeepSpeed key whose other settings this engine does not have: accepted when absent, null or equal to `def`
  // (DeepSpeed's default, what the engine does), a ConfigError naming the key and the default otherwise.
  void accept_only_default(const std::string& key, const nlohmann::json& def);

  // Throws ConfigError "<path> = <value>: expected <allowed>" unless `ok`.
  void require(bool ok, const std::string& key, const std::string& allowed) const;
  [[noreturn]] void fail(const std::string& key, const std::string& allowed) const;

  // Every key of the object that no read asked for: a warning at the root (DeepSpeed ignores unknown top-level keys),
  // a ConfigError inside a section, with the closest known key. That is our rule for every section — DeepSpeed's
  // pydantic sections (zero_optimization, monitors, comms_logger) forbid extras, its dict-read ones (fp16, bf16,
  // aio, activation_checkpointing, …) ignore them — because a misspelt key there would otherwise change nothing.
  void finish();

 private:
  // The value at key, or nullptr when absent; throws the unfilled-"auto" error for "auto".
  const nlohmann::json* lookup(const std::string& key);
  // Throws for a key present as null: a number has no null (`what` says what is allowed).
  void refuse_null_number(const std::string& key, const std::string& what);

  nlohmann::json& object_;
  std::string path_;
  ParseContext& context_;
  std::vector<std::string> known_;
};

}  // namespace dscpp
