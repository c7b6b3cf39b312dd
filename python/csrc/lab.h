// sac's policy lab from Python: profiles, budgeted plans, explanations and
// statistics (sac/lab/, sac/cache/statistics.h). The region a profile or an
// explanation runs is a Python function of no arguments.
#pragma once

#include <pybind11/pybind11.h>

namespace sac::python {

void add_lab(pybind11::module_& m);

}  // namespace sac::python
