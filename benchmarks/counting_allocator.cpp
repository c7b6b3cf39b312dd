// The counting allocator of examples/support.h, for a Python process:
// side_by_side.py loads this library with ctypes after `import torch`, so that
// PyTorch's side is measured by the very allocator that measures sac's.
#include "examples/support.h"

#include <cstdint>

extern "C" {

void sac_counting_install() { sac_examples::CountingAllocator::install(); }
int64_t sac_counting_live_bytes() { return sac_examples::CountingAllocator::live_bytes(); }
int64_t sac_counting_peak_bytes() { return sac_examples::CountingAllocator::peak_bytes(); }
void sac_counting_reset_peak() { sac_examples::CountingAllocator::reset_peak(); }
void sac_counting_limit(int64_t bytes) { sac_examples::CountingAllocator::limit_to(bytes); }

}  // extern "C"
