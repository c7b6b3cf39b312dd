// Note [Rewritten by a recomputation]
//
// A tensor from outside that a region writes (whole, as a region's own:
// Note [Overwritten before read]; or in part) is written again by each
// recomputation of the region, with what the forward wrote, which bumps its
// version. What read it after the forward's write (the region itself, a
// region nested inside it or after it, autograd's saves of it) finds a newer
// version when the region's recomputation has run: the same values, which a
// check of versions alone would blame (FSDP's unsharded parameters, a
// scratch buffer, a cache, a row of one written).
//
// So while a region can recompute, the tensors it writes are noted here,
// and what is read of them (a read from outside, a saved argument, a saved
// tensor) is watched by value too: a changed version whose storage holds
// the same bytes is no change. A read of such a tensor after something else
// wrote it (a write of the user's between forward and backward) reads other
// bytes in the recomputation, and is still caught. Every other tensor is
// watched by its version alone, as autograd watches.
#pragma once

#include <sac/base/internal/version_watch.h>
#include <sac/check/internal/checksum.h>

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>

namespace sac::detail {

// The tensors of version counter `counter` are written by a region that can
// recompute, until the matching forget (a count: nested regions each note
// them).
void note_written_by_region(const void* counter);
void forget_written_by_region(const void* counter);

// Has what a region read changed since? Its version, and for a tensor a
// region writes (noted above), the bytes of its storage.
class ReadWatch {
 public:
  explicit ReadWatch(const at::Tensor& t);

  // Whether the version changed, and with it the bytes where those are kept.
  bool changed() const;
  const VersionWatch& version() const { return version_; }
  const void* identity() const { return version_.identity(); }
  // Whether it watches the bytes too (a tensor a region writes).
  bool watches_bytes() const { return bytes_.has_value(); }
  // Watches from the counter's current version (and the storage's current
  // bytes) on.
  void rebase();

 private:
  struct Bytes {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    ValueChecksum checksum;
  };
  VersionWatch version_;
  std::optional<Bytes> bytes_;
};

}  // namespace sac::detail
