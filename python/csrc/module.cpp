// torch_sac._C: sac's selective checkpointing modes and policies as a Python
// module. python/torch_sac/__init__.py is its front: it turns PyTorch's
// arguments (op overloads, policy functions) into these.
#include "hooks_bridge.h"
#include "lab.h"
#include "python_policy.h"

#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <sac/base/internal/check.h>
#include <sac/base/internal/region_events.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace sac::python {
namespace {

// The region a pair of modes serves inside PyTorch's checkpoint, which
// tells sac's region events (sac/base/internal/region_events.h) nothing: the
// modes tell them as sac's own frame would, so that a step's memory can be
// recorded (sac/lab/peak.h). It dies with the last of the pair, after the
// cache they share: the region's release.
struct DoorRegion {
  DoorRegion() = default;
  DoorRegion(const DoorRegion&) = delete;
  DoorRegion& operator=(const DoorRegion&) = delete;
  ~DoorRegion() {
    if (sac::detail::RegionEvents* events = sac::detail::region_events()) {
      events->released(this);
    }
  }
};

// One of the two modes as a Python context manager, which is what
// torch.utils.checkpoint's context_fn returns. An exit without an entry is
// an error here, not a corrupted mode stack.
class Mode {
 public:
  enum class Kind { Caching, Cached };
  Mode(std::shared_ptr<DoorRegion> region, std::shared_ptr<RegionContext> context, Kind kind)
      : region_(std::move(region)), context_(std::move(context)), kind_(kind) {}

  void enter() {
    sac::detail::RegionEvents* events = entered_ == 0 ? sac::detail::region_events() : nullptr;
    if (events != nullptr && kind_ == Kind::Cached) {
      events->recomputation_began(region_.get());
    }
    context_->enter();
    ++entered_;
    if (events != nullptr && kind_ == Kind::Caching) {
      events->forward_began(region_.get());
    }
  }
  void exit() {
    TORCH_CHECK(entered_ > 0, "sac: the ", name(),
                " mode was exited without being entered; use it as a context manager "
                "(`with mode:`) or call __enter__ before __exit__.");
    --entered_;
    context_->exit();
    sac::detail::RegionEvents* events = entered_ == 0 ? sac::detail::region_events() : nullptr;
    if (events != nullptr) {
      kind_ == Kind::Caching ? events->forward_ended(region_.get())
                             : events->recomputation_ended(region_.get());
    }
  }
  const char* name() const { return kind_ == Kind::Caching ? "caching" : "cached"; }

  // What a listener hears of the region from Python, as sac's own frame
  // tells it (Note [A region left unchecked], sac/lab/plan_trace.cpp): the inputs
  // PyTorch's checkpoint holds, each by `frame_handles` handles; each save,
  // held until the returned token dies; and that it told all of that.
  void hear_input(const at::Tensor& input, int64_t frame_handles) const {
    if (sac::detail::RegionEvents* events = sac::detail::region_events()) {
      events->input_held(region_.get(), input, frame_handles);
    }
  }
  std::shared_ptr<const void> hear_save(const at::Tensor& saved) const {
    auto token = std::make_shared<int>(0);
    if (sac::detail::RegionEvents* events = sac::detail::region_events()) {
      events->saved(region_.get(), saved, std::shared_ptr<const void>(token));
    }
    return token;
  }
  void heard_whole() const {
    if (sac::detail::RegionEvents* events = sac::detail::region_events()) {
      events->heard_whole(region_.get());
    }
  }

 private:
  // Declared first: destroyed after the context (see DoorRegion).
  std::shared_ptr<DoorRegion> region_;
  std::shared_ptr<RegionContext> context_;
  Kind kind_;
  int entered_ = 0;
};

// Lives as long as a save autograd holds (Mode::hear_save).
struct SaveToken {
  std::shared_ptr<const void> alive;
};

// sac::CheckpointRegion as a Python context manager: `with sac.region():`.
// Python's exceptions do not unwind C++, so the exit says whether the code
// in the region raised (the region is then abandoned, as in C++).
class Region {
 public:
  explicit Region(CheckpointOptions options) : options_(std::move(options)) {}

  void enter() {
    TORCH_CHECK(!region_, "sac.region: this region is active already; make a new "
                          "sac.region(...) for each `with`.");
    region_.emplace(options_);
  }
  void exit(bool raised) {
    TORCH_CHECK(region_, "sac.region was exited without being entered; use it as a "
                         "context manager (`with sac.region(...):`).");
    sac::detail::end_region(*region_, raised);
    region_.reset();
  }

 private:
  CheckpointOptions options_;
  std::optional<CheckpointRegion> region_;
};

// A compiled function called in a region is traced there, and the region
// refuses the trace from the dispatcher (sac/record/recorder.cpp). Dynamo
// wraps what a trace raises in its InternalTorchDynamoError, which reads as
// a bug of Dynamo's: the region's exit raises sac's refusal in its place,
// chained to Dynamo's (which stays as its cause).
void raise_trace_refusal_first(py::handle raised) {
  static constexpr const char* kRefusal = "sac::CheckpointRegion: the region runs";
  const std::string message = py::str(raised);
  const size_t at = message.find(kRefusal);
  const std::string type = py::str(py::type::handle_of(raised).attr("__qualname__"));
  if (at == std::string::npos || type.find("Dynamo") == std::string::npos) {
    return;
  }
  py::object refusal = py::reinterpret_steal<py::object>(
      PyObject_CallFunction(PyExc_RuntimeError, "s", message.substr(at).c_str()));
  PyException_SetCause(refusal.ptr(), py::reinterpret_borrow<py::object>(raised).release().ptr());
  PyErr_SetObject(PyExc_RuntimeError, refusal.ptr());
  throw py::error_already_set();
}

// While entered, this thread's regions run plainly, and those that began
// as checkpoints all the same are counted: sac.measure_step_phases' plain
// step, for regions of PyTorch's checkpoint, whose frames tell sac nothing
// of what they save (sac/lab/peak.h predicts sac's own).
class PlainRegions final : public sac::detail::RegionEvents {
 public:
  void forward_began(const void*) override { ++checkpointed_; }
  void forward_ended(const void*) override {}
  void recomputation_began(const void*) override {}
  void recomputation_ended(const void*) override {}
  void released(const void*) override {}
  void outputs_kept(size_t) override {}
  bool regions_run_plainly() const override { return true; }

  void enter() {
    TORCH_CHECK(!guard_, "sac: the plain regions' context is entered already.");
    guard_.emplace(this);
  }
  void exit() { guard_.reset(); }
  size_t checkpointed() const { return checkpointed_; }

 private:
  size_t checkpointed_ = 0;
  std::optional<sac::detail::RegionEventsGuard> guard_;
};

py::tuple contexts(const Policy& policy, bool allow_cache_entry_mutation,
                   std::shared_ptr<RegionStatistics> statistics) {
  SelectiveCheckpointContexts pair = create_selective_checkpoint_contexts(
      policy, allow_cache_entry_mutation, /*offload_to=*/nullptr, std::move(statistics));
  auto region = std::make_shared<DoorRegion>();
  return py::make_tuple(Mode(region, pair.caching, Mode::Kind::Caching),
                        Mode(region, pair.cached, Mode::Kind::Cached));
}

// torch_sac.CheckpointError, set by the package's __init__ (never freed: the
// translator may run until the interpreter exits).
PyObject* checkpoint_error_type = nullptr;

// See Note [CheckpointError in Python].
[[noreturn]] void throw_as_python(const CheckpointError& error) {
  if (checkpoint_error_type == nullptr || !Py_IsInitialized()) {
    throw error;
  }
  py::gil_scoped_acquire gil;
  PyErr_SetString(checkpoint_error_type, error.what_without_backtrace());
  python_error translated;
  translated.persist();
  throw translated;
}

}  // namespace
}  // namespace sac::python

PYBIND11_MODULE(_C, m) {
  using namespace sac;
  using sac::python::Mode;
  m.doc() = "sac's C++ modes and policies; use the torch_sac package, not this module.";
  // sac's errors read as torch's do: the message without C++ frames, and
  // the Python type torch gives each kind of c10::Error.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) {
        std::rethrow_exception(error);
      }
    } catch (const c10::Error& e) {
      torch::translate_exception_to_python(std::current_exception());
    } catch (python_error& e) {
      e.restore();
    }
  });
  m.def("_set_checkpoint_error", [](py::object type) {
    sac::python::checkpoint_error_type = type.release().ptr();
    sac::detail::set_checkpoint_error_translator(&sac::python::throw_as_python);
  });
  sac::python::install_hooks_bridge(m);
  sac::python::add_lab(m);
  py::class_<Policy>(m, "Policy", "Which op calls to save, recompute or offload.")
      .def("describe", &Policy::describe)
      .def_property_readonly("checkpoints", &Policy::checkpoints)
      .def("__repr__", [](const Policy& p) { return "torch_sac.Policy(" + p.describe() + ")"; });

  // The modes' entries and exits run inside torch's own error and warning
  // handling (HANDLE_TH_ERRORS): their warnings (a demoted call, an
  // untagged name) become Python warnings, as those of ops do.
  py::class_<Mode>(m, "Mode", "One of sac's two modes, as a context manager.")
      .def(
          "__enter__",
          [](Mode& mode) -> Mode& {
            HANDLE_TH_ERRORS
            mode.enter();
            return mode;
            END_HANDLE_TH_ERRORS_PYBIND
          },
          py::return_value_policy::reference)
      .def("__exit__",
           [](Mode& mode, py::args) {
             HANDLE_TH_ERRORS
             mode.exit();
             return false;
             END_HANDLE_TH_ERRORS_PYBIND
           })
      .def("__repr__",
           [](const Mode& mode) { return std::string("<sac ") + mode.name() + " mode>"; })
      .def("_hear_input", &Mode::hear_input, py::arg("input"), py::arg("frame_handles"))
      .def(
          "_hear_save",
          [](const Mode& mode, const at::Tensor& saved) {
            return sac::python::SaveToken{mode.hear_save(saved)};
          },
          py::arg("saved"))
      .def("_heard_whole", &Mode::heard_whole);
  py::class_<sac::python::SaveToken>(
      m, "_SaveToken",
      "Held with a save of PyTorch's checkpoint while sac hears the step: its "
      "death is autograd letting go of the save.");

  py::class_<sac::python::Region>(m, "CheckpointRegion",
                                  "sac::CheckpointRegion, as a context manager.")
      .def(py::init([](std::optional<Policy> policy, bool preserve_rng_state, bool debug,
                       bool allow_cache_entry_mutation,
                       std::shared_ptr<RegionStatistics> statistics,
                       const std::string& determinism_check, const std::string& name) {
             CheckpointOptions options;
             if (policy) {
               options.policy(*policy);
             }
             TORCH_CHECK(determinism_check == "default" || determinism_check == "none" ||
                             determinism_check == "values",
                         "sac.region: determinism_check must be \"default\", \"none\" or "
                         "\"values\", not \"",
                         determinism_check, "\".");
             options.preserve_rng_state(preserve_rng_state)
                 .debug(debug)
                 .determinism_check(determinism_check == "values" ? DeterminismCheck::Values
                                    : determinism_check == "none" ? DeterminismCheck::None
                                                                  : DeterminismCheck::Default)
                 .name(name);
             // Both are errors without a policy, so they are set only when asked for.
             if (allow_cache_entry_mutation) {
               options.allow_cache_entry_mutation(true);
             }
             if (statistics) {
               options.statistics(std::move(statistics));
             }
             return std::make_unique<sac::python::Region>(std::move(options));
           }),
           py::arg("policy"), py::arg("preserve_rng_state"), py::arg("debug"),
           py::arg("allow_cache_entry_mutation"), py::arg("statistics"),
           py::arg("determinism_check"), py::arg("name"))
      .def(
          "__enter__",
          [](sac::python::Region& region) -> sac::python::Region& {
            HANDLE_TH_ERRORS
            region.enter();
            return region;
            END_HANDLE_TH_ERRORS_PYBIND
          },
          py::return_value_policy::reference)
      .def("__exit__",
           [](sac::python::Region& region, py::handle type, py::handle value, py::handle) {
             HANDLE_TH_ERRORS
             region.exit(!type.is_none());
             if (!value.is_none()) {
               sac::python::raise_trace_refusal_first(value);
             }
             return false;
             END_HANDLE_TH_ERRORS_PYBIND
           });

  m.def("create_selective_checkpoint_contexts", &sac::python::contexts, py::arg("policy"),
        py::arg("allow_cache_entry_mutation") = false, py::arg("statistics") = nullptr);
  py::class_<sac::python::PlainRegions>(m, "_PlainRegions")
      .def(py::init<>())
      .def(
          "__enter__",
          [](sac::python::PlainRegions& plain) -> sac::python::PlainRegions& {
            plain.enter();
            return plain;
          },
          py::return_value_policy::reference)
      .def("__exit__", [](sac::python::PlainRegions& plain, const py::args&) { plain.exit(); })
      .def_property_readonly("checkpointed", &sac::python::PlainRegions::checkpointed);
  m.def(
      "_hearing",
      [] { return sac::detail::region_events() != nullptr && !sac::detail::regions_run_plainly(); },
      "Whether a listener hears this thread's regions now (sac.measure_step_phases' step).");
  m.def(
      "_regions_run_plainly", [] { return sac::detail::regions_run_plainly(); },
      "Whether this thread's regions run without checkpointing now: "
      "sac.measure_step_phases' plain step.");

  // Policies.
  m.def("save_ops", &Policy::save_ops, py::arg("op_names"));
  m.def(
      "answer_ops",
      [](const std::vector<std::string>& names, py::handle answer) {
        return Policy::answer_ops(names, sac::python::checkpoint_policy_from_python(answer));
      },
      py::arg("op_names"), py::arg("answer"));
  m.def("policy_from_fn", &sac::python::policy_from_python, py::arg("policy_fn"));
  m.def("answer_for_pytorch", &sac::python::answer_for_pytorch, py::arg("policy"), py::arg("op"),
        py::arg("args"), py::arg("kwargs"), py::arg("output"), py::arg("call"));

  // Presets (sac/policy/presets.h).
  m.def("nothing_saveable", &nothing_saveable);
  m.def("everything_saveable", &everything_saveable);
  m.def("compute_intensive_ops", &compute_intensive_ops);
  m.def("torchtitan_default", &torchtitan_default);
  m.def("dots_saveable", &dots_saveable);
  m.def("dots_with_no_batch_dims_saveable", &dots_with_no_batch_dims_saveable);
  m.def("offload_dot_with_no_batch_dims", &offload_dot_with_no_batch_dims);
  m.def("outputs_larger_than", &outputs_larger_than, py::arg("bytes"));
  m.def("never_recompute_collectives", &never_recompute_collectives);
  m.def("shape_deciding_ops", &shape_deciding_ops);
  m.def("shape_deciding_op_names", &shape_deciding_op_names);

  // Combinators (sac/policy/combinators.h).
  m.def("any_of", &any_of, py::arg("policies"));
  m.def("all_of", &all_of, py::arg("policies"));
  m.def("except_", &sac::except, py::arg("policy"), py::arg("excluded"));
  m.def("every_nth", &every_nth, py::arg("op_name"), py::arg("n"));
  m.def("offload_if", py::overload_cast<Policy, int64_t>(&offload_if), py::arg("policy"),
        py::arg("min_bytes"));

  // Named values (sac/policy/tag.h, names.h).
  m.def("tag", &tag, py::arg("tensor"), py::arg("name"));
  m.def("save_only_these_names", &save_only_these_names, py::arg("names"));
  m.def("save_and_offload_only_these_names", &save_and_offload_only_these_names, py::arg("save"),
        py::arg("offload"));
  m.def("save_any_names_but_these", &save_any_names_but_these, py::arg("names"));

  m.def(
      "mechanism", [] { return std::string(dispatch::to_string(dispatch::mechanism())); },
      "How sac sits below autograd: per-op kernels or the fallback key (SAC_DISPATCH).");
}
