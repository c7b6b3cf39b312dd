#include <sac/offload/offload.h>

#include <sac/base/internal/detached_alias.h>
#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/base/internal/stash.h>
#include <sac/base/internal/version_watch.h>
#include <sac/dispatch/internal/interceptor.h>

#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <unordered_set>

namespace sac {
namespace {

// What one OffloadGuard decided: which tensors move, and where.
class Offloader final : public detail::TensorStash, public std::enable_shared_from_this<Offloader> {
 public:
  explicit Offloader(OffloadOptions options) : options_(std::move(options)) {
    if (options_.target() == nullptr) {
      options_.target(host_memory());
    }
    for (const auto& t : options_.left_in_place()) {
      if (t.defined() && t.has_storage()) {
        kept_storages_.insert(t.storage().unsafeGetStorageImpl());
      }
    }
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() override;

  bool moves(const at::Tensor& t) const {
    if (static_cast<int64_t>(t.nbytes()) < options_.min_bytes()) {
      return false;
    }
    if (t.has_storage() && kept_storages_.count(t.storage().unsafeGetStorageImpl()) > 0) {
      return false;
    }
    return options_.target()->accepts(t);
  }
  CopyTarget& target() const { return *options_.target(); }

 private:
  OffloadOptions options_;
  std::unordered_set<const c10::StorageImpl*> kept_storages_;
};

// One saved tensor: moved to the target, or kept as it is.
class OffloadHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHooks(std::shared_ptr<const Offloader> offloader)
      : offloader_(std::move(offloader)) {}

  void call_pack_hook(const at::Tensor& t) override {
    watch_.emplace(t);
    if (!offloader_->moves(t)) {
      kept_ = detail::detached_alias(t);
      return;
    }
    // The copy's own ops belong to no region: no interceptor or observer
    // sees them, and autograd builds no graph for them.
    detail::IsolationGuard isolated;
    c10::AutoGradMode no_grad(false);
    from_ = CopyTarget::Origin::of(t);
    copy_ = offloader_->target().copy_out(t);
  }

  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(watch_.has_value(), "sac: an offloaded tensor was unpacked before it was packed");
    TORCH_CHECK(!watch_->changed(),
                "sac::OffloadGuard: a tensor saved for backward was modified in place "
                "after it was saved (version ",
                watch_->version(), " when saved, ", watch_->current_version(),
                " now), so backward would use the value it "
                "had then. Autograd without hooks raises the same error: do not modify "
                "it before backward, or modify a clone.");
    if (kept_.defined()) {
      return kept_;
    }
    detail::IsolationGuard isolated;
    c10::AutoGradMode no_grad(false);
    return offloader_->target().copy_back(copy_, from_);
  }

 private:
  std::shared_ptr<const Offloader> offloader_;
  std::optional<detail::VersionWatch> watch_;
  at::Tensor kept_;
  at::Tensor copy_;
  CopyTarget::Origin from_;
};

std::unique_ptr<torch::autograd::SavedVariableHooks> Offloader::hooks() {
  return std::make_unique<OffloadHooks>(shared_from_this());
}

}  // namespace

OffloadGuard::OffloadGuard(OffloadOptions options) {
  detail::install_hooking_engine();
  auto offloader = std::make_shared<Offloader>(std::move(options));
  hooks_ =
      std::make_unique<detail::SavedTensorHooksGuard>([offloader] { return offloader->hooks(); });
  stash_ = std::make_unique<detail::StashScope>(offloader);
}

OffloadGuard::~OffloadGuard() = default;

}  // namespace sac
