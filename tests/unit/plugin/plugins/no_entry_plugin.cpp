// A shared library named like a plugin that does not export kolos_plugin_v1.
extern "C" __attribute__((visibility("default"))) int kolos_plugin_v0(void) { return 0; }
