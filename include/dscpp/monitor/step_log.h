// The rank-0 progress line printed every steps_per_print optimizer steps.
#pragma once

#include <cstdint>
#include <string>

namespace dscpp {

// "step 10 | loss 3.2104 | lr 1.000e-03 | scale 65536 | grad_norm 0.5213 | 812.4 samples/s | skipped 0 | rss 1.2 GB"
std::string format_step_line(int64_t step, double loss, double lr, double loss_scale, double grad_norm,
                             double samples_per_s, int64_t skipped_steps);

// Resident set size of this process in bytes (from /proc/self/statm); 0 where unavailable.
int64_t resident_bytes();
// The most this process has had resident so far (VmHWM in /proc/self/status); 0 where unavailable.
int64_t peak_resident_bytes();
// File descriptors this process holds open (entries of /proc/self/fd); -1 where unavailable. A leak shows as growth.
int64_t open_file_descriptors();

// The project's one bytes formatter (logs, the comms logger's summary, memory breakdowns, `dscpp plan`): powers of
// 1024, named as DeepSpeed's logs name them (its comms logger's convert_size, see_memory_usage's "GB"):
// "1.23 GB", "512.00 MB", "12.00 KB", "100 B".
std::string format_bytes(double bytes);

}  // namespace dscpp
