// A plugin with a symbol nothing defines: RTLD_NOW must refuse it at load
// time instead of failing when the symbol is first called.
#include "kolos/core/plugin_abi.h"

extern "C" void kolos_test_symbol_nobody_defines(void);

extern "C" __attribute__((visibility("default"))) const kolos_plugin_descriptor* kolos_plugin_v1(
    void) {
  kolos_test_symbol_nobody_defines();
  return nullptr;
}
