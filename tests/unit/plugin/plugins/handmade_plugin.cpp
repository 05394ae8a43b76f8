// A descriptor written by hand, so that the build can make one field wrong
// on purpose (-DTEST_ABI=2, -DTEST_KOLOS="0.0.9", ...). Its create() returns
// NULL without a message: a plugin bug the core must still report. The
// build stamp says the same versions (-DTEST_NO_STAMP: none);
// -DTEST_ABORT_IF_LOADED makes loading the library end the process, for a
// plugin the core must refuse from its stamp without loading it.
#include <cstdlib>

#include "kolos/config.h"
#include "kolos/core/plugin_abi.h"

#ifndef TEST_ABI
#define TEST_ABI KOLOS_PLUGIN_ABI_VERSION
#endif
#ifndef TEST_NAME
#define TEST_NAME "testhandmade"
#endif
#ifndef TEST_ROLE
#define TEST_ROLE "gradients"
#endif
#ifndef TEST_KOLOS
#define TEST_KOLOS KOLOS_VERSION
#endif
#ifndef TEST_TORCH
#define TEST_TORCH KOLOS_TORCH_VERSION
#endif

namespace {

#ifndef TEST_NO_STAMP
KOLOS_PLUGIN_STAMP(TEST_KOLOS, TEST_TORCH)
#endif

#ifdef TEST_ABORT_IF_LOADED
__attribute__((constructor)) void abort_if_loaded() { std::abort(); }
#endif

void* create_nothing(char*, size_t) { return nullptr; }
void destroy_nothing(void*) {}

const kolos_plugin_descriptor kDescriptor{TEST_ABI,
                                          TEST_NAME,
                                          TEST_ROLE,
                                          TEST_KOLOS,
                                          TEST_TORCH,
                                          KOLOS_COMPILER,
                                          "hand-made test descriptor",
                                          &create_nothing,
                                          &destroy_nothing};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kolos_plugin_descriptor* kolos_plugin_v1(
    void) {
#ifdef TEST_NULL_DESCRIPTOR
  return nullptr;
#else
  return &kDescriptor;
#endif
}
