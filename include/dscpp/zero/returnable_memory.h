// Memory for ZeRO-3's block-sized, short-lived buffers (a gathered group, a gradient bucket, a unit being built
// partitioned) that is really given back when freed.
//
// On the CPU it is mapped straight from the kernel instead of taken from the heap. glibc raises its mmap threshold
// to the size of the largest chunk it has unmapped, so once one block-sized buffer is freed every later one comes
// from the heap, where small long-lived tensors (activations saved for backward, shards) land between them and pin
// the holes: the freed memory stays resident and the heap grows step by step (measured on 4 ranks with 24 blocks
// of 12.6 MB: one training step grew each rank's RSS by 270 MB while 45 MB of heap was in use). A freed mapping
// waits in a cache for the next buffer of its length (in whole pages), which saves faulting its pages in again;
// idle and in-use mappings together stay within the most that was once in use at the same time, and trim_heap
// unmaps the idle ones. Other devices use their own allocator (CUDA's caching allocator reuses blocks too).
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>

namespace dscpp {

// A 1-D tensor of `numel` zeros whose storage is returned to the system when freed or released
// (compat::release_storage).
torch::Tensor returnable_zeros(int64_t numel, const torch::TensorOptions& options);

// Gives `tensor`'s released storage `nbytes` of such memory again (contents unspecified): the counterpart of
// compat::release_storage for tensors made by returnable_zeros.
void allocate_returnable(const torch::Tensor& tensor, size_t nbytes);

// Gives the free pages inside the C heap back to the system (glibc's malloc_trim; nothing elsewhere), and unmaps the
// idle returnable mappings. For one-time points that leave large holes or buffers behind that will not be needed
// again, e.g. after a unit is built partitioned: it walks the whole heap.
void trim_heap();

}  // namespace dscpp
