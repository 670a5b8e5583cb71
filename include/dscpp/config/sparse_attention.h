// "sparse_attention": DeepSpeed's block-sparse attention section (its keys are DeepSpeed's SparsityConfig classes'
// arguments), parsed and checked here; the layouts are dscpp/sparse_attention/sparsity_config.h's and the attention
// that computes only their blocks dscpp/sparse_attention/block_sparse_attention.h's. A model applies it (gpt-train
// --sparse_attention, dscpp.ops.sparse_attention.SparseSelfAttention from Python): the engine refuses the section
// otherwise (InitOptions::sparse_attention_applied). docs/parallelism.md has each key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

class JsonReader;

// A layout's parameters, one struct for every mode (each mode reads its own; DeepSpeed's class defaults).
//   dense         every block
//   fixed         local windows of num_local_blocks; num_global_blocks per window (the last ones, one pattern per
//                 head up to num_different_global_patterns) attended by all later rows (unidirectional) or all rows,
//                 and with horizontal_global_attention attending to all
//   variable      random blocks per row, local windows of the sizes in local_window_blocks (the last size repeated),
//                 global blocks by index or [start, end) range
//   bigbird       random blocks, a sliding window of num_sliding_window_blocks, the first num_global_blocks rows and
//                 columns global
//   bslongformer  a sliding window and global blocks by index or range, rows and columns
//   local         a sliding window only (DeepSpeed's LocalSlidingWindowSparsityConfig; not a config mode there)
struct SparsityConfig {
  std::string mode = "fixed";
  int64_t num_heads = 1;  // the model's, not the config's
  int64_t block = 16;
  bool different_layout_per_head = false;
  bool unidirectional = false;  // "attention": "unidirectional" (else "bidirectional")
  // fixed
  int64_t num_local_blocks = 4;
  int64_t num_global_blocks = 1;             // also bigbird's
  bool horizontal_global_attention = false;  // also variable's
  int64_t num_different_global_patterns = 1;
  // variable, bigbird (the config's default 0 for both; BigBirdSparsityConfig's class default is 1)
  int64_t num_random_blocks = 0;
  std::vector<int64_t> local_window_blocks = {4};
  std::vector<int64_t> global_block_indices = {0};  // also bslongformer's
  std::optional<std::vector<int64_t>> global_block_end_indices;
  // bigbird, bslongformer, local
  int64_t num_sliding_window_blocks = 3;

  // The class constructors' checks, as DeepSpeed's raise them (std::invalid_argument with the facts).
  void validate() const;
  // Layouts computed per head (else one, copied to every head).
  int64_t layout_heads() const { return different_layout_per_head ? num_heads : 1; }
};

// The section as DeepSpeed's get_sparse_attention reads it: "mode" (default "fixed") and that mode's keys; a key
// the mode does not read is refused naming both. "attention" is read for every mode but dense (DeepSpeed's parse
// drops it for bigbird and bslongformer, whose classes take it). ConfigError naming the key.
SparsityConfig parse_sparse_attention(JsonReader& section);

}  // namespace dscpp
