// Note [Rewritten by a recomputation]
//
// A tensor from outside that a region overwrites whole before reading it is
// the region's own (Note [Overwritten before read]): each recomputation of
// the region writes it again, with what the forward wrote, and bumps its
// version. Another region that read it after the forward's write (nested
// inside the first, or after it) finds a newer version when the first
// region's recomputation runs before its own: the same values, which a
// check of versions alone would blame (FSDP's unsharded parameters, a
// scratch buffer, a cache).
//
// So while a region can recompute, the tensors it overwrites are noted
// here, and what another region reads of them (a read from outside, a saved
// argument, a saved tensor) is watched by value too: a changed version whose
// storage holds the same bytes is no change. A region that reads such a
// tensor after something else wrote it (a write of the user's between the
// two regions) reads other bytes in its recomputation, and is still caught.
// Every other tensor is watched by its version alone, as autograd watches.
#pragma once

#include <sac/base/internal/version_watch.h>
#include <sac/checkpoint/internal/value_check.h>

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>

namespace sac::detail {

// The tensors of version counter `counter` are overwritten by a region that
// can recompute, until the matching forget (a count: nested regions each
// note them).
void note_overwritten_by_region(const void* counter);
void forget_overwritten_by_region(const void* counter);

// Has what a region read changed since? Its version, and for a tensor a
// region overwrites (noted above), the bytes of its storage.
class ReadWatch {
 public:
  explicit ReadWatch(const at::Tensor& t);

  // Whether the version changed, and with it the bytes where those are kept.
  bool changed() const;
  const VersionWatch& version() const { return version_; }
  const void* identity() const { return version_.identity(); }
  // Whether it watches the bytes too (a tensor a region overwrites).
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
