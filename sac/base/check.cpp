#include <sac/base/internal/check.h>
#include <sac/base/internal/early_stop.h>

#include <atomic>

namespace sac::detail {
namespace {

std::atomic<CheckpointErrorTranslator> translator{nullptr};
thread_local bool untranslated = false;

}  // namespace

void throw_checkpoint_error(CheckpointError error) {
  note_recomputation_error(error);  // Note [Early stop cannot be swallowed]
  // See Note [CheckpointError in Python].
  if (CheckpointErrorTranslator translate = translator.load(); translate && !untranslated) {
    translate(error);
  }
  throw std::move(error);
}

void set_checkpoint_error_translator(CheckpointErrorTranslator translate) {
  translator.store(translate);
}

UntranslatedCheckpointErrors::UntranslatedCheckpointErrors() : previous_(untranslated) {
  untranslated = true;
}

UntranslatedCheckpointErrors::~UntranslatedCheckpointErrors() { untranslated = previous_; }

}  // namespace sac::detail
