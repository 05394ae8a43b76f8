// Checks of a run's roles across sections (role_checks.cpp). Private to
// core/src/config.
#pragma once

#include "kolos/core/run_config.h"

namespace kolos {

// Which plugin each role gets, and the keys of a role's section that the
// choice leaves without a reader; the layouts a model may run under.
// Throws ConfigError at the first problem, located in the document.
void check_roles(const RunConfig& c);

}  // namespace kolos
